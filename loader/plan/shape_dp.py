"""The 1-D shape programme shared by the shape planners: the rows a batch size pads to over the planning
windows, and the exact dynamic programme that picks K widths over a length histogram (``shapes.plan_shapes``
for one length, ``shape_boxes`` for pairs)."""

from __future__ import annotations

import numpy as np


def padded_rows(n, batch, windows: int):
    """Rows served for n samples (weights: may be fractional) of a shape with ``batch`` rows: ``ceil(n / B) * B``
    in each of ``windows`` windows (n split evenly); ``windows=0``: n (partial batches are not padded)."""
    n = np.asarray(n, dtype=np.float64)
    if not windows:
        return n
    x = n / (windows * np.asarray(batch, dtype=np.float64))
    return windows * np.ceil(x * (1 - 1e-12) - 1e-9) * batch


def dp_plan(values, count, mx, sizes, windows: int, num_shapes: int) -> list[tuple[int, int]]:
    """The exact programme: buckets ``(start, end)`` over the U sorted distinct costs ``values`` (weights
    ``count``, per value the longest of each side ``mx[U, d]``, rows per batch ``sizes[U]`` of a bucket ending
    there) of least padded tokens, masked rows included; at most ``num_shapes`` buckets (fewer when cheaper)."""
    u = len(values)
    k_max = min(num_shapes, u)
    csum = np.concatenate([[0.0], np.cumsum(count)])
    best = np.full((k_max, u), np.inf)  # best[k, b]: costs 0..b in k+1 buckets, the last one ending at b
    choice = np.full((k_max, u), -1, dtype=np.int64)
    one_side = mx.shape[1] == 1
    for b in range(u):
        if one_side:
            width = float(values[b])
        else:  # bucket a..b pads to the longest source and target among them
            width = np.maximum.accumulate(mx[b::-1], axis=0)[::-1].sum(axis=1)
        seg = padded_rows(csum[b + 1] - csum[:b + 1], sizes[b], windows) * width  # seg[a]: bucket a..b
        best[0, b] = seg[0]
        if b and k_max > 1:
            cand = best[:k_max - 1, :b] + seg[None, 1:]  # the previous bucket ends at a, this one is a+1..b
            i = np.argmin(cand, axis=1)
            best[1:, b] = cand[np.arange(k_max - 1), i]
            choice[1:, b] = i
    k = int(np.argmin(best[:, u - 1]))  # ties keep the fewer shapes
    ends, b = [], u - 1
    while k >= 0:
        ends.append(b)
        b = int(choice[k, b])
        k -= 1
    ends = ends[::-1]
    return list(zip([0] + [e + 1 for e in ends[:-1]], ends))

