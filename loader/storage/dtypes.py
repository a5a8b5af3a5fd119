"""dtype-code tables of the ``.idx`` formats and the token-dtype choice of each library.

The tables differ on purpose (see shared/reference/fairseq-megatron-semantics.md §1.4): code 7 is float64 in
fairseq but float32 in Megatron-LM, and codes 9/10 (uint32/uint64) exist only in fairseq >= 0.12.
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import UsageError

FAIRSEQ_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float64),  # np.double: a duplicate of 6, never written (the first match wins)
    8: np.dtype(np.uint16),
    9: np.dtype(np.uint32),
    10: np.dtype(np.uint64),
}

MEGATRON_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}

TABLES = {"fairseq": FAIRSEQ_CODES, "megatron": MEGATRON_CODES, "legacy": FAIRSEQ_CODES}


def code_for(dtype, format: str) -> int | None:
    """The header code ``format``'s own writer stores for ``dtype`` (its first match), or None."""
    dtype = np.dtype(dtype)
    for code, candidate in TABLES[format].items():
        if candidate == dtype:
            return code
    return None


def dtype_for_vocab(vocab_size: int, format: str = "fairseq") -> np.dtype:
    """The token dtype each library's preprocessing picks for a vocabulary of ``vocab_size`` symbols.

    fairseq >= 0.12 (``best_fitting_int_dtype``): uint16 below 65500, else uint32 (int64 past 2**32-1).
    Megatron-LM (``DType.optimal_dtype``) has no uint32 and picks int32 instead. The threshold is 65500 in
    both, not 65536.
    """
    if vocab_size < 0:
        raise UsageError(f"vocab_size must be >= 0, got {vocab_size}")
    if vocab_size < 65500:
        return np.dtype(np.uint16)
    if format == "megatron":
        if vocab_size > np.iinfo(np.int32).max:
            return np.dtype(np.int64)
        return np.dtype(np.int32)
    if vocab_size < 4294967295:
        return np.dtype(np.uint32)
    return np.dtype(np.int64)
