"""Packing plans over integer lengths: rows of a fixed length holding several sequences.

* ``pack(lengths, row_length)``: document-aware packing. Whole sequences (split only when longer than a row)
  go into rows by best-fit decreasing: longest first, each into the fullest row it still fits (a sorted list of
  free capacities and a binary search: about 1M sequences/s). The plan
  gives each piece its row and offset, from which ``segment_ids`` (1, 2, ... per row, 0 = padding) and
  ``positions`` (restarting at 0 in every piece) follow, so attention can be masked per document.
* ``gpt_sample_index``: Megatron's concatenate-and-slice (documents in a shuffled order, concatenated, cut into
  samples of ``seq_len`` tokens plus one overlapping label token): Megatron's ``build_sample_idx`` array, row for
  row and in its dtype; ``sample_rows`` gives the same rows for samples starting anywhere in a stream.
* ``pack_sentences``: BERT-style, consecutive sentences of one document up to a maximum length.
* ``pack_pairs``: encoder-decoder pairs side by side in rows of a fixed ``(L_src, L_tgt)`` shape, both sides with
  their own segment ids, so attention and cross-attention stay inside each pair.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from babelfeed.errors import DataError, UsageError


@dataclass
class PackPlan:
    """One entry per piece: ``sequence`` (its index), ``start``/``length`` within the sequence, ``row``, ``offset``."""

    sequence: np.ndarray
    start: np.ndarray
    length: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    row_length: int
    num_rows: int

    @property
    def efficiency(self) -> float:
        """Real tokens / (rows x row_length)."""
        return float(self.length.sum() / max(self.num_rows * self.row_length, 1))

    def segment_ids(self) -> np.ndarray:
        """int32[num_rows, row_length]: 1, 2, ... for the pieces of each row in offset order; 0 for padding."""
        return segments(self.num_rows, self.row_length, self.row, self.offset, self.length)[0]

    def positions(self) -> np.ndarray:
        """int32[num_rows, row_length]: 0, 1, ... within each piece; 0 for padding."""
        return segments(self.num_rows, self.row_length, self.row, self.offset, self.length)[1]

    def gather(self, tokens_of, pad: int = 0, dtype=np.int64) -> np.ndarray:
        """The packed rows, reading each sequence's tokens with ``tokens_of(i)`` (a 1-D array)."""
        out = np.full((self.num_rows, self.row_length), pad, dtype=dtype)
        for i, s, n, r, o in zip(self.sequence.tolist(), self.start.tolist(), self.length.tolist(),
                                 self.row.tolist(), self.offset.tolist()):
            out[r, o:o + n] = tokens_of(i)[s:s + n]
        return out


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    excl = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, np.int64) - excl, lengths) + np.arange(total, dtype=np.int64)


def segments(num_rows: int, width: int, row: np.ndarray, offset: np.ndarray, length: np.ndarray):
    """(segment_ids, positions, first, piece_segment) for pieces placed at (row, offset) with the given lengths:
    segment ids 1, 2, ... per row in offset order (0 = padding), positions restarting per piece, a mask of each
    piece's first token, and each piece's own segment id."""
    row, offset, length = (np.asarray(x, dtype=np.int64) for x in (row, offset, length))
    seg = np.zeros((num_rows, width), dtype=np.int32)
    pos = np.zeros((num_rows, width), dtype=np.int32)
    first = np.zeros((num_rows, width), dtype=bool)
    order = np.lexsort((offset, row))
    r, o, n = row[order], offset[order], length[order]
    new_row = np.concatenate([[True], r[1:] != r[:-1]]) if len(r) else np.zeros(0, bool)
    idx = np.arange(len(r))
    k = idx - np.maximum.accumulate(np.where(new_row, idx, 0)) + 1
    flat = ragged_arange(r * width + o, n)
    seg.reshape(-1)[flat] = np.repeat(k, n).astype(np.int32)
    pos.reshape(-1)[flat] = ragged_arange(np.zeros(len(n), np.int64), n).astype(np.int32)
    first.reshape(-1)[(r * width + o)[n > 0]] = True
    piece_segment = np.empty(len(order), dtype=np.int32)
    piece_segment[order] = k
    return seg, pos, first, piece_segment


