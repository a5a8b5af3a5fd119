"""What the fetcher holds of one sparse shadow file: its byte ranges held, in flight and asked for (with the batch
clocks that need them), and blocks given back to the file system; :class:`RemoteFile`, one ``.bin`` object and its
shadow.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import numpy as np

from babelfeed.storage.remote import limits
from babelfeed.storage.remote.ranges import merged, subtract, within


class Piece:
    """A byte range of a shadow file: held (fetched), or in flight (``job`` fetching it). What the cache holds,
    evicts and pins."""

    __slots__ = ("remote", "a", "b", "dues", "used", "pins", "alive", "job", "fresh")

    def __init__(self, remote, a: int, b: int, job=None):
        self.remote, self.a, self.b, self.job = remote, a, b, job
        self.dues: list | np.ndarray = _NO_DUES  # the batch clocks at which hints said it is needed
        self.used = 0.0  # when a gather last asked for it (monotonic seconds)
        self.pins = 0  # connections whose last ensure covered it: they may be reading it now
        self.alive = True  # held (False once evicted)
        self.fresh = False  # fetched for a waiting gather that has not pinned it yet (not evicted meanwhile)

    @property
    def blocks(self) -> range:
        """The file-system blocks (``BLOCK`` bytes) it lies in."""
        return range(self.a // limits.BLOCK, (self.b - 1) // limits.BLOCK + 1)

    def next_due(self, clock: float = -np.inf) -> float:
        """The first batch clock after ``clock`` that a hint says needs it (inf: none)."""
        d = self.compact(clock)
        return float(d.min()) if len(d) else float("inf")

    def add_dues(self, dues: np.ndarray, clock: float = -np.inf) -> None:
        """Hints say batches at clocks ``dues`` read it (kept as they come: sorted only when the cache must
        choose what to evict)."""
        self.dues = self.dues + [dues] if isinstance(self.dues, list) else [self.dues, dues]
        if len(self.dues) > 64:
            self.compact(clock)

    def compact(self, clock: float) -> np.ndarray:
        """The dues after ``clock`` (earlier ones are spent: that batch has read it), as one array."""
        d = np.concatenate(self.dues) if isinstance(self.dues, list) else self.dues
        if len(d) and d.min() <= clock:
            d = d[d > clock]
        if len(d) > 4096:
            d = np.unique(d)
        self.dues = d
        return d


_NO_DUES = np.zeros(0, np.float64)


class Pieces:
    """The pieces of one shadow file (held, or in flight): disjoint, sorted by start, with their bounds kept as
    arrays too (updated in place) for interval arithmetic."""

    def __init__(self):
        self.items: list[Piece] = []
        self._a = np.zeros(0, np.int64)
        self._b = np.zeros(0, np.int64)
        self._joined = None  # the pieces' union, for covers()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._a, self._b

    def covers(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether every range ``[a, b)`` lies in what the pieces hold (neighbouring pieces joined)."""
        if self._joined is None:
            self._joined = merged(self._a, self._b)
        return within(a, b, *self._joined)

    def overlapping(self, a: int, b: int) -> list[Piece]:
        return self.items[int(np.searchsorted(self._b, a, side="right")):int(np.searchsorted(self._a, b, side="left"))]

    def missing(self, a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
        """The parts of ranges ``[a, b)`` not held, merged, in order."""
        x, y = subtract(a, b, self._a, self._b)
        return list(zip(x.tolist(), y.tolist()))

    def add(self, piece: Piece) -> None:
        k = int(np.searchsorted(self._a, piece.a))
        self.items.insert(k, piece)
        self._a = np.insert(self._a, k, piece.a)
        self._b = np.insert(self._b, k, piece.b)
        self._joined = None

    def remove(self, piece: Piece) -> None:
        k = int(np.searchsorted(self._a, piece.a))
        while self.items[k] is not piece:
            k += 1
        del self.items[k]
        self._a = np.delete(self._a, k)
        self._b = np.delete(self._b, k)
        self._joined = None


_PUNCH = None


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give a sparse file's blocks back (``fallocate(PUNCH_HOLE | KEEP_SIZE)``); False where unsupported."""
    global _PUNCH
    if _PUNCH is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            f = libc.fallocate
            f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            _PUNCH = f
        except (OSError, AttributeError):
            _PUNCH = False
    if not _PUNCH:
        return False
    return _PUNCH(fd, 0x02 | 0x01, offset, length) == 0  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


class RemoteFile:
    """One ``.bin`` object and its sparse shadow file."""

    def __init__(self, store, key: str, size: int, etag: str, path: str):
        self.store, self.key, self.size, self.etag, self.path = store, key, size, etag, path
        self.held = Pieces()
        self.flying = Pieces()  # ranges a request is fetching now (others asking for them wait for it)
        self.blocks: dict[int, int] = {}  # block -> held pieces in it (the disk the shadow takes)
        # asked for, not yet requested: sorted, disjoint ranges, each with the earliest batch clock that needs it
        # (-inf: a gather waits for it). Requests are formed from them when a connection is free, so ranges asked
        # for by many hints (and every process of the host) are joined into few requests.
        self.pend_a = self.pend_b = np.zeros(0, np.int64)
        self.pend_d = np.zeros(0, np.float64)
        self.failed: list = []  # (start, end, error, when) of requests that failed: a waiting gather raises it
        self.queued: float | None = None  # the due of its entry in the fetcher's queue (None: not queued)
        self.evictions = 0  # pieces dropped so far (a waiting gather asks again for what it lost)
        # the host reads (nearly) every byte of it this epoch and the cache can keep them: hinted ranges are
        # fetched as whole aligned blocks of LARGEST_REQUEST (few large requests; no byte wasted)
        self.dense = False
        self.shared = False  # other hosts read rows of it this epoch (fetched with BABELFEED_FETCH_SPARSE_GAP)
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # notified as requests land
        self.fd = os.open(path, os.O_WRONLY)
        self.ino = os.fstat(self.fd).st_ino  # (a process reading another file at this path reads a replaced object)
        self.retired = False  # replaced by a new mirror of the object (``Fetcher.retire``)

    def close(self) -> None:
        """Close the shadow file (a record retired, once no request writes into it); lock held."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def pending_bytes(self) -> int:
        return int((self.pend_b - self.pend_a).sum())

    def take(self, piece: Piece) -> int:
        """Hold ``piece``; returns the bytes of blocks it newly occupies."""
        self.held.add(piece)
        new = 0
        for blk in piece.blocks:
            n = self.blocks.get(blk, 0)
            new += limits.BLOCK if n == 0 else 0
            self.blocks[blk] = n + 1
        return new

    def cluster(self, piece: Piece, most: int = 64) -> list | None:
        """``piece`` and the held pieces that share a block with it, and theirs (at most ``most``): dropped
        together, their blocks come free. None when one of them is pinned, or the group grows past ``most``."""
        group, todo, seen = [], [piece], {id(piece)}
        while todo:
            p = todo.pop()
            if p.pins:
                return None
            group.append(p)
            if len(group) > most:
                return None
            for blk in (p.blocks[0], p.blocks[-1]):  # (inner blocks are its own)
                if self.blocks.get(blk, 0) > 1:
                    for q in self.held.overlapping(blk * limits.BLOCK, (blk + 1) * limits.BLOCK):
                        if id(q) not in seen:
                            seen.add(id(q))
                            todo.append(q)
        return group

    def drop(self, piece: Piece) -> int:
        """Let ``piece`` go, giving back the blocks no held piece lies in (a hole punched); returns their bytes,
        or -1 where the file system cannot punch holes (nothing is dropped then). Bytes of a dropped piece left
        in a block another piece holds stay there unheld: the next ensure of them fetches them again."""
        free = [blk for blk in piece.blocks if self.blocks.get(blk, 0) == 1]
        runs = []
        for blk in free:
            if runs and runs[-1][1] == blk:
                runs[-1][1] = blk + 1
            else:
                runs.append([blk, blk + 1])
        for a, b in runs:
            if not punch_hole(self.fd, a * limits.BLOCK, (b - a) * limits.BLOCK):
                return -1
        self.held.remove(piece)
        self.evictions += 1
        piece.alive = False
        for blk in piece.blocks:
            n = self.blocks[blk] - 1
            if n:
                self.blocks[blk] = n
            else:
                del self.blocks[blk]
        return len(free) * limits.BLOCK
