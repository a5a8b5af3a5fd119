"""What a set of planned samples holds, per stream: the counts the ledger adds up (``iterators.ledger``)."""

from __future__ import annotations

import numpy as np

from babelfeed._native import plan_kernel

FIELDS = ("samples", "src_tokens", "tgt_tokens")


def window_totals(direction: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray, streams: int) -> np.ndarray:
    """``int64[3, streams]``: samples, source tokens and target tokens per stream of a set of samples."""
    got = plan_kernel.stream_totals(direction, src_len, tgt_len, streams)
    if got is not None:
        return got
    d = np.asarray(direction, np.int64)
    out = np.empty((3, streams), np.int64)
    out[0] = np.bincount(d, minlength=streams)
    out[1] = np.bincount(d, weights=np.asarray(src_len, np.float64), minlength=streams).round()
    out[2] = np.bincount(d, weights=np.asarray(tgt_len, np.float64), minlength=streams).round()
    return out

