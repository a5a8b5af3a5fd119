"""Byte-range arithmetic over sorted, disjoint intervals (numpy arrays of starts and ends): merging, subtracting,
overlaps, and the requests that cover what is missing.
"""

from __future__ import annotations

import os

import numpy as np

from babelfeed.errors import UsageError
from babelfeed.storage.remote import limits


def pack(values, dtype="<i8") -> np.ndarray:
    """An array for a message (carried as raw bytes after its JSON: :func:`send`)."""
    return np.ascontiguousarray(values, dtype=dtype)


def unpack(value, dtype="<i8") -> np.ndarray:
    """:func:`pack`'s inverse, in native byte order; a plain list is taken as it is."""
    return np.asarray(value, dtype=np.dtype(dtype).newbyteorder("="))


def flat_files(files: list, dues: bool = False) -> dict:
    """``[[path, starts, ends(, dues(, inode))], ...]`` as one message part: the paths, each file's count of
    ranges, and the ranges of all of them in three arrays (a hint at 1,000 directions names ~2,000 files: as four
    arrays each, its encoding took 30-100 ms of the thread making batches). A file without dues (None) gets NaN
    (the message's own ``due``); ``inode``: the file the asking reader opened at the path (0 or absent: not said).
    :func:`split_files` is its inverse."""
    starts = [np.asarray(f[1], np.int64).ravel() for f in files]
    ends = [np.asarray(f[2], np.int64).ravel() for f in files]
    own = [np.asarray(f[3], np.float64).ravel() if dues and len(f) > 3 and f[3] is not None else None
           for f in files]  # (each file's dues, where it has them)
    paths = [os.path.abspath(f[0]) for f in files]
    for p, a, b, d in zip(paths, starts, ends, own):
        if len(b) != len(a) or (d is not None and len(d) != len(a)):
            raise UsageError(f"{p}: {len(a):,} range starts, {len(b):,} ends"
                             f"{'' if d is None else f', {len(d):,} dues'}: give as many of each")
    out = {"paths": paths, "counts": pack([len(a) for a in starts]),
           "starts": pack(np.concatenate(starts) if files else []),
           "ends": pack(np.concatenate(ends) if files else [])}
    if dues:
        out["dues"] = pack(np.concatenate([np.full(len(a), np.nan) if d is None else d for a, d in zip(starts, own)])
                           if files else [], "<f8")
    inodes = [int(f[4]) if len(f) > 4 else 0 for f in files]
    if any(inodes):
        out["inodes"] = pack(inodes)
    return out


def split_files(files) -> list:
    """:func:`flat_files`'s inverse: ``[[path, starts, ends, dues or None, inode or 0], ...]`` (views of the
    message's arrays); a list of files is taken as it is."""
    if not isinstance(files, dict):
        return files
    cuts = np.cumsum(unpack(files["counts"]))[:-1]
    starts = np.split(unpack(files["starts"]), cuts)
    ends = np.split(unpack(files["ends"]), cuts)
    dues = np.split(unpack(files["dues"], "<f8"), cuts) if "dues" in files else [None] * len(starts)
    inodes = unpack(files["inodes"]).tolist() if "inodes" in files else [0] * len(starts)
    return [[p, a, b, d, i] for p, a, b, d, i in zip(files["paths"], starts, ends, dues, inodes)]


