"""Remote data fetched ahead by the plan: before a batch is gathered, this rank's next batches' rows are asked for.

The order is a pure function of (seed, epoch, window), so the rows of every batch this process will gather are
known before it gathers them. For data in an object store (``storage/remote/server.py``), :class:`FetchAhead` keeps two
things ahead of the batch being gathered:

* a *group* of this process's next batches (``GROUP``): their rows are fetched and pinned in one round trip to
  the host's fetcher, so the gathers of the group ask nothing more (a gather checks its ranges against the
  group's in-process);
* *hints* for the batches after the group, up to ``BABELFEED_FETCH_AHEAD_MB`` of their rows' bytes (default 64),
  each range with the clock of the batch that reads it first: the fetcher requests them in that order, joined
  into few large requests, and its cache evicts what is needed farthest ahead.

A process that gathers every ``stride``-th batch (a DataLoader worker of ``stride``, a grain worker) asks for its
own only: the stride is set by the adapter, or read from the batches it is asked for. Ranks ask for their own
batches (``split="batches"``) or their own rows (``split="rows"``); a host's fetcher joins them across gaps
shorter than a request costs (the rows between, other hosts', come too; ``BABELFEED_FETCH_SPARSE_GAP``).
"""

from __future__ import annotations

import os
import time
from collections import deque

from babelfeed.storage.remote import client as remote  # (called through the module: tests stand in for the fetcher there)
from babelfeed.stages import timed


GROUP = 16  # batches whose rows one round trip fetches and pins (the first group: the first batch alone; each
# later one twice the last while its bytes are under GROUP_SHARE of the lookahead, up to LARGEST_GROUP)
LARGEST_GROUP = 1024
GROUP_SHARE = 1 / 16
CHUNK = 64  # batches of the first hint message; later ones are sized to CHUNK_SHARE of the lookahead's bytes
# (up to LARGEST_CHUNK batches): with a thousand files, a message of few rows per file costs the fetcher per file
CHUNK_SHARE = 1 / 4
LARGEST_CHUNK = 4096
# The time the rows of one hint message may take to work out (in the thread making batches, which holds up the
# batch after it): a message is cut to as many batches as fit, at least SMALLEST_CHUNK. At 1M tokens/s a batch
# of 4,096 tokens is taken every 4 ms, and the adapters read two batches ahead: a message of 4,096 batches took
# 40-140 ms, and training waited on it.
STEP_SECONDS = 0.002
SMALLEST_CHUNK = 16


def ahead_bytes() -> int:
    return int(float(os.environ.get("BABELFEED_FETCH_AHEAD_MB", "64")) * (1 << 20))


class FetchAhead:
    """``rows(ks, base)`` -> ``(files, n)``: the byte ranges (with each range's due) of this process's batches
    ``ks`` counted from global batch ``base``, and how many of them exist (the epoch may end first).
    ``shares()`` -> ``({path: share}, hosts[, rank])``: how much of each file the epoch reads here, how many ranks
    read the data, and this one's (files read nearly whole are fetched in large blocks)."""

    def __init__(self, rows, shares=None):
        self.rows = rows
        self.shares = shares  # shares(): {path: share of its bytes this process reads this epoch}
        self.told = None  # the epoch the fetcher was told the shares of
        self.stride: int | None = None  # set by an adapter that knows it (a DataLoader worker's count)
        self.key = None
        self.last = None
        self.group = (0, -1)  # (first, last) k of the pinned group
        self.hinted = -1  # the last k hinted
        self.chunks: deque = deque()  # (last k, bytes) of the hints ahead
        self.ahead = ahead_bytes()
        self.first = True
        self.group_n = GROUP  # batches of the next group
        self.group_bytes = self.ahead * GROUP_SHARE  # (a group grows while its bytes are under half of this)
        self.chunk_n = CHUNK  # batches of the next hint message

    @timed("fetch")
    def before(self, k: int, base: int, epoch: int, stride: int | None = None, due: float | None = None) -> bool:
        """Batch ``k`` (from global batch ``base`` of ``epoch``) is about to be gathered; returns whether its rows
        are fetched and pinned now (its gather need not ask). ``stride``: every how many batches this process
        gathers, where the caller knows it (else the adapter's, else read from the batches asked for). ``due``: the
        batch's clock (``remote.ensure_many``)."""
        if self.shares is not None and self.told != epoch:
            self.told = epoch
            got = remote.plan(*self.shares(), epoch=epoch)
            if isinstance(got, dict) and got.get("cache_limit"):  # (a group is pinned while it is read: a small
                # cache keeps its groups small)
                self.group_bytes = min(self.group_bytes, int(got["cache_limit"]) / 8)

        stride = self.stride or stride
        unknown = False
        if stride is None:
            guess = None if self.last is None or self.last[:2] != (epoch, base) else k - self.last[2]
            if guess is not None and 0 < guess <= 256:
                stride = guess
            elif self.key is not None:
                stride = self.key[2]
            else:  # (the first batch of a worker: its own alone, until the next one tells the stride)
                stride, unknown = 1, True
        self.last = (epoch, base, k)
        key = (epoch, base, stride)
        if key != self.key or k < self.group[0]:  # another epoch, resume point, stride, or a step back: start over
            self.key, self.group, self.hinted = key, (k, k - 1), k - stride
            self.chunks.clear()
            self.group_n, self.chunk_n = GROUP, CHUNK
        if k > self.group[1] or (k - self.group[0]) % stride:
            n = 1 if self.first else self.group_n
            self.first = False
            files, got = self.rows(range(k, k + n * stride, stride), base)
            remote.ensure_many(files, group=True, due=due)
            self.group = (k, k + (max(got, 1) - 1) * stride)
            if n > 1 and got == n and _size(files) < self.group_bytes / 2:
                self.group_n = min(2 * n, LARGEST_GROUP)
        if unknown:
            self.key = None
            return True
        while self.chunks and self.chunks[0][0] <= self.group[1]:
            self.chunks.popleft()
        queued = sum(b for _, b in self.chunks)
        start = max(self.hinted, self.group[1]) + stride
        sent = 0
        while (queued < self.ahead / 2 or not self.chunks) and sent < 2:  # (topped up a little at each batch:
            # the first batch does not wait for the whole lookahead to be planned)
            sent += 1
            n = self.chunk_n
            t0 = time.perf_counter()
            files, got = self.rows(range(start, start + n * stride, stride), base)
            if not got:
                break
            size = _size(files)
            spent = time.perf_counter() - t0
            if files:
                remote.hint(files)
            last = start + (got - 1) * stride
            self.chunks.append((last, size))
            self.hinted, start, queued = last, last + stride, queued + size
            if got == n and size:  # (the next message: a share of the lookahead's bytes, at this message's rate,
                # and no more batches than fit in STEP_SECONDS at this message's cost)
                fit = STEP_SECONDS * got / max(spent, 1e-9)
                self.chunk_n = int(max(min(self.ahead * CHUNK_SHARE * got / size, LARGEST_CHUNK, fit),
                                       SMALLEST_CHUNK))
            if got < n or queued >= self.ahead:
                break
        return True


def _size(files: list) -> int:
    return sum(int((f[2] - f[1]).sum()) for f in files)
