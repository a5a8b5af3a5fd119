"""Static batch shapes for XLA: K shapes chosen from the length histogram to minimise padding.

A shape plan is a small set of batch shapes ``(B, L)`` (one sequence per sample) or ``(B, L_src, L_tgt)``
(pairs, each shape a box), each within the token budget: ``B * max(L...) <= max_tokens``. Every batch the loader
emits then has exactly one of these shapes, so a jitted step compiles at most K times. Shapes are kept in order
of per-sample cost (``L`` or ``L_src + L_tgt``), and a sample goes to the first shape it fits, which is therefore
the cheapest one (:func:`assign`, O(n) through per-side lookup tables, no sort).

The objective is the epoch's padded tokens *including masked rows*: a shape of B rows taking n samples is served
as ``ceil(n / B)`` batches per planning window (``windows`` of them; 0: partial batches are not padded), so the
batch size, rounded down to the multiple, enters the cost. Lengths are histogrammed with ``bincount`` (O(n)).

* 1-D lengths: an exact dynamic programme over the U distinct lengths. A shape takes the lengths in ``(a, b]``
  and is as wide as its longest; ``best[k][b] = min_a best[k-1][a] + cost(a, b)``, O(K U^2) time, O(K U) memory.
  This is the optimum over every plan of at most K shapes whose widths are observed lengths (tested against
  brute force). It is compared in ``benchmarks/`` with fairseq's percentile edges (``get_buckets``) and Lhotse's
  equal-token-mass edges.
* Pairs: boxes over the 2-D (source, target) histogram (:mod:`babelfeed.plan.shape_boxes`), a local search started from
  the previous planner's answer (the same programme on ``max(src, tgt)``, ``method="max"``), so it never pads
  more than that plan; (short source, long target) and (long source, short target) get boxes of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from babelfeed.errors import ConfigError, DataError, InternalError, UsageError
from babelfeed.plan.shape_boxes import plan_pairs
from babelfeed.plan.shape_dp import dp_plan, padded_rows


@dataclass
class ShapePlan:
    """K batch shapes, cheapest first. ``edges[k]``: the longest side of shape k; ``widths[k]``: its width(s)."""

    edges: np.ndarray  # int64[K]
    widths: np.ndarray  # int64[K] (1-D) or int64[K, 2] (pairs: source, target)
    batch_sizes: np.ndarray  # int64[K]
    efficiency: float = 0.0  # real / padded tokens, every sample padded to its shape (partial batches aside)
    share: np.ndarray = field(default_factory=lambda: np.zeros(0))  # fraction of samples per shape
    max_tokens: int = 0
    padded: float = 0.0  # expected padded tokens of an epoch, masked rows included (the planner's objective)
    real: float = 0.0  # real tokens of an epoch
    windows: int = 1  # planning windows per epoch (each ends every shape with a partial batch); 0: not padded

    @property
    def num_shapes(self) -> int:
        return len(self.edges)

    @property
    def pairs(self) -> bool:
        return self.widths.ndim == 2

    @property
    def fill(self) -> float:
        """Real / padded tokens with the masked rows that complete each shape's last batch."""
        return self.real / self.padded if self.padded else 0.0

    @property
    def shapes(self) -> list[tuple]:
        if self.pairs:
            return [(int(b), int(w[0]), int(w[1])) for b, w in zip(self.batch_sizes, self.widths)]
        return [(int(b), int(w)) for b, w in zip(self.batch_sizes, self.widths)]

    def bucket(self, lengths) -> np.ndarray:
        """Shape index of each sample (int[N], or int[N, 2] for pairs): the first, i.e. cheapest, shape it fits;
        -1 where none does. A 1-D array given to a pair plan is read as ``max(src, tgt)``."""
        x = np.asarray(lengths)
        if x.ndim == 2:
            return assign(self.widths, x[:, 0], x[:, 1])
        return assign(self.widths, x, x if self.pairs else None)

    def describe(self) -> str:
        head = "shape  batch x src x tgt" if self.pairs else "shape  batch x length"
        lines = [f"{head}   tokens/batch   share of samples"]
        for i, (shape, s) in enumerate(zip(self.shapes, self.share)):
            dims = " x ".join(str(x) for x in shape)
            lines.append(f"{i:>5}  {dims:<18} {shape[0] * max(shape[1:]):>12,}   {s:>8.1%}")
        lines.append(f"expected padding efficiency {self.efficiency:.1%} (real / padded tokens per sample), "
                     f"{self.fill:.1%} with the masked rows ending each shape's batches")
        return "\n".join(lines)


