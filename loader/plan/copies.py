"""Copies of one sample in one batch: spread over batches of the same window (``batching.spread_copies``).

An up-sampled corpus is drawn several times per epoch (a 250-pair direction at temperature 5: ~34 times), and
its copies have the same lengths, so the length sort puts them side by side: on the demo corpus, half of all
rows repeated another row of their own batch. fairseq does the same. It makes a batch less diverse and puts a
small corpus's gradient into few steps. With ``spread_copies`` (the default for training), each window's batches
are rearranged so that a sample's copies go to different batches:

* static shapes: within the batches of one shape, the samples are dealt out so that copies land in different
  batches. Every batch keeps its shape and its row count: padding does not change at all;
* dynamic batches: the window is cut again (:func:`deferred_cut`, compiled in ``_plan_copies.c``) walking the
  length order as the plain cut does, but a sample whose row its batch already holds waits for the next batch
  that does not hold it and whose widths (the plain cut's there) hold it, so it widens nothing; each batch takes
  the waiting samples first, one per row. Copies thus go to the nearest batches after their own, at the price of
  the padding of a short row in a longer batch. ``batching.max_repeats`` (default 4% of a window's rows) spends a
  few repeats where that price is highest: the copies that waited for the widest batches stay with their row's
  first sample, and the window is cut again;
* packed rows and ``compat="fairseq"`` keep their order.

Measured (``benchmarks/bench_copies.py``, temperature 5, max_tokens 4096): on a newcomer-like mixture of six
directions from 50,000 to 100 pairs, repeats fall from 45% of rows to 4.5% for 0.975x the plain padding
efficiency with the epoch as one window, and to 4.1-4.3% for 0.98x with windows of 4,000 or 20,000 samples. On
the demo corpus planned as one window (a 121-row direction served 35 times in 155 batches) 57% -> 4.3% costs
0.955x: each of those rows needs 35 batches whose widths hold it, and the benchmark's estimate of the best any
placement could do there is 0.950x with no repeats and 0.975x with 5%. Tried and not kept: moving the k-th copy
to the k-th later batch and cutting again (the previous placement: 0.926x at 4.3% on the demo's epoch); sending
every copy to the cheapest batches that hold it and filling around them (0.90-0.94x: the other samples drift
against the copies' batches and widen them); a waiting sample joining any batch whatever its widths (0.948x).

Everything is a pure function of the window's samples, so resume, the ledger and ``trace`` stay exact.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.errors import UsageError


def identities(comp: np.ndarray, local: np.ndarray) -> np.ndarray:
    """One int64 per sample naming the row it reads (its component and row there)."""
    return comp.astype(np.int64) << 40 | local.astype(np.int64)


def copy_rank(ident: np.ndarray) -> np.ndarray:
    """Per sample: how many samples before it (in plan order) read the same row (0: its first appearance)."""
    n = len(ident)
    order = np.argsort(ident, kind="stable")
    sorted_ids = ident[order]
    first = np.ones(n, bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    starts = np.flatnonzero(first)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - starts[np.cumsum(first) - 1]
    return rank


def _batches(ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, sizes, batch)``: each batch's first sample and size, and each sample's batch (plan order)."""
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    sizes = ends - starts
    return starts, sizes, np.repeat(np.arange(len(ends), dtype=np.int64), sizes)


