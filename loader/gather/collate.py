"""Planned samples -> fairseq's translation batch, gathered through the token spaces (gather.py).

The output is fairseq's translation batch, so fairseq-style models consume it unchanged::

    {"id": int64[B], "nsentences": B, "ntokens": non-pad target tokens,
     "net_input": {"src_tokens": [B, S] left-padded, "src_lengths": int64[B],
                   "prev_output_tokens": [B, T] (target with </s> moved to the front)},
     "target": [B, T] right-padded,
     "weight": float32[B] (1 for real rows; 0 for rows that only pad a batch, never counted),
     "direction": int32[B] (the stream each row comes from)}

Rows are sorted by source length, descending (stable), as fairseq's ``collate`` does. Everything the gather needs
per row (component, token addresses, lengths) comes from the plan, and per-component facts (prefix tokens, token
space, id base) from tables indexed by component, so a batch costs the same whether its rows come from one
corpus or a thousand. Two paths leave the fast padded gather: raw-text rows (segmented now, written from ragged
arrays) and source noise (the sources gathered ragged, transformed per task, written back).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from babelfeed.gather import engine as gather
from babelfeed.errors import ConfigError, FormatError
from babelfeed.plan.packing import segments
from babelfeed.sources.rows import groups
from babelfeed.gather.transforms import NoiseContext, Ragged, apply as apply_noise
from babelfeed.stages import timed


@dataclass(frozen=True)
class CollateOptions:
    pad: int = 1
    eos: int = 2
    left_pad_source: bool = True
    left_pad_target: bool = False
    pad_to_multiple: int = 1
    dtype: str = "int64"
    sort_by_source_length: bool = True
    vocab_size: int = 0  # symbols of the dictionary: every token id must be below it (0: unchecked)

    def __post_init__(self):
        if self.pad_to_multiple < 1:
            raise ConfigError(f"pad_to_multiple must be >= 1, got {self.pad_to_multiple}")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ConfigError(f"collate.dtype={self.dtype!r} is not a numpy dtype") from None
        if dtype.kind not in "iu":
            raise ConfigError(f"collate.dtype={self.dtype!r} must be an integer dtype (token ids)")
        if self.vocab_size and np.iinfo(dtype).max < self.vocab_size - 1:
            raise ConfigError(f"collate.dtype={self.dtype!r} cannot hold token ids up to {self.vocab_size - 1} (a "
                              f"dictionary of {self.vocab_size} symbols): ids would wrap around. Use int32 or int64")


def _width(longest: int, multiple: int, minimum: int = 0) -> int:
    w = max(int(longest), int(minimum))
    if multiple > 1 and w % multiple:
        w += multiple - w % multiple
    return w


def _prefix_table(prefixes) -> tuple[np.ndarray, np.ndarray]:
    """Per component: its prefix tokens (padded into a table) and their count."""
    plen = np.array([len(p) for p in prefixes], dtype=np.int64)
    table = np.zeros((len(prefixes), int(plen.max(initial=0))), dtype=np.int64)
    for i, p in enumerate(prefixes):
        table[i, :len(p)] = p
    return table, plen


class _Side:
    """Per-component facts of one side (source or target): token space, prefix, raw-text reader."""

    def __init__(self, comps, side: str):
        at = [getattr(c, f"{side}_at") for c in comps]
        self.space = np.array([a[0] for a in at], dtype=np.int64)
        self.prefix, self.plen = _prefix_table([getattr(c, f"{side}_prefix") for c in comps])
        self.spaces_used = sorted({int(s) for s in self.space if s >= 0})
        # every component in one token space, none raw: no per-batch lookup of spaces
        self.single = len(self.spaces_used) == 1 and bool((self.space >= 0).all())

    def padded(self, spaces, comp, start, length, width: int, left_pad: bool, pad: int, dtype, prev_eos=None,
               largest: list | None = None):
        plen = self.plen[comp]
        if self.single:
            return gather.padded(spaces, self.spaces_used[0], start, length - plen, self.prefix[comp], plen, width,
                                 left_pad, pad, dtype, prev_eos, largest)
        sid = self.space[comp]
        if not len(self.spaces_used):  # raw text only: prefixes and padding, the caller writes the rest
            out = np.full((len(comp), width), pad, dtype=dtype)
            gather.put_prefix(out, self.prefix[comp], plen,
                              (width - length) if left_pad else np.zeros(len(comp), np.int64))
            return out if prev_eos is None else (out, None)
        one = len(self.spaces_used) == 1 and (sid >= 0).all()
        if not one:  # rows of raw text read a harmless address; their cells are written over
            start = np.where(sid >= 0, start, gather.MARGIN if spaces.flat else 0)
            sid = np.where(sid >= 0, sid, self.spaces_used[0])
        return gather.padded(spaces, self.spaces_used[0] if one else sid, start, length - plen, self.prefix[comp],
                             plen, width, left_pad, pad, dtype, prev_eos)

    def with_prefix(self, comp: np.ndarray, seg: Ragged) -> Ragged:
        """Raw-text rows: each segmentation behind its component's prefix."""
        plen = self.plen[comp]
        total = plen + seg.lengths
        starts = np.cumsum(total) - total
        out = np.empty(int(total.sum()), dtype=np.int64)
        out[gather.ragged_arange(starts + plen, seg.lengths)] = seg.tokens
        gather.put_prefix(out[None], self.prefix[comp], plen, starts, rows=np.zeros(len(comp), np.int64))
        return Ragged(out, total)


