"""Read ``.idx``/``.bin`` token files written by fairseq or Megatron-LM, memory-mapped.

Three index layouts share one reader (byte tables in shared/reference/fairseq-megatron-semantics.md §1):

* fairseq MMIDIDX: 26-byte header, int32 sizes, int64 byte pointers, no document index;
* Megatron-LM MMIDIDX: the same magic, a 34-byte header with a document count, then the document index, and
  optionally int8 per-sequence modes (nothing in the header says so);
* fairseq's legacy lazy/cached "TNTIDX" format (token values stored +1).

The two MMIDIDX layouts are told apart by the file size alone, which is unambiguous: with ``n`` the count at
byte 18, fairseq's file is ``26 + 12 n`` bytes and Megatron's ``34 + 12 n + 8 d`` (``+ n`` with modes), and
``8 + 8 d`` can never be 0. Opening reads a small index (maps a large one) and parses the header; no per-record
Python work happens. The ``.bin`` is mapped on first read. Mappings hold no file descriptor (``mapping.py``), so
a run over thousands of corpora keeps no file open.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import BadMagicError, CallOrderError, DataChangedError, OutOfRange, TruncatedFileError, UsageError
from . import stamps
from .index_format import (FAIRSEQ_HEADER,  # noqa: F401  (the magics are part of this module's interface)
                           LEGACY_HEADER, MEGATRON_HEADER, MMIDIDX_MAGIC, TNTIDX_MAGIC, _Index, _parse_mmidx,
                           _parse_tntidx)
from .mapping import map_file
from .remote.client import ensure, is_shadow
from .verify import IndexChecks


VERIFY_MODES = ("full", "quick")


def index_path(prefix) -> str:
    return os.fspath(prefix) + ".idx"


def data_path(prefix) -> str:
    return os.fspath(prefix) + ".bin"


def dataset_exists(prefix) -> bool:
    """True when both ``prefix.idx`` and ``prefix.bin`` exist."""
    return os.path.exists(index_path(prefix)) and os.path.exists(data_path(prefix))


class IndexedDataset(IndexChecks):
    """A memory-mapped ``.idx``/``.bin`` token dataset, as written by fairseq or Megatron-LM.

    >>> ds = IndexedDataset("data_bin/shard000/train.eng_Latn-tur_Latn.eng_Latn")   # doctest: +SKIP
    >>> len(ds), ds.dtype, ds.format                                                # doctest: +SKIP
    (40, dtype('uint32'), 'fairseq')
    >>> ds[0]                     # tokens of sequence 0, in the stored dtype (a read-only view)  # doctest: +SKIP
    >>> ds.get(0, offset=1, length=2)                                                # doctest: +SKIP

    ``verify`` chooses how much of the index is checked at open:

    * ``"full"`` (default): every size is >= 0 and every pointer equals the running sum of the sizes before it
      (vectorised, in bounded chunks; about 10 ms per million records), document indices are monotone and end
      at the sequence count, and the ``.bin`` holds every byte the index refers to. A passed check is
      remembered by a stamp of the files' identity (:mod:`~babelfeed.storage.stamps`), so later opens of the same
      unchanged files cost O(1); a file rewritten, replaced or touched is checked again.
    * ``"quick"``: O(1) checks of the records (header, file sizes, first and last pointer, and 256 evenly spaced
      records) and the document index whole (monotone from 0 to the sequence count: one pass over the documents,
      which an LM samples by). Every read checks that its record lies inside the ``.bin``, but a size or
      pointer corrupted in the middle of the index can then hand out a record that overlaps its neighbour:
      use it only on data already checked (``babelfeed inspect --verify``).

    ``content_digest`` is a hash of the sizes (and document index): the identity of the data a resumable run
    keys its fingerprint and shuffles on, computed once per file and remembered with the stamp.

    fairseq's multi-worker preprocessing corrupts pointers once a ``.bin`` passes 2 GiB (an int32 overflow,
    fairseq issue #5532). Such a file fails the check with an error saying so; ``recompute_pointers=True``
    rebuilds the pointers from the sizes (int64 running sum, held in memory) and reads it correctly.
    """

    def __init__(self, prefix, *, verify: str = "full", recompute_pointers: bool = False, _checked=None):
        if verify not in VERIFY_MODES:
            raise UsageError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.prefix = os.fspath(prefix)
        self.index_file = index_path(prefix)
        self.data_file = data_path(prefix)
        self._verify = verify
        self._recompute = bool(recompute_pointers)
        self._remote: bool | None = None  # whether the .bin is a remote file's shadow (looked up on first read)
        self._bin_map = None
        # One stat per file: the identity a stamp is checked against, and the sizes the layout is checked with.
        self._ids = [stamps.identity_of(_stat(self.index_file)),
                     stamps.identity_of(_stat(self.data_file), self.data_file)]
        self._facts = stamps.lookup_ids(self.index_file, self._ids)
        if _checked is not None and _checked == self._ids:  # checked by the process that pickled it
            self._facts["verified"] = True
        self._open(self._ids[0][2], self._ids[1][2])
        if self._full and not self._recompute:
            stamps.record_ids(self.index_file, self._ids, verified=True, digest=self.content_digest,
                              shortest=self.shortest)

    # ----------------------------------------------------------------------------------------- opening
    def _open(self, idx_size: int, bin_size: int) -> None:
        idx_buf = b""
        if idx_size:
            idx_buf = _read_index(self.index_file, idx_size)
        head = bytes(idx_buf[:9])
        if head.startswith(TNTIDX_MAGIC):
            index = _parse_tntidx(self.index_file, idx_buf, idx_size)
        elif head == MMIDIDX_MAGIC:
            index = _parse_mmidx(self.index_file, idx_buf, idx_size)
        elif head and (MMIDIDX_MAGIC.startswith(head) or TNTIDX_MAGIC.startswith(head)):
            raise TruncatedFileError(self.index_file, f"index is {idx_size} bytes, cut off inside the magic")
        elif not head:
            raise TruncatedFileError(self.index_file, "index file is empty")
        else:
            raise BadMagicError(
                self.index_file,
                f"not a fairseq/Megatron index: starts with {head.hex()} where "
                f"{MMIDIDX_MAGIC.hex()} (MMIDIDX) or {TNTIDX_MAGIC.hex()} (TNTIDX) was expected",
            )
        self._index = index
        # the full check, unless one passed on these very files before
        self._full = self._verify == "full" and not self._facts.get("verified")
        self.dtype: np.dtype = index.dtype
        self.format: str = index.format
        self.dtype_code: int = index.dtype_code
        self._itemsize = index.dtype.itemsize
        self._bin_size = bin_size
        self._bin_map = None  # mapped on first read: a loader that gathers through a flat space never maps it here
        if index.format == "legacy":
            self._check_legacy(index)
            self._pointers = index.end_pointers[:-1] * self._itemsize
        else:
            self._pointers = index.pointers
            self._check_mmidx(index)
        self._doc_idx = None
        self._tokens = None

    @property
    def _bin(self):
        if self._bin_map is None:
            if self._index is None:
                raise CallOrderError(f"{self.prefix}: the dataset is closed")
            self._bin_map = map_file(self.data_file, inode=self.bin_inode) if self._bin_size else b""
            if len(self._bin_map) < self._bin_size:
                raise TruncatedFileError(self.data_file, f".bin is {len(self._bin_map)} bytes, {self._bin_size} when "
                                                         f"the index was opened: the file changed under the reader")
        return self._bin_map

    @property
    def bin_size(self) -> int:
        """Size of the ``.bin`` in bytes when the dataset was opened."""
        return self._bin_size

    @property
    def bin_inode(self) -> int:
        """The ``.bin``'s inode when the dataset was opened: the file its index describes. Its mapping refuses
        another file at the path, and the fetcher another version of a remote one (each request names it)."""
        return self._ids[1][1]

    # ----------------------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self._index.sizes)

    @property
    def sizes(self) -> np.ndarray:
        """Tokens per sequence: int32 (int64 for the legacy format), read-only, memory-mapped."""
        return self._index.sizes

    @property
    def content_digest(self) -> str:
        """A hash of the format, dtype, sizes, document index and modes: what identifies the data whatever its
        path. Computed once per file (remembered with the verification stamp)."""
        digest = self._facts.get("digest")
        if digest is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{self.format}:{self.dtype.str}:{len(self)}:".encode())
            for part in (self._index.sizes, self._index.doc_idx, self._index.modes):
                if part is not None:
                    h.update(np.ascontiguousarray(part).data)
                h.update(b"|")
            digest = self._facts["digest"] = h.hexdigest()
            self._facts["shortest"] = int(self._index.sizes.min()) if len(self) else 0
            if not self._full:
                stamps.record_ids(self.index_file, self._ids, digest=digest, shortest=self._facts["shortest"])
        return digest

    @property
    def shortest(self) -> int:
        """The fewest tokens of any record (0 when there is none), remembered with the stamp like the digest."""
        if "shortest" not in self._facts:
            self._facts.pop("digest", None)  # computed together
            _ = self.content_digest
        return int(self._facts["shortest"])

    @property
    def pointers(self) -> np.ndarray:
        """Byte offset of every sequence in the ``.bin`` (int64)."""
        return self._pointers

    @property
    def doc_idx(self) -> np.ndarray:
        """Document boundaries ``[0, e1, ..., N]`` (int64). fairseq files have one document per sequence."""
        if self._index.doc_idx is not None:
            return self._index.doc_idx
        if self._doc_idx is None:
            self._doc_idx = np.arange(len(self) + 1, dtype=np.int64)
        return self._doc_idx

    @property
    def modes(self) -> np.ndarray | None:
        """Megatron per-sequence modes (int8) when the file has them, else None."""
        return self._index.modes

    @property
    def tokens(self) -> np.ndarray:
        """Every token of the ``.bin`` as one flat read-only array (stored values; see ``token_shift``).

        The vectorised gather reads ``tokens[pointers[i] // itemsize + j]`` for whole batches at once.
        """
        if self._tokens is None:
            count = self._bin_size // self._itemsize
            self._tokens = np.frombuffer(self._bin, dtype=self.dtype, count=count) if count else np.zeros(0, self.dtype)
        return self._tokens

    @property
    def token_shift(self) -> int:
        """Subtract from stored values to get token ids: 1 for the legacy TNTIDX format, else 0."""
        return self._index.token_shift

    @property
    def num_tokens(self) -> int:
        n = len(self)
        return (int(self._pointers[-1]) // self._itemsize + int(self.sizes[-1])) if n else 0

    @property
    def num_documents(self) -> int:
        return len(self.doc_idx) - 1

    def _span(self, i: int) -> tuple[int, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise OutOfRange(f"{self.prefix}: record {i} out of range for {n} records")
        size = int(self._index.sizes[i])
        ptr = int(self._pointers[i])
        if size < 0 or ptr < 0 or ptr % self._itemsize or ptr + size * self._itemsize > self._bin_size:
            self._fail(
                f"record {i} (pointer {ptr}, size {size}) lies outside the {self._bin_size}-byte .bin "
                f"({self.data_file}) or is misaligned for {self.dtype.name}"
            )
        return ptr, size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.get(int(i))

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of record ``i`` (to its end when ``length`` is None)."""
        ptr, size = self._span(int(i))
        if not 0 <= offset <= size:
            raise OutOfRange(f"{self.prefix}: offset {offset} outside record {i} of {size} tokens")
        if length is None:
            length = size - offset
        if length < 0 or offset + length > size:
            raise OutOfRange(f"{self.prefix}: length {length} at offset {offset} runs past record {i} of {size} tokens")
        if self._remote is None:
            self._remote = is_shadow(self.data_file)
        if self._remote and length:  # a remote .bin's shadow: its bytes are fetched before they are read
            a = ptr + offset * self._itemsize
            ensure(self.data_file, [a], [a + length * self._itemsize], inode=self.bin_inode)
        out = np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=ptr + offset * self._itemsize)
        if self._index.token_shift:
            out = out - np.asarray(self._index.token_shift, dtype=self.dtype)
        return out

    def __iter__(self):
        for i in range(len(self)):
            yield self.get(i)

    # ----------------------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Drop the maps. Views handed out earlier keep their own reference and stay valid."""
        self._index = self._pointers = self._tokens = None
        self._bin_map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        # Picklable for worker processes: reopened from the path. The parent's check carries over only to the
        # very files it checked (same identity); a file replaced since is refused (the parent planned from the
        # old one).
        checked = self._verify == "full" and not self._recompute
        return {"prefix": self.prefix, "recompute_pointers": self._recompute, "verify": self._verify,
                "checked": self._ids if checked else None, "opened": self._ids}

    def __setstate__(self, state):
        self.__init__(state["prefix"], verify=state.get("verify", "full"),
                      recompute_pointers=state["recompute_pointers"], _checked=state.get("checked"))
        for path, was, now in zip((self.index_file, self.data_file), state.get("opened") or (), self._ids):
            if stamps.replaced(was, now):
                raise DataChangedError(path, "replaced since the process that sent this dataset opened it: that "
                                             "process planned from the old file, and reading the new one here would "
                                             "mix two versions of the data. Restart from the last saved state")

    def __repr__(self) -> str:
        return (
            f"IndexedDataset({self.prefix!r}, format={self.format!r}, dtype={self.dtype.name}, "
            f"sequences={len(self)})"
        )


# Indexes up to this size are read into memory rather than mapped: a mapping costs one of the kernel's limited
# mappings per file (vm.max_map_count, 65,530 by default), which thousands of small corpora would exhaust.
_READ_BELOW = 1 << 18


def _read_index(path: str, size: int):
    if size < _READ_BELOW:
        with open(path, "rb") as f:
            return f.read()
    return map_file(path, size)


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(2, "No such file (an indexed dataset needs both .idx and .bin)", path) from None
