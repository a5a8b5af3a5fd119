"""Gather a planned batch into padded arrays: one vectorised copy per side, no per-sample Python loop.

The output is fairseq's translation batch, so fairseq-style models consume it unchanged::

    {"id": int64[B], "nsentences": B, "ntokens": non-pad target tokens,
     "net_input": {"src_tokens": [B, S] left-padded, "src_lengths": int64[B],
                   "prev_output_tokens": [B, T] (target with </s> moved to the front)},
     "target": [B, T] right-padded,
     "weight": float32[B] (1 for real rows; 0 for rows that only pad a batch, never counted)}

Rows are sorted by source length, descending (stable), as fairseq's ``collate`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .packing import ragged_arange, segments


@dataclass(frozen=True)
class CollateOptions:
    pad: int = 1
    eos: int = 2
    left_pad_source: bool = True
    left_pad_target: bool = False
    pad_to_multiple: int = 1
    dtype: str = "int64"
    sort_by_source_length: bool = True

    def __post_init__(self):
        if self.pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {self.pad_to_multiple}")


def _width(longest: int, multiple: int, minimum: int = 0) -> int:
    w = max(int(longest), int(minimum))
    if multiple > 1 and w % multiple:
        w += multiple - w % multiple
    return w


def fill_side(out: np.ndarray, lengths: np.ndarray, groups, left_pad: bool) -> None:
    """Write each row's prefix and tokens into ``out`` (pre-filled with pad).

    ``groups``: iterable of ``(positions, dataset, rows, prefix)``: batch rows ``positions`` take records ``rows`` of
    ``dataset`` (an IndexedDataset), each preceded by the ``prefix`` token ids.
    """
    start = (out.shape[1] - lengths) if left_pad else np.zeros_like(lengths)
    fill_at(out, [(positions, start[positions], ds, rows, prefix) for positions, ds, rows, prefix in groups])


def shift_eos_to_front(target: np.ndarray, lengths: np.ndarray, pad: int, eos: int, left_pad: bool) -> np.ndarray:
    """fairseq's ``prev_output_tokens``: each row ``[eos, t0, ..., t_{n-2}]``, padded like the target."""
    prev = np.full_like(target, pad)
    prev[:, 1:] = target[:, :-1]
    width = target.shape[1]
    rows = np.arange(len(lengths))
    if left_pad:
        prev[rows, width - lengths] = eos
    else:
        prev[:, 0] = eos
        inside = lengths < width
        prev[rows[inside], lengths[inside]] = pad
    prev[lengths == 0] = pad
    return prev


def collate_pairs(groups_src, groups_tgt, src_len: np.ndarray, tgt_len: np.ndarray | None, ids: np.ndarray,
                  opts: CollateOptions, weight: np.ndarray | None = None, pad_to_length: dict | None = None,
                  extra: dict | None = None, src_ragged: tuple | None = None) -> dict:
    """Build the fairseq batch dict. ``groups_*`` as for :func:`fill_side`; lengths include prefixes and ``</s>``.

    ``extra``: more per-row arrays to put in the batch, reordered with the rows. ``src_ragged``: the sources
    already gathered (and noised) as ``(tokens, lengths)`` in row order, instead of ``groups_src``.
    """
    n = len(src_len)
    dtype = np.dtype(opts.dtype)
    src_len = np.asarray(src_len, dtype=np.int64)
    order = np.argsort(-src_len, kind="stable") if opts.sort_by_source_length else np.arange(n)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    ptl = pad_to_length or {}
    src = np.full((n, _width(src_len.max(initial=0), opts.pad_to_multiple, ptl.get("source", 0))), opts.pad, dtype)
    if src_ragged is not None:
        fill_ragged(src, src_ragged[0], src_ragged[1], inverse, opts.left_pad_source)
        src_len = np.minimum(src_len, src.shape[1])
    else:
        fill_side(src, src_len[order], [(inverse[p], ds, r, pre) for p, ds, r, pre in groups_src],
                  opts.left_pad_source)
    batch = {
        "id": np.asarray(ids, dtype=np.int64)[order],
        "nsentences": n,
        "net_input": {"src_tokens": src, "src_lengths": src_len[order]},
        "weight": (np.ones(n, np.float32) if weight is None else np.asarray(weight, np.float32))[order],
    }
    for key, values in (extra or {}).items():
        batch[key] = np.asarray(values)[order]
    if tgt_len is not None:
        tgt_len = np.asarray(tgt_len, dtype=np.int64)[order]
        tgt = np.full((n, _width(tgt_len.max(initial=0), opts.pad_to_multiple, ptl.get("target", 0))), opts.pad, dtype)
        fill_side(tgt, tgt_len, [(inverse[p], ds, r, pre) for p, ds, r, pre in groups_tgt], opts.left_pad_target)
        batch["target"] = tgt
        batch["net_input"]["prev_output_tokens"] = shift_eos_to_front(tgt, tgt_len, opts.pad, opts.eos,
                                                                      opts.left_pad_target)
        batch["ntokens"] = int(tgt_len[batch["weight"] > 0].sum())
    else:
        batch["ntokens"] = int(src_len[order][batch["weight"] > 0].sum())
    return batch


