"""Static shapes for (source, target) pairs: K boxes ``(B, L_src, L_tgt)`` over the 2-D length histogram.

Grouping pairs by ``max(src, tgt)`` cannot tell (short source, long target) from (long source, short target):
50 x (10, 100) + 50 x (100, 10) in 2 shapes pads both to (100, 100), 55% real tokens, where boxes (10, 100) and
(100, 10) hold them with no padding. Choosing K boxes over a 2-D histogram is NP-hard in general; this is a
local search that is exact in its evaluation and never worse than the max(src, tgt) plan it starts from:

1. A weighted ``bincount`` of ``src * T + tgt`` (O(n), one pass in blocks) gives the occupied cells. Beyond
   2^22 cells (lengths over about 2048) lengths are binned by a power of two first, widths rounded up to the bin.
2. The max(src, tgt) plan (the exact programme of :func:`babelfeed.plan.shapes.dp_plan` on the cells).
3. Candidate widths per side ("levels"): every occupied length if at most ``LEVELS``, else weighted quantiles
   and evenly spaced lengths, plus the max plan's widths and the longest. Cells merge onto this coarse grid;
   as box widths are levels, the coarse grid prices any set of boxes exactly.
4. From the max plan (filled up to K boxes) and from a greedy build (the one box holding everything, then the
   best box added, K - 1 times): replace each box in turn by the best box anywhere on the grid, until no
   replacement lowers the cost. For one slot, every candidate box (a, b) is priced at once: with the other
   boxes fixed, each cell's current owner is known, the samples box (a, b) takes from owner m are a 2-D prefix
   sum of m's cells (those of m cost more per sample than the candidate), and the cost of the plan with the
   candidate follows in closed form, masked rows and batch sizes included (O(K^2 G^2) per slot). Only boxes
   reaching every cell the others leave loose are priced, and prefix sums are taken only of the boxes some
   candidate undercuts.
"""

from __future__ import annotations

import numpy as np

from babelfeed.plan.shape_dp import dp_plan, padded_rows

GRID_CELLS = 1 << 22  # fine histogram cells at most; beyond, lengths are binned by a power of two
LEVELS = 64  # candidate widths per side for the box search (256 gains < 0.1 point of fill, at 10x the time)
MAX_SWEEPS = 25
CHUNK = 1 << 16  # rows per block of the histogram pass


