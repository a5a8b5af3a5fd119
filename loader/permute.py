"""Keyed pseudorandom permutations of ``[0, n)`` evaluated at any positions, without building the permutation.

``permute(positions, n, key)`` returns ``pi(positions)`` for a bijection ``pi`` of ``[0, n)`` chosen by ``key``:
a 4-round Feistel network over the smallest even number of bits covering ``n``, with cycle-walking for the
values that land outside ``[0, n)`` (at most 4x the domain, so a few walks on average). It is vectorised
over numpy arrays, O(1) in memory per position, and a pure function of (key, n, position) - the property that
lets an epoch of a billion samples be read window by window, in any process, in any order.
"""

from __future__ import annotations

import hashlib

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.errors import UsageError

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_C1 = np.uint32(0x85EBCA6B)
_C2 = np.uint32(0xC2B2AE35)


def derive_key(*parts) -> np.ndarray:
    """Round keys (uint64[4]) from any tuple of ints/strings: ``derive_key(seed, "mix", epoch, direction)``."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: a fast, well-distributed 64-bit hash
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _mix32(x: np.ndarray) -> np.ndarray:
    # murmur3 finaliser: the 32-bit path, half the memory traffic of the 64-bit one
    x = x ^ (x >> np.uint32(16))
    x = x * _C1
    x = x ^ (x >> np.uint32(13))
    x = x * _C2
    return x ^ (x >> np.uint32(16))


def _feistel(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint32:
        mask, sh, mix = np.uint32((1 << half) - 1), np.uint32(half), _mix32
    else:
        mask, sh, mix = np.uint64((1 << half) - 1), np.uint64(half), _mix
    left = x >> sh
    right = x & mask
    for k in keys[:_ROUNDS]:
        left, right = right, left ^ (mix(right ^ k) & mask)
    return (left << sh) | right


def permute(positions, n: int, key) -> np.ndarray:
    """``pi(positions)`` (int64) for the permutation of ``[0, n)`` selected by ``key`` (from ``derive_key``)."""
    pos = np.asarray(positions, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(pos)
    compiled = plan_kernel.permute(pos, n, key)
    if compiled is not None:
        return compiled
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise UsageError(f"positions must lie in [0, {n})")
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    keys = np.asarray(key, dtype=np.uint64)
    narrow = bits <= 32
    if narrow:
        keys = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    dtype = np.uint32 if narrow else np.uint64
    with np.errstate(over="ignore"):
        out = _feistel(pos.astype(dtype), half, keys)
        limit = dtype(n) if n <= np.iinfo(dtype).max else None
        bad = np.flatnonzero(out >= limit) if limit is not None else np.zeros(0, np.int64)
        while bad.size:  # cycle-walk: re-encrypt until the value falls inside the domain
            walked = _feistel(out[bad], half, keys)
            out[bad] = walked
            bad = bad[walked >= limit]
    return out.astype(np.int64)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of every element of a non-negative int64 array (exact below 2**53)."""
    _, e = np.frexp(x.astype(np.float64))
    return np.where(x > 0, e, 0).astype(np.int64)


_CHUNK = 1 << 16  # elements per pass of permute_many: temporaries stay in cache


# A run of at least this many positions of one permutation is evaluated with scalar keys (faster than per-element)
_RUN = 4096


def permute_many(positions, n, keys, which=None) -> np.ndarray:
    """``permute(positions[i], n[i], keys[i])`` for every i at once: many permutations (one per corpus) evaluated
    in one vectorised pass, bit-identical to calling :func:`permute` per corpus.

    ``n``: int64 per position; ``keys``: uint64 round keys, [len(positions), 4]. With ``which``, ``n`` and
    ``keys`` are per-corpus tables and position i uses row ``which[i]`` of them: long runs of one corpus (where
    ``which`` is grouped) are then evaluated with scalar keys, the many short ones together.
    """
    pos = np.asarray(positions, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.uint64)
    if which is not None:
        compiled = plan_kernel.permute_many(pos, n, keys, which)
        if compiled is not None:
            return compiled
    out = np.zeros(len(pos), dtype=np.int64)
    rest = np.arange(len(pos))
    if which is not None and len(pos):
        which = np.asarray(which, dtype=np.int64)
        cuts = np.flatnonzero(which[1:] != which[:-1]) + 1
        starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(pos)]])
        long = (ends - starts) >= _RUN
        for a, b in zip(starts[long].tolist(), ends[long].tolist()):
            c = int(which[a])
            out[a:b] = permute(pos[a:b], int(n[c]), keys[c])
        if long.any():
            rest = np.concatenate([np.arange(a, b) for a, b in zip(starts[~long], ends[~long])] or
                                  [np.zeros(0, np.int64)])
    for a in range(0, len(rest), _CHUNK):
        sel = rest[a:a + _CHUNK]
        if which is None:
            out[sel] = _permute_chunk(pos[sel], n[sel], keys[sel])
        else:
            w = which[sel]
            out[sel] = _permute_chunk(pos[sel], n[w], keys[w])
    return out


def _permute_chunk(pos, n, keys) -> np.ndarray:
    out = np.zeros(len(pos), dtype=np.int64)
    if (pos < 0).any() or ((pos >= n) & (n > 1)).any():
        raise UsageError("positions must lie in [0, n)")
    bits = np.maximum(2, _bit_length(np.maximum(n - 1, 0)))
    bits += bits % 2
    live = n > 1
    with np.errstate(over="ignore"):
        for narrow in (True, False):
            sel = np.flatnonzero(live & ((bits <= 32) == narrow))
            if not len(sel):
                continue
            dtype = np.uint32 if narrow else np.uint64
            k = (keys[sel, :_ROUNDS] & np.uint64(0xFFFFFFFF)).astype(np.uint32) if narrow else keys[sel, :_ROUNDS]
            half = (bits[sel] // 2).astype(dtype)
            mask = ((np.ones(len(sel), dtype) << half) - dtype(1)).astype(dtype)
            limit = n[sel].astype(np.uint64)  # 2**32 rows fit 32-bit lanes but not a uint32 limit
            got = _feistel_many(pos[sel].astype(dtype), half, mask, k, narrow)
            bad = np.flatnonzero(got >= limit)
            while bad.size:  # cycle-walk, each element within its own permutation's domain
                walked = _feistel_many(got[bad], half[bad], mask[bad], k[bad], narrow)
                got[bad] = walked
                bad = bad[walked >= limit[bad]]
            out[sel] = got.astype(np.int64)
    return out


def _feistel_many(x, half, mask, keys, narrow: bool):
    mix = _mix32 if narrow else _mix
    left = x >> half
    right = x & mask
    for r in range(_ROUNDS):
        left, right = right, left ^ (mix(right ^ keys[:, r]) & mask)
    return (left << half) | right
