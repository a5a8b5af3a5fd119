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


# ------------------------------------------------------------------------------------------------ intervals
class Intervals:
    """Disjoint sorted byte ranges ``[a, b)`` (what a sparse shadow file holds)."""

    def __init__(self):
        self.a = np.zeros(0, np.int64)
        self.b = np.zeros(0, np.int64)

    def missing(self, a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
        """The parts of ranges ``[a, b)`` not held, merged, in order."""
        order = np.argsort(a, kind="stable")
        out: list[list[int]] = []
        for s, e in zip(a[order].tolist(), b[order].tolist()):
            if e <= s:
                continue
            k = int(np.searchsorted(self.b, s, side="right"))  # first held range ending after s
            while s < e:
                if k < len(self.a) and self.a[k] <= s:
                    s = max(s, int(self.b[k]))
                    k += 1
                    continue
                stop = e if k >= len(self.a) else min(e, int(self.a[k]))
                if out and out[-1][1] >= s:
                    out[-1][1] = max(out[-1][1], stop)
                else:
                    out.append([s, stop])
                s = stop
        return [(x, y) for x, y in out]

    def add(self, ranges: list[tuple[int, int]]) -> None:
        if not ranges:
            return
        a = np.concatenate([self.a, np.array([r[0] for r in ranges], np.int64)])
        b = np.concatenate([self.b, np.array([r[1] for r in ranges], np.int64)])
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        reach = np.maximum.accumulate(b)
        new = np.ones(len(a), bool)
        new[1:] = a[1:] > reach[:-1]  # a range starting past everything before it opens a new run
        starts = np.flatnonzero(new)
        self.a = a[starts]
        self.b = reach[np.append(starts[1:] - 1, len(a) - 1)]  # each run ends at the furthest end within it

    @property
    def held(self) -> int:
        return int((self.b - self.a).sum())


def requests_for(missing: list[tuple[int, int]], gap: int = GAP, largest: int = LARGEST_REQUEST
                 ) -> list[tuple[int, int]]:
    """Missing ranges joined into requests: neighbours less than ``gap`` apart become one, none longer than
    ``largest`` (a long range is cut into parallel pieces)."""
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
        self.held = Intervals()
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_WRONLY)


class Fetcher:
    def __init__(self, cache: str):
        self.cache = cache
        self.stores: dict = {}
        self.remotes: dict[str, _Remote] = {}
        self.lock = threading.Lock()
        self.mirror_locks: dict[str, threading.Lock] = {}
        self.counters = {"requests": 0, "bytes": 0, "ensure_calls": 0, "bytes_asked": 0}
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
                    data = store.get(key, etag=etag or None, size=size)
                    tmp = f"{path}.{os.getpid()}.partial"
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, path)
                new_manifest[rel] = {"size": size, "etag": etag}
            tmp = f"{manifest_path}.{os.getpid()}.partial"
            with open(tmp, "w") as f:
                json.dump({**new_manifest, **{"": {"url": url, "size": 0, "etag": ""}}}, f)
            os.replace(tmp, manifest_path)
        return local

    def ensure(self, path: str, starts: list[int], ends: list[int]) -> dict:
        """Fetch what the shadow ``path`` lacks of byte ranges ``[starts, ends)``; returns what it cost."""
        remote = self.remotes.get(path)
        if remote is None:
            raise FileNotFoundError(2, "not a remote file of this fetcher (mirror its folder first)", path)
        a = np.asarray(starts, np.int64)
        b = np.minimum(np.asarray(ends, np.int64), remote.size)
        with remote.lock:  # (one object's ranges at a time: a range two processes ask for is fetched once)
            missing = remote.held.missing(a, b)
            asked = int(np.maximum(b - a, 0).sum())
            reqs = requests_for(missing)
            got = remote.store.get_ranges(remote.key, reqs, remote.etag or None) if reqs else []
            for (s, _), data in zip(reqs, got):
                os.pwrite(remote.fd, data, s)
            remote.held.add(reqs)
        fetched = sum(e - s for s, e in reqs)
        with self.lock:
            c = self.counters
            c["ensure_calls"] += 1
            c["requests"] += len(reqs)
            c["bytes"] += fetched
            c["bytes_asked"] += asked
        return {"requests": len(reqs), "bytes": fetched}

    def ensure_many(self, files: list) -> dict:
        """:meth:`ensure` for ``[[path, starts, ends], ...]``, the files in parallel."""
        if len(files) == 1:
            return self.ensure(*files[0])
        results = list(self.pool.map(lambda f: self.ensure(*f), files))
        return {"requests": sum(r["requests"] for r in results), "bytes": sum(r["bytes"] for r in results)}

    def hint(self, files: list) -> None:
        """Start fetching ``files``' ranges in the background (a batch's gather will ask for them later)."""
        for f in files:
            self.background.submit(self._quietly, f)

    def _quietly(self, f) -> None:
        try:
            self.ensure(*f)
        except Exception:  # (the gather's own ensure of these ranges raises it, where it is needed)
            pass

    def stats(self) -> dict:
        """A flat dict of numbers (TensorBoard and W&B take it as it is): requests and bytes fetched, what was
        asked for, bytes held in the shadows, and the latency of ranged requests (ms, p50/p90/p99)."""
        with self.lock:
            held = sum(r.held.held for r in self.remotes.values())
            lat = []
            for store in self.stores.values():
                del store.latencies[:-10_000]
                lat += store.latencies
            out = {**self.counters, "bytes_held": held, "files": len(self.remotes)}
        for q in (50, 90, 99):
            out[f"latency_p{q}_ms"] = round(float(np.percentile(lat, q)) * 1e3, 3) if lat else 0.0
        return out


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
                            reply = fetcher.ensure_many(msg["files"])
                        elif op == "hint":
                            fetcher.hint(msg["files"])
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