def varlen(segment_ids) -> dict:
    """The varlen form of packed rows, as FlashAttention's ``*_varlen_func`` and Megatron's THD layout take it,
    from their segment ids (``[rows, width]``; 0: padding; 1, 2, ...: a row's segments, each a contiguous run):

    * ``indices`` (int64 ``[tokens]``): the real tokens' places in the flattened ``[rows * width]`` batch
      (``x.reshape(rows * width, ...)[indices]`` is the THD input, padding left out);
    * ``cu_seqlens`` (int32 ``[segments + 1]``): where each segment starts among those tokens, from 0 to the
      number of real tokens; no segment crosses a row;
    * ``max_seqlen`` (int): the longest segment;
    * ``row_cu_seqlens`` (int32 ``[rows, most + 1]``): the same per row, within the row's real tokens, its last
      value repeated where a row has fewer than the most segments.
    """
    seg = np.asarray(segment_ids)
    if seg.ndim != 2:
        raise UsageError(f"segment_ids must be [rows, width], got shape {seg.shape}")
    rows, width = seg.shape
    flat = seg.reshape(-1)
    indices = np.flatnonzero(flat > 0)
    begins = np.ones(len(indices), bool)  # a real token begins a segment after another id or at a row's start
    if len(indices):
        begins[1:] = (flat[indices[1:]] != flat[indices[:-1]]) | (indices[1:] // width != indices[:-1] // width) | (
            indices[1:] != indices[:-1] + 1)
    starts = np.flatnonzero(begins)
    cu = np.concatenate([starts, [len(indices)]]).astype(np.int32)
    lengths = np.diff(cu)
    row_of = indices[starts] // width if len(starts) else np.zeros(0, np.int64)
    per_row = np.bincount(row_of, minlength=rows)
    most = int(per_row.max()) if rows else 0
    row_cu = np.zeros((rows, most + 1), np.int32)
    if len(starts):
        first = np.concatenate([[0], np.cumsum(per_row)[:-1]])
        k = np.arange(len(starts)) - first[row_of]
        ends = np.cumsum(lengths)
        row_cu[row_of, k + 1] = ends - (ends - lengths)[first[row_of]]
        np.maximum.accumulate(row_cu, axis=1, out=row_cu)
    return {"indices": indices.astype(np.int64), "cu_seqlens": cu, "max_seqlen": int(lengths.max(initial=0)),
            "row_cu_seqlens": row_cu}