def repeats(ident: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per sample (plan order), whether another sample of its batch reads the same row."""
    n = len(ident)
    batch = _batches(ends)[2]
    order = np.lexsort((ident, batch))
    b, i = batch[order], ident[order]
    same = (b[1:] == b[:-1]) & (i[1:] == i[:-1])
    hit = np.zeros(n, bool)
    hit[1:] |= same
    hit[:-1] |= same
    out = np.zeros(n, bool)
    out[order] = hit
    return out


def deal(ident: np.ndarray, ends: np.ndarray, shape: np.ndarray, candidates: np.ndarray | None = None
         ) -> np.ndarray | None:
    """Static shapes: a new order of the samples (indices into the plan order) in which, within every run of
    consecutive batches of one shape, the samples are dealt out batch by batch in order of the row they read,
    so that a row's copies go to different batches (as long as the run has as many batches as copies). Each
    batch keeps its shape and row count. ``candidates``: the samples that may repeat; None (nothing moves) when
    none of them does."""
    n = len(ident)
    movable = np.ones(n, bool) if candidates is None else candidates
    if n < 2 or not movable.any() or not (copy_rank(ident[movable]) > 0).any():
        return None
    starts, sizes, batch = _batches(ends)
    group = np.concatenate([[0], np.cumsum(shape[1:] != shape[:-1])])[batch]
    slot = np.arange(n) - starts[batch]
    spread = (slot + 0.5) / sizes[batch]  # the slots of a run in interleaved order: batch after batch
    slots = np.lexsort((batch, spread, group))
    samples = np.lexsort((np.arange(n), ident, group))
    order = np.empty(n, np.int64)
    order[slots] = samples
    return order


def deferred_cut(row: np.ndarray, cost: np.ndarray, nrows: int, max_tokens: int, max_sentences: int,
                 multiple: int, src: np.ndarray | None = None, tgt: np.ndarray | None = None,
                 lim_src: np.ndarray | None = None, lim_tgt: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Batches over samples in plan order (costs never decreasing, each in [1, max_tokens]) in which no row is
    twice: ``(order, ends)``. ``row``: per sample, a dense id in ``[0, nrows)`` (samples that may share a batch
    have ids of their own). Each batch takes first the samples the batch before gave back (to keep a multiple of
    ``multiple`` rows), then one waiting sample of each row that waits, oldest first, then the next samples in
    order, as many as ``max_tokens`` (batch size x its longest cost) and ``max_sentences`` allow; a sample whose
    row the batch already holds waits for the next batch that does not. A waiting sample joins a batch only if
    its lengths ``src``/``tgt`` are within ``lim_src``/``lim_tgt`` at the sample the batch starts from (the
    widths the plain cut has there: it widens nothing). Once every sample has been reached, the ones still
    waiting fill batches as they fit, rows and all (they have no later batch to go to). The compiled kernel
    gives the same arrays."""
    n = len(row)
    row = np.ascontiguousarray(row, dtype=np.int64)
    cost = np.ascontiguousarray(cost, dtype=np.int64)
    unlimited = np.full(n, LARGE, np.int64)
    src, tgt = (np.zeros(n, np.int64) if x is None else np.ascontiguousarray(x, dtype=np.int64) for x in (src, tgt))
    lim_src, lim_tgt = (unlimited if x is None else np.ascontiguousarray(x, dtype=np.int64) for x in (lim_src, lim_tgt))
    cap = int(max_sentences) or max(n, 1)
    args = (row, cost, src, tgt, lim_src, lim_tgt, int(nrows), int(max_tokens), cap, int(multiple))
    got = plan_kernel.deferred_cut(*args)
    return got if got is not None else _deferred_cut(*args)


LARGE = 1 << 40  # no limit


def _deferred_cut(row, cost, src, tgt, lim_src, lim_tgt, nrows, max_tokens, cap, multiple, drain_at=None):
    """:func:`deferred_cut` in Python (the kernel's reference; used where it is not built). ``drain_at``: a list
    given gets the first batch made once every sample was reached (for tests)."""
    n = len(row)
    if n and (int(cost.min()) < 1 or int(cost.max()) > max_tokens or int(row.min()) < 0 or int(row.max()) >= nrows):
        raise UsageError(f"deferred_cut needs costs in [1, max_tokens={max_tokens}] and rows in [0, {nrows})")
    rows, costs = row.tolist(), cost.tolist()
    ss, ts, ls, lt = src.tolist(), tgt.tolist(), lim_src.tolist(), lim_tgt.tolist()
    stamp = [-1] * nrows  # the batch that last took a sample of the row
    waiting: dict[int, deque] = {}  # row -> its samples waiting, oldest first
    queue: deque = deque()  # rows with samples waiting, in the order they started waiting
    given_back: list = []
    out: list = []
    ends: list = []
    i = b = 0
    while i < n or queue or given_back:
        size = width = 0
        for x in given_back:
            out.append(x)
            stamp[rows[x]] = b
            size, width = size + 1, max(width, costs[x])
        given_back = []
        drain = i >= n
        if drain and drain_at is not None and not drain_at:
            drain_at.append(b)
        most_s, most_t = (LARGE, LARGE) if drain else (ls[i], lt[i])
        seen: list = []  # rows passed over (held already, or too wide here) or served once: back to the front
        while queue:
            r = queue[0]
            x = waiting[r][0]
            if size >= cap or (size + 1) * max(width, costs[x]) > max_tokens:
                break
            queue.popleft()
            if (stamp[r] == b and not drain) or ss[x] > most_s or ts[x] > most_t:
                seen.append(r)
                continue
            waiting[r].popleft()
            out.append(x)
            stamp[r] = b
            size, width = size + 1, max(width, costs[x])
            if waiting[r]:
                if drain:
                    queue.appendleft(r)  # the same row again while it fits
                else:
                    seen.append(r)
            else:
                del waiting[r]
        queue.extendleft(reversed(seen))
        while i < n and size < cap:
            r = rows[i]
            if stamp[r] == b:
                if r not in waiting:
                    waiting[r] = deque()
                    queue.append(r)
                waiting[r].append(i)
                i += 1
                continue
            if (size + 1) * max(width, costs[i]) > max_tokens:
                break
            out.append(i)
            stamp[r] = b
            size, width = size + 1, max(width, costs[i])
            i += 1
        if size >= multiple and size % multiple:
            k = size % multiple
            given_back = out[-k:]
            del out[-k:]
        ends.append(len(out))
        b += 1
    return np.asarray(out, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def spread(ident: np.ndarray, src: np.ndarray, tgt: np.ndarray, ends: np.ndarray, max_tokens: int,
           max_sentences: int, multiple: int, candidates: np.ndarray | None = None, max_repeats: float = 0.0
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """Dynamic batches: ``(order, ends)``, the window's samples (indices into the plan order) cut again so that
    no batch holds a row twice (:func:`deferred_cut`), or None when no row has copies. ``ends``: the plain cut.
    A row with more copies than the plain cut has batches wide enough for it keeps the excess together (no
    placement can part them). ``max_repeats``: a share of the window's rows that may still repeat a row of their
    batch, spent on the copies that traveled to the widest batches (each kept with its row's first sample: the
    first so kept makes two rows repeat, each later one more); the cut is then made again with them."""
    n = len(ident)
    key = ident if candidates is None else np.where(candidates, ident, -1 - np.arange(n, dtype=np.int64))
    by_row = np.argsort(key, kind="stable")  # one sort gives each sample its row, copy rank and row's first sample
    ordered = key[by_row]
    starts_row = np.ones(n, bool)
    starts_row[1:] = ordered[1:] != ordered[:-1]
    row = np.empty(n, np.int64)
    row[by_row] = np.cumsum(starts_row) - 1
    firsts = by_row[starts_row]  # per row: its first sample (plan order)
    rank = np.empty(n, np.int64)
    rank[by_row] = np.arange(n) - np.flatnonzero(starts_row)[row[by_row]]
    if not (rank > 0).any():
        return None
    src, tgt = src.astype(np.int64), tgt.astype(np.int64)
    cost = np.maximum(src, tgt)
    starts, _, plain = _batches(ends)
    widths = np.maximum.reduceat(cost, starts)  # never decreasing, as the costs
    free = rank >= np.maximum(len(widths) - np.searchsorted(widths, cost, side="left"), 1)
    limits = (src, tgt, np.maximum.reduceat(src, starts)[plain], np.maximum.reduceat(tgt, starts)[plain])
    args = (cost, max_tokens, max_sentences, multiple, limits)
    order, cut = _cut(row, len(firsts), free, *args)
    budget = int(max_repeats * n)
    if budget <= 0:
        return order, cut
    b_starts, _, b_of = _batches(cut)
    padded = np.maximum.reduceat(src[order], b_starts) + np.maximum.reduceat(tgt[order], b_starts)
    batch = np.empty(n, np.int64)
    batch[order] = b_of
    copies = np.flatnonzero((rank > 0) & ~free)
    extra = padded[batch[copies]] - padded[batch[firsts[row[copies]]]]
    by = np.argsort(-extra, kind="stable")
    by = by[extra[by] > 0]
    opened = np.zeros(len(by), bool)  # the first copy of a row kept: two rows repeat; each later one: one more
    opened[np.unique(row[copies[by]], return_index=True)[1]] = True
    free[copies[by[np.cumsum(1 + opened) <= budget]]] = True
    return _cut(row, len(firsts), free, *args)


def _cut(row, nrows, free, cost, max_tokens, max_sentences, multiple, limits):
    """:func:`deferred_cut` over ``row`` (dense ids, plan order), the ``free`` samples each a row of its own."""
    rows = row.copy()
    k = int(free.sum())
    rows[free] = nrows + np.arange(k, dtype=np.int64)
    return deferred_cut(rows, cost, nrows + k, max_tokens, max_sentences, multiple, *limits)
