"""Per-row facts of many corpora in memory: compact length copies, the flat row table, record checks.

* :class:`LengthCache`: in-memory copies of sequence lengths (uint16 where they fit) within a byte budget;
* :class:`RowTable`: every row's length and token address of every dataset in two flat arrays, so that thousands
  of small corpora are planned and addressed with a few gathers instead of a loop over corpora;
* :func:`check_records`: records lie inside their ``.bin``, aligned; :func:`groups`: rows grouped by component.
"""

from __future__ import annotations

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.errors import InconsistentIndexError
from babelfeed.storage.indexed import IndexedDataset


class LengthCache:
    """In-memory copies of sequence lengths (uint16 where they fit), within a byte budget.

    Planning looks lengths up at random rows; a compact in-memory copy does that ~3x faster than the
    memory-mapped int32 sizes of an index. Copies are made on first use, while the budget lasts; beyond it,
    lookups read the memmap, so memory stays bounded however large the corpus.
    """

    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self.used = 0

    def copy(self, sizes: np.ndarray) -> np.ndarray | None:
        if self.used + 2 * len(sizes) > self.budget:
            return None
        longest = int(sizes.max()) if len(sizes) else 0
        if len(sizes) and int(sizes.min()) < 0:
            return None  # a negative size: left to the checks that name the file and record
        dtype = np.uint16 if longest <= np.iinfo(np.uint16).max else np.int32
        need = np.dtype(dtype).itemsize * len(sizes)
        if self.used + need > self.budget:
            return None
        self.used += need
        return np.asarray(sizes).astype(dtype)

    def copy_pair(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray | None:
        """Both sides' copies interleaved in one [n, 2] array, written in place (no copies to stack): the same
        arrays and budget as ``copy`` of each where both fit with one dtype; None (nothing spent) otherwise."""
        if len(src) != len(tgt) or not len(src) or self.used + 4 * len(src) > self.budget:
            return None
        pair = plan_kernel.pair_sizes(src, tgt)  # uint16 (the usual case): one compiled pass
        if pair is not None:
            self.used += pair.nbytes
            return pair
        lo = min(int(src.min()), int(tgt.min()))
        dtypes = {np.uint16 if int(x.max()) <= np.iinfo(np.uint16).max else np.int32 for x in (src, tgt)}
        dtype = dtypes.pop()
        if lo < 0 or dtypes or self.used + 2 * np.dtype(dtype).itemsize * len(src) > self.budget:
            return None
        pair = np.empty((len(src), 2), dtype)
        np.copyto(pair[:, 0], src, casting="unsafe")
        np.copyto(pair[:, 1], tgt, casting="unsafe")
        self.used += pair.nbytes
        return pair


def check_records(ds, rows, sizes, ptr) -> None:
    """Every record ``rows`` (sizes, byte pointers) lies inside ``ds``'s ``.bin``, aligned; else raise naming the
    first one that does not."""
    item = ds.dtype.itemsize
    sizes = np.asarray(sizes, dtype=np.int64)
    bad = (sizes < 0) | (ptr < 0) | (ptr % item != 0) | (ptr + sizes * item > ds.bin_size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        r = int(rows[i]) if not isinstance(rows, slice) else (rows.start or 0) + i
        p, n = int(ptr[i]), int(sizes[i])
        what = (f"has a negative size ({n})" if n < 0 else f"is misaligned (byte pointer {p} for {ds.dtype.name})"
                if p < 0 or p % item else f"(byte pointer {p}, {n} tokens of {ds.dtype.name}) lies outside the "
                f"{ds.bin_size}-byte .bin {ds.data_file}")
        raise InconsistentIndexError(ds.index_file, f"record {r} {what}")


def groups(keys: np.ndarray) -> list[np.ndarray]:
    """Indices of ``keys`` grouped by value (ascending values; indices ascending within a group)."""
    order = np.argsort(keys, kind="stable")
    return [g for g in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1) if len(g)]


def distinct_datasets(components) -> list:
    seen: dict = {}
    for c in components:
        for ds in (c.src, c.tgt):
            if ds is not None:
                seen.setdefault(id(ds), ds)
    return list(seen.values())


class RowTable:
    """Lengths and token addresses of every row of every dataset of a SourceSet, in two flat arrays.

    With thousands of small corpora, reading lengths and addresses component by component costs more than the
    rows themselves; with the table, a window's samples are described by a few gathers whatever the number of
    components. 12 bytes per row (int32 length, int64 address), taken from the length budget
    (``data.length_cache_mb``); components then read their lengths from it instead of copying them.
    """

    MIN_COMPONENTS = 8
    BYTES_PER_ROW = 12

    def __init__(self, components, spaces):
        datasets = distinct_datasets(components)
        counts = np.array([len(ds) for ds in datasets], dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(counts)])
        where = {id(ds): int(b) for ds, b in zip(datasets, base[:-1].tolist())}
        self.size = np.empty(int(base[-1]), dtype=np.int32)
        self.start = np.zeros(int(base[-1]), dtype=np.int64)
        for ds, a, b in zip(datasets, base[:-1].tolist(), base[1:].tolist()):
            self.size[a:b] = ds.sizes
            if isinstance(ds, IndexedDataset):
                self.start[a:b] = ds.pointers
                check_records(ds, slice(0, b - a), self.size[a:b], self.start[a:b])
                self.start[a:b] //= ds.dtype.itemsize
                self.start[a:b] += spaces.address(ds)[1]
        self.nbytes = self.size.nbytes + self.start.nbytes
        n = len(components)
        self.src_row = np.array([where[id(c.src)] for c in components], dtype=np.int64)
        self.tgt_row = np.array([where[id(c.tgt)] if c.tgt is not None else -1 for c in components], dtype=np.int64)
        self.src_plen = np.array([len(c.src_prefix) for c in components], dtype=np.int32)
        self.tgt_plen = np.array([len(c.tgt_prefix) for c in components], dtype=np.int32)
        for c, (ds, a, b) in ((c, (ds, where[id(ds)], where[id(ds)] + len(ds))) for c in components
                              for ds in (c.src, c.tgt) if ds is not None):
            side = "src" if ds is c.src else "tgt"
            c._lengths.setdefault(side, self.size[a:b])  # lengths come from the table, not from copies
            if c.tgt is c.src:
                c._lengths.setdefault("tgt", self.size[a:b])
        self.components = n

    def lengths(self, comp: np.ndarray, local: np.ndarray, pairs: np.ndarray) -> None:
        """Lengths (prefixes included) into int32 ``pairs[:, 2:4]``."""
        g = self.src_row[comp] + local
        pairs[:, 2] = self.size[g]
        pairs[:, 2] += self.src_plen[comp]
        has_tgt = self.tgt_row[comp] >= 0
        if has_tgt.all():
            g = self.tgt_row[comp] + local
            pairs[:, 3] = self.size[g]
            pairs[:, 3] += self.tgt_plen[comp]
        elif has_tgt.any():
            sel = np.flatnonzero(has_tgt)
            pairs[sel, 3] = self.size[self.tgt_row[comp[sel]] + local[sel]] + self.tgt_plen[comp[sel]]

    def addresses(self, comp: np.ndarray, local: np.ndarray, side: str) -> np.ndarray:
        row = (self.src_row if side == "src" else self.tgt_row)[comp]
        out = self.start[np.maximum(row, 0) + local]
        out[row < 0] = 0
        return out
