"""Token-budget batching over length arrays: pure functions from integers to integers.

Budget semantics (fairseq's ``batch_by_size``): a sample costs ``max(src_len, tgt_len)`` (prefixes and
``</s>`` included), and a batch of ``B`` samples whose longest costs ``L`` is admitted while

    B * L <= max_tokens   and   B <= max_sentences

that is, the *padded* size of the longer side. ``B`` is cut to a multiple of ``required_batch_size_multiple``
(``m``) when ``B >= m``; a batch smaller than ``m`` happens only where the samples are too long for ``m`` of
them to fit, or at the very end. Example, lengths 3 3 3 4 4 5 5 5 6 7 8 9 10 12 16 20, max_tokens 20:

    m = 1: [3 3 3 4 4] (5 x 4 = 20) [5 5 5] [6 7] [8 9] [10] [12] [16] [20]
    m = 2: [3 3 3 4] [4 5 5 5] [6 7] [8 9] [10] [12] [16] [20]

babelfeed orders a window by (cost, source length) ascending with random tie-breaks, so the cost never
decreases along the order and greedy batching is one short binary search per batch, not a loop over samples.
"""

from __future__ import annotations

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.errors import DataError, UsageError

_U16 = np.iinfo(np.uint16).max


def length_order(src_len: np.ndarray, tgt_len: np.ndarray | None, rng: np.random.Generator,
                 rkey: np.ndarray | None = None) -> np.ndarray:
    """Indices sorting samples by (max(src, tgt), src) ascending, ties in random order.

    Three stable 16-bit radix passes (random key, source length, cost): linear time, the fast path of
    numpy's stable sort. ``rkey``: the random key, when the caller has drawn it (``random_key``).
    """
    src = np.asarray(src_len)
    if rkey is None:
        rkey = random_key(rng, len(src))
    if plan_kernel.KERNEL is not None:  # one radix sort of the four fields packed into 64 bits
        order = plan_kernel.length_order(src, tgt_len, rkey)
        if order is not None:
            return order  # None: a cost over 16 bits (raised below), or keys too wide to pack
    cost = src if tgt_len is None else np.maximum(src, np.asarray(tgt_len))
    n = len(src)
    if n and int(cost.max()) > _U16:
        raise DataError(f"sample of {int(cost.max())} tokens: lengths above {_U16} are not supported")
    order = np.argsort(rkey, kind="stable")
    if tgt_len is not None:
        order = order[np.argsort(src.astype(np.uint16)[order], kind="stable")]
    return order[np.argsort(cost.astype(np.uint16)[order], kind="stable")]


def random_key(rng: np.random.Generator, n: int) -> np.ndarray:
    """The uint16 key that orders samples of equal lengths (``length_order``'s first draw from ``rng``)."""
    return rng.integers(0, _U16 + 1, size=n, dtype=np.uint16)


def batch_sorted(cost: np.ndarray, max_tokens: int, max_sentences: int | None = None, multiple: int = 1) -> np.ndarray:
    """Batch boundaries for samples whose costs never decrease: returns ``ends`` with batch b = ``[ends[b-1], ends[b])``.

    Greedy: each batch takes as many samples as the budget allows, then is cut to a multiple of ``multiple``.
    """
    cost = np.asarray(cost)
    n = len(cost)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cap = n if not max_sentences else int(max_sentences)
    if 1 <= int(cost[0]) and int(cost[-1]) <= max_tokens:  # the compiled cut checks the order itself
        compiled = plan_kernel.batch_ends(cost, max_tokens, cap, multiple)
        if compiled is not None:
            return compiled
    if n > 1 and (np.diff(cost.astype(np.int64)) < 0).any():
        raise UsageError("batch_sorted needs costs in non-decreasing order")
    if int(cost[-1]) > max_tokens:
        raise DataError(f"a sample of {int(cost[-1])} tokens exceeds max_tokens={max_tokens}")
    if int(cost[0]) < 1:
        raise UsageError("sample costs must be >= 1")
    mv = memoryview(np.ascontiguousarray(cost, dtype=np.int64))
    ends = []
    i = 0
    while i < n:
        # largest k in [1, hi] with k * cost[i + k - 1] <= max_tokens (monotone in k)
        lo, hi = 1, min(cap, n - i, max_tokens // mv[i])
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if mid * mv[i + mid - 1] <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        if lo >= multiple:
            lo -= lo % multiple
        i += lo
        ends.append(i)
    return np.asarray(ends, dtype=np.int64)


def fairseq_batch_by_size(indices, num_tokens, max_tokens=None, max_sentences=None, required_batch_size_multiple=1,
                          drop_last_partial: bool = False) -> list[np.ndarray]:
    """fairseq's ``batch_by_size_vec`` (``data_utils_fast.pyx``), the same state machine, over ``indices`` in order.

    ``num_tokens[indices[k]]`` is the cost of the k-th sample. A running batch is *committed* at sizes below the
    multiple or at multiples of it; on overflow the batch is cut at its last committed size and the uncommitted
    tail starts the next one, and if the tail alone overflows, it is emitted without the current sample.
    ``drop_last_partial=True`` adds fairseq main's post-step (after commit d871f616) that drops a last batch
    whose size is not a multiple; v0.12.x and Open-NLLB keep it.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        return []
    max_tokens = -1 if max_tokens is None else int(max_tokens)
    max_sentences = -1 if max_sentences is None else int(max_sentences)
    mult = int(required_batch_size_multiple)
    costs = np.asarray(num_tokens)[indices].astype(np.int64)
    if max_tokens > 0 and int(costs.max()) > max_tokens:
        k = int(np.argmax(costs > max_tokens))
        raise DataError(f"sample {int(indices[k])} has {int(costs[k])} tokens, more than max_tokens={max_tokens}")
    ends = [0]  # ends[-1]: committed end of the running batch; earlier entries end finished batches
    batch_start = tail_max = batch_max = 0
    for pos, cost in enumerate(costs.tolist()):
        tail_max = max(tail_max, cost)
        new_end = pos + 1
        new_max = max(batch_max, tail_max)
        n = new_end - batch_start
        overflow = (max_sentences > 0 and n > max_sentences) or (max_tokens > 0 and n * new_max > max_tokens)
        if overflow:
            if max_tokens > 0 and tail_max * (new_end - ends[-1]) > max_tokens:
                ends.append(pos)  # the tail without this sample becomes a batch of its own
                tail_max = cost
            batch_start = ends[-1]
            ends.append(new_end)
            new_max = tail_max
        if overflow or n < mult or n % mult == 0:
            ends[-1] = new_end
            batch_max = new_max
            tail_max = 0
    cuts = ends if ends[-1] != len(indices) else ends[:-1]
    batches = np.split(indices, cuts)
    if drop_last_partial and mult > 1 and len(batches[-1]) % mult != 0:
        batches.pop()
    return batches


def fairseq_ordered_indices(src_sizes, tgt_sizes, seed: int) -> np.ndarray:
    """fairseq's ``ordered_indices``: ``np.random.seed(seed)``; a permutation, then stable sorts by tgt and by src.

    The result is lexicographic (src, tgt, random). fairseq seeds the *global* numpy RNG; this function saves
    and restores its state so that callers are not affected.
    """
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        perm = np.random.permutation(len(src_sizes))
    finally:
        np.random.set_state(state)
    src = np.asarray(src_sizes)
    if tgt_sizes is not None:
        perm = perm[np.argsort(np.asarray(tgt_sizes)[perm], kind="mergesort")]
    return perm[np.argsort(src[perm], kind="mergesort")]
