"""Language-model samples as integers: each sample a list of *pieces* (token-space address, length, column).

A dataset's split is read as its sequences, shuffled anew every epoch, and cut into samples per mode:

* ``concat``: the epochs' sequences concatenated (epoch after epoch) and cut every ``seq_len`` tokens, each sample
  carrying one extra label token (Megatron's GPT sample index): a sample is the tail of one sequence, whole
  sequences, and the head of another. As in Megatron, an epoch's last tokens are not dropped: they begin the next
  epoch's first sample, so the first e epochs hold ``(e T - 1) // seq_len`` samples (T tokens per epoch), epoch
  e those from ``N(e - 1)`` to ``N(e)``; its arrays keep the sequences of the previous epoch that it reads
  (``carry``) before its own ``order``;
* ``pack``: whole sequences packed into rows of ``seq_len + 1`` tokens (best-fit decreasing), a piece per
  sequence at its column;
* ``sentences``: consecutive sentences of one document up to ``seq_len + 1`` tokens (BERT-style).

Samples of an epoch are served in a keyed pseudorandom order. :meth:`LMSource.pieces` turns any set of
(epoch, sample) pairs into pieces in one vectorised pass, checking that every record it reads lies inside the
``.bin``; the gather then copies every piece of a batch at once (``gather.scatter``). The per-epoch arrays (sequence order, sample index, pack plan) are cached by
:class:`~babelfeed.lm.blending.IndexCache` under names derived from everything they depend on.
"""

from __future__ import annotations

import os

import numpy as np

from babelfeed.lm.blending import document_splits
from babelfeed.sources.cache import IndexCache
from babelfeed.plan.packing import gpt_sample_index, pack, pack_sentences, ragged_arange, sample_rows
from babelfeed.permute import derive_key, permute
from babelfeed.sources.corpus import open_shared
from babelfeed.sources.rows import check_records
from babelfeed.errors import DataError, UsageError

MODES = ("concat", "pack", "sentences")