def pair_cells(lengths: np.ndarray, weights, longest: int):
    """Occupied cells of the (source, target) histogram: their lengths int[C, 2] and weights float[C], and
    whether they are the samples' own lengths (not binned). ``longest``: the longest length of either side.

    One pass over the samples, a block of rows at a time, so each block's keys ``src * T + tgt`` are counted
    while in cache. Up to ``longest`` 2046 the histogram is square and each side's longest is read off it;
    beyond, the columns are reduced and lengths binned through per-side lookup tables."""
    longest = int(longest)
    if (longest + 2) ** 2 <= GRID_CELLS:
        n1 = longest + 1
        count, occupied = _histogram(lengths, n1, n1, None, weights)
        rows, cols = occupied.reshape(n1, n1).any(axis=1), occupied.reshape(n1, n1).any(axis=0)
        tops, q = (int(np.flatnonzero(rows)[-1]), int(np.flatnonzero(cols)[-1])), 1
        nt = n1
    else:
        tops = (int(lengths[:, 0].max()), int(lengths[:, 1].max()))
        q = 1
        while (tops[0] // q + 2) * (tops[1] // q + 2) > GRID_CELLS:
            q *= 2
        ns, nt = -(-tops[0] // q) + 1, -(-tops[1] // q) + 1
        luts = None if q == 1 else (-(-np.arange(tops[0] + 1) // q) * nt, -(-np.arange(tops[1] + 1) // q))
        count, occupied = _histogram(lengths, ns, nt, luts, weights)
    cells = np.flatnonzero(occupied)
    cs, ct = np.divmod(cells, nt)
    if q > 1:
        cs, ct = np.minimum(cs * q, tops[0]), np.minimum(ct * q, tops[1])
    return np.stack([cs, ct], axis=1).astype(np.int64), count[cells], q == 1


def _histogram(lengths, ns: int, nt: int, luts, weights):
    """Weights (float64, summed in sample order) and occupancy of the ns x nt cells ``(s, t)``, flat; ``luts``:
    per-side tables mapping a length to its binned key part (the source's times nt), else the lengths as they are."""
    size, n = ns * nt, len(lengths)
    block = max(CHUNK, size)  # adding up a block's counts costs ``size``: no more than counting the block
    hist = np.zeros(size, dtype=np.int64)
    keys = np.empty(min(block, n) if weights is None else n, dtype=np.int64)
    part = np.empty(min(block, n), dtype=np.int64) if luts is not None else None
    for i in range(0, n, block):
        b = lengths[i:i + block]
        k = keys[:len(b)] if weights is None else keys[i:i + len(b)]
        if luts is None:
            np.multiply(b[:, 0], nt, out=k, dtype=np.int64)
            k += b[:, 1]
        else:
            np.take(luts[0], b[:, 0], out=k, mode="clip")
            k += np.take(luts[1], b[:, 1], out=part[:len(b)], mode="clip")
        if weights is None:
            hist += np.bincount(k, minlength=size)
    if weights is None:
        return hist.astype(np.float64), hist > 0
    count = np.bincount(keys, weights=weights, minlength=size)
    occupied = count > 0  # a cell of positive weights only has a positive sum; the others are counted
    other = ~(weights > 0)
    if other.any():
        occupied |= np.bincount(keys[other], minlength=size) > 0
    return count, occupied


def max_plan(cells, count, num_shapes: int, sizes, windows: int) -> np.ndarray:
    """The previous planner: the exact programme over max(src, tgt); a bucket pads to its longest of each side."""
    cost = cells.max(axis=1)
    top = int(cost.max())
    per_cost = np.bincount(cost, weights=count, minlength=top + 1)
    values = np.flatnonzero(np.bincount(cost, minlength=top + 1))
    mx = np.zeros((top + 1, 2), dtype=np.int64)
    np.maximum.at(mx, cost, cells)  # cells, not samples: at most GRID_CELLS
    mx = mx[values]
    buckets = dp_plan(values, per_cost[values], mx, sizes(values), windows, num_shapes)
    return np.array([mx[a:b + 1].max(axis=0) for a, b in buckets], dtype=np.int64)


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


class _Grid:
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
        self._i, self._j = np.indices(self.hist.shape)
        self._best = {}

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
        """The box that, added to ``others``, gives the cheapest plan (every occupied cell held); remembered."""
        key = tuple(others)
        if key not in self._best:
            self._best[key] = self._best_box(others)
        return self._best[key]

    def _best_box(self, others) -> tuple[int, int]:
        owner = self.owner(others)
        m = len(others)
        split = np.zeros((m + 1,) + self.hist.shape)  # split[o + 1]: the weight of the cells box o owns
        split[owner + 1, self._i, self._j] = self.hist
        # o's weight: rows, then columns, as its prefix sums add them (a sum over a slow axis is sequential)
        held = split.sum(axis=1).cumsum(axis=1)[:, -1]
        loose = np.argwhere(self.occ & (owner < 0))
        a0, b0 = loose.max(axis=0) if len(loose) else (0, 0)  # a box must reach every loose cell: price those only
        cost, rows = self.cost[a0:, b0:], self.rows[a0:, b0:]
        c = np.array([self.cost[a, b] for a, b in others], dtype=np.float64)
        takes = np.flatnonzero(np.append(True, c > cost[0, 0]))  # 0 (loose) and boxes a candidate can undercut
        prefix = split[takes].cumsum(axis=1)[:, a0:].cumsum(axis=2)[:, :, b0:]  # weight inside box (a, b)
        new = prefix[0].copy()
        total = np.zeros(cost.shape)
        plane = dict(zip((takes[1:] - 1).tolist(), range(1, len(takes))))
        for o, (a, b) in enumerate(others):  # summed box by box, in order (weights round as they always did)
            size = self.rows[a, b]
            if o in plane:
                moved = np.where(c[o] > cost, prefix[plane[o]], 0.0)  # cheaper per sample: the samples move
                new += moved
                total += padded_rows(held[o + 1] - moved, size, self.windows) * c[o]
            else:  # costs no more per sample than any candidate: keeps its samples
                total += padded_rows(held[o + 1], size, self.windows) * c[o]
        total += padded_rows(new, rows, self.windows) * cost
        k = int(np.argmin(total))  # the first least in row order, as over the whole grid with the rest at inf
        if total.flat[k] == np.inf:
            return 0, 0
        a, b = np.unravel_index(k, total.shape)
        return int(a) + int(a0), int(b) + int(b0)

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
                box = self.best_box(others)
                if box == boxes[k]:  # the same boxes in another order: no change beyond rounding, not taken
                    continue
                trial = others + [box]
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


def plan_pairs(lengths, longest: int, weights, num_shapes: int, sizes, windows: int, method: str):
    """Box widths int[K, 2] for these pairs, the histogram cells and weights the plan is priced on, and whether
    the cells are the samples' own lengths."""
    cells, count, exact = pair_cells(lengths, weights, longest)
    start = max_plan(cells, count, num_shapes, sizes, windows)
    if method == "max":
        return start, cells, count, exact
    grid = _Grid(cells, count, start, sizes, windows)
    first = grid.index(start)
    best, cost = first, grid.total(first)
    for boxes in (first, []):
        found, found_cost = grid.search(boxes, num_shapes)
        if found_cost < cost:
            best, cost = found, found_cost
    return grid.widths(grid.prune(best)), cells, count, exact
