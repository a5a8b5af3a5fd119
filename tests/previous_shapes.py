"""Frozen copies of the previous static-shape code (loader/shape_boxes.py and loader/shapes.py as of commit
589dbcb), for tests/plan/test_shape_speed.py: the faster code must give exactly what these gave.

``previous_pair_cells``: one bincount over a whole int64 key array; ``previous_assign``: three whole-array
gathers; ``PreviousGrid``: the box search, one loop over the other boxes per candidate slot.
"""

import numpy as np

from babelfeed.plan.shape_boxes import GRID_CELLS, LEVELS, MAX_SWEEPS
from babelfeed.plan.shapes import padded_rows


def previous_pair_cells(lengths, tops, weights):
    s, t = lengths[:, 0], lengths[:, 1]
    top_s, top_t = int(tops[0]), int(tops[1])
    q = 1
    while (top_s // q + 2) * (top_t // q + 2) > GRID_CELLS:
        q *= 2
    if q > 1:
        s, t = -(-s // q), -(-t // q)
    ns, nt = -(-top_s // q) + 1, -(-top_t // q) + 1
    key = np.multiply(s, nt, dtype=np.int64)
    key += t
    count = np.bincount(key, weights=weights, minlength=ns * nt).astype(np.float64)
    occupied = count > 0 if weights is None else np.bincount(key, minlength=ns * nt) > 0
    cells = np.flatnonzero(occupied)
    cs, ct = np.divmod(cells, nt)
    if q > 1:
        cs, ct = np.minimum(cs * q, top_s), np.minimum(ct * q, top_t)
    return np.stack([cs, ct], axis=1).astype(np.int64), count[cells]


def previous_assign(widths, src, tgt=None):
    widths = np.asarray(widths, dtype=np.int64)
    widths = widths[:, None] if widths.ndim == 1 else widths
    cols = [np.asarray(src)] if tgt is None else [np.asarray(src), np.asarray(tgt)]
    widths = widths[:, :len(cols)]
    luts, bounds = [], []
    for d in range(len(cols)):
        u = np.unique(widths[:, d])
        lut = np.searchsorted(u, np.arange(int(u[-1]) + 2), side="left")
        luts.append(lut.astype(np.int32))
        bounds.append(np.append(u, np.iinfo(np.int64).max))
    grids = np.meshgrid(*bounds, indexing="ij")
    fits = np.ones((len(widths),) + grids[0].shape, dtype=bool)
    for d, g in enumerate(grids):
        fits &= widths[:, d].reshape((-1,) + (1,) * len(grids)) >= g[None]
    table = np.where(fits.any(axis=0), fits.argmax(axis=0), -1).ravel()
    if len(cols) == 1:
        return np.take(table[luts[0]], cols[0], mode="clip")
    cell = np.take(luts[0] * len(bounds[1]), cols[0], mode="clip")
    cell += np.take(luts[1], cols[1], mode="clip")
    return np.take(table, cell)


def _levels(x, count, must, n: int) -> np.ndarray:
    present = np.bincount(x, minlength=int(x.max()) + 1)
    values = np.flatnonzero(present)
    if len(values) <= n:
        return values
    mass = np.cumsum(np.bincount(x, weights=count, minlength=len(present))[values])
    half = max(n // 2, 2)
    quantiles = values[np.minimum(np.searchsorted(mass, np.linspace(0, mass[-1], half)[1:]), len(values) - 1)]
    even = values[np.minimum(np.searchsorted(values, np.linspace(values[0], values[-1], half)), len(values) - 1)]
    return np.unique(np.concatenate([quantiles, even, must, values[-1:]]))


class PreviousGrid:
    """The coarse histogram the search prices boxes on; a box is a pair of level indices (a, b)."""

    def __init__(self, cells, count, must, sizes, windows: int):
        self.ls = _levels(cells[:, 0], count, must[:, 0], LEVELS)
        self.lt = _levels(cells[:, 1], count, must[:, 1], LEVELS)
        i, j = np.searchsorted(self.ls, cells[:, 0]), np.searchsorted(self.lt, cells[:, 1])
        size = len(self.ls) * len(self.lt)
        self.hist = np.bincount(i * len(self.lt) + j, weights=count, minlength=size).reshape(len(self.ls), -1)
        self.occ = np.bincount(i * len(self.lt) + j, minlength=size).reshape(len(self.ls), -1) > 0
        self.cost = (self.ls[:, None] + self.lt[None, :]).astype(np.float64)
        self.rows = sizes(np.maximum(self.ls[:, None], self.lt[None, :]))
        self.windows = windows

    def index(self, widths) -> list[tuple[int, int]]:
        return [(int(np.searchsorted(self.ls, a)), int(np.searchsorted(self.lt, b))) for a, b in widths]

    def widths(self, boxes) -> np.ndarray:
        return np.array([(self.ls[a], self.lt[b]) for a, b in boxes], dtype=np.int64).reshape(-1, 2)

    def owner(self, boxes) -> np.ndarray:
        """Per cell the box that takes it: the cheapest holding it (ties as the plan orders them); -1: none."""
        w = self.widths(boxes)
        order = np.lexsort((w[:, 0], w.max(axis=1), w.sum(axis=1))) if len(boxes) else []
        owner = np.full(self.hist.shape, -1, dtype=np.int64)
        for k in order:
            a, b = boxes[k]
            sub = owner[:a + 1, :b + 1]
            sub[sub < 0] = k
        return owner

    def total(self, boxes) -> float:
        owner = self.owner(boxes)
        if (owner[self.occ] < 0).any():
            return np.inf
        n = np.bincount(owner[self.occ], weights=self.hist[self.occ], minlength=len(boxes))
        a, b = np.array(boxes).T
        return float(padded_rows(n, self.rows[a, b], self.windows) @ self.cost[a, b])

    def best_box(self, others) -> tuple[int, int]:
        """The box that, added to ``others``, gives the cheapest plan (every occupied cell held)."""
        owner = self.owner(others)
        m = len(others)
        split = np.zeros((m + 1,) + self.hist.shape)  # split[o + 1]: the weight of the cells box o owns
        np.put_along_axis(split, (owner + 1)[None], self.hist[None], axis=0)
        prefix = split.cumsum(axis=1).cumsum(axis=2)  # prefix[o + 1, a, b]: o's weight inside box (a, b)
        loose = np.argwhere(self.occ & (owner < 0))
        feasible = np.ones(self.hist.shape, dtype=bool)
        if len(loose):
            need_a, need_b = loose.max(axis=0)
            feasible[:need_a] = False
            feasible[:, :need_b] = False
        new = prefix[0].copy()
        total = np.zeros(self.hist.shape)
        for o, (a, b) in enumerate(others):
            c, rows, held = self.cost[a, b], self.rows[a, b], prefix[o + 1, -1, -1]
            moved = np.where(c > self.cost, prefix[o + 1], 0.0)  # cheaper per sample: the samples move
            new += moved
            total += padded_rows(held - moved, rows, self.windows) * c
        total += padded_rows(new, self.rows, self.windows) * self.cost
        total[~feasible] = np.inf
        a, b = np.unravel_index(int(np.argmin(total)), total.shape)
        return int(a), int(b)

    def search(self, boxes, num_shapes: int) -> tuple[list, float]:
        boxes = list(boxes)
        current = self.total(boxes) if boxes else np.inf
        while len(boxes) < num_shapes:
            grown = boxes + [self.best_box(boxes)]
            cost = self.total(grown)
            if not cost < current:
                break
            boxes, current = grown, cost
        for _ in range(MAX_SWEEPS):
            improved = False
            for k in range(len(boxes)):
                others = boxes[:k] + boxes[k + 1:]
                trial = others + [self.best_box(others)]
                cost = self.total(trial)
                if cost < current * (1 - 1e-12):
                    boxes, current, improved = trial, cost, True
            if not improved:
                break
        return boxes, current

    def prune(self, boxes) -> list:
        """Boxes that hold some occupied cell, each once."""
        owner = self.owner(boxes)
        used = set(np.unique(owner[self.occ]).tolist())
        return [box for k, box in enumerate(boxes) if k in used]
