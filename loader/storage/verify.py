"""The checks an index gets at open (``verify="full"`` / ``"quick"``), as a mixin of ``IndexedDataset``: sizes
against pointers, document indices, the ``.bin`` covering every record. Messages name the file and record."""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import FormatError, InconsistentIndexError, TruncatedFileError
from . import stamps
from .remote.client import is_shadow


# Records checked per chunk by the full pointer check: bounds the temporary memory to ~100 MB.
_CHUNK = 1 << 22
# Evenly spaced records whose pointers the quick check compares with their neighbour (each probe costs a
# page fault; every read checks its own bounds anyway).
_QUICK_SAMPLES = 256


class IndexChecks:
    """Needs ``index_file``, ``data_file``, ``format``, ``_itemsize``, ``_bin_size``, ``_pointers``, ``_full``,
    ``_recompute`` and ``_facts`` (what a stamp remembers) from the dataset."""

    def _fail(self, message: str, path: str | None = None):
        raise InconsistentIndexError(path or self.index_file, message)

    def _check_sizes_nonnegative(self, sizes: np.ndarray) -> None:
        for start in range(0, len(sizes), _CHUNK):
            chunk = sizes[start : start + _CHUNK]
            bad = np.flatnonzero(chunk < 0)
            if bad.size:
                i = start + int(bad[0])
                self._fail(f"record {i} has negative size {int(sizes[i])}")

    def _check_running_sum(self, sizes: np.ndarray, stored: np.ndarray, unit: int, what: str) -> None:
        """Compare ``stored`` (N) with the exclusive running sum of ``sizes`` times ``unit``, chunk by chunk."""
        carry = 0
        for start in range(0, len(sizes), _CHUNK):
            chunk = sizes[start : start + _CHUNK].astype(np.int64)
            expected = np.cumsum(chunk) - chunk + carry
            if unit != 1:
                expected *= unit
            got = stored[start : start + _CHUNK]
            bad = np.flatnonzero(got != expected)
            if bad.size:
                i = start + int(bad[0])
                self._pointer_mismatch(i, int(got[bad[0]]), int(expected[bad[0]]), what)
            carry += int(chunk.sum())

    def _pointer_mismatch(self, i: int, got: int, expected: int, what: str) -> None:
        if self.format == "fairseq" and got != expected and (expected - got) % (1 << 32) == 0:
            # off by whole multiples of 2^32: the signature of an int32 running sum
            self._fail(f"{what} of record {i} is {got}, but the sizes before it add up to {expected}: off by a "
                       f"multiple of 2^32, as fairseq's multi-worker preprocess writes pointers once the .bin passes "
                       f"2 GiB (int32 overflow, fairseq issue #5532). Open with recompute_pointers=True to rebuild "
                       f"the pointers from the sizes.")
        self._fail(f"{what} of record {i} is {got}, but the sizes before it add up to {expected}: records overlap "
                   f"or leave gaps (a corrupt index, or one that belongs to another .bin)")

    def _check_mmidx(self, index: _Index) -> None:
        n = len(index.sizes)
        sizes = index.sizes
        if index.doc_idx is not None:
            self._check_doc_idx(index.doc_idx, n)
        if self._recompute:
            self._check_sizes_nonnegative(sizes)
            ends = np.cumsum(sizes, dtype=np.int64)
            self._pointers = (ends - sizes) * self._itemsize
            total = int(ends[-1]) * self._itemsize if n else 0
        elif self._full:
            self._check_sizes_nonnegative(sizes)
            self._check_running_sum(sizes, self._pointers, self._itemsize, "byte pointer")
            total = int(self._pointers[-1]) + int(sizes[-1]) * self._itemsize if n else 0
        elif self._facts.get("verified"):
            total = int(self._pointers[-1]) + int(sizes[-1]) * self._itemsize if n else 0
        else:
            total = self._quick_check(sizes, self._pointers, self._itemsize)
        self._check_bin_covers(total)

    def _quick_check(self, sizes: np.ndarray, pointers: np.ndarray, unit: int) -> int:
        n = len(sizes)
        if n == 0:
            return 0
        if int(pointers[0]) != 0:
            self._pointer_mismatch(0, int(pointers[0]), 0, "byte pointer")
        k = min(n, _QUICK_SAMPLES)
        probe = (np.arange(k, dtype=np.int64) * (n - 1)) // max(k - 1, 1)  # evenly spaced, distinct, ends included
        neg = probe[sizes[probe] < 0]
        if neg.size:
            self._fail(f"record {int(neg[0])} has negative size {int(sizes[neg[0]])}")
        inner = probe[probe < n - 1]
        step = pointers[inner + 1] - pointers[inner]
        bad = np.flatnonzero(step != sizes[inner].astype(np.int64) * unit)
        if bad.size:
            i = int(inner[bad[0]])
            self._pointer_mismatch(i + 1, int(pointers[i + 1]), int(pointers[i]) + int(sizes[i]) * unit, "byte pointer")
        return int(pointers[-1]) + int(sizes[-1]) * unit

    def check_ends_with(self, token: int, name: str = "</s>", fetched: bool = False) -> None:
        """Every record's last token is ``token`` (stored value): fairseq's builders, babelfeed's included, end each
        sentence with ``</s>``, so a record that does not is not a sentence: the tail of a ``.bin`` zeroed or
        overwritten after a crash, a sparse copy, another file's bytes. ``verify="full"``: every record, read once
        per file (a stamp remembers); ``"quick"``: the last 4,096 records (where a zeroed tail shows) and 256
        spread over the file. Raises FormatError naming the file and the first record that fails. A remote
        ``.bin`` is checked only when ``fetched`` (its shadow holds all of it)."""
        key = f"ends_with_{int(token)}"
        if self._facts.get(key):
            return
        n = len(self)
        if not n:
            return
        sizes = self._index.sizes

        if is_shadow(self.data_file) and not fetched:  # a remote .bin: every row is checked as the gather
            return  # fetches it (collate's _check_ends); checking here would fetch its records at open
        if self._verify == "full":
            picks = None
        else:
            picks = np.unique(np.concatenate([np.linspace(0, n - 1, min(n, _QUICK_SAMPLES)).astype(np.int64),
                                              np.arange(max(0, n - 4096), n)]))
        tokens = self.tokens
        for start in range(0, n if picks is None else len(picks), _CHUNK):
            rows = np.arange(start, min(n, start + _CHUNK)) if picks is None else picks[start:start + _CHUNK]
            size = sizes[rows].astype(np.int64)
            end = self._pointers[rows].astype(np.int64) // self._itemsize + size - 1  # (pointers are in bytes)
            # (a record outside the .bin, which a quick check does not look for, is the reads' to refuse by name)
            inside = (end >= 0) & (end < len(tokens))
            ok = (size > 0) | ~inside
            look = inside & (size > 0)
            ok[look] = tokens[end[look]] == token
            if not ok.all():
                k = int(np.flatnonzero(~ok)[0])
                last = f"token {int(tokens[end[k]])}" if size[k] else "nothing (an empty record)"
                raise FormatError(self.data_file, f"record {int(rows[k])} ends with {last}, not {name} (id "
                                                  f"{int(token)}): each record of a fairseq data_bin is a sentence "
                                                  f"ending with {name}. The .bin was damaged (a tail zeroed or "
                                                  f"overwritten after a crash, a sparse copy) or belongs to another "
                                                  f"index: binarize it again")
        if picks is None:  # (a quick check proves nothing for the whole file: nothing remembered)
            self._facts[key] = True
            stamps.record_ids(self.index_file, self._ids, **{key: True})

    def _check_bin_covers(self, total_bytes: int) -> None:
        if total_bytes > self._bin_size:
            raise TruncatedFileError(
                self.data_file,
                f".bin is {self._bin_size} bytes but the index ({self.index_file}) refers to {total_bytes} bytes "
                f"({len(self)} records of {self.dtype.name}): the file was cut short or belongs to another index",
            )
        if total_bytes < self._bin_size:
            warnings.warn(
                f"{self.data_file}: {self._bin_size - total_bytes} trailing bytes after the last record "
                f"that the index does not refer to",
                stacklevel=5,  # the caller of IndexedDataset(...)
            )

    def _check_doc_idx(self, doc_idx: np.ndarray, n: int) -> None:
        if len(doc_idx) == 0:
            self._fail("document index is empty; it must start with 0 and end with the sequence count")
        if int(doc_idx[0]) != 0 or int(doc_idx[-1]) != n:
            self._fail(
                f"document index runs from {int(doc_idx[0])} to {int(doc_idx[-1])}, "
                f"it must run from 0 to the sequence count {n}"
            )
        if not self._full and self._verify != "quick":
            return  # checked in full on these very files before (the stamp)
        # "quick" too: one vectorised pass over the documents (an LM samples by them; sentence data has two entries)
        for start in range(0, len(doc_idx) - 1, _CHUNK):
            chunk = doc_idx[start : start + _CHUNK + 1]
            bad = np.flatnonzero(np.diff(chunk) < 0)
            if bad.size:
                j = start + int(bad[0])
                self._fail(f"document index decreases at document {j}: {int(doc_idx[j])} then {int(doc_idx[j + 1])}")

    def _check_legacy(self, index: _Index) -> None:
        n = len(index.sizes)
        dims, ends = index.dim_offsets, index.end_pointers
        if int(dims[0]) != 0 or int(dims[-1]) != n or int(ends[0]) != 0:
            self._fail(
                f"offsets must start at 0 (dim {int(dims[0])}, data {int(ends[0])}) and dim offsets end at {n} "
                f"(got {int(dims[-1])})"
            )
        if self._full or self._recompute:
            self._check_sizes_nonnegative(index.sizes)
            self._check_running_sum(np.ones(n, dtype=np.int64), dims[:-1], 1, "dim offset")
            self._check_running_sum(index.sizes, ends[:-1], 1, "data offset")
            if n and int(ends[-1]) != int(ends[-2]) + int(index.sizes[-1]):
                self._pointer_mismatch(n, int(ends[-1]), int(ends[-2]) + int(index.sizes[-1]), "data offset")
        elif not self._facts.get("verified"):
            self._quick_check(index.sizes, ends[:-1], 1)
        self._check_bin_covers(int(ends[-1]) * self._itemsize)