def fill_at(out: np.ndarray, groups) -> None:
    """Like :func:`fill_side`, with explicit places: ``groups`` of ``(row, offset, dataset, records, prefix)``
    arrays write each record (after its prefix) at ``out[row, offset:]``."""
    width = out.shape[1]
    flat = out.reshape(-1)
    for row, offset, ds, recs, prefix in groups:
        plen = len(prefix)
        base = row.astype(np.int64) * width + offset
        if plen:
            flat[(base[:, None] + np.arange(plen)).ravel()] = np.tile(prefix, len(row))
        sizes = np.asarray(ds.sizes[recs], dtype=np.int64)
        values = ds.tokens[ragged_arange(np.asarray(ds.pointers[recs], dtype=np.int64) // ds.dtype.itemsize, sizes)]
        if ds.token_shift:
            values = values.astype(np.int64) - ds.token_shift
        flat[ragged_arange(base + plen, sizes)] = values


def collate_packed(groups_src, groups_tgt, placement: dict, shape: tuple[int, int], ids: np.ndarray,
                   opts: CollateOptions, row_weight: np.ndarray) -> dict:
    """Packed pairs: every row holds several (source, target) pairs side by side.

    ``placement``: per pair ``row``, ``src_offset``, ``tgt_offset``, ``src_len``, ``tgt_len`` (prefixes and
    ``</s>`` included). The batch adds ``src_segment_ids``/``src_positions`` and ``tgt_segment_ids``/
    ``tgt_positions`` so attention (and cross-attention: equal segment ids) stays inside each pair;
    ``prev_output_tokens`` moves ``</s>`` to the front of every target segment. Rows are right-padded.
    ``weight`` is per row (0 for rows that only fill the batch); ``target_weight`` per target token.
    """
    n_rows = len(row_weight)
    ls, lt = shape
    dtype = np.dtype(opts.dtype)
    src = np.full((n_rows, ls), opts.pad, dtype)
    tgt = np.full((n_rows, lt), opts.pad, dtype)
    fill_at(src, groups_src)
    fill_at(tgt, groups_tgt)
    p = placement
    src_seg, src_pos, _, pair_segment = segments(n_rows, ls, p["row"], p["src_offset"], p["src_len"])
    tgt_seg, tgt_pos, tgt_first, _ = segments(n_rows, lt, p["row"], p["tgt_offset"], p["tgt_len"])
    prev = np.full_like(tgt, opts.pad)
    prev[:, 1:] = tgt[:, :-1]
    prev[tgt_first] = opts.eos
    prev[tgt_seg == 0] = opts.pad
    row_weight = np.asarray(row_weight, np.float32)
    target_weight = (tgt_seg > 0).astype(np.float32) * row_weight[:, None]
    real_pairs = row_weight[p["row"]] > 0
    return {
        "id": np.asarray(ids, dtype=np.int64),
        "nsentences": int(real_pairs.sum()),
        "ntokens": int(target_weight.sum()),
        "net_input": {"src_tokens": src, "src_lengths": (src_seg > 0).sum(axis=1).astype(np.int64),
                      "src_segment_ids": src_seg, "src_positions": src_pos, "prev_output_tokens": prev,
                      "tgt_segment_ids": tgt_seg, "tgt_positions": tgt_pos},
        "target": tgt,
        "target_weight": target_weight,
        "weight": row_weight,
        "row": np.asarray(p["row"], dtype=np.int64),  # per pair: its row
        "segment": pair_segment,  # per pair: its segment id in that row (the same on both sides)
    }


def fill_ragged(out: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, positions: np.ndarray, left_pad: bool) -> None:
    """Write ragged sentences (``tokens`` back to back, ``lengths``) into rows ``positions`` of ``out``,
    right- or left-aligned; sentences longer than the row are cut to it (the caller masks those rows)."""
    width = out.shape[1]
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = np.minimum(lengths, width)
    starts = np.cumsum(lengths) - lengths
    src = ragged_arange(starts, keep)
    col0 = (width - keep) if left_pad else np.zeros_like(keep)
    dest = ragged_arange(np.asarray(positions, np.int64) * width + col0, keep)
    out.reshape(-1)[dest] = tokens[src]