def pack(lengths, row_length: int) -> PackPlan:
    """Pack sequences of these lengths into rows of ``row_length`` tokens (best-fit decreasing).

    >>> plan = pack([5, 3, 2, 6], row_length=8)
    >>> plan.num_rows, round(plan.efficiency, 3)
    (2, 1.0)
    """
    if row_length < 1:
        raise UsageError(f"row_length must be >= 1, got {row_length}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if (lengths < 0).any():
        raise UsageError("lengths must be >= 0")
    # pieces: full rows cut from sequences longer than a row, then the remainders
    full = lengths // row_length
    rem = lengths % row_length
    seq_f = np.repeat(np.arange(len(lengths)), full)
    start_f = ragged_arange(np.zeros(len(full), np.int64), full) * row_length
    order = np.argsort(-rem, kind="stable")
    order = order[rem[order] > 0]
    seq, start, length, row, offset = [], [], [], [], []
    n_rows = len(seq_f)  # each full piece fills a row of its own
    caps: list[int] = []  # remaining capacities of the open rows, sorted
    rows_by_cap: dict[int, list[int]] = {}
    for i in order.tolist():
        n = int(rem[i])
        k = bisect.bisect_left(caps, n)  # the fullest row that still fits n
        if k < len(caps):
            cap = caps.pop(k)
            r = rows_by_cap[cap].pop()
        else:
            cap, r = row_length, n_rows
            n_rows += 1
        left = cap - n
        if left:
            bisect.insort(caps, left)
            rows_by_cap.setdefault(left, []).append(r)
        off = row_length - cap
        seq.append(i)
        start.append(int(full[i]) * row_length)
        length.append(n)
        row.append(r)
        offset.append(off)
    return PackPlan(
        np.concatenate([seq_f, np.asarray(seq, np.int64)]),
        np.concatenate([start_f, np.asarray(start, np.int64)]),
        np.concatenate([np.full(len(seq_f), row_length, np.int64), np.asarray(length, np.int64)]),
        np.concatenate([np.arange(len(seq_f)), np.asarray(row, np.int64)]),
        np.concatenate([np.zeros(len(seq_f), np.int64), np.asarray(offset, np.int64)]),
        row_length, n_rows)


def sample_rows(stream_sizes, starts, add_extra_token: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's ``(document position, offset)`` of samples starting at tokens ``starts`` of the concatenated
    documents ``stream_sizes``: the position of the document where the previous sample's tokens end (its label
    token included), and the start's offset in it. So with ``add_extra_token=False`` a start on a document
    boundary is ``(d, size_d)`` at the end of the document before, and zero-length documents are never named.
    A start whose sample runs past the last document (a last partial sample) is ``(last, size_last - extra)``."""
    stream = np.asarray(stream_sizes, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    extra = int(add_extra_token)
    ends = np.cumsum(stream)
    past = starts + extra > (int(ends[-1]) if len(ends) else 0)
    pos = np.where(past, len(stream) - 1, np.searchsorted(ends, starts + extra, side="left"))
    begin = (ends - stream)[np.maximum(pos, 0)] if len(stream) else np.zeros_like(pos)
    offset = np.where(past, (int(stream[-1]) if len(stream) else 0) - extra, starts - begin)
    return pos.astype(np.int64), offset.astype(np.int64)


def gpt_sample_index(sizes, document_order, seq_len: int, add_extra_token: bool = True,
                     drop_last: bool = True) -> np.ndarray:
    """Megatron's ``build_sample_idx`` array: ``[num_samples + 1, 2]`` of (position in ``document_order``,
    offset), int32 when ``max(len(document_order), max(sizes))`` fits, else int64, as Megatron's helpers choose.

    Documents ``sizes[document_order]`` are concatenated; sample i spans the tokens from row i to row i+1
    (plus ``add_extra_token`` overlapping label token). Samples start every ``seq_len`` tokens; row 0 is (0, 0),
    and every other row follows Megatron's walk (``sample_rows``): with ``add_extra_token=False`` a start on a
    document boundary is ``(d, size_d)``, not ``(d + 1, 0)``. ``drop_last`` drops a last partial sample
    (Megatron's training default; without it the count is Megatron's float32 ``ceil``). Example: sizes
    [5, 3, 7, 4], order [2, 0, 3, 1], seq_len 4 -> [[0, 0], [0, 4], [1, 1], [2, 0], [3, 0]].
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.asarray(document_order, dtype=np.int64)
    stream = sizes[order]
    total = int(stream.sum())
    extra = int(add_extra_token)
    if seq_len < 1:
        raise UsageError(f"seq_len must be >= 1, got {seq_len}")
    if drop_last:
        n = (total - extra) // seq_len
    else:  # helpers.cpp: ceil(float(num_epochs * tokens_per_epoch - extra) / seq_length), a C++ float
        n = int(np.ceil(np.float32(total - extra) / np.float32(seq_len)))
    n = max(n, 0)
    pos, offset = sample_rows(stream, np.arange(n + 1, dtype=np.int64) * seq_len, add_extra_token)
    pos[0], offset[0] = 0, 0
    top = max(len(order), int(sizes.max()) if len(sizes) else 0)
    return np.stack([pos, offset], axis=1).astype(np.int32 if top <= np.iinfo(np.int32).max else np.int64)


