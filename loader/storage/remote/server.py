"""The host's fetcher: one process per host (per user and cache folder) that reads object stores for every
babelfeed process of the host, so that DataLoader and grain workers share one cache and never download the
same bytes twice.

It keeps a *shadow* of each remote data folder under ``$BABELFEED_CACHE_DIR/objects/``: the small files
(``.idx``, ``dict.txt``, ``spm.model``, reports) are fetched whole, checked against the object's size and ETag,
and kept until the object changes; each ``.bin`` is a sparse file of the object's size, into which the byte
ranges that batches read are written as they are fetched. Every other part of babelfeed (corpus discovery,
index checks, the flat token spaces, the gather kernel) then reads local files, unchanged: the batches are the
same bytes as from a local copy by construction.

Processes ask for byte ranges ahead of need (``hint``, each range with the batch clock that reads it first) and
when they are about to read them (``ensure``: returns once they are held, and pins them). What is asked for
goes into one pool per file; each time one of the ``CONCURRENCY`` connections is free, a request is formed from
the pool: the range needed first (a waiting gather's before any hint), joined with its pending neighbours less
than ``GAP`` apart (``SPARSE_GAP`` in a file other hosts read too), at most ``LARGEST_REQUEST`` long, never over
bytes held or in flight. A file the host reads nearly whole (``plan``) is fetched in aligned blocks. Every
request carries the object's ETag as a precondition: an object replaced in the store is refused by name, never
mixed with what was fetched before.

Started by the first process that needs it (``storage/remote/client.py``) as a fresh interpreter (obstore does not
survive ``fork``), on a Unix socket only this user can open; it exits after ``IDLE_SECONDS`` without clients.

    python -m babelfeed.storage.remote.server SOCKET CACHE_DIR
"""

from __future__ import annotations

import errno
import fcntl
import heapq
import json
import os
import signal
import socketserver
import sys
import threading
import time

import numpy as np

from babelfeed.errors import DataChangedError, InternalError, redact
from babelfeed.fileio import open_private
from babelfeed.storage.remote import limits
from babelfeed.storage.remote.folders import Folders
from babelfeed.storage.remote.limits import cache_limit, running_socket
from babelfeed.storage.remote.objects import StoreError
from babelfeed.storage.remote.network import Job, Network
from babelfeed.storage.remote.pieces import Piece, Pieces, RemoteFile
from babelfeed.storage.remote.ranges import joined_share, merged_dues, overlap_pairs, split_files, subtract, unpack
from babelfeed.storage.remote.wire import receive, send


COUNTERS_SECONDS = 1.0  # the counters are saved this often (when they changed), for the next fetcher


class Client:
    """One connection's pins: the pieces its last ``ensure`` covered, which it may be reading now. They are
    released at its next ``ensure`` (a thread gathers one batch at a time) or when it disconnects."""

    def __init__(self):
        self.pinned: list[Piece] = []
        self.plan: tuple | None = None  # (ranks, its rank, {path: share}) its process reads this epoch


