"""Cut a planned window's length-ordered samples into batches: dynamic, static shapes, packed, fairseq's.

Pure functions from integer arrays to integer arrays. Each returns *selections* (indices into its inputs) rather
than reordered copies, so the planner reorders its per-sample arrays once, whatever the mode.

* :func:`dynamic`: greedy token-budget batches (``batching.batch_sorted``).
* :func:`static`: every batch one of a few fixed shapes (B, L_src, L_tgt); the last batch of a shape is filled
  with masked rows.
* :func:`packed`: pairs side by side in rows of one shape (``packing.pack_pairs``), B rows per batch.
* :func:`fairseq`: ``ordered_indices``, the size filter, ``batch_by_size`` and the epoch shuffle, as fairseq.
* :func:`block_shuffle`: the served order, batches of similar cost shuffled in blocks (rank balance).
"""

from __future__ import annotations

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.plan.batching import batch_sorted, fairseq_batch_by_size, fairseq_ordered_indices
from babelfeed.plan.packing import pack_pairs
from babelfeed.plan.shapes import assign
from babelfeed.errors import DataError


def dynamic(src_len, tgt_len, max_tokens: int, max_sentences: int, multiple: int, ordered: bool = False
            ) -> np.ndarray:
    """Batch ends over samples ordered by cost: batch b = ``[ends[b-1], ends[b])``. ``ordered``: the caller ordered
    them (the planner's length order): the compiled cut compares only the costs it reads, not every pair."""
    n = len(src_len)
    if n and 1 <= max(int(src_len[0]), int(tgt_len[0])) and max(int(src_len[-1]), int(tgt_len[-1])) <= max_tokens:
        compiled = plan_kernel.batch_ends(src_len, max_tokens, max_sentences or n, multiple, tgt_len, ordered)
        if compiled is not None:  # the kernel reads both columns in place for the costs
            return compiled
    return batch_sorted(np.maximum(src_len, tgt_len), max_tokens, max_sentences or None, multiple)


def static(src_len, tgt_len, shapes, with_target: bool, on_too_long: str):
    """Group the length-ordered samples by the first shape they fit (shapes come cheapest first, so that is the
    cheapest shape holding the sample); cut each group into batches of exactly that shape's B rows, the last one
    completed with masked rows.

    Returns ``(select, ends, shape, masked, unfit)``: ``select`` the kept samples in their new order, per batch
    its end (into the selection), shape index and masked row count, and ``unfit`` the samples that fit no shape.
    """
    widths = np.array([s[1:] for s in shapes], dtype=np.int64)
    sizes = np.array([s[0] for s in shapes], dtype=np.int64)
    k = assign(widths, src_len, tgt_len if widths.shape[1] > 1 and with_target else None)
    unfit = np.flatnonzero(k < 0)
    if len(unfit) and on_too_long == "raise":
        i = int(unfit[0])
        raise DataError(f"a sample of {int(src_len[i])} source / {int(tgt_len[i])} target tokens fits none of "
                        f"the static shapes {list(shapes)}")
    keep = np.flatnonzero(k >= 0)
    select = keep[np.argsort(k[keep].astype(np.int16), kind="stable")]  # a radix sort on 16 bits: O(n)
    counts = np.bincount(k[select], minlength=len(sizes))
    ends, shape, masked = [], [], []
    start = 0
    for s_idx, n in enumerate(counts.tolist()):
        b = int(sizes[s_idx])
        for first in range(0, n, b):
            real = min(b, n - first)
            ends.append(start + first + real)
            shape.append(s_idx)
            masked.append(b - real)
        start += n
    return (select, np.asarray(ends, np.int64), np.asarray(shape, np.int64), np.asarray(masked, np.int64), unfit)


def packed_rows_per_batch(pack_shape, max_tokens: int, max_sentences: int, multiple: int) -> int:
    b = max(1, max_tokens // max(pack_shape))
    if max_sentences:
        b = min(b, max_sentences)
    return b - b % multiple if b >= multiple else b


def packed(src_len, tgt_len, pack_shape, rows_per_batch: int, rng: np.random.Generator | None):
    """Pack the pairs side by side into rows of ``pack_shape`` (first-fit decreasing, ties in random order when
    ``rng`` is given), then cut the rows into batches of ``rows_per_batch``.

    Returns ``(select, ends, masked, placement)``: ``placement`` per selected pair its ``row`` (within its
    batch), ``src_offset`` and ``tgt_offset``; the last batch's missing rows are counted as masked.
    """
    ls, lt = pack_shape
    shuffle = rng.permutation(len(src_len)) if rng is not None else np.arange(len(src_len))
    plan = pack_pairs(src_len[shuffle], tgt_len[shuffle], ls, lt)
    order = np.lexsort((plan.src_offset, plan.row))
    prow, soff, toff = plan.row[order], plan.src_offset[order], plan.tgt_offset[order]
    b = rows_per_batch
    n_batches = -(-plan.num_rows // b)
    ends = np.searchsorted(prow, (np.arange(n_batches) + 1) * b, side="left").astype(np.int64)
    masked = np.zeros(n_batches, np.int64)
    if n_batches:
        masked[-1] = n_batches * b - plan.num_rows
    return shuffle[order], ends, masked, {"row": prow % b, "src_offset": soff, "tgt_offset": toff}


def fairseq(src_len, tgt_len, with_target: bool, seed: int, epoch: int, max_tokens: int, max_sentences: int,
            multiple: int, max_source_positions: int, max_target_positions: int, drop_last: bool):
    """fairseq's multilingual epoch, as TranslationMultiSimpleEpochTask + EpochBatchIterator build it.

    The virtual dataset is every direction's draw concatenated in direction order; then ``ordered_indices``
    (``np.random.seed(seed)``, a permutation, stable sorts by target and by source length),
    ``filter_indices_by_size`` (order kept), ``batch_by_size`` on ``max(src, tgt)``, and the epoch iterator's
    ``np.random.seed(seed + epoch); np.random.shuffle(batches)``; rank r then takes batches r, r + W, ...
    (``ShardedIterator``), which is global batch g on rank g % W here too.

    Returns ``(select, ends, served, too_long)``: ``too_long`` the filtered samples (indices into the inputs).
    """
    order = fairseq_ordered_indices(src_len, tgt_len if with_target else None, seed)
    too_long = (src_len[order] > max_source_positions) | (tgt_len[order] > max_target_positions)
    dropped = order[too_long]
    order = order[~too_long]
    cost = np.maximum(src_len, tgt_len)
    batches = fairseq_batch_by_size(order, cost, max_tokens, max_sentences or None, multiple,
                                    drop_last_partial=drop_last)
    ends = np.cumsum([len(b) for b in batches]).astype(np.int64)
    served = list(range(len(batches)))
    np.random.RandomState(seed + epoch).shuffle(served)
    return order, ends, np.asarray(served, dtype=np.int64), dropped


def block_shuffle(n: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """Batches in cost order, cut into blocks of ``block``; blocks and their members shuffled.

    Consecutive global batches then cost about the same, so the batches of one step (one per rank) are balanced
    for any world size up to the block size, while the global order stays independent of it.
    """
    blocks = [np.arange(s, min(s + block, n)) for s in range(0, n, block)]
    out = [rng.permutation(blocks[i]) for i in rng.permutation(len(blocks))]
    return np.concatenate(out) if out else np.zeros(0, np.int64)