class Collater:
    """Planned sample references -> the fairseq batch dict (source noise applied where a task has it)."""

    def __init__(self, sources, opts: CollateOptions, seed: int = 1, max_source_positions: int = 0):
        self.sources, self.opts = sources, opts
        self.seed, self.max_source_positions = seed, max_source_positions
        self.noise_dropped = 0  # rows whose noised source outgrew its limit (weight 0), since construction
        comps = sources.components
        sizes = [len(c) for c in comps]
        self.id_base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.stream_index = None  # the run's stream numbers, where an edit changed the streams (run.layout)
        self.src, self.tgt = _Side(comps, "src"), _Side(comps, "tgt")
        self.raw = np.array([c.raw for c in comps], dtype=bool)
        keys: dict = {}  # components with the same transforms and prefix length are noised together
        self.noise_group = np.array([keys.setdefault(repr((c.src_noise, len(c.src_prefix))), len(keys))
                                     for c in comps], dtype=np.int64)
        self.noise_steps = [None] * len(keys)
        for c, g in zip(comps, self.noise_group.tolist()):
            self.noise_steps[g] = (c.src_noise, len(c.src_prefix))
        self.noised = np.array([bool(c.src_noise) for c in comps], dtype=bool)
        self.any_raw, self.any_noise = bool(self.raw.any()), bool(self.noised.any())

    def ids(self, comp, local) -> np.ndarray:
        return self.id_base[comp] + local

    def _streams(self, direction) -> np.ndarray:
        """A batch's ``direction``: the run's number of each row's stream."""
        d = np.asarray(direction, dtype=np.int32)
        return d if self.stream_index is None else self.stream_index[d]

    def addresses(self, comp: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Token-space addresses (source, target) of samples, int64 [n, 2]: from the flat row table when there is
        one, else component by component (a stable sort groups them, each component's pointers read once)."""
        comp = np.asarray(comp, dtype=np.int64)
        out = np.zeros((len(comp), 2), np.int64)
        table = self.sources.row_table()
        if table is not None:
            out[:, 0] = table.addresses(comp, local, "src")
            out[:, 1] = table.addresses(comp, local, "tgt")
            return out
        comps = self.sources.components
        for group in groups(comp):
            c = comps[int(comp[group[0]])]
            out[group, 0] = c.addresses(local[group], "src")
            out[group, 1] = c.addresses(local[group], "tgt")
        return out

    def ranges(self, s, dues: np.ndarray | None = None) -> list:
        """``[[path, byte starts, byte ends(, dues)], ...]``: the bytes of remote files that planned samples ``s``
        read (each side's whole row, prefix tokens included: a few bytes more); with ``dues`` (one per sample),
        each range's. Empty for local data."""
        spaces = self.sources.spaces
        if not spaces.remote or not len(s.comp):
            return []
        comp = s.comp.astype(np.int64)
        addr = self._addr(s)
        files = spaces.ranges(self.src.space[comp], addr[:, 0], np.asarray(s.src_len, np.int64), dues)
        if self.sources.with_target:
            files += spaces.ranges(self.tgt.space[comp], addr[:, 1], np.asarray(s.tgt_len, np.int64), dues)
        return files

    def _addr(self, s) -> np.ndarray:
        return s.addr if s.addr is not None else self.addresses(s.comp, s.local)

    # ------------------------------------------------------------------------------------ padded batches
    def __call__(self, s, weight=None, pad_to_length: dict | None = None, sort: bool | None = None,
                 epoch: int = 1, spaces=None) -> dict:
        """``s``: the batch's planned :class:`~babelfeed.plan.planner.Samples` (stream, component, row, lengths,
        addresses). ``spaces``: the token spaces as this batch reads them (``TokenSpaces.reading``: its clock,
        whether its rows were fetched ahead); default the sources' own."""
        o = self.opts
        spaces = self.sources.spaces if spaces is None else spaces
        comp, local = s.comp.astype(np.int64), s.local
        ids = self.ids(comp, local)
        addr = self._addr(s)
        src_len, tgt_len = np.array(s.src_len, dtype=np.int64), np.array(s.tgt_len, dtype=np.int64)
        n = len(ids)
        has_tgt = self.sources.with_target
        raw_src, raw_tgt = ({}, {}) if not (self.any_raw and self.raw[comp].any()) else self._segment(
            comp, local, ids, epoch, src_len, tgt_len)
        weight = np.ones(n, np.float32) if weight is None else np.asarray(weight, np.float32)
        src_ragged = None
        seen = {"source": [], "target": []}  # the largest id of each side, where the compiled gather wrote it
        if self.any_noise and self.noised[comp].any():
            src_ragged, src_len, weight = self._noised_sources(addr[:, 0], comp, ids, src_len, raw_src, weight, epoch,
                                                               pad_to_length, spaces)
        order = np.argsort(-src_len, kind="stable") if (o.sort_by_source_length if sort is None else sort) \
            else np.arange(n)
        ptl = pad_to_length or {}
        dtype = np.dtype(o.dtype)
        width = _width(src_len.max(initial=0), o.pad_to_multiple, ptl.get("source", 0))
        if src_ragged is not None:
            src = np.full((n, width), o.pad, dtype)
            inverse = np.empty(n, dtype=np.int64)
            inverse[order] = np.arange(n)
            gather.from_ragged(src, inverse, src_ragged[0], src_ragged[1], o.left_pad_source)
            src_len = np.minimum(src_len, width)
        else:
            src = self._side(spaces, self.src, raw_src, comp, addr[:, 0], src_len, order, width, o.left_pad_source,
                             largest=seen["source"])
        batch = {
            "id": ids[order],
            "nsentences": n,
            "net_input": {"src_tokens": src, "src_lengths": src_len[order]},
            "weight": weight[order],
            "direction": self._streams(s.direction)[order],
        }
        if has_tgt:
            tgt_len = tgt_len[order]
            width = _width(tgt_len.max(initial=0), o.pad_to_multiple, ptl.get("target", 0))
            tgt, prev = self._side(spaces, self.tgt, raw_tgt, comp, addr[:, 1], tgt_len, order, width,
                                   o.left_pad_target, lengths_sorted=True, prev_eos=o.eos, largest=seen["target"])
            if prev is None or raw_tgt:  # raw-text rows were written after the shift
                col0 = (width - tgt_len) if o.left_pad_target else np.zeros(len(tgt_len), np.int64)
                prev = gather.shifted(tgt, col0, tgt_len, o.pad, o.eos)
            batch["target"] = tgt
            batch["net_input"]["prev_output_tokens"] = prev
            batch["ntokens"] = int(tgt_len[batch["weight"] > 0].sum())
        else:
            batch["ntokens"] = int(src_len[order][batch["weight"] > 0].sum())
        if o.vocab_size:
            self._check_ids(batch, comp, local, order, seen)
        return batch

    def _check_ids(self, batch: dict, comp: np.ndarray, local: np.ndarray, order: np.ndarray, seen: dict) -> None:
        """Refuse a batch holding a token id outside the dictionary (a .bin from another vocabulary, a truncated
        dict.txt, corrupt data), naming the file and record it came from. A side the compiled gather wrote whole
        is checked by the largest id it saw; any other side by one reduction."""
        vocab = self.opts.vocab_size
        for name, arr in (("source", batch["net_input"]["src_tokens"]), ("target", batch.get("target"))):
            if len(seen[name]) == 1 and seen[name][0] < vocab:
                continue
            bad = gather.first_outside(arr, vocab)
            if bad is not None:
                row = int(order[bad[0]])
                self._refuse(name, int(arr[bad]), int(comp[row]), int(local[row]))

    def _refuse(self, side: str, token: int, comp: int, local: int) -> None:
        c = self.sources.components[comp]
        ds = c.src if side == "source" or c.tgt is None else c.tgt
        path = getattr(ds, "data_file", None) or getattr(ds, "path", None) or c.key
        raise FormatError(path, f"record {local} ({side} of {c.key}, shard {c.shard}) holds token id {token}, "
                                f"outside the dictionary of {self.opts.vocab_size} symbols: the data was binarized "
                                f"with another dictionary, dict.txt was cut short, or the file is corrupt")

    @timed("gather")
    def _side(self, spaces, side: _Side, raw: dict, comp, start, length, order, width: int, left_pad: bool,
              lengths_sorted: bool = False, prev_eos=None, largest: list | None = None):
        """One side's padded rows in batch order: one gather from the token spaces, raw-text rows written over
        (with ``prev_eos``: also the rows shifted behind it, before raw-text rows are written)."""
        o = self.opts
        lengths = length if lengths_sorted else length[order]
        out = side.padded(spaces, comp[order], start[order], lengths, width, left_pad, o.pad,
                          np.dtype(o.dtype), prev_eos, None if raw else largest)
        if spaces.remote:  # (while the fetched rows are pinned: before the next side's fetch)
            self._check_ends(side, comp[order], start[order], lengths)
        if prev_eos is not None:
            out, prev = out
        if raw:
            inverse = np.empty(len(order), dtype=np.int64)
            inverse[order] = np.arange(len(order))
            for pos, seg in raw.values():
                rows = inverse[pos]
                out[rows] = o.pad
                gather.from_ragged(out, rows, seg.tokens, seg.lengths, left_pad)
        return out if prev_eos is None else (out, prev)

    def _check_ends(self, side: _Side, comp, start, length) -> None:
        """Rows of remote data end with ``</s>``, each checked as it is fetched (a local ``.bin`` is checked
        whole at open; a remote one would have to be downloaded whole for that): a row that does not is a
        damaged object or one that belongs to another index, refused naming the file and the byte."""
        spaces = self.sources.spaces
        body = np.asarray(length, np.int64) - side.plen[comp]
        sid = side.space[comp]
        keep = (sid >= 0) & (body > 0)
        for s in np.unique(sid[keep]).tolist():
            sel = np.flatnonzero(keep & (sid == s))
            last = np.asarray(start, np.int64)[sel] + body[sel] - 1
            values = spaces.tokens(s)[last].astype(np.int64) - spaces.shift(s)
            bad = np.flatnonzero(values != self.opts.eos)
            if bad.size:
                k = int(sel[bad[0]])
                c = self.sources.components[int(comp[k])]
                ds = c.src if side is self.src or c.tgt is None else c.tgt
                from babelfeed.storage.remote.client import remote_names  # (the object's URL, not the shadow's)

                raise FormatError(remote_names(str(getattr(ds, "data_file", c.key))),
                                  f"a row of {c.key} (shard {c.shard}) ends with token {int(values[bad[0]])}, not "
                                  f"</s> (id {self.opts.eos}): the object is damaged or belongs to another index")

    def _segment(self, comp, local, ids, epoch: int, src_len, tgt_len) -> tuple[dict, dict]:
        """Raw-text rows, segmented now (within their planned lengths): per component, (rows, prefix + pieces)
        for each side; ``src_len``/``tgt_len`` are updated to the sampled lengths."""
        comps = self.sources.components
        raw_src, raw_tgt = {}, {}
        for cid in np.unique(comp[self.raw[comp]]).tolist():
            pos = np.flatnonzero(comp == cid)
            c = comps[cid]
            src = c.src.sample(local[pos], ids[pos], epoch)
            raw_src[cid] = (pos, self.src.with_prefix(comp[pos], src))
            src_len[pos] = raw_src[cid][1].lengths
            if c.tgt is None:
                continue
            tgt = src if c.tgt is c.src else c.tgt.sample(local[pos], ids[pos], epoch)  # monolingual: one draw
            raw_tgt[cid] = (pos, self.tgt.with_prefix(comp[pos], tgt))
            tgt_len[pos] = raw_tgt[cid][1].lengths
        return raw_src, raw_tgt

    def _noised_sources(self, src_start, comp, ids, src_len, raw_src, weight, epoch, pad_to_length, spaces):
        """Sources gathered ragged, each task's transforms applied to its rows (randomness from seed, epoch and
        sample id), reassembled in row order. Rows that outgrow the source limit (or the static width) keep
        weight 0 and are cut: filter-too-long after the transforms, never silently."""
        n = len(src_len)
        width = int(src_len.max(initial=0))
        rows = self._side(spaces, self.src, raw_src, comp, src_start, src_len, np.arange(n), width, False)
        flat = rows[np.arange(width) < src_len[:, None]].astype(np.int64)
        starts = np.cumsum(src_len) - src_len
        new_len = src_len.copy()
        pieces = []
        groups = self.noise_group[comp]
        for g in np.unique(groups).tolist():
            sel = np.flatnonzero(groups == g)
            steps, plen = self.noise_steps[g]
            if not steps:
                pieces.append((sel, None))
                continue
            ragged = Ragged(flat[gather.ragged_arange(starts[sel], src_len[sel])], src_len[sel])
            noised = apply_noise(ragged, NoiseContext(self.seed, epoch, ids[sel], protect_prefix=plen), steps)
            new_len[sel] = noised.lengths
            pieces.append((sel, noised))
        out_starts = np.cumsum(new_len) - new_len
        out = np.empty(int(new_len.sum()), dtype=np.int64)
        for sel, noised in pieces:
            dest = gather.ragged_arange(out_starts[sel], new_len[sel])
            out[dest] = flat[gather.ragged_arange(starts[sel], src_len[sel])] if noised is None else noised.tokens
        limit = self.max_source_positions or int(new_len.max(initial=0))
        if pad_to_length and pad_to_length.get("source"):
            limit = min(limit, int(pad_to_length["source"]))
        over = new_len > limit
        weight = weight.copy()
        self.noise_dropped += int((over & (weight > 0)).sum())
        weight[over] = 0
        return (out, new_len), np.minimum(new_len, limit), weight

    # ------------------------------------------------------------------------------------ packed batches
    def packed(self, s, placement: dict, shape: tuple, row_weight: np.ndarray, spaces=None) -> dict:
        """Packed pairs: every row holds several (source, target) pairs side by side.

        ``placement``: per pair ``row``, ``src_offset``, ``tgt_offset``, ``src_len``, ``tgt_len`` (prefixes and
        ``</s>`` included). The batch adds ``src_segment_ids``/``src_positions`` and ``tgt_segment_ids``/
        ``tgt_positions`` so attention (and cross-attention: equal segment ids) stays inside each pair;
        ``prev_output_tokens`` moves ``</s>`` to the front of every target segment. Rows are right-padded.
        ``weight`` is per row (0 for rows that only fill the batch); ``target_weight`` per target token.
        """
        o = self.opts
        comp = s.comp.astype(np.int64)
        ids = self.ids(comp, s.local)
        n_rows = len(row_weight)
        ls, lt = shape
        dtype = np.dtype(o.dtype)
        p = placement
        addr = self._addr(s)
        spaces = self.sources.spaces if spaces is None else spaces
        src = self._scatter(spaces, self.src, comp, addr[:, 0], p["row"], p["src_offset"], p["src_len"], (n_rows, ls),
                            dtype)
        tgt = self._scatter(spaces, self.tgt, comp, addr[:, 1], p["row"], p["tgt_offset"], p["tgt_len"], (n_rows, lt),
                            dtype)
        src_seg, src_pos, _, pair_segment = segments(n_rows, ls, p["row"], p["src_offset"], p["src_len"])
        tgt_seg, tgt_pos, tgt_first, _ = segments(n_rows, lt, p["row"], p["tgt_offset"], p["tgt_len"])
        prev = np.full_like(tgt, o.pad)
        prev[:, 1:] = tgt[:, :-1]
        prev[tgt_first] = o.eos
        prev[tgt_seg == 0] = o.pad
        row_weight = np.asarray(row_weight, np.float32)
        target_weight = (tgt_seg > 0).astype(np.float32) * row_weight[:, None]
        real_pairs = row_weight[p["row"]] > 0
        if o.vocab_size:
            for side, arr, off, length in (("source", src, p["src_offset"], p["src_len"]),
                                           ("target", tgt, p["tgt_offset"], p["tgt_len"])):
                bad = gather.first_outside(arr, o.vocab_size)
                if bad is not None:
                    row, col = bad
                    pair = int(np.flatnonzero((p["row"] == row) & (off <= col) & (col < off + length))[0])
                    self._refuse(side, int(arr[bad]), int(comp[pair]), int(s.local[pair]))
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
            "direction": self._streams(s.direction),
        }

    def _scatter(self, spaces, side: _Side, comp, start, row, offset, length, shape, dtype) -> np.ndarray:
        """Pairs' prefixes and tokens written at (row, offset) of a padded [rows, width] array."""
        out = np.full(shape, self.opts.pad, dtype=dtype)
        plen = side.plen[comp]
        body = np.asarray(length, np.int64) - plen
        base = np.asarray(row, np.int64) * shape[1] + offset
        gather.scatter(spaces, side.space[comp], start, body, out, base + plen)
        gather.put_prefix(out, side.prefix[comp], plen, np.asarray(offset, np.int64), rows=row)
        return out