def pack_sentences(sizes, doc_idx, max_length: int) -> np.ndarray:
    """BERT-style samples: runs of consecutive sentences of one document with at most ``max_length`` tokens.

    Returns int64[N, 2] of [first sentence, end sentence) per sample; a sentence longer than ``max_length``
    is a sample of its own (the caller truncates it).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    out = []
    for d in range(len(doc_idx) - 1):
        a, b = int(doc_idx[d]), int(doc_idx[d + 1])
        start, used = a, 0
        for s in range(a, b):
            n = int(sizes[s])
            if s > start and used + n > max_length:
                out.append((start, s))
                start, used = s, 0
            used += n
        if b > start:
            out.append((start, b))
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


@dataclass
class PairPackPlan:
    """Pairs side by side in rows of (src_length, tgt_length): per pair its row and offsets on both sides."""

    row: np.ndarray
    src_offset: np.ndarray
    tgt_offset: np.ndarray
    src_len: np.ndarray
    tgt_len: np.ndarray
    src_length: int
    tgt_length: int
    num_rows: int

    @property
    def efficiency(self) -> float:
        """Real tokens of both sides / (rows x (src_length + tgt_length))."""
        return float((self.src_len.sum() + self.tgt_len.sum()) /
                     max(self.num_rows * (self.src_length + self.tgt_length), 1))

    def segment_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) int32 segment ids; pair k of a row is segment k + 1 on both sides."""
        return (segments(self.num_rows, self.src_length, self.row, self.src_offset, self.src_len)[0],
                segments(self.num_rows, self.tgt_length, self.row, self.tgt_offset, self.tgt_len)[0])


def pack_pairs(src_len, tgt_len, src_length: int, tgt_length: int) -> PairPackPlan:
    """First-fit decreasing of (source, target) pairs into rows with room on *both* sides.

    Pairs go longest first (by their share of the row) into the first open row with room on both sides; the
    search is one vectorised comparison over the open rows, which drop out once even the smallest pair no
    longer fits them.
    """
    src_len = np.asarray(src_len, dtype=np.int64)
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    if ((src_len > src_length) | (tgt_len > tgt_length)).any():
        raise DataError(f"a pair is longer than the row shape ({src_length}, {tgt_length})")
    n = len(src_len)
    order = np.argsort(-(src_len / src_length + tgt_len / tgt_length), kind="stable")
    row = np.empty(n, np.int64)
    so = np.empty(n, np.int64)
    to = np.empty(n, np.int64)
    min_s, min_t = (int(src_len.min()), int(tgt_len.min())) if n else (0, 0)
    ids = np.zeros(0, np.int64)  # open rows, in creation order (first fit)
    fs = np.zeros(0, np.int64)
    ft = np.zeros(0, np.int64)
    n_rows = 0
    for step, i in enumerate(order.tolist()):
        s, t = int(src_len[i]), int(tgt_len[i])
        fit = np.flatnonzero((fs >= s) & (ft >= t))
        if fit.size:
            j = int(fit[0])
        else:
            ids, fs, ft = np.append(ids, n_rows), np.append(fs, src_length), np.append(ft, tgt_length)
            j = len(ids) - 1
            n_rows += 1
        row[i], so[i], to[i] = ids[j], src_length - fs[j], tgt_length - ft[j]
        fs[j] -= s
        ft[j] -= t
        if step % 256 == 255:  # drop rows no remaining pair can enter
            alive = (fs >= min_s) & (ft >= min_t)
            ids, fs, ft = ids[alive], fs[alive], ft[alive]
    return PairPackPlan(row, so, to, src_len, tgt_len, src_length, tgt_length, n_rows)