class LMSource:
    """One dataset's split, with per-epoch shuffled sequence orders and sample indexes (cached)."""

    def __init__(self, prefix, split: str, split_name: str, seq_len: int, mode: str, seed: int,
                 cache: IndexCache | None, verify: str = "full"):
        if mode not in MODES:
            raise UsageError(f"mode must be one of {MODES}, got {mode!r}")
        self.prefix = os.fspath(prefix)
        self.ds = open_shared(prefix, verify=verify)  # (inside corpus.reusing: a dataset already open)
        # shuffles are keyed by the data (its size hashes), not by how its path is spelled: the same files named
        # relatively, absolutely, through a symlink or mounted elsewhere on another host give the same batches
        self.data_key = self.ds.content_digest
        parts = document_splits(self.ds, split)
        if parts.get(split_name) is None:
            raise DataError(f"{self.prefix}: split {split!r} leaves no documents for {split_name!r}")
        self.sequences = np.arange(parts[split_name][1].start, parts[split_name][1].stop, dtype=np.int64)
        self.documents = parts[split_name][0]
        if not len(self.sequences):
            raise DataError(f"{self.prefix}: the {split_name} split is empty")
        self.seq_len, self.mode, self.seed, self.cache = seq_len, mode, seed, cache
        self.split, self.split_name = split, split_name
        self.at = (-1, 0)  # (token space, first token of this dataset there), set by the iterator
        self._epochs: dict[int, dict] = {}
        self._counts: dict[int, int] = {}
        self._tokens: int | None = None  # tokens per epoch (concat)

    def _describe(self, epoch: int) -> dict:
        st = os.stat(self.prefix + ".idx")
        return {"kind": "lm-epoch", "data": self.data_key, "prefix": os.path.abspath(self.prefix),
                "idx_size": st.st_size, "idx_mtime": st.st_mtime_ns, "split": self.split, "split_name": self.split_name,
                "seq_len": self.seq_len, "mode": self.mode, "seed": self.seed, "epoch": epoch,
                "layout": 2}  # 2: concat epochs carry their leftover tokens, Megatron's sample index rows

    def _order(self, epoch: int) -> np.ndarray:
        return self.sequences[permute(np.arange(len(self.sequences)), len(self.sequences),
                                      derive_key(self.seed, "lm-order", self.data_key, epoch))]

    def epoch_tokens(self) -> int:
        """The tokens of one epoch of this dataset's split."""
        if self._tokens is None:
            self._tokens = int(np.asarray(self.ds.sizes, dtype=np.int64)[self.sequences].sum())
        return self._tokens

    def _cut(self, epochs: int) -> int:
        """Samples of ``seq_len`` + 1 tokens in the first ``epochs`` epochs, cut as one stream (Megatron)."""
        if self._tokens is None:
            self._tokens = int(np.asarray(self.ds.sizes, dtype=np.int64)[self.sequences].sum())
        return max((epochs * self._tokens - 1) // self.seq_len, 0) if epochs else 0

    def _concat(self, epoch: int, order: np.ndarray, sizes: np.ndarray) -> dict:
        """Epoch ``epoch``'s samples ``[N(e-1), N(e))`` of the stream of every epoch's order: the first starts in
        the previous epoch's last sequences (``carry``), whose leftover tokens it reads."""
        if epoch == 1:
            return {"order": order, "carry": order[:0], "sample_index": gpt_sample_index(sizes, order, self.seq_len)}
        first, last = self._cut(epoch - 1), self._cut(epoch)
        prev = self._order(epoch - 1)
        ends = np.cumsum(sizes[prev])
        start = first * self.seq_len - (epoch - 2) * self._tokens  # within the previous epoch's tokens
        a = int(np.searchsorted(ends, start, side="right"))  # the sequence holding that token
        carry = prev[a:]
        skip = start - (int(ends[a - 1]) if a else 0)
        local = sizes[np.concatenate([carry, order])]
        pos, offset = sample_rows(local, skip + np.arange(last - first + 1, dtype=np.int64) * self.seq_len)
        return {"order": order, "carry": carry, "sample_index": np.stack([pos, offset], axis=1)}

    def _build(self, epoch: int) -> dict:
        order = self._order(epoch)
        sizes = np.asarray(self.ds.sizes, dtype=np.int64)
        check_records(self.ds, self.sequences, sizes[self.sequences],
                      np.asarray(self.ds.pointers[self.sequences], dtype=np.int64))  # the plans trust the sizes
        if self.mode == "sentences":
            doc_idx = np.asarray(self.ds.doc_idx)[self.documents.start:self.documents.stop + 1]
            return {"order": order, "sentence_ranges": pack_sentences(sizes, doc_idx, self.seq_len + 1)}
        if self.mode == "concat":
            return self._concat(epoch, order, sizes)
        plan = pack(sizes[order], self.seq_len + 1)
        return {"order": order, "piece_sequence": plan.sequence, "piece_start": plan.start,
                "piece_length": plan.length, "piece_row": plan.row, "piece_offset": plan.offset,
                "num_rows": np.asarray([plan.num_rows], dtype=np.int64)}

    def epoch(self, e: int) -> dict:
        if e not in self._epochs:
            arrays = self.cache.get("lm", self._describe(e), lambda: self._build(e)) if self.cache else self._build(e)
            if self.mode == "pack":  # pieces of each row, in column order (CSR)
                arrays = dict(arrays)
                row, offset = np.asarray(arrays["piece_row"]), np.asarray(arrays["piece_offset"])
                arrays["row_order"] = np.lexsort((offset, row))
                arrays["row_start"] = np.searchsorted(row[arrays["row_order"]],
                                                      np.arange(int(arrays["num_rows"][0]) + 1))
            self._epochs = {e: arrays}  # one epoch at a time in memory
        return self._epochs[e]

    def samples_per_epoch(self, e: int) -> int:
        if self.mode == "concat":  # one stream over the epochs: N(e) - N(e - 1)
            return self._cut(e) - self._cut(e - 1)
        if self.mode == "sentences":  # the same samples every epoch, only reordered
            e = 1
        if e not in self._counts:
            arrays = self.epoch(e)
            self._counts[e] = len(arrays["sentence_ranges"]) if self.mode == "sentences" else int(arrays["num_rows"][0])
        return self._counts[e]

    def locate(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k-th samples drawn from this source -> (epoch, sample served there); epochs follow one another and
        each serves its samples in a keyed pseudorandom order."""
        k = np.asarray(k, dtype=np.int64)
        epoch, j = np.ones(len(k), np.int64), k.copy()
        if len(k):
            e, start = 1, 0
            top = int(k.max())
            while True:
                n = self.samples_per_epoch(e)
                if n <= 0:
                    raise DataError(f"{self.prefix}: an epoch of this split holds no sample of {self.seq_len} tokens")
                inside = (k >= start) & (k < start + n)
                epoch[inside], j[inside] = e, k[inside] - start
                if start + n > top:
                    break
                start += n
                e += 1
        out = np.empty_like(j)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            key = derive_key(self.seed, "lm-samples", self.data_key, e)
            out[sel] = permute(j[sel], self.samples_per_epoch(e), key)
        return epoch, out

    def pieces(self, e: int, samples: np.ndarray, width: int) -> tuple[np.ndarray, dict]:
        """Pieces of ``samples`` of epoch ``e``: (pieces per sample, {"start": token-space address, "length",
        "column": where the piece starts in its row}); pieces of a sample are in column order, and every row is
        at most ``width`` tokens (longer sentence runs are cut, as a reader would)."""
        arrays = self.epoch(e)
        order = np.asarray(arrays["order"])
        sizes = self.ds.sizes
        samples = np.asarray(samples, dtype=np.int64)
        if self.mode == "concat":
            idx = np.asarray(arrays["sample_index"])
            (p0, o0), (p1, o1) = idx[samples].T, idx[samples + 1].T
            count = (p1 - p0 + 1).astype(np.int64)
            p = ragged_arange(p0, count)
            seq = np.concatenate([np.asarray(arrays["carry"], dtype=np.int64), order])[p]
            size = np.asarray(sizes[seq], dtype=np.int64)
            first = np.concatenate([[0], np.cumsum(count)[:-1]])
            is_first = np.zeros(len(p), bool)
            is_first[first] = True
            is_last = np.zeros(len(p), bool)
            is_last[np.cumsum(count) - 1] = True
            start = np.where(is_first, np.repeat(o0, count), 0)
            stop = np.minimum(np.where(is_last, np.repeat(o1, count) + 1, size), size)
            length = np.maximum(stop - start, 0)
        elif self.mode == "sentences":
            ranges = np.asarray(arrays["sentence_ranges"])[samples]
            count = ranges[:, 1] - ranges[:, 0]
            seq = ragged_arange(ranges[:, 0], count)
            start = np.zeros(len(seq), np.int64)
            length = np.asarray(sizes[seq], dtype=np.int64)
        else:
            row_start = np.asarray(arrays["row_start"])
            count = row_start[samples + 1] - row_start[samples]
            m = np.asarray(arrays["row_order"])[ragged_arange(row_start[samples], count)]
            seq = order[np.asarray(arrays["piece_sequence"])[m]]
            start = np.asarray(arrays["piece_start"])[m].astype(np.int64)
            length = np.asarray(arrays["piece_length"])[m].astype(np.int64)
            column = np.asarray(arrays["piece_offset"])[m].astype(np.int64)
        if self.mode != "pack":  # back to back from column 0, cut at the row's width
            before = np.cumsum(length) - length  # tokens of all earlier pieces
            first = np.minimum(np.cumsum(count) - count, max(len(length) - 1, 0))
            column = before - np.repeat(before[first] if len(length) else np.zeros(len(count), np.int64), count)
            length = np.clip(width - column, 0, length)
        pointers = np.asarray(self.ds.pointers[seq], dtype=np.int64)
        check_records(self.ds, seq, sizes[seq], pointers)  # every record read lies inside the .bin, aligned
        address = self.at[1] + pointers // self.ds.dtype.itemsize + start
        return count, {"start": address, "length": length, "column": column, "sequence": seq}
