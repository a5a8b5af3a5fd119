"""The host's fetcher: one process per host (per user and cache folder) that reads object stores for every
babelfeed process of the host, so that DataLoader and grain workers share one cache and never download the
same bytes twice.

It keeps a *shadow* of each remote data folder under ``$BABELFEED_CACHE_DIR/objects/``: the small files
(``.idx``, ``dict.txt``, ``spm.model``, reports) are fetched whole, checked against the object's size and ETag,
and kept until the object changes; each ``.bin`` is a sparse file of the object's size, into which the byte
ranges that batches read are written as they are fetched. Every other part of babelfeed (corpus discovery,
index checks, the flat token spaces, the gather kernel) then reads local files, unchanged: the batches are the
same bytes as from a local copy by construction. A range is fetched when a process asks for it (``ensure``,
before the gather reads it; the prefetcher asks ahead), with the object's ETag as a precondition: an object
replaced in the store is refused by name, never mixed with what was fetched before.

Started by the first process that needs it (``storage/remote.py``) as a fresh interpreter (obstore does not
survive ``fork``), on a Unix socket only this user can open; it exits after ``IDLE_SECONDS`` without clients.

    python -m babelfeed.storage.fetcher SOCKET CACHE_DIR
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import time

import numpy as np

IDLE_SECONDS = float(os.environ.get("BABELFEED_FETCHER_IDLE", "300"))
# ranges closer than this are fetched as one request, and no request is longer than LARGEST_REQUEST (parallel
# requests beat one long one); BABELFEED_FETCH_GAP / BABELFEED_FETCH_LARGEST set them (bytes)
GAP = int(os.environ.get("BABELFEED_FETCH_GAP", 16 << 10))
LARGEST_REQUEST = int(os.environ.get("BABELFEED_FETCH_LARGEST", 8 << 20))
SMALL_FILE = 64 << 20  # a non-.bin object up to this size is fetched whole into the shadow


BLOCK = 4096  # the file-system block: the cache counts, and gives back, whole blocks


def cache_limit(cache: str) -> int:
    """The bytes the shadows may hold: ``BABELFEED_FETCH_CACHE_MB``, else a quarter of the free space of the
    cache's file system (at most 64 GiB, at least 256 MiB)."""
    mb = os.environ.get("BABELFEED_FETCH_CACHE_MB")
    if mb:
        return int(float(mb) * (1 << 20))
    try:
        st = os.statvfs(cache)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 4 << 30
    return int(min(max(free // 4, 256 << 20), 64 << 30))


def shadow_root(cache: str, url: str) -> str:
    """The local folder that mirrors remote folder ``url``."""
    return os.path.join(cache, "objects", hashlib.blake2b(url.rstrip("/").encode(), digest_size=10).hexdigest())


# ------------------------------------------------------------------------------------------------ messages
def send(sock: socket.socket, obj) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def receive(sock: socket.socket):
    head = _exactly(sock, 4)
    if head is None:
        return None
    body = _exactly(sock, struct.unpack("<I", head)[0])
    return None if body is None else json.loads(body)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# ------------------------------------------------------------------------------------------------ pieces
class Piece:
    """A byte range of a shadow file as one request fetched it: what the cache holds, evicts and pins."""

    __slots__ = ("remote", "a", "b", "dues", "used", "pins", "alive", "event")

    def __init__(self, remote, a: int, b: int):
        self.remote, self.a, self.b = remote, a, b
        self.dues: list = []  # heap: the batch clocks at which hints said it is needed
        self.used = 0.0  # when a gather last asked for it (monotonic seconds)
        self.pins = 0  # connections whose last ensure covered it: they may be reading it now
        self.alive = True  # held (False once evicted)
        self.event = None  # a range in flight: set when its fetch ends (those asking for it wait on it)

    @property
    def blocks(self) -> range:
        """The file-system blocks (``BLOCK`` bytes) it lies in."""
        return range(self.a // BLOCK, (self.b - 1) // BLOCK + 1)

    def next_due(self) -> float:
        return self.dues[0] if self.dues else float("inf")


class Pieces:
    """The held pieces of one shadow file: disjoint, sorted by start."""

    def __init__(self):
        self.starts: list[int] = []
        self.items: list[Piece] = []

    def overlapping(self, a: int, b: int) -> list[Piece]:
        import bisect

        k = max(bisect.bisect_right(self.starts, a) - 1, 0)
        out = []
        while k < len(self.items) and self.items[k].a < b:
            if self.items[k].b > a:
                out.append(self.items[k])
            k += 1
        return out

    def missing(self, a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
        """The parts of ranges ``[a, b)`` not held, merged, in order."""
        import bisect

        order = np.argsort(a, kind="stable")
        out: list[list[int]] = []
        for s, e in zip(a[order].tolist(), b[order].tolist()):
            if e <= s:
                continue
            k = max(bisect.bisect_right(self.starts, s) - 1, 0)
            while s < e:
                if k < len(self.items) and self.items[k].a <= s:
                    s = max(s, self.items[k].b)
                    k += 1
                    continue
                stop = e if k >= len(self.items) else min(e, self.items[k].a)
                if out and out[-1][1] >= s:
                    out[-1][1] = max(out[-1][1], stop)
                else:
                    out.append([s, stop])
                s = stop
        return [(x, y) for x, y in out]

    def add(self, piece: Piece) -> None:
        import bisect

        k = bisect.bisect_left(self.starts, piece.a)
        self.starts.insert(k, piece.a)
        self.items.insert(k, piece)

    def remove(self, piece: Piece) -> None:
        import bisect

        k = bisect.bisect_left(self.starts, piece.a)
        while self.items[k] is not piece:
            k += 1
        del self.starts[k]
        del self.items[k]

    @property
    def held(self) -> int:
        return sum(p.b - p.a for p in self.items)


_PUNCH = None


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give a sparse file's blocks back (``fallocate(PUNCH_HOLE | KEEP_SIZE)``); False where unsupported."""
    global _PUNCH
    if _PUNCH is None:
        import ctypes
        import ctypes.util

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


def requests_for(missing: list[tuple[int, int]], gap: int | None = None, largest: int | None = None
                 ) -> list[tuple[int, int]]:
    """Missing ranges joined into requests: neighbours less than ``gap`` apart become one, none longer than
    ``largest`` (a long range is cut into parallel pieces). Defaults: ``GAP`` and ``LARGEST_REQUEST``."""
    gap = GAP if gap is None else gap
    largest = LARGEST_REQUEST if largest is None else largest
    out: list[list[int]] = []
    for a, b in missing:
        if out and a - out[-1][1] < gap and b - out[-1][0] <= largest:
            out[-1][1] = b
        else:
            out.append([a, b])
    cut = []
    for a, b in out:
        while b - a > largest:
            cut.append((a, a + largest))
            a += largest
        cut.append((a, b))
    return cut


# ------------------------------------------------------------------------------------------------ the server
class _Remote:
    """One ``.bin`` object and its sparse shadow file."""

    def __init__(self, store, key: str, size: int, etag: str, path: str):
        self.store, self.key, self.size, self.etag, self.path = store, key, size, etag, path
        self.held = Pieces()
        self.flying: list[Piece] = []  # ranges a request is fetching now (others asking for them wait)
        self.blocks: dict[int, int] = {}  # block -> held pieces in it (the disk the shadow takes)
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_WRONLY)

    def take(self, piece: Piece) -> int:
        """Hold ``piece``; returns the bytes of blocks it newly occupies."""
        self.held.add(piece)
        new = 0
        for blk in piece.blocks:
            n = self.blocks.get(blk, 0)
            new += BLOCK if n == 0 else 0
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
                    for q in self.held.overlapping(blk * BLOCK, (blk + 1) * BLOCK):
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
            if not punch_hole(self.fd, a * BLOCK, (b - a) * BLOCK):
                return -1
        self.held.remove(piece)
        piece.alive = False
        for blk in piece.blocks:
            n = self.blocks[blk] - 1
            if n:
                self.blocks[blk] = n
            else:
                del self.blocks[blk]
        return len(free) * BLOCK


class Client:
    """One connection's pins: the pieces its last ``ensure`` covered, which it may be reading now. They are
    released at its next ``ensure`` (a thread gathers one batch at a time) or when it disconnects."""

    def __init__(self):
        self.pinned: list[Piece] = []


class Fetcher:
    def __init__(self, cache: str):
        self.cache = cache
        self.stores: dict = {}
        self.remotes: dict[str, _Remote] = {}
        self.lock = threading.Lock()
        self.mirror_locks: dict[str, threading.Lock] = {}
        self.counters = {"requests": 0, "bytes": 0, "ensure_calls": 0, "bytes_asked": 0, "evicted_bytes": 0,
                         "hits": 0, "misses": 0}
        self.limit = cache_limit(cache)
        self.held_bytes = 0  # the disk the held pieces take (4 KiB blocks)
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(8, thread_name_prefix="ensure")  # files of one request, in parallel
        self.background = ThreadPoolExecutor(4, thread_name_prefix="hint")  # lookahead fetches

    def store(self, root: str, options: dict | None):
        from babelfeed.storage.objects import Store

        key = (root, json.dumps(options or {}, sort_keys=True))
        with self.lock:
            if key not in self.stores:
                self.stores[key] = Store(root, options)
            return self.stores[key]

    def mirror(self, url: str, options: dict | None = None) -> str:
        """The shadow folder of remote folder ``url``, brought up to date with the store: small files fetched whole
        (kept while size and ETag hold), each ``.bin`` a sparse file of its size (a new file when its ETag
        changed, so nothing fetched from the old object is ever read as the new one's)."""
        from babelfeed.storage.objects import ObjectStoreError, split_url

        url = url.rstrip("/")
        root, prefix = split_url(url)
        store = self.store(root, options)
        local = shadow_root(self.cache, url)
        with self.lock:
            lock = self.mirror_locks.setdefault(local, threading.Lock())
        with lock:
            os.makedirs(local, mode=0o700, exist_ok=True)
            manifest_path = os.path.join(local, ".manifest.json")
            try:
                with open(manifest_path) as f:
                    manifest = json.load(f)
            except (OSError, ValueError):
                manifest = {}
            objects = store.list(prefix)
            if not objects:
                raise ObjectStoreError(f"{url}: no objects under this prefix (a data folder holds dict.txt and "
                                       f".idx/.bin files)")
            new_manifest = {}
            wanted = []  # small files to fetch whole
            for key, size, etag in objects:
                rel = key[len(prefix):].lstrip("/") if prefix else key
                if not rel or rel.startswith(".") or "/." in rel or ".." in rel.split("/"):
                    continue
                path = os.path.join(local, rel)
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                known = manifest.get(rel)
                same = known is not None and known["size"] == size and known["etag"] == etag and os.path.exists(path)
                if rel.endswith(".bin"):
                    if not same or os.path.getsize(path) != size:
                        tmp = f"{path}.{os.getpid()}.partial"
                        with open(tmp, "wb") as f:
                            f.truncate(size)  # sparse: blocks are written as ranges are fetched
                        os.replace(tmp, path)  # a new inode: a reader of the old object's file keeps its own
                    with self.lock:
                        current = self.remotes.get(path)
                        if current is None or current.etag != etag or current.size != size:
                            self.remotes[path] = _Remote(store, key, size, etag, path)
                elif not same:
                    if size > SMALL_FILE:
                        continue  # (a large file babelfeed does not read: not mirrored)
                    wanted.append((key, etag, size, path))
                new_manifest[rel] = {"size": size, "etag": etag}
            for _ in self.pool.map(lambda w: _whole(store, *w), wanted):  # (the small files, in parallel)
                pass
            tmp = f"{manifest_path}.{os.getpid()}.partial"
            with open(tmp, "w") as f:
                json.dump({**new_manifest, **{"": {"url": url, "size": 0, "etag": ""}}}, f)
            os.replace(tmp, manifest_path)
        return local

    def ensure(self, path: str, starts: list[int], ends: list[int], client: Client | None = None,
               clock: float | None = None, due: float | None = None) -> dict:
        """Fetch what the shadow ``path`` lacks of byte ranges ``[starts, ends)``; returns what it cost.

        ``client``: the asking connection, which pins the pieces (nothing it may be reading is evicted);
        ``clock``: the batch it gathers (hints due at or before it are spent); ``due``: for a hint, the batch
        that will read these ranges (the cache evicts what is needed farthest ahead, or never again)."""
        remote = self.remotes.get(path)
        if remote is None:
            raise FileNotFoundError(2, "not a remote file of this fetcher (mirror its folder first)", path)
        a = np.asarray(starts, np.int64)
        b = np.minimum(np.asarray(ends, np.int64), remote.size)
        now = time.monotonic()
        asked = int(np.maximum(b - a, 0).sum())
        fetched = requests = cost = 0
        for _ in range(8):  # (a range another request fetches is waited for; one evicted meanwhile, fetched again)
            with remote.lock:
                missing = remote.held.missing(a, b)
                if not missing:  # every range held: pinned while the lock says so
                    self._touch(remote, a, b, client, clock, due, now)
                    break
                flying = Pieces()
                for f in remote.flying:
                    flying.add(f)
                waits = {id(f.event): f.event for f in remote.flying if any(f.a < e and s < f.b for s, e in missing)}
                mine = flying.missing(np.array([m[0] for m in missing], np.int64),
                                      np.array([m[1] for m in missing], np.int64))
                reqs = requests_for(mine)
                if reqs:  # a request bridging a gap never spans a held or flying piece: pieces stay disjoint,
                    # so a hole punched for one never zeroes bytes another still holds
                    for taken in (remote.held, flying):
                        if taken.items:
                            reqs = taken.missing(np.array([r[0] for r in reqs], np.int64),
                                                 np.array([r[1] for r in reqs], np.int64))
                done = threading.Event()
                mine_flying = [Piece(None, x, y) for x, y in reqs]
                for f in mine_flying:
                    f.event = done
                    remote.flying.append(f)
            if reqs:  # the network, outside the lock: gathers of held ranges of this file go on meanwhile
                try:
                    got = remote.store.get_ranges(remote.key, reqs, remote.etag or None)
                    with remote.lock:
                        for (x, y), data in zip(reqs, got):
                            os.pwrite(remote.fd, data, x)
                            cost += remote.take(Piece(remote, x, y))
                finally:
                    with remote.lock:
                        remote.flying = [f for f in remote.flying if f.event is not done]
                    done.set()
                requests += len(reqs)
                fetched += sum(y - x for x, y in reqs)
            for event in waits.values():
                event.wait()
        else:
            raise RuntimeError(f"{remote.store.url(remote.key)}: the ranges asked for could not be held (evicted "
                               f"as fast as they were fetched: raise BABELFEED_FETCH_CACHE_MB)")
        with self.lock:
            c = self.counters
            c["ensure_calls"] += 1
            c["requests"] += requests
            c["bytes"] += fetched
            c["bytes_asked"] += asked
            c["misses" if requests else "hits"] += 1
            self.held_bytes += cost
            over = self.held_bytes > self.limit
        if over:
            self.evict()
        return {"requests": requests, "bytes": fetched}

    @staticmethod
    def _touch(remote, a, b, client, clock, due, now) -> None:
        """Record a use (pins, the clock) or a hint's due on the held pieces under ``[a, b)`` (lock held)."""
        touched = []
        for x, y in zip(a.tolist(), b.tolist()):
            if y > x:
                touched += remote.held.overlapping(x, y)
        for piece in {id(p): p for p in touched}.values():
            if due is not None:
                heapq.heappush(piece.dues, due)
            else:
                piece.used = now
                if clock is not None:
                    while piece.dues and piece.dues[0] <= clock:
                        heapq.heappop(piece.dues)
                if client is not None:
                    piece.pins += 1
                    client.pinned.append(piece)

    def release(self, client: Client) -> None:
        """The client has read what its last ensure covered."""
        for piece in client.pinned:
            with piece.remote.lock:
                piece.pins -= 1
        client.pinned = []

    def evict(self) -> None:
        """Bring the held bytes under the limit (to 90% of it): first what no hint says is needed again, least
        recently used first, then what is needed farthest ahead; never a pinned piece (read now). The blocks go
        back to the file system (a hole punched in the sparse file)."""
        with self.lock:
            target = int(self.limit * 0.9)
            if self.held_bytes <= self.limit:
                return
            pieces = [p for r in self.remotes.values() for p in r.held.items]
        pieces.sort(key=lambda p: (-p.next_due(), p.used))
        freed = 0
        for piece in pieces:
            if self.held_bytes - freed <= target:
                break
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
                        return  # (no hole punching here: the cache keeps what it has)
                    freed += gone
        with self.lock:
            self.held_bytes -= freed
            self.counters["evicted_bytes"] += freed

    def ensure_many(self, files: list, client: Client | None = None, clock: float | None = None) -> dict:
        """:meth:`ensure` for ``[[path, starts, ends], ...]``, the files in parallel; the client's pins of its
        previous request are released first."""
        if client is not None:
            self.release(client)
        if len(files) == 1:
            return self.ensure(*files[0], client=client, clock=clock)
        results = list(self.pool.map(lambda f: self.ensure(*f, client=client, clock=clock), files))
        return {"requests": sum(r["requests"] for r in results), "bytes": sum(r["bytes"] for r in results)}

    def hint(self, files: list, due: float | None = None) -> None:
        """Start fetching ``files``' ranges in the background (a batch's gather will ask for them later)."""
        for f in files:
            self.background.submit(self._quietly, f, due)

    def _quietly(self, f, due) -> None:
        try:
            self.ensure(*f, due=float("inf") if due is None else due)
        except Exception:  # (the gather's own ensure of these ranges raises it, where it is needed)
            pass

    def stats(self) -> dict:
        """A flat dict of numbers (TensorBoard and W&B take it as it is): requests and bytes fetched, what was
        asked for, bytes held in the shadows, and the latency of ranged requests (ms, p50/p90/p99)."""
        with self.lock:
            held = self.held_bytes
            pinned = len({(id(r), blk) for r in self.remotes.values() for p in r.held.items if p.pins
                          for blk in p.blocks}) * BLOCK
            lat = []
            for store in self.stores.values():
                del store.latencies[:-10_000]
                lat += store.latencies
            out = {**self.counters, "bytes_held": held, "bytes_pinned": pinned, "cache_limit": self.limit,
                   "files": len(self.remotes)}
        for q in (50, 90, 99):
            out[f"latency_p{q}_ms"] = round(float(np.percentile(lat, q)) * 1e3, 3) if lat else 0.0
        return out


def _whole(store, key: str, etag: str, size: int, path: str) -> None:
    """A small object fetched whole into ``path`` (written aside, renamed into place)."""
    data = store.get(key, etag=etag or None, size=size)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e), "path": getattr(e, "path", None),
            "reason": getattr(e, "reason", None)}


def serve(sock_path: str, cache: str) -> None:
    fetcher = Fetcher(cache)
    state = {"clients": 0, "last": time.monotonic()}
    guard = threading.Lock()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            with guard:
                state["clients"] += 1
            client = Client()
            try:
                while True:
                    msg = receive(self.request)
                    if msg is None:
                        return
                    try:
                        op = msg.get("op")
                        if op == "mirror":
                            reply = {"path": fetcher.mirror(msg["url"], msg.get("options"))}
                        elif op == "ensure":
                            reply = fetcher.ensure_many(msg["files"], client, msg.get("clock"))
                        elif op == "hint":
                            fetcher.hint(msg["files"], msg.get("due"))
                            reply = {}
                        elif op == "stats":
                            reply = fetcher.stats()
                        elif op == "ping":
                            reply = {"pid": os.getpid()}
                        else:
                            raise ValueError(f"unknown request {op!r}")
                    except Exception as e:  # the asking process raises it, by type and message
                        reply = {"error": _error(e)}
                    send(self.request, reply)
            finally:
                fetcher.release(client)
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
            time.sleep(min(5.0, IDLE_SECONDS / 4))
            with guard:
                idle = state["clients"] == 0 and time.monotonic() - state["last"] > IDLE_SECONDS
            if idle:
                server.shutdown()
                return

    threading.Thread(target=idle_watch, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        try:
            os.unlink(sock_path)
        except OSError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
