"""Copies of one sample in one batch: spread over batches of the same window (``batching.spread_copies``).

An up-sampled corpus is drawn several times per epoch (a 250-pair direction at temperature 5: ~34 times), and
its copies have the same lengths, so the length sort puts them side by side: on the demo corpus, half of all
rows repeated another row of their own batch. fairseq does the same. It makes a batch less diverse and puts a
small corpus's gradient into few steps. With ``spread_copies`` (the default for training), each window's batches
are rearranged so that a sample's copies go to different batches:

* static shapes: within the batches of one shape, the samples are dealt out so that copies land in different
  batches. Every batch keeps its shape and its row count: padding does not change at all;
* dynamic batches: the k-th copy of a sample moves to the k-th later batch whose longest source and target
  already hold it (so it widens nothing), and the window is cut again with the same token budget. On the demo
  corpus planned as one window, repeats fall from 57% to 4.3% of rows for 0.926x the padding efficiency; with
  windows of 4,000 samples 1.1% for 0.953x (``benchmarks/bench_copies.py`` prints the curve, and an estimate
  of the best any placement could do: 0.950x with no repeats on that epoch);
* packed rows and ``compat="fairseq"`` keep their order.

What dynamic batches pay is the price of the distinct batches themselves: on the demo's epoch the smallest
direction's rows are each served ~35 times, and each needs ~35 batches whose widths hold it, so most copies sit
among longer rows. Variants tried on the demo's whole epoch were worse or no better (not kept): leaving the
costliest copies together (0.940x for 6.1% repeats on the demo); sending every copy of a row to the cheapest
batches that hold it and filling around them (no repeats, but 0.90-0.94x: the other samples' order drifts
against the copies' batches and widens them).

Everything is a pure function of the window's samples, so resume, the ledger and ``trace`` stay exact.
"""

from __future__ import annotations

import numpy as np


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


def _fitting_batches(b, k, s, t, src, tgt, starts, last) -> np.ndarray:
    """Per copy (its batch ``b``, copy rank ``k``, lengths ``s``, ``t``): the ``k``-th batch after ``b`` whose
    longest source and target already hold it (so it widens nothing), or, where there are fewer than ``k`` such
    batches, ``b + k`` (at most the last batch)."""
    width_s = np.maximum.reduceat(src, starts).astype(np.int64)
    width_t = np.maximum.reduceat(tgt, starts).astype(np.int64)
    nb = len(width_s)
    out = np.minimum(b + k, last)
    pair = s.astype(np.int64) << 20 | t.astype(np.int64)
    pairs, which = np.unique(pair, return_inverse=True)
    step = max(1, (1 << 21) // max(nb, 1))  # pairs at a time: a [pairs, batches] mask of ~2M entries
    for lo in range(0, len(pairs), step):
        block = pairs[lo:lo + step]
        fits = (width_s[None, :] >= (block >> 20)[:, None]) & (width_t[None, :] >= (block & 0xFFFFF)[:, None])
        flat = np.flatnonzero(fits.ravel())  # row-major: (pair, batch) as pair * nb + batch, in order
        sel = np.flatnonzero((which >= lo) & (which < lo + len(block)))
        row = which[sel] - lo
        row_end = np.searchsorted(flat, (row + 1) * nb)
        at = np.searchsorted(flat, row * nb + b[sel], side="right") + k[sel] - 1  # the k-th fitting batch after b
        ok = at < row_end
        out[sel[ok]] = flat[at[ok]] - row[ok] * nb
    return out


def push(ident: np.ndarray, src: np.ndarray, tgt: np.ndarray, ends: np.ndarray, candidates: np.ndarray | None = None
         ) -> np.ndarray | None:
    """Dynamic batches: a new order of the samples (indices into the plan order, whose costs never decrease)
    in which the k-th copy of a row (k >= 1, counting in plan order) moves to the k-th later batch that holds it
    without widening (``_fitting_batches``), at the same relative place in it; the others keep their order. Cut it
    again with the running maximum of the costs (a copy is shorter than the samples it joins): no batch exceeds
    the token budget. None when nothing moves."""
    n = len(ident)
    rank = np.zeros(n, np.int64)
    look = np.arange(n) if candidates is None else np.flatnonzero(candidates)
    if len(look) > 1:
        rank[look] = copy_rank(ident[look])
    moved = np.flatnonzero(rank > 0)
    if not len(moved):
        return None
    starts, sizes, batch = _batches(ends)
    b = batch[moved]
    target = _fitting_batches(b, rank[moved], src[moved], tgt[moved], src, tgt, starts, len(ends) - 1)
    place = starts[target] + (moved - starts[b]) / sizes[b] * sizes[target]
    o = np.argsort(place, kind="stable")
    moved, place = moved[o], place[o]
    stay = np.flatnonzero(rank == 0)
    at = np.searchsorted(stay, place, side="right") + np.arange(len(moved))  # merged: copies among the others
    order = np.empty(n, np.int64)
    taken = np.zeros(n, bool)
    taken[at] = True
    order[at] = moved
    order[~taken] = stay
    return order