class Fetcher:
    def __init__(self, cache: str):
        self.cache = cache
        self.remotes: dict[str, RemoteFile] = {}
        self.lock = threading.Lock()
        self.counters = {"requests": 0, "bytes": 0, "ensure_calls": 0, "bytes_asked": 0, "evicted_bytes": 0,
                         "hits": 0, "misses": 0, "hinted_bytes": 0, "bytes_again": 0}
        self.limit = cache_limit(cache)
        self.held_bytes = 0  # the disk the held pieces take (4 KiB blocks)
        self.flying_bytes = 0
        self.clients: set = set()  # the connected clients (whose plans make the host's)
        self.hint_jobs = 0  # requests in flight for hints only (at most CONCURRENCY - RESERVED)
        self.clock = -np.inf  # the latest batch a gather asked for (dues up to it are spent)
        self.queue: list = []  # heap of (earliest due, seq, remote) of files with ranges pending
        self.seq = 0
        self.network = Network(limits.CONCURRENCY, self._take, self._landed)
        self.folders = Folders(self)  # the remote folders mirrored, their stores and checks
        self.counters_path = os.path.join(cache, "objects", "fetcher.counters.json")
        self.saved = None
        self.load_counters()

    def load_counters(self) -> None:
        """The counters of the fetchers before this one (a restart after a kill or an idle exit keeps adding up:
        telemetry never goes back to zero mid-run); ``fetcher_starts`` counts the fetchers."""
        try:
            with open(self.counters_path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
        for k in self.counters:
            if isinstance(saved.get(k), (int, float)):
                self.counters[k] = saved[k]
        self.counters["fetcher_starts"] = int(saved.get("fetcher_starts", 0)) + 1

    def save_counters(self) -> None:
        """Write the counters (atomically) where the next fetcher finds them, when they changed."""
        with self.lock:
            got = dict(self.counters)
        if got == self.saved:
            return
        tmp = f"{self.counters_path}.{os.getpid()}.partial"
        try:
            with open(tmp, "w") as f:
                json.dump(got, f)
            os.replace(tmp, self.counters_path)
            self.saved = got
        except OSError:
            pass  # (a full disk: counters are not worth an error)

    def _remote(self, path: str, ino: int = 0) -> RemoteFile:
        """The record of shadow ``path``; ``ino``: the file the asking process reads there (0: not said), refused
        when it is no longer the shadow's (its object was replaced in the store, and another job opened the new
        version)."""
        remote = self.remotes.get(path)
        if remote is None:
            raise FileNotFoundError(2, "not a remote file of this fetcher (mirror its folder first)", path)
        if ino and ino != remote.ino:
            raise DataChangedError(remote.store.url(remote.key),
                                   f"replaced in the store since the job opened it (the folder was opened again on "
                                   f"this host, by this job or another, and mirrored the new version, ETag "
                                   f"{remote.etag}): the rest of the run would mix two versions of the data. Restart "
                                   f"from the last saved state")
        return remote

    def retire(self, old: RemoteFile) -> None:
        """Forget the record ``old``, replaced by a new mirror of its object (``Folders.mirror``): nothing more is
        fetched for it, its bytes no longer count against the cache (a reader still mapping the replaced file keeps
        it until it lets go), a gather waiting on it is refused, and its file is closed once no request writes into
        it. Kept, its descriptor and its bytes stayed for the fetcher's life: a notebook uploading six versions
        held six copies against the limit, and evicted the current data to make room."""
        with old.cond:
            old.retired = True
            old.pend_a = old.pend_b = np.zeros(0, np.int64)
            old.pend_d = np.zeros(0, np.float64)
            freed = len(old.blocks) * limits.BLOCK
            for piece in old.held.items:
                piece.alive = False  # (an eviction under way passes them by)
            old.held, old.blocks = Pieces(), {}
            old.evictions += 1
            idle = not old.flying.items
            if idle:
                old.close()
            old.cond.notify_all()
        with self.lock:
            self.held_bytes -= freed

    def _ask(self, remote: RemoteFile, a: np.ndarray, b: np.ndarray, dues: np.ndarray) -> None:
        """Add ranges ``[a, b)`` (each needed first at batch clock ``dues``; -inf: now) to what is pending, less
        what is held or in flight (lock held). Nothing for a record retired by a new mirror."""
        if remote.retired:
            return
        ma, mb = subtract(a, b, *remote.held.arrays())
        if len(ma) and remote.flying.items:
            ma, mb = subtract(ma, mb, *remote.flying.arrays())
        if not len(ma):
            return
        q, k = overlap_pairs(a, b, ma, mb)
        md = np.full(len(ma), np.inf)
        np.minimum.at(md, k, np.asarray(dues, np.float64)[q])
        remote.pend_a, remote.pend_b, remote.pend_d = merged_dues(
            np.concatenate([remote.pend_a, ma]), np.concatenate([remote.pend_b, mb]),
            np.concatenate([remote.pend_d, md]))
        first = float(remote.pend_d.min())
        if remote.queued is None or first < remote.queued:
            with self.lock:
                self._queue(remote, first)  # (an entry at a later due is stale now: dropped when it comes up)

    def _take(self) -> Job | None:
        """The next request (the network's thread, for a free connection): the pending range needed first, of
        any file, joined with its pending neighbours less than ``GAP`` apart, at most ``LARGEST_REQUEST`` long.
        A range only hinted is requested while the cache has room for it (or can make room by evicting what is
        needed later than it); a gather's is always requested. ``RESERVED`` connections are kept for gathers:
        a gather never queues behind a lookahead's blocks for a free connection."""
        while True:
            with self.lock:
                if not self.queue:
                    return None
                due, _, remote = self.queue[0]
                if due > -np.inf and limits.CONCURRENCY and self.hint_jobs >= limits.CONCURRENCY - limits.RESERVED:
                    return None  # (woken when a request lands)
            for may_evict in (True, False):
                with remote.lock:
                    first = float(remote.pend_d.min()) if len(remote.pend_a) else None
                    if remote.queued != due or first != due:  # (stale: the file's entry is another, or none)
                        with self.lock:
                            if self.queue and self.queue[0][2] is remote and self.queue[0][0] == due:
                                heapq.heappop(self.queue)
                                if remote.queued == due:
                                    remote.queued = None
                                    if first is not None:
                                        self._queue(remote, first)
                        break  # (the next entry)
                    job = self._form(remote, may_evict)
                if not isinstance(job, tuple):
                    return job  # a request, or None: no room in the cache for what is hinted next (woken when
                    # a gather releases some)
                self._evict_for(*job)  # (no file's lock held: eviction takes them one by one)

    def _queue(self, remote: RemoteFile, due: float) -> None:
        """Give ``remote`` its one entry in the queue of files with ranges pending, at ``due`` (self.lock held)."""
        self.seq += 1
        heapq.heappush(self.queue, (due, self.seq, remote))
        remote.queued = due

    def _form(self, remote: RemoteFile, may_evict: bool):
        """A request around ``remote``'s most urgent pending range (lock held); or, when the cache has no room
        for it, ``(bytes, due)`` to evict first (``may_evict``), else None."""
        pa, pb, pd = remote.pend_a, remote.pend_b, remote.pend_d
        i = int(np.argmin(pd))
        urgent = pd[i] == -np.inf
        if remote.dense and (not urgent or remote.size <= limits.WHOLE_AT_ONCE):  # the host reads (nearly) all
            # of this file: its aligned block, whole (a small one even when a gather waits: one request, not two)
            x = int(pa[i]) // limits.LARGEST_REQUEST * limits.LARGEST_REQUEST
            return self._cut(remote, x, min(x + limits.LARGEST_REQUEST, remote.size), bool(urgent), int(pa[i]))
        # the run of neighbours less than GAP apart around i, then at most LARGEST_REQUEST of it around i
        cut = pa[1:] - pb[:-1] >= (limits.SPARSE_GAP if remote.shared else limits.GAP)
        taken = [t for t in (remote.held.arrays()[0], remote.flying.arrays()[0]) if len(t)]
        if taken:  # a request never spans bytes held or in flight: no byte is fetched twice, and pieces stay
            # disjoint (a hole punched for one never zeroes bytes another holds)
            starts = np.sort(np.concatenate(taken)) if len(taken) > 1 else taken[0]
            cut |= np.searchsorted(starts, pa[1:]) > np.searchsorted(starts, pb[:-1])
        apart = np.flatnonzero(cut) + 1
        lo = int(apart[np.searchsorted(apart, i, side="right") - 1]) if len(apart) and apart[0] <= i else 0
        k = np.searchsorted(apart, i, side="right")
        hi = int(apart[k]) if k < len(apart) else len(pa)
        if pb[i] - pa[i] > limits.LARGEST_REQUEST:
            lo, hi = i, i + 1
        else:
            lo = min(max(lo, int(np.searchsorted(pa, pb[i] - limits.LARGEST_REQUEST // 2, side="left"))), i)
            hi = min(hi, lo + int(np.searchsorted(pb[lo:hi], pa[lo] + limits.LARGEST_REQUEST, side="right")))
            hi = max(hi, i + 1)
        x, y = int(pa[lo]), min(int(pb[hi - 1]), int(pa[lo]) + limits.LARGEST_REQUEST)
        if not urgent:
            with self.lock:
                room = self.limit * 0.9 - self.held_bytes - self.flying_bytes
                empty = self.held_bytes + self.flying_bytes == 0
            if room < y - x and not empty:
                return (int(y - x - room), float(pd[i])) if may_evict else None
        return self._cut(remote, x, y, bool(urgent))

    def _cut(self, remote: RemoteFile, x: int, y: int, urgent: bool, anchor: int | None = None) -> Job:
        """The request for bytes ``[x, y)`` (lock held): the pending ranges in it taken out (one cut at an end
        keeps its rest pending), and what it brings that is neither held nor in flight kept. With ``anchor`` (a
        block), ``[x, y)`` is first narrowed to the bytes missing around ``anchor``: from the first byte not here
        to the last, split where ``SPAN_HELD`` or more are held or in flight (those are not fetched again)."""
        fa, fb = subtract(np.array([x]), np.array([y]), *remote.held.arrays())
        if remote.flying.items:
            fa, fb = subtract(fa, fb, *remote.flying.arrays())
        if anchor is not None and len(fa) > 1:
            apart = np.flatnonzero(fa[1:] - fb[:-1] >= limits.SPAN_HELD) + 1
            k = int(np.searchsorted(fa, anchor, side="right")) - 1
            lo = int(apart[np.searchsorted(apart, k, side="right") - 1]) if len(apart) and apart[0] <= k else 0
            j = int(np.searchsorted(apart, k, side="right"))
            hi = int(apart[j]) if j < len(apart) else len(fa)
            fa, fb = fa[lo:hi], fb[lo:hi]
            x, y = int(fa[0]), int(fb[-1])
        pa, pb, pd = remote.pend_a, remote.pend_b, remote.pend_d
        lo = int(np.searchsorted(pb, x, side="right"))
        hi = int(np.searchsorted(pa, y, side="left"))
        dues = np.unique(pd[lo:hi])
        keep_a, keep_b, keep_d = [pa[:lo]], [pb[:lo]], [pd[:lo]]
        if lo < hi and pa[lo] < x:
            keep_a.append(pa[lo:lo + 1])
            keep_b.append(np.array([x], np.int64))
            keep_d.append(pd[lo:lo + 1])
        if lo < hi and pb[hi - 1] > y:
            keep_a.append(np.array([y], np.int64))
            keep_b.append(pb[hi - 1:hi])
            keep_d.append(pd[hi - 1:hi])
        keep_a.append(pa[hi:])
        keep_b.append(pb[hi:])
        keep_d.append(pd[hi:])
        remote.pend_a, remote.pend_b, remote.pend_d = (np.concatenate(keep_a), np.concatenate(keep_b),
                                                       np.concatenate(keep_d))
        if len(fa):  # (from the first byte not here to the last: what is held at either end is not fetched again)
            x, y = int(fa[0]), int(fb[-1])
        job = Job(remote, x, y, list(zip(fa.tolist(), fb.tolist())), [dues[dues > -np.inf]], urgent)
        for a, b in job.parts:
            remote.flying.add(Piece(remote, a, b, job))
        with self.lock:
            self.flying_bytes += sum(b - a for a, b in job.parts)
            self.hint_jobs += not urgent
        return job

    def _landed(self, job: Job, data: bytes | None, error: BaseException | None) -> None:
        """A request ended (the network's thread): its parts written and held, or the error kept for the
        gathers waiting on it."""
        remote = job.remote
        new = 0
        now = time.monotonic()
        with remote.cond:  # (written and taken under the file's lock: an eviction punching the blocks of a
            # neighbouring piece never zeroes bytes written but not yet held)
            for piece in [p for p in remote.flying.items if p.job is job]:
                remote.flying.remove(piece)
            if remote.retired:  # (replaced by a new mirror while in flight: nothing kept, closed when idle)
                data = error = None
                if not remote.flying.items:
                    remote.close()
            if data is not None:
                try:
                    for x, y in job.parts:
                        os.pwrite(remote.fd, memoryview(data)[x - job.a:y - job.a], x)
                except OSError as e:
                    data, error = None, self.disk_error(e, remote.path)
            if data is not None:
                for x, y in job.parts:
                    piece = Piece(remote, x, y)
                    if len(job.dues[0]):
                        piece.add_dues(job.dues[0])
                    piece.used = now
                    piece.fresh = job.urgent  # (a gather waits for it: not evicted before it pins it)
                    new += remote.take(piece)
            elif error is not None:
                remote.failed = [f for f in remote.failed if now - f[3] < 600][-100:] + [(job.a, job.b, error, now)]
            remote.cond.notify_all()
        with self.lock:
            self.flying_bytes -= sum(y - x for x, y in job.parts)
            self.hint_jobs -= not job.urgent
            if data is not None:
                self.counters["requests"] += 1
                self.counters["bytes"] += len(data)
                # (bytes a request brought that were held or in flight already: it spanned them, one request
                # being cheaper than two; never written, never counted as held)
                self.counters["bytes_again"] += len(data) - sum(y - x for x, y in job.parts)
            self.held_bytes += new
            over = self.held_bytes > self.limit
        if over and not job.urgent:
            self.evict()

    def disk_error(self, e: OSError, path: str) -> Exception:
        """A write into the cache that failed, as an error naming the cache folder and the settings that size it
        (a full disk above all)."""
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return StoreError(f"{path}: writing fetched bytes into the cache failed: {e.strerror or e}")
        return StoreError(f"{self.cache}: the cache's disk is full ({e.strerror} writing {path}): free space "
                          f"there, set BABELFEED_FETCH_CACHE_MB below its free space (the cache may hold "
                          f"{self.limit / (1 << 20):,.0f} MB now), or set BABELFEED_CACHE_DIR to a folder on a "
                          f"larger disk")

    def ensure(self, path: str, starts, ends, client: Client | None = None, clock: float | None = None,
               remote: RemoteFile | None = None) -> dict:
        """Fetch what the shadow ``path`` lacks of byte ranges ``[starts, ends)``, and return when it is all held;
        returns what it cost. ``client``: the asking connection, which pins what it covers (nothing it may be
        reading is evicted); ``clock``: the batch it gathers (hints due by then are spent); ``remote``: the
        record the request was checked against (else the path's now)."""
        remote = remote or self._remote(path)
        a = unpack(starts)
        b = np.minimum(unpack(ends), remote.size)
        asked = int(np.maximum(b - a, 0).sum())
        since = time.monotonic()
        waited = False
        with remote.cond:
            seen = remote.evictions
            ma, mb = a, b
            while True:
                if remote.evictions != seen:  # (something was dropped meanwhile: all of it looked at again)
                    ma, mb = a, b
                if remote.held.covers(ma, mb):
                    ma = ma[:0]
                else:
                    ma, mb = subtract(ma, mb, *remote.held.arrays())  # (what is still missing of what was)
                if not len(ma):  # every range held: pinned while the lock says so
                    self._touch(remote, a, b, client, clock)
                    break
                for x, y, error, when in remote.failed:
                    if when >= since and ((ma < y) & (mb > x)).any():
                        raise error
                if remote.retired:
                    raise DataChangedError(remote.store.url(remote.key), "replaced in the store while the job read "
                                           "it (the folder was mirrored again on this host, by this job or another): "
                                           "the rest of the run would mix two versions of the data. Restart from "
                                           "the last saved state")
                if not waited or remote.evictions != seen:  # (asked again after an eviction: idempotent)
                    self._ask(remote, ma, mb, np.full(len(ma), -np.inf))
                    self.network.wake()
                seen = remote.evictions
                waited = True
                remote.cond.wait(1.0)
        with self.lock:
            c = self.counters
            c["ensure_calls"] += 1
            c["bytes_asked"] += asked
            c["misses" if waited else "hits"] += 1
            if clock is not None and clock > self.clock:
                self.clock = clock
            over = self.held_bytes > self.limit
        if over:
            self.evict()
        return {"waited": waited}

    def _touch(self, remote: RemoteFile, a: np.ndarray, b: np.ndarray, client: Client | None, clock: float | None
               ) -> None:
        """Record a use on the held pieces under ``[a, b)``: pinned by ``client``, dues up to ``clock`` spent
        (lock held)."""
        pa, pb = remote.held.arrays()
        _, k = overlap_pairs(a, b, pa, pb)
        now = time.monotonic()
        for i in np.unique(k).tolist():
            piece = remote.held.items[i]
            piece.used = now
            piece.fresh = False
            if client is not None:
                piece.pins += 1
                client.pinned.append(piece)

    def release(self, client: Client) -> None:
        """The client has read what its last ensure covered."""
        for piece in client.pinned:
            with piece.remote.lock:
                piece.pins -= 1
        if client.pinned:
            self.network.wake()
        client.pinned = []

    def evict(self) -> None:
        """Bring the held bytes under the limit (to 90% of it)."""
        with self.lock:
            if self.held_bytes <= self.limit:
                return
            need = self.held_bytes - int(self.limit * 0.9)
        self._evict_for(need, -np.inf)

    def _evict_for(self, need: int, due: float) -> int:
        """Free ``need`` bytes of held pieces that are needed later than batch clock ``due`` (or never again):
        first what no hint says is needed again, least recently used first, then what is needed farthest ahead;
        never a pinned piece (read now), nor one just fetched for a waiting gather. The blocks go back to the
        file system (a hole punched in the sparse file). Returns the bytes freed."""
        with self.lock:
            pieces = [p for r in list(self.remotes.values()) for p in list(r.held.items)]
            clock = self.clock
        now = time.monotonic()
        ranked = sorted(((p.next_due(clock), p) for p in pieces if not p.pins), key=lambda t: (-t[0], t[1].used))
        freed = 0
        for next_due, piece in ranked:
            if freed >= need or next_due <= due:
                break
            if piece.fresh and now - piece.used < 60:
                continue
            remote = piece.remote
            with remote.lock:
                if not piece.alive:
                    continue
                group = remote.cluster(piece)  # (the pieces sharing its blocks go with it: blocks come free)
                if group is None:
                    continue  # one of them is pinned (being read)
                for p in group:
                    gone = remote.drop(p)
                    if gone < 0:
                        need = 0  # (no hole punching here: the cache keeps what it has)
                        break
                    freed += gone
        with self.lock:
            self.held_bytes -= freed
            self.counters["evicted_bytes"] += freed
        return freed

    def ensure_many(self, files: list, client: Client | None = None, clock: float | None = None,
                    keep: bool = False) -> dict:
        """:meth:`ensure` for ``[[path, starts, ends], ...]``: every file's ranges asked for first (all in flight
        together), then waited for. The client's pins of its previous request are released first, unless
        ``keep`` (a batch outside the group its last request pinned: both stay pinned until its next one)."""
        if client is not None and not keep:
            self.release(client)
        # each file's record looked up once: a replaced object refused before anything is asked, and a mirror
        # meanwhile (another job) never has the rest served into the new version's file
        remotes = [self._remote(f[0], int(f[4]) if len(f) > 4 else 0) for f in files]
        for f, remote in zip(files[1:], remotes[1:]):  # (the others first asked for, then each waited for in turn)
            a, b = unpack(f[1]), np.minimum(unpack(f[2]), remote.size)
            with remote.lock:
                if not remote.held.covers(a, b):
                    self._ask(remote, a, b, np.full(len(a), -np.inf))
        if len(files) > 1:
            self.network.wake()
        waited = False
        for f, remote in zip(files, remotes):
            waited |= self.ensure(*f[:3], client=client, clock=clock, remote=remote)["waited"]
        return {"waited": waited}

    def hint(self, files: list, due=None) -> None:
        """Ask for ``[[path, starts, ends(, dues)], ...]`` ahead of need (batches will read them, the first at
        batch clock ``due``, or each range at its own): fetched in that order, joined into few requests, and the
        cache told which held pieces are needed when."""
        for f in files:
            try:
                remote = self._remote(f[0], int(f[4]) if len(f) > 4 else 0)
            except (FileNotFoundError, DataChangedError):  # (not mirrored, or replaced: the gather raises it)
                continue
            a = unpack(f[1])
            b = np.minimum(unpack(f[2]), remote.size)
            default = np.inf if due is None else float(due)
            dues = unpack(f[3], "<f8") if len(f) > 3 and f[3] is not None else np.full(len(a), default)
            if np.isnan(dues).any():  # (a file sent without dues of its own: the message's)
                dues = np.where(np.isnan(dues), default, dues)
            with self.lock:
                self.counters["hinted_bytes"] += int(np.maximum(b - a, 0).sum())
                pressed = self.held_bytes + self.flying_bytes > self.limit // 2  # (else nothing is evicted soon)
            with remote.lock:
                held = remote.held.covers(a, b)
                if held and not pressed:
                    continue  # (all of it here, and the cache has room: nothing to ask, no dues to keep)
                pa, pb = remote.held.arrays()
                if len(pa) and pressed:  # what is held already: told when it is needed
                    q, k = overlap_pairs(a, b, pa, pb)
                    if len(k):
                        order = np.argsort(k, kind="stable")
                        k, d = k[order], dues[q[order]]
                        cuts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
                        for c0, c1 in zip(cuts.tolist(), cuts[1:].tolist() + [len(k)]):
                            remote.held.items[int(k[c0])].add_dues(d[c0:c1], self.clock)
                if not held:
                    self._ask(remote, a, b, dues)
        self.network.wake()

    def plan(self, files: dict, hosts: int = 1, rank: int | None = None, client: Client | None = None,
             epoch=None, inodes: dict | None = None) -> dict:
        """``{path: share}`` or ``{path: [share, rows]}``: the share of each file's rows the host's gathers read
        this epoch (from the plan), and the rows it holds, with ``hosts`` reading the data. Files of which
        fetching the rows read, joined across gaps under ``GAP``, brings ``DENSE`` or more are fetched in whole
        blocks, as long as the cache can keep all of them (the largest first); the others range by range (on
        several hosts: joined across ``SPARSE_GAP``, by default the gap; the rows between are other hosts').

        ``rank`` (of ``hosts`` ranks), from ``client``: the shares are one rank's, and the ranks of this host
        (its connected clients') are added up: eight ranks of 64 on one host read an eighth of the data, as
        one host of eight.

        ``inodes`` (``{path: inode}``): the files the process reads; one no longer the shadow's is refused
        (:meth:`_remote`), each epoch, whether or not its bytes are cached."""
        for path, ino in (inodes or {}).items():
            if path in self.remotes:
                self._remote(path, int(ino))
        if rank is not None and hosts > 1 and client is not None:
            with self.lock:
                client.plan = (hosts, int(rank), files)
                mine = {c.plan[1]: c.plan[2] for c in self.clients if c.plan and c.plan[0] == hosts}
            total: dict = {}
            for got in mine.values():
                for p, v in got.items():
                    share, rows = v if isinstance(v, (list, tuple)) else (v, 0)
                    total[p] = [total.get(p, [0.0])[0] + float(share), int(rows)]
            files = {p: [min(v[0], 1.0), v[1]] for p, v in total.items()}
            hosts = max(1, round(hosts / len(mine)))
        self.folders.check_unchanged([p for p in files if p in self.remotes], epoch)
        gap = limits.SPARSE_GAP if hosts > 1 else limits.GAP
        brings = {p: joined_share(*(v if isinstance(v, (list, tuple)) else (v, 0)), self.remotes[p].size, gap)
                  for p, v in files.items() if p in self.remotes}
        dense = sorted(((os.path.getsize(p), p) for p, share in brings.items() if share >= limits.DENSE), reverse=True)
        room = self.limit * 0.8
        chosen = set()
        for size, p in dense:
            if size <= room:
                chosen.add(p)
                room -= size
        for p, share in files.items():
            if p in self.remotes:
                self.remotes[p].dense = p in chosen
                self.remotes[p].shared = hosts > 1 and p not in chosen
        return {"dense": len(chosen), "cache_limit": self.limit}

    def stats(self) -> dict:
        """A flat dict of numbers (TensorBoard and W&B take it as it is): requests and bytes fetched, what was
        asked for, bytes held in the shadows, and the latency of ranged requests (ms, p50/p90/p99)."""
        with self.lock:
            held = self.held_bytes
            pinned = len({(id(r), blk) for r in self.remotes.values() for p in r.held.items if p.pins
                          for blk in p.blocks}) * limits.BLOCK
            lat = []
            for store in self.folders.stores.values():
                del store.latencies[:-10_000]
                lat += store.latencies
            out = {**self.counters, "bytes_held": held, "bytes_pinned": pinned, "bytes_in_flight": self.flying_bytes,
                   "bytes_pending": sum(r.pending_bytes for r in self.remotes.values()),
                   "cache_limit": self.limit, "files": len(self.remotes),
                   "bodies_retried": sum(st.retried for st in self.folders.stores.values())}
        for q in (50, 90, 99):
            out[f"latency_p{q}_ms"] = round(float(np.percentile(lat, q)) * 1e3, 3) if lat else 0.0
        return out


def _error(e: BaseException) -> dict:
    if not isinstance(e, Exception):  # (the store client's Rust panics are BaseExceptions: a malformed endpoint
        # URL was one, and the request's thread died with it, the process told only that the fetcher hung up)
        said = str(e)
        e = StoreError(("the endpoint is not a valid URL (data.storage.endpoint, AWS_ENDPOINT_URL): " if "Uri" in said
                        else "the store client failed (check the endpoint and data.storage): ") + said)
    path, reason = getattr(e, "path", None), getattr(e, "reason", None)
    return {"type": type(e).__name__, "message": redact(str(e)), "path": redact(path) if isinstance(path, str) else path,
            "reason": redact(reason) if isinstance(reason, str) else reason}


class _Redacted:
    """The fetcher's log (its stdout and stderr): every line with URL credentials replaced (``redact``)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact(text))

    def __getattr__(self, name):
        return getattr(self.stream, name)


def serve(sock_path: str, cache: str) -> None:
    sys.stdout, sys.stderr = _Redacted(sys.stdout), _Redacted(sys.stderr)
    objects = os.path.join(cache, "objects")
    running = open_private(os.path.join(objects, "fetcher.running"))  # held while this fetcher lives: one a cache
    try:
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"another fetcher serves the cache folder {cache} (its socket: {running_socket(cache) or '?'}): not "
              f"started", flush=True)
        sys.exit(3)
    tmp = os.path.join(objects, f"fetcher.socket.{os.getpid()}.partial")
    with open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
        f.write(sock_path.encode())
    os.replace(tmp, os.path.join(objects, "fetcher.socket"))  # (found by a process that works out another path)
    fetcher = Fetcher(cache)
    fetcher.save_counters()  # (this start counted at once: a fetcher killed within a second was not)
    state = {"clients": 0, "last": time.monotonic()}
    guard = threading.Lock()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            with guard:
                state["clients"] += 1
            client = Client()
            with fetcher.lock:
                fetcher.clients.add(client)
            try:
                while True:
                    msg = receive(self.request)
                    if msg is None:
                        return
                    try:
                        op = msg.get("op")
                        if op == "mirror":
                            reply = fetcher.folders.mirror(msg["url"], msg.get("options"), msg.get("env"))
                        elif op == "ensure":
                            reply = fetcher.ensure_many(split_files(msg["files"]), client, msg.get("clock"), bool(msg.get("keep")))
                        elif op == "hint":  # (answered first: the asking process goes on while it is taken in)
                            send(self.request, {})
                            try:
                                fetcher.hint(split_files(msg["files"]), msg.get("due"))
                            except Exception:  # (advisory: the gather's own request raises what matters)
                                pass
                            continue
                        elif op == "list":
                            reply = fetcher.folders.listing(msg["url"], msg.get("options"), msg.get("env"))
                        elif op == "delete":
                            reply = fetcher.folders.delete(msg["url"], msg.get("options"), msg.get("env"))
                        elif op == "upload":
                            reply = fetcher.folders.upload(msg["url"], msg["path"], msg.get("options"), msg.get("env"))
                        elif op == "plan":
                            reply = fetcher.plan(msg["files"], int(msg.get("hosts", 1)), msg.get("rank"), client,
                                                 msg.get("epoch"), msg.get("inodes"))
                        elif op == "stats":
                            reply = fetcher.stats()
                        elif op == "ping":
                            reply = {"pid": os.getpid()}
                        else:
                            raise InternalError(f"unknown request {op!r}")
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except BaseException as e:  # the asking process raises it, by type and message
                        reply = {"error": _error(e)}
                    send(self.request, reply)
            finally:
                fetcher.release(client)
                with fetcher.lock:
                    fetcher.clients.discard(client)
                with guard:
                    state["clients"] -= 1
                    state["last"] = time.monotonic()

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    old = os.umask(0o077)  # the socket: this user only
    try:
        server = Server(sock_path, Handler)
    finally:
        os.umask(old)

    def idle_watch():
        while True:
            for _ in range(max(1, int(min(5.0, limits.IDLE_SECONDS / 4) / COUNTERS_SECONDS))):
                time.sleep(min(COUNTERS_SECONDS, limits.IDLE_SECONDS / 4))
                fetcher.save_counters()
            with guard:
                idle = state["clients"] == 0 and time.monotonic() - state["last"] > limits.IDLE_SECONDS
            if idle:
                server.shutdown()
                return

    threading.Thread(target=idle_watch, daemon=True).start()
    # SIGTERM (kill, a job's end): exit as after an idle wait, the socket removed and the counters saved
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        fetcher.save_counters()
        server.server_close()
        try:
            os.unlink(sock_path)
        except OSError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
