"""Static batch shapes for XLA: K shapes chosen from the length histogram to minimise padding.

A shape plan is a small set of batch shapes ``(B, L)`` (one sequence per sample) or ``(B, L_src, L_tgt)``
(pairs), each within the token budget: ``B * max(L...) <= max_tokens``. Every batch the loader emits then has
exactly one of these shapes, so a jitted step compiles at most K times.

The boundaries come from an exact dynamic programme. Sort the distinct sample costs c (the length, or
``max(src, tgt)`` for pairs); a bucket takes the samples with cost in ``(a, b]`` and pads each of them to the
bucket's longest. ``best[k][b] = min_a best[k-1][a] + padded(a, b)`` over the U distinct costs, O(K U^2) time,
O(U) memory. Boundaries at observed costs lose nothing (a boundary can always drop to the longest sample below
it), so this is the optimum over all K-bucket plans. It is compared in ``benchmarks/`` with fairseq's
percentile edges (``get_buckets``) and Lhotse's equal-token-mass edges.

For pairs the padded size of bucket (a, b] is ``count * (max src + max tgt)`` over its samples: source and
target widths follow the bucket's own longest source and target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ShapePlan:
    """K batch shapes. ``edges[k]`` is the largest cost bucket k takes; ``widths[k]`` its padded length(s)."""

    edges: np.ndarray  # int64[K], ascending
    widths: np.ndarray  # int64[K] (1-D) or int64[K, 2] (pairs: source, target)
    batch_sizes: np.ndarray  # int64[K]
    efficiency: float = 0.0  # real / padded tokens, every sample padded to its shape (partial batches aside)
    share: np.ndarray = field(default_factory=lambda: np.zeros(0))  # fraction of samples per shape
    max_tokens: int = 0

    @property
    def num_shapes(self) -> int:
        return len(self.edges)

    @property
    def pairs(self) -> bool:
        return self.widths.ndim == 2

    @property
    def shapes(self) -> list[tuple]:
        if self.pairs:
            return [(int(b), int(w[0]), int(w[1])) for b, w in zip(self.batch_sizes, self.widths)]
        return [(int(b), int(w)) for b, w in zip(self.batch_sizes, self.widths)]

    def bucket(self, cost) -> np.ndarray:
        """Shape index of samples of the given cost (``max(src, tgt)`` for pairs); -1 beyond the largest shape."""
        k = np.searchsorted(self.edges, np.asarray(cost), side="left")
        return np.where(k < len(self.edges), k, -1)

    def describe(self) -> str:
        head = "shape  batch x src x tgt" if self.pairs else "shape  batch x length"
        lines = [f"{head}   tokens/batch   share of samples"]
        for i, (shape, s) in enumerate(zip(self.shapes, self.share)):
            dims = " x ".join(str(x) for x in shape)
            lines.append(f"{i:>5}  {dims:<18} {shape[0] * max(shape[1:]):>12,}   {s:>8.1%}")
        lines.append(f"expected padding efficiency {self.efficiency:.1%} (real / padded tokens per sample)")
        return "\n".join(lines)


def _batch_sizes(longest: np.ndarray, max_tokens: int, multiple: int, max_sentences: int | None) -> np.ndarray:
    b = np.maximum(max_tokens // np.maximum(longest, 1), 1)
    if max_sentences:
        b = np.minimum(b, max_sentences)
    rounded = b - b % multiple
    return np.where(b >= multiple, rounded, b).astype(np.int64)


def _histogram(lengths: np.ndarray, weights: np.ndarray | None):
    """Distinct costs, and per cost: sample weight, real tokens, longest source and target."""
    lengths = np.asarray(lengths)
    pairs = lengths.ndim == 2
    cost = lengths.max(axis=1) if pairs else lengths
    w = np.ones(len(cost)) if weights is None else np.asarray(weights, dtype=np.float64)
    values, inverse = np.unique(cost, return_inverse=True)
    count = np.bincount(inverse, weights=w, minlength=len(values))
    real = np.bincount(inverse, weights=w * (lengths.sum(axis=1) if pairs else lengths), minlength=len(values))
    if pairs:
        mx = np.zeros((len(values), 2), dtype=np.int64)
        np.maximum.at(mx, inverse, lengths.astype(np.int64))
    else:
        mx = values.astype(np.int64)[:, None]
    return values.astype(np.int64), count, real, mx


def plan_shapes(lengths, num_shapes: int, max_tokens: int, multiple: int = 8, max_sentences: int | None = None,
                weights=None) -> ShapePlan:
    """The padding-optimal plan of at most ``num_shapes`` shapes for these lengths.

    ``lengths``: int[N] (single sequences) or int[N, 2] (source, target lengths). ``weights``: optional per-sample
    weights (e.g. a corpus's sampling rate), so the plan fits the mixture the loader will actually draw.

    >>> plan = plan_shapes(np.array([3, 4, 4, 9, 10, 30]), 2, max_tokens=64, multiple=1)
    >>> plan.shapes, round(plan.efficiency, 3)
    ([(6, 10), (2, 30)], 0.75)
    """
    if num_shapes < 1:
        raise ValueError(f"num_shapes must be >= 1, got {num_shapes}")
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        raise ValueError("no lengths to plan shapes for")
    if (lengths < 1).any():
        raise ValueError("lengths must be >= 1")
    values, count, real, mx = _histogram(lengths, weights)
    if values[-1] > max_tokens:
        raise ValueError(f"a sample of {int(values[-1])} tokens does not fit max_tokens={max_tokens}")
    u = len(values)
    k_max = min(num_shapes, u)
    csum = np.concatenate([[0.0], np.cumsum(count)])
    # best[k, b]: least padded tokens covering costs 0..b with k+1 buckets, the last one ending at b.
    # Bucket a+1..b holds csum[b+1]-csum[a+1] samples padded to the widest source and target among them.
    best = np.full((k_max, u), np.inf)
    choice = np.full((k_max, u), -1, dtype=np.int64)
    for b in range(u):
        widths_to_b = np.maximum.accumulate(mx[b::-1], axis=0)[::-1].sum(axis=1)  # bucket a..b, a = 0..b
        best[0, b] = csum[b + 1] * widths_to_b[0]
        if b == 0:
            continue
        a = np.arange(b)  # the previous bucket ends at a; this one spans a+1..b
        seg = (csum[b + 1] - csum[a + 1]) * widths_to_b[1:]
        for k in range(1, k_max):
            cand = best[k - 1, :b] + seg
            i = int(np.argmin(cand))
            best[k, b], choice[k, b] = cand[i], i
    k = int(np.argmin(best[:, u - 1]))  # more shapes never pad more; ties keep the fewer
    ends = []
    b = u - 1
    while k >= 0:
        ends.append(b)
        b = int(choice[k, b])
        k -= 1
    ends = ends[::-1]
    starts = [0] + [e + 1 for e in ends[:-1]]
    edges = values[ends]
    widths = np.array([np.max(mx[s:e + 1], axis=0) for s, e in zip(starts, ends)], dtype=np.int64)
    share = np.array([count[s:e + 1].sum() for s, e in zip(starts, ends)]) / count.sum()
    padded = sum(count[s:e + 1].sum() * w.sum() for s, e, w in zip(starts, ends, widths))
    if lengths.ndim == 1:
        widths = widths[:, 0]
    longest = widths if widths.ndim == 1 else widths.max(axis=1)
    return ShapePlan(edges.astype(np.int64), widths, _batch_sizes(longest, max_tokens, multiple, max_sentences),
                     float(real.sum() / padded), share, max_tokens)


def shapes_from_widths(widths, lengths, max_tokens: int, multiple: int = 8, max_sentences: int | None = None,
                       batch_sizes=None) -> ShapePlan:
    """A plan from given widths (``[L, ...]`` or ``[(L_src, L_tgt), ...]``), e.g. an explicit config."""
    widths = np.asarray(widths, dtype=np.int64)
    pairs = widths.ndim == 2
    order = np.argsort(widths.max(axis=1) if pairs else widths, kind="stable")
    widths = widths[order]
    longest = widths.max(axis=1) if pairs else widths
    if batch_sizes is None:
        bs = _batch_sizes(longest, max_tokens, multiple, max_sentences)
    else:
        bs = np.asarray(batch_sizes, dtype=np.int64)[order]
        over = bs * longest > max_tokens
        if over.any():
            k = int(np.argmax(over))
            raise ValueError(f"shape {tuple(int(x) for x in np.atleast_1d(widths[k]))} with batch {int(bs[k])} "
                             f"exceeds max_tokens={max_tokens}")
    plan = ShapePlan(longest.copy(), widths, bs, max_tokens=max_tokens)
    return evaluate(plan, lengths)


def evaluate(plan: ShapePlan, lengths, weights=None) -> ShapePlan:
    """Fill in ``efficiency`` and ``share`` of ``plan`` for these lengths (samples that fit no shape: error)."""
    lengths = np.asarray(lengths)
    pairs = lengths.ndim == 2
    w = np.ones(len(lengths)) if weights is None else np.asarray(weights, np.float64)
    if pairs:
        fits = (lengths[:, None, 0] <= plan.widths[None, :, 0]) & (lengths[:, None, 1] <= plan.widths[None, :, 1])
        k = np.where(fits.any(axis=1), fits.argmax(axis=1), -1)
    else:
        k = plan.bucket(lengths)
    if (k < 0).any():
        raise ValueError(f"{int((k < 0).sum())} samples fit none of the shapes (longest {int(lengths.max())})")
    width = plan.widths[k].sum(axis=1) if pairs else plan.widths[k]
    real = (lengths.sum(axis=1) if pairs else lengths) * w
    plan.efficiency = float(real.sum() / (width * w).sum())
    plan.share = np.bincount(k, weights=w, minlength=plan.num_shapes) / w.sum()
    return plan


# -------------------------------------------------------------------------------- the usual alternatives
def percentile_edges(lengths, num_shapes: int) -> np.ndarray:
    """fairseq's ``get_buckets``: unique lower percentiles at ``linspace(0, 100, K + 1)[1:]``."""
    return np.unique(np.percentile(np.asarray(lengths), np.linspace(0, 100, num_shapes + 1), method="lower")[1:])


def equal_mass_edges(lengths, num_shapes: int) -> np.ndarray:
    """Lhotse's ``estimate_duration_buckets``: a new bucket each time the running token sum passes total / K."""
    s = np.sort(np.asarray(lengths))
    per = s.sum() / num_shapes
    run = np.cumsum(s)
    cuts = np.searchsorted(run, per * np.arange(1, num_shapes), side="right")
    edges = np.unique(s[np.minimum(cuts, len(s) - 1)])
    return np.unique(np.concatenate([edges, [s[-1]]]))


def edges_efficiency(lengths, edges) -> float:
    """Real / padded tokens when each sample is padded up to the first edge >= its length."""
    lengths = np.asarray(lengths)
    edges = np.unique(np.concatenate([np.asarray(edges), [lengths.max()]]))
    return float(lengths.sum() / edges[np.searchsorted(edges, lengths)].sum())