def merged(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals ``[a, b)`` as sorted, disjoint intervals (touching ones joined; empty ones gone)."""
    return merged_dues(a, b, np.zeros(len(a)))[:2]


def merged_dues(a: np.ndarray, b: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`merged`, each interval with the earliest due ``d`` of those joined into it."""
    a, b, d = np.asarray(a, np.int64), np.asarray(b, np.int64), np.asarray(d, np.float64)
    keep = b > a
    a, b, d = a[keep], b[keep], d[keep]
    if len(a) < 2:
        return a, b, d
    order = np.argsort(a, kind="stable")
    a, b, d = a[order], b[order], d[order]
    reach = np.maximum.accumulate(b)
    first = np.empty(len(a), bool)
    first[0] = True
    first[1:] = a[1:] > reach[:-1]
    at = np.flatnonzero(first)
    return a[at], np.maximum.reduceat(b, at), np.minimum.reduceat(d, at)


def within(a: np.ndarray, b: np.ndarray, ja: np.ndarray, jb: np.ndarray) -> bool:
    """Whether every range ``[a, b)`` lies inside one of the sorted, disjoint intervals ``[ja, jb)``."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not len(ja):
        return not (b > a).any()
    k = np.searchsorted(ja, a, side="right") - 1
    return bool(((b <= a) | ((k >= 0) & (b <= jb[np.maximum(k, 0)]))).all())


def subtract(a: np.ndarray, b: np.ndarray, ha: np.ndarray, hb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[a, b)`` less the union of ``[ha, hb)``: sorted, disjoint intervals."""
    a, b = merged(a, b)
    if not len(a) or not len(ha):
        return a, b
    pts = np.concatenate([a, b, ha, hb])
    n, m = len(a), len(ha)
    dq = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64), np.zeros(2 * m, np.int64)])
    dh = np.concatenate([np.zeros(2 * n, np.int64), np.ones(m, np.int64), -np.ones(m, np.int64)])
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    q, h = np.cumsum(dq[order]), np.cumsum(dh[order])
    last = np.flatnonzero(np.r_[pts[1:] != pts[:-1], True])  # the state after every event at a point
    p = pts[last]
    inside = ((q[last] > 0) & (h[last] == 0))[:-1]
    return merged(p[:-1][inside], p[1:][inside])


def overlap_pairs(a: np.ndarray, b: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(query, piece)`` index pairs of the intervals ``[a, b)`` and the sorted, disjoint ``[pa, pb)`` that
    overlap."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    lo = np.searchsorted(pb, a, side="right")
    hi = np.searchsorted(pa, b, side="left")
    count = np.maximum(hi - lo, 0)
    count[b <= a] = 0
    total = int(count.sum())
    q = np.repeat(np.arange(len(a)), count)
    offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    return q, lo[q] + offsets


def joined_share(share: float, rows: int, size: int, gap: int) -> float:
    """The share of a file's bytes that fetching ``share`` of its ``rows`` (taken evenly at random), joined
    across gaps under ``gap`` bytes, brings: with rows of ``size / rows`` bytes, a run of ``m`` rows not read
    between two read ones is fetched when ``m`` is under ``M = gap / row``; the runs of ``M`` or more (a share
    ``(1 - s)^M (M s + 1 - s)`` of the rows) are not. ``share`` itself when the rows are not known."""
    s = min(max(float(share), 0.0), 1.0)
    if rows <= 0 or size <= 0 or s <= 0.0:
        return s
    m = gap / (size / rows)
    return float(1.0 - (1.0 - s) ** m * (m * s + 1.0 - s)) if s < 1.0 else 1.0


def requests_for(missing: list[tuple[int, int]], gap: int | None = None, largest: int | None = None
                 ) -> list[tuple[int, int]]:
    """Sorted, disjoint ranges joined into requests: neighbours less than ``gap`` apart share one (the bytes
    between them come too: cheaper than a round trip), none longer than ``largest`` (a long range is cut into
    parallel requests). Defaults: ``GAP`` and ``LARGEST_REQUEST`` (the benchmark's lower bound of requests)."""
    gap = limits.GAP if gap is None else gap
    largest = limits.LARGEST_REQUEST if largest is None else largest
    out: list[tuple[int, int]] = []
    joinable = False  # (the last piece of a range cut in pieces takes no neighbour)
    for a, b in missing:
        if joinable and a - out[-1][1] < gap and b - out[-1][0] <= largest:
            out[-1] = (out[-1][0], b)
            continue
        joinable = b - a <= largest
        while b - a > largest:
            out.append((a, a + largest))
            a += largest
        out.append((a, b))
    return out
