"""Parsing the three ``.idx`` layouts (fairseq MMIDIDX, Megatron-LM MMIDIDX, fairseq's legacy TNTIDX) into
arrays over the index bytes; byte tables in shared/reference/fairseq-megatron-semantics.md §1."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import InconsistentIndexError, TruncatedFileError, UnknownDtypeError, UnsupportedVersionError
from .dtypes import TABLES

MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
TNTIDX_MAGIC = b"TNTIDX\x00\x00"
FAIRSEQ_HEADER = 26
MEGATRON_HEADER = 34
LEGACY_HEADER = 48


@dataclass
class _Index:
    format: str  # "fairseq" | "megatron" | "legacy"
    dtype: np.dtype
    dtype_code: int
    sizes: np.ndarray  # tokens per sequence
    pointers: np.ndarray | None  # byte offset of each sequence in .bin (int64)
    doc_idx: np.ndarray | None  # document boundaries, None for fairseq layouts
    modes: np.ndarray | None = None  # Megatron multimodal sequence modes
    token_shift: int = 0  # subtracted from stored values on read (1 for TNTIDX)
    end_pointers: np.ndarray | None = None  # legacy data_offsets (N+1, in elements)
    dim_offsets: np.ndarray | None = None  # legacy per-item shape offsets (N+1)


def _u64(buf, offset: int) -> int:
    return struct.unpack_from("<Q", buf, offset)[0]


def _lookup_dtype(path, code: int, format: str) -> np.dtype:
    table = TABLES[format]
    if code in table:
        return table[code]
    hint = ""
    if format == "megatron" and code in TABLES["fairseq"]:
        hint = (
            f" (code {code} means {TABLES['fairseq'][code].name} in fairseq >= 0.12, but this file has "
            "the Megatron-LM layout, whose table stops at 8)"
        )
    known = ", ".join(f"{c}={d.name}" for c, d in table.items())
    raise UnknownDtypeError(path, f"unknown dtype code {code} for the {format} layout{hint}; known codes: {known}")


def _parse_mmidx(path: str, buf, size: int) -> _Index:
    if size < FAIRSEQ_HEADER:
        raise TruncatedFileError(path, f"index is {size} bytes, shorter than the {FAIRSEQ_HEADER}-byte MMIDIDX header")
    version = _u64(buf, 9)
    if version != 1:
        raise UnsupportedVersionError(path, f"MMIDIDX version {version}, only version 1 is defined")
    code = buf[17]
    n = _u64(buf, 18)
    fairseq_size = FAIRSEQ_HEADER + 12 * n
    if size == fairseq_size:
        fmt, header, d, modes = "fairseq", FAIRSEQ_HEADER, None, False
    else:
        d = _u64(buf, 26) if size >= MEGATRON_HEADER else None
        if d is not None and size == MEGATRON_HEADER + 12 * n + 8 * d:
            fmt, header, modes = "megatron", MEGATRON_HEADER, False
        elif d is not None and size == MEGATRON_HEADER + 13 * n + 8 * d:
            fmt, header, modes = "megatron", MEGATRON_HEADER, True
        else:
            layouts = f"fairseq needs 26 + 12*{n} = {fairseq_size} bytes"
            # (a document index holds a leading 0 and at most one entry per sequence: a larger count is the bytes
            # of a fairseq index, not a Megatron header, and the size it gives means nothing)
            if d is not None and d <= n + 1:
                layouts += (
                    f", Megatron-LM needs 34 + 12*{n} + 8*{d} = {MEGATRON_HEADER + 12 * n + 8 * d} bytes "
                    f"(or {MEGATRON_HEADER + 13 * n + 8 * d} with sequence modes)"
                )
            cls = TruncatedFileError if size < fairseq_size else InconsistentIndexError
            raise cls(path, f"index is {size} bytes for a header that declares {n} sequences: {layouts}")
    dtype = _lookup_dtype(path, code, fmt)
    off = header
    sizes = np.frombuffer(buf, dtype=np.int32, count=n, offset=off)
    off += 4 * n
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=off)
    off += 8 * n
    doc_idx = None
    mode_arr = None
    if fmt == "megatron":
        doc_idx = np.frombuffer(buf, dtype=np.int64, count=d, offset=off)
        off += 8 * d
        if modes:
            mode_arr = np.frombuffer(buf, dtype=np.int8, count=n, offset=off)
    return _Index(fmt, dtype, code, sizes, pointers, doc_idx, mode_arr)


def _parse_tntidx(path: str, buf, size: int) -> _Index:
    if size < LEGACY_HEADER:
        raise TruncatedFileError(path, f"index is {size} bytes, shorter than the {LEGACY_HEADER}-byte TNTIDX header")
    version, code, elem_size, n, s = struct.unpack_from("<5Q", buf, 8)
    if version != 1:
        raise UnsupportedVersionError(path, f"TNTIDX version {version}, only version 1 is defined")
    dtype = _lookup_dtype(path, code, "legacy")
    if elem_size != dtype.itemsize:
        raise InconsistentIndexError(
            path, f"header says element size {elem_size} but dtype code {code} ({dtype.name}) has {dtype.itemsize}"
        )
    expected = LEGACY_HEADER + 16 * (n + 1) + 8 * s
    if size != expected:
        cls = TruncatedFileError if size < expected else InconsistentIndexError
        raise cls(path, f"index is {size} bytes, its header ({n} items, {s} shape entries) implies {expected}")
    if s != n:
        raise InconsistentIndexError(
            path, f"{n} items but {s} shape entries: multi-dimensional items are not token sequences"
        )
    off = LEGACY_HEADER
    dim_offsets = np.frombuffer(buf, dtype=np.int64, count=n + 1, offset=off)
    off += 8 * (n + 1)
    data_offsets = np.frombuffer(buf, dtype=np.int64, count=n + 1, offset=off)
    off += 8 * (n + 1)
    sizes = np.frombuffer(buf, dtype=np.int64, count=s, offset=off)
    return _Index(
        "legacy", dtype, code, sizes, None, None, token_shift=1, end_pointers=data_offsets, dim_offsets=dim_offsets
    )
