"""Write ``.idx``/``.bin`` token files byte-identical to fairseq's or Megatron-LM's own builders.

Writes are atomic: tokens go to a temporary file beside the target, the index is written to another, both
are fsynced, any old index is removed, and the two are renamed into place ``.bin`` first and ``.idx`` last.
A writer killed at any point leaves either the complete new pair or no ``.idx`` at all, so nothing that
:class:`~babelfeed.IndexedDataset` would open. Temporaries end in ``.partial``.
"""

from __future__ import annotations

import array
import os
import struct

import numpy as np

from ..errors import CallOrderError, DataError, UnsupportedDtypeError, UsageError
from ..fileio import NamedWrites, atomic_write, create_temp, fsync_dir
from .dtypes import TABLES, code_for
from .indexed import MMIDIDX_MAGIC, IndexedDataset, data_path, index_path

FORMATS = ("megatron", "fairseq")
DEFAULT_DTYPE = {"megatron": np.int32, "fairseq": np.int64}  # each library's own builder default
_INT32_MAX = np.iinfo(np.int32).max


class IndexedDatasetBuilder:
    """Append token sequences, then ``finalize()`` into ``prefix.bin`` / ``prefix.idx``.

    ``format="megatron"`` writes Megatron-LM's layout (document index; ``end_document()`` closes a document),
    ``format="fairseq"`` writes fairseq's (no document index; every sequence is its own document). For the same
    sequences the files are byte-identical to what ``megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder``
    or ``fairseq.data.indexed_dataset.MMapIndexedDatasetBuilder`` write.

    >>> with IndexedDatasetBuilder("/tmp/demo", np.uint16, format="megatron") as b:   # doctest: +SKIP
    ...     b.add_item([5, 6, 2]); b.add_item([7, 2]); b.end_document()
    ...     b.finalize()

    Values that do not fit ``dtype`` raise instead of wrapping. A document still open at ``finalize()`` is
    closed (Megatron's builder would write an index its own reader rejects). Leaving the ``with`` block on an
    exception, or calling ``abort()``, deletes the temporaries.
    """

    def __init__(self, prefix, dtype=None, format: str = "megatron", multimodal: bool = False):
        if format not in FORMATS:
            raise UsageError(f"format must be one of {FORMATS}, got {format!r}")
        self.format = format
        self.dtype = np.dtype(DEFAULT_DTYPE[format] if dtype is None else dtype)
        self.dtype_code = code_for(self.dtype, format)
        if self.dtype_code is None:
            known = ", ".join(sorted({d.name for d in TABLES[format].values()}))
            raise UnsupportedDtypeError(
                f"the {format} index format has no dtype code for {self.dtype.name} (it can store: {known})"
                + ("; uint32/uint64 exist only in fairseq's table" if format == "megatron" else "")
            )
        if multimodal and format != "megatron":
            raise UsageError("sequence modes exist only in the megatron format")
        self.prefix = os.fspath(prefix)
        self.multimodal = multimodal
        directory = os.path.dirname(self.prefix) or "."
        os.makedirs(directory, exist_ok=True)  # the prefix's folder, as `open` would not: "out/train" just works
        base = os.path.basename(self.prefix)
        fd, self._tmp_bin = create_temp(directory, f".{base}.", ".bin.partial")
        self._data = NamedWrites(os.fdopen(fd, "wb"), self.prefix + ".bin")  # (a full disk names the file)
        self._sizes = array.array("q")
        self._doc_idx = array.array("q", [0])
        self._modes = array.array("b")
        self._finalized = False
        self._integer = self.dtype.kind in "iu"
        if self._integer:
            info = np.iinfo(self.dtype)
            self._lo, self._hi = int(info.min), int(info.max)

    def __len__(self) -> int:
        return len(self._sizes)

    # -------------------------------------------------------------------------------------- adding
    def _convert(self, tokens) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.dtype == self.dtype:
            return arr.ravel()
        if self._integer and arr.size:
            if arr.dtype.kind not in "iub":
                if arr.dtype.kind != "f" or not np.all(np.floor(arr) == arr):
                    raise DataError(f"{self.prefix}: token values must be integers, got {arr.dtype}")
            lo, hi = arr.min(), arr.max()
            if lo < self._lo or hi > self._hi:
                bad = lo if lo < self._lo else hi
                raise DataError(
                    f"{self.prefix}: token value {bad} does not fit {self.dtype.name} "
                    f"[{self._lo}, {self._hi}] (sequence {len(self._sizes)}); choose a wider dtype"
                )
        return arr.astype(self.dtype).ravel()

    def add_item(self, tokens, mode: int = 0) -> None:
        """Append one sequence (any array-like of token ids; multi-dimensional input is flattened)."""
        self._check_open()
        arr = self._convert(tokens)
        self._data.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)
        if self.multimodal:
            self._modes.append(mode)

    def add_items(self, tokens, lengths, modes=None, one_document_each: bool = False) -> None:
        """Append many sequences at once: ``tokens`` is their concatenation, ``lengths`` their sizes.

        ``one_document_each=True`` closes a document after every sequence (Megatron's NMT preprocessing
        writes sentences that way).
        """
        self._check_open()
        lengths = np.asarray(lengths, dtype=np.int64)
        arr = self._convert(tokens)
        if lengths.ndim != 1 or (lengths.size and lengths.min() < 0) or int(lengths.sum()) != arr.size:
            raise DataError(
                f"{self.prefix}: lengths must be non-negative and add up to the {arr.size} tokens given "
                f"(they add up to {int(lengths.sum())})"
            )
        if self.multimodal:  # (checked before anything is written: one mode per sequence, or the index is unreadable)
            m = np.zeros(len(lengths), np.int8) if modes is None else np.asarray(modes, np.int8)
            if m.shape != (len(lengths),):
                raise UsageError(f"{self.prefix}: add_items got {m.size} mode(s) for {len(lengths)} sequence(s); "
                                 f"give one mode per sequence")
        self._data.write(arr.tobytes(order="C"))
        first = len(self._sizes)
        self._sizes.frombytes(lengths.astype("<i8").tobytes())
        if one_document_each:
            self._doc_idx.frombytes(np.arange(first + 1, len(self._sizes) + 1, dtype="<i8").tobytes())
        if self.multimodal:
            self._modes.frombytes(m.tobytes())

    def add_documents(self, tokens, lengths, sequences_per_document) -> None:
        """Append whole documents: ``tokens`` and ``lengths`` as in :meth:`add_items`, and how many of those
        sequences each document holds (each at least one)."""
        counts = np.asarray(sequences_per_document, dtype=np.int64)
        if counts.ndim != 1 or (counts.size and counts.min() < 1) or int(counts.sum()) != len(lengths):
            raise DataError(f"{self.prefix}: sequences_per_document must be >= 1 each and add up to the "
                            f"{len(lengths)} sequences given")
        first = len(self._sizes)
        self.add_items(tokens, lengths)
        self._doc_idx.frombytes((first + np.cumsum(counts)).astype("<i8").tobytes())

    def end_document(self) -> None:
        """Close the current document (Megatron); a no-op boundary for the fairseq format."""
        self._check_open()
        self._doc_idx.append(len(self._sizes))

    def add_index(self, prefix) -> None:
        """Append every sequence and document of another dataset with the same dtype (a merge)."""
        self._check_open()
        other = IndexedDataset(prefix)
        if other.dtype != self.dtype or other.format == "legacy":
            raise DataError(
                f"cannot merge {other.prefix} ({other.format}, {other.dtype.name}) into a "
                f"{self.format} {self.dtype.name} builder"
            )
        offset = len(self._sizes)
        self._sizes.frombytes(np.asarray(other.sizes, dtype="<i8").tobytes())
        if self.multimodal:
            modes = other.modes if other.modes is not None else np.zeros(len(other), np.int8)
            self._modes.frombytes(np.asarray(modes, np.int8).tobytes())
        self._doc_idx.frombytes((np.asarray(other.doc_idx[1:], dtype="<i8") + offset).tobytes())
        nbytes = other.num_tokens * other.dtype.itemsize
        other.close()
        with open(data_path(prefix), "rb") as src:
            _copy_bytes(src, self._data, nbytes)

    # -------------------------------------------------------------------------------------- finishing
    def _index_bytes(self) -> bytes:
        sizes = np.frombuffer(self._sizes, dtype=np.int64) if len(self._sizes) else np.zeros(0, np.int64)
        if sizes.size and sizes.max() > _INT32_MAX:
            raise DataError(f"{self.prefix}: a sequence of {int(sizes.max())} tokens does not fit the int32 size field")
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1] * self.dtype.itemsize, out=pointers[1:])
        parts = [MMIDIDX_MAGIC, struct.pack("<Q", 1), struct.pack("<B", self.dtype_code), struct.pack("<Q", len(sizes))]
        if self.format == "megatron":
            doc_idx = np.frombuffer(self._doc_idx, dtype=np.int64)
            if doc_idx[-1] != len(sizes):
                doc_idx = np.append(doc_idx, len(sizes))
            parts.append(struct.pack("<Q", len(doc_idx)))
        parts += [sizes.astype("<i4").tobytes(), pointers.astype("<i8").tobytes()]
        if self.format == "megatron":
            parts.append(doc_idx.astype("<i8").tobytes())
            if self.multimodal:
                parts.append(np.frombuffer(self._modes, dtype=np.int8).tobytes())
        return b"".join(parts)

    def finalize(self, index_file=None) -> None:
        """Write the index and move both files into place atomically.

        ``index_file`` is accepted for drop-in compatibility with the fairseq/Megatron call
        ``finalize(idx_path)``; it must name ``prefix + ".idx"``.
        """
        self._check_open()
        if index_file is not None and os.path.abspath(index_file) != os.path.abspath(index_path(self.prefix)):
            raise UsageError(f"index_file must be {index_path(self.prefix)!r}, got {index_file!r}")
        payload = self._index_bytes()
        self._data.flush()
        self._data.fsync()
        self._data.close()
        # Old .idx first, so no moment exists where an old index sits beside the new .bin; the new index
        # appears last, so a crash anywhere leaves no .idx rather than a half-written pair.
        try:
            os.unlink(index_path(self.prefix))
        except FileNotFoundError:
            pass
        os.replace(self._tmp_bin, data_path(self.prefix))
        atomic_write(index_path(self.prefix), payload)
        fsync_dir(os.path.dirname(self.prefix) or ".")
        self._finalized = True

    def abort(self) -> None:
        """Discard everything written so far; the target files are left untouched."""
        if not self._data.closed:
            try:
                self._data.close()
            except OSError:  # (the write that failed, flushed again: the temporary goes anyway)
                pass
        if os.path.exists(self._tmp_bin):
            os.unlink(self._tmp_bin)
        self._finalized = True

    def _check_open(self) -> None:
        if self._finalized:
            raise CallOrderError(f"{self.prefix}: builder already finalized or aborted")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and not self._finalized:
            self.abort()
        elif not self._finalized:
            self.abort()
            raise CallOrderError(f"{self.prefix}: builder left without finalize(); nothing was written")


def _copy_bytes(src, dst, nbytes: int) -> None:
    remaining = nbytes
    while remaining > 0:
        chunk = src.read(min(remaining, 16 << 20))
        if not chunk:
            raise DataError(f"{src.name}: ended {remaining} bytes early")
        dst.write(chunk)
        remaining -= len(chunk)


def convert_index(src_prefix, dst_prefix, format: str) -> None:
    """Rewrite ``src_prefix`` in another index layout (fairseq <-> Megatron), copying the ``.bin``."""
    src = IndexedDataset(src_prefix)
    builder = IndexedDatasetBuilder(dst_prefix, src.dtype, format=format)
    try:
        builder.add_index(src_prefix)
        builder.finalize()
    except BaseException:
        builder.abort()
        raise
    finally:
        src.close()


__all__ = ["IndexedDatasetBuilder", "convert_index", "FORMATS"]