def batch_sizes(longest, max_tokens: int, multiple: int, max_sentences: int | None) -> np.ndarray:
    """Rows per batch: the token budget over the longest side, rounded down to the multiple (if that leaves any)."""
    b = np.maximum(max_tokens // np.maximum(np.asarray(longest), 1), 1)
    if max_sentences:
        b = np.minimum(b, max_sentences)
    rounded = b - b % multiple
    return np.where(b >= multiple, rounded, b).astype(np.int64)


_batch_sizes = batch_sizes


ASSIGN_BLOCK = 1 << 14  # samples per block of assign()


def assign(widths, src, tgt=None) -> np.ndarray:
    """Index of the first shape (in ``widths`` order) each sample fits, -1 where none does; O(n).

    Per side, a lookup table maps a length to the first distinct width that holds it; a (K+1)^d table then maps
    those levels to the first shape holding both, 16,384 samples at a time so the three gathers work in cache.
    ``tgt=None`` checks the first width only."""
    widths = np.asarray(widths, dtype=np.int64)
    widths = widths[:, None] if widths.ndim == 1 else widths
    cols = [np.asarray(src)] if tgt is None else [np.asarray(src), np.asarray(tgt)]
    widths = widths[:, :len(cols)]
    luts, bounds = [], []
    for d in range(len(cols)):
        u = np.unique(widths[:, d])  # K values
        lut = np.searchsorted(u, np.arange(int(u[-1]) + 2), side="left")  # len(u): longer than every shape
        luts.append(lut.astype(np.int32))
        bounds.append(np.append(u, np.iinfo(np.int64).max))
    grids = np.meshgrid(*bounds, indexing="ij")
    fits = np.ones((len(widths),) + grids[0].shape, dtype=bool)
    for d, g in enumerate(grids):
        fits &= widths[:, d].reshape((-1,) + (1,) * len(grids)) >= g[None]
    table = np.where(fits.any(axis=0), fits.argmax(axis=0), -1).ravel()
    if len(cols) == 1:  # one gather: length -> shape
        return np.take(table[luts[0]], cols[0], mode="clip")
    row, col = (luts[0] * len(bounds[1])).astype(np.intp), luts[1].astype(np.intp)
    src, tgt = cols
    if src.ndim != 1 or src.shape != tgt.shape:
        cell = np.take(row, src, mode="clip")  # lengths past the table: its last entry
        cell += np.take(col, tgt, mode="clip")
        return np.take(table, cell)
    out = np.empty(len(src), dtype=table.dtype)  # a block at a time: the cells stay in cache
    cell, part = np.empty(min(len(src), ASSIGN_BLOCK), np.intp), np.empty(min(len(src), ASSIGN_BLOCK), np.intp)
    for i in range(0, len(src), ASSIGN_BLOCK):
        c = np.take(row, src[i:i + ASSIGN_BLOCK], out=cell[:len(src[i:i + ASSIGN_BLOCK])], mode="clip")
        c += np.take(col, tgt[i:i + ASSIGN_BLOCK], out=part[:len(c)], mode="clip")
        np.take(table, c, out=out[i:i + len(c)])
    return out


def _histogram_1d(lengths, weights):
    """Distinct lengths and their weights, by bincount (O(n), no sort)."""
    top = int(lengths.max())
    count = np.bincount(lengths, weights=weights, minlength=top + 1).astype(np.float64)
    present = count > 0 if weights is None else np.bincount(lengths, minlength=top + 1) > 0
    values = np.flatnonzero(present)
    return values.astype(np.int64), count[values]


def plan_shapes(lengths, num_shapes: int, max_tokens: int, multiple: int = 8, max_sentences: int | None = None,
                weights=None, windows: int = 1, method: str = "boxes") -> ShapePlan:
    """The plan of at most ``num_shapes`` shapes of least padded tokens (masked rows included) for these lengths.

    ``lengths``: int[N] (single sequences) or int[N, 2] (source, target lengths). ``weights``: optional per-sample
    weights (e.g. a corpus's sampling rate), so the plan fits the mixture the loader will actually draw.
    ``windows``: how many times per epoch each shape ends with a partial batch completed by masked rows (the
    planner's windows); 0 when partial batches are served as they are. ``method`` (pairs): ``"boxes"``, free
    (source, target) boxes; ``"max"``, the previous planner, buckets of ``max(src, tgt)``.

    >>> plan = plan_shapes(np.array([3, 4, 4, 9, 10, 30]), 2, max_tokens=64, multiple=1, windows=0)
    >>> plan.shapes, round(plan.efficiency, 3)
    ([(6, 10), (2, 30)], 0.75)
    """
    if num_shapes < 1:
        raise UsageError(f"num_shapes must be >= 1, got {num_shapes}")
    if method not in ("boxes", "max"):
        raise UsageError(f"method must be 'boxes' or 'max', got {method!r}")
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        raise UsageError("no lengths to plan shapes for")
    if lengths.ndim not in (1, 2) or (lengths.ndim == 2 and lengths.shape[1] != 2):
        raise UsageError(f"lengths must be int[N] or int[N, 2], got shape {lengths.shape}")
    if lengths.min() < 1:
        raise UsageError("lengths must be >= 1")
    longest = int(lengths.max())  # of either side: a flat reduction (over strided columns it costs 10x more)
    if longest > max_tokens:
        raise DataError(f"a sample of {longest} tokens does not fit max_tokens={max_tokens}")
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w is not None and not w.sum() > 0:
        w = None  # nothing weighs anything: plan for the samples as they are
    sizes = lambda longest: batch_sizes(longest, max_tokens, multiple, max_sentences)  # noqa: E731
    if lengths.ndim == 1:
        values, count = _histogram_1d(lengths, w)
        buckets = dp_plan(values, count, values[:, None], sizes(values), windows, num_shapes)
        widths = values[[e for _, e in buckets]]
        plan = ShapePlan(widths.copy(), widths, sizes(widths), max_tokens=max_tokens, windows=windows)
        real = float(lengths.sum() if w is None else _dot(w, lengths))
        return summarise(plan, values, None, count, real)

    widths, cells, count, exact = plan_pairs(lengths, longest, w, num_shapes, sizes, windows, method)
    if w is None and exact:  # the histogram's cells are the lengths: their tokens, summed in integers
        real = float(cells.sum(axis=1) @ count.astype(np.int64))
    else:
        real = float(lengths.sum() if w is None else _dot(w, lengths[:, 0]) + _dot(w, lengths[:, 1]))
    plan = _ordered(widths, sizes, max_tokens, windows)
    return summarise(plan, cells[:, 0], cells[:, 1], count, real)


def _dot(w, x):
    """``w @ x`` for float64 weights and integer lengths: the same sum (one BLAS dot over float64), but numpy's
    matmul casts mixed types element by element, 10-20x slower than casting the lengths first."""
    return w @ np.asarray(x).astype(np.float64)


def _ordered(widths, sizes, max_tokens: int, windows: int, batch=None) -> ShapePlan:
    """A plan of these widths, cheapest per sample first (ties: the narrower longest side, then the source)."""
    widths = np.asarray(widths, dtype=np.int64)
    pairs = widths.ndim == 2
    longest = widths.max(axis=1) if pairs else widths
    order = np.lexsort((widths[:, 0], longest, widths.sum(axis=1))) if pairs else np.argsort(widths, kind="stable")
    bs = sizes(longest[order]) if batch is None else np.asarray(batch, dtype=np.int64)[order]
    return ShapePlan(longest[order].copy(), widths[order], bs, max_tokens=max_tokens, windows=windows)


def summarise(plan: ShapePlan, src, tgt, count, real: float) -> ShapePlan:
    """Fill in share, efficiency and padded tokens of ``plan`` for samples (or histogram cells) of these lengths
    and weights ``count``; a sample that fits no shape is an error."""
    k = assign(plan.widths, src, tgt)
    if (k < 0).any():
        longest = np.maximum(src, tgt) if tgt is not None else src
        widest = plan.widths.max(axis=0).tolist() if plan.pairs else [int(plan.widths.max())]
        raise DataError(f"{int(np.count_nonzero(k < 0))} lengths fit none of the shapes (longest "
                        f"{int(np.max(longest))}; the shapes reach {' x '.join(map(str, widest))}): widen "
                        f"batching.shapes, or lower filter.max_source_positions / max_target_positions to leave "
                        f"such samples out")
    n = np.bincount(k, weights=count, minlength=plan.num_shapes)
    per_sample = plan.widths.sum(axis=1) if plan.pairs else plan.widths
    plan.real = float(real)
    plan.efficiency = float(real / max(float(n @ per_sample), 1e-300))
    plan.padded = float(padded_rows(n, plan.batch_sizes, plan.windows) @ per_sample)
    plan.share = n / max(n.sum(), 1e-300)
    return plan


def shapes_from_widths(widths, lengths, max_tokens: int, multiple: int = 8, max_sentences: int | None = None,
                       batch_sizes=None, weights=None, windows: int = 1) -> ShapePlan:
    """A plan from given widths (``[L, ...]`` or ``[(L_src, L_tgt), ...]``), e.g. an explicit config; shapes are
    put in order of per-sample cost, so that a sample's first fitting shape is its cheapest."""
    sizes = lambda longest: _batch_sizes(longest, max_tokens, multiple, max_sentences)  # noqa: E731
    plan = _ordered(widths, sizes, max_tokens, windows, batch_sizes)
    if batch_sizes is not None:
        over = plan.batch_sizes * plan.edges > max_tokens
        if over.any():
            k = int(np.argmax(over))
            raise ConfigError(f"shape {tuple(int(x) for x in np.atleast_1d(plan.widths[k]))} with batch "
                              f"{int(plan.batch_sizes[k])} exceeds max_tokens={max_tokens}")
    return evaluate(plan, lengths, weights)


def shapes_ordered(widths, max_tokens: int, multiple: int = 8, max_sentences: int | None = None) -> ShapePlan:
    """The plan of given widths as :func:`shapes_from_widths` orders them, without the statistics (no lengths
    read: ``efficiency``, ``share``, ``padded`` and ``real`` stay 0)."""
    return _ordered(widths, lambda longest: _batch_sizes(longest, max_tokens, multiple, max_sentences), max_tokens, 1)


def evaluate(plan: ShapePlan, lengths, weights=None) -> ShapePlan:
    """Fill in ``efficiency``, ``padded`` and ``share`` of ``plan`` for these lengths (a sample that fits no
    shape: error)."""
    lengths = np.asarray(lengths)
    w = np.ones(len(lengths)) if weights is None else np.asarray(weights, np.float64)
    if lengths.ndim == 2:
        real = _dot(w, lengths[:, 0]) + _dot(w, lengths[:, 1])
        return summarise(plan, lengths[:, 0], lengths[:, 1] if plan.pairs else None, w, real)
    return summarise(plan, lengths, lengths if plan.pairs else None, w, _dot(w, lengths))


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
