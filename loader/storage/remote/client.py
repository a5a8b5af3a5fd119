"""Remote data folders as local ones: ``local_folder("s3://bucket/data_bin")`` returns the host's shadow of it
(``storage/remote/server.py``), and ``ensure(path, starts, ends)`` fetches the byte ranges of a shadow ``.bin`` that a
gather is about to read. Every process of the host talks to the one fetcher process over a Unix socket; none of
them loads an object-store client itself, so forked DataLoader workers are safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from babelfeed.errors import BabelfeedError, DataChangedError, StoreNotice, redact
from babelfeed.fileio import cache_dir, open_private, private_folder, private_folders
from babelfeed.storage.remote.limits import cache_limit, running_socket
from babelfeed.storage.remote.objects import StoreError, is_remote, store_env  # noqa: F401  (this
from babelfeed.storage.remote.ranges import flat_files, merged, within
from babelfeed.storage.remote.wire import PROTOCOL, receive, send


# module's face)

START_SECONDS = 20.0  # how long a process waits for the fetcher it started to answer
HUNG_SECONDS = float(os.environ.get("BABELFEED_FETCHER_HUNG", 30))  # a fetcher silent this long to a ping is hung
_SLICE = 5.0  # how long a request waits for its answer before it asks whether the fetcher is alive
LOG_BYTES = 4 << 20  # fetcher.log is rotated (to fetcher.log.1) past this size when a fetcher starts


def _cache() -> str:
    """The cache folder, resolved: a folder reached through a link (or ``$HOME`` and its real path) is one folder,
    with one fetcher and one set of shadow paths (under two names, a job took the fetcher's shadows for local
    files and read their holes as zeros). Resolved once per process and setting, once the folder exists (every
    index open asks whether its ``.bin`` is a shadow: resolving each time was a third of a first open)."""
    named = cache_dir()
    got = _resolved.get(named)
    if got is None:
        got = os.path.realpath(named)
        if os.path.isdir(got):
            _resolved[named] = got
    return got


_resolved: dict[str, str] = {}  # cache_dir() -> its real path


def _objects(cache: str) -> str:
    """The cache's ``objects/`` folder, made private and checked (refused when someone else owns it, can write to
    it, or planted a link in its place: the lock, the log and the shadows live there)."""
    return private_folder(os.path.join(cache, "objects"), "the fetcher's shadows, lock and log")


def socket_path(cache: str | None = None) -> str:
    """The fetcher's socket for this user and cache folder: in a folder only this user can write to
    (``$XDG_RUNTIME_DIR/babelfeed``, else ``babelfeed-UID`` in the temporary folder, else in ``/tmp``), so no
    other user can take its name first; where someone else holds those folders (or their paths are too long: a
    Unix socket's must stay under ~100 bytes), in the cache's private ``objects/``."""
    cache = os.path.realpath(cache) if cache else _cache()
    key = hashlib.blake2b(cache.encode(), digest_size=8).hexdigest()
    name = f"fetcher-{key}-p{PROTOCOL}.sock"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folders = ([os.path.join(runtime, "babelfeed")] if runtime and os.path.isdir(runtime) else []) + \
        [os.path.join(tempfile.gettempdir(), f"babelfeed-{uid}"), f"/tmp/babelfeed-{uid}"]
    refused = []
    for folder in dict.fromkeys(folders):
        if len(os.path.join(folder, name).encode()) > 100 or not os.path.isdir(os.path.dirname(folder)):
            continue
        try:
            return os.path.join(private_folder(folder, "the fetcher's socket"), name)
        except (StoreError, OSError) as e:
            refused.append(str(e))
    fallback = os.path.join(_objects(cache), name)
    if len(fallback.encode()) > 100:
        raise StoreError(f"no folder can hold the fetcher's socket: {'; '.join(refused) or 'the temporary folder'}"
                         f"{'' if refused else chr(39) + 's path is too long'}, and the cache folder's path is too "
                         f"long ({fallback}): set BABELFEED_CACHE_DIR to a shorter path") from None
    return fallback


_local = threading.local()
_lock = threading.Lock()


def _connect(path: str) -> socket.socket | None:
    """A connection to the fetcher at ``path``, or None. The process at the other end must be this user's (its
    credentials, from the kernel), or it is refused."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    peer = _peer(s)
    if peer is not None and hasattr(os, "getuid"):
        uid = peer[1]
        if uid != os.getuid():
            s.close()
            raise BabelfeedError(f"{path}: the fetcher's socket is served by another user's process (uid {uid}): "
                                 f"refused; set BABELFEED_CACHE_DIR to a folder of your own or remove the socket")
    return s


def _peer(s: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process at the other end of ``s`` (from the kernel), where the system says."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _start(cache: str, path: str) -> tuple[socket.socket, str]:
    """Connect to the host's fetcher, starting it first when none answers (one starter at a time: a lock file).
    Returns the connection and the fetcher's socket: ``path``, or the one the running fetcher of this cache
    folder wrote in ``objects/fetcher.socket`` (a process of another environment works ``path`` out elsewhere:
    ``XDG_RUNTIME_DIR``, ``TMPDIR``; two fetchers of one cache punched holes in each other's files)."""
    objects = _objects(cache)
    cache_limit(cache)  # (a bad setting said here, not in the fetcher's log)
    with open_private(os.path.join(objects, "fetcher.lock")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(path)
        if s is not None:
            return s, path
        other = running_socket(cache)
        # (and beside ours, a fetcher of another version from before fetcher.socket, which writes none)
        for other in dict.fromkeys([other] + _other_protocols(path)):
            s = _connect(other) if other and other != path else None
            if s is None:
                continue
            if other.endswith(f"-p{PROTOCOL}.sock"):
                return s, other
            pid = (_peer(s) or ("?",))[0]
            s.close()
            raise StoreError(f"the cache folder {cache} is served by the fetcher of another babelfeed version "
                             f"(pid {pid}, socket {other}): wait for it to exit (idle for BABELFEED_FETCHER_IDLE "
                             f"seconds), stop it (kill {pid}), or set BABELFEED_CACHE_DIR to another folder")
        try:
            os.unlink(path)  # a socket left by a fetcher that died
        except OSError:
            pass
        log_path = os.path.join(objects, "fetcher.log")
        try:
            if os.lstat(log_path).st_size > LOG_BYTES:
                os.replace(log_path, log_path + ".1")  # (one earlier log kept)
        except OSError:
            pass
        log = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p) if not env.get("PYTHONPATH") else \
            env["PYTHONPATH"]
        proc = subprocess.Popen([sys.executable, "-m", "babelfeed.storage.remote.server", path, cache],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env)
        log.close()
        _started[:] = [p for p in _started if p.poll() is None] + [proc]  # (kept while it runs, reaped once it
        # exits: a fetcher outlives the request that started it)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            s = _connect(path)
            if s is not None:
                return s, path
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = ""
        try:
            with open(log_path, "rb") as f:
                tail = f.read()[-1500:].decode(errors="replace")
        except OSError:
            pass
        raise BabelfeedError(f"the object-store fetcher did not start (its log, {log_path}, ends: "
                             f"{redact(tail.strip()[-600:]) or 'nothing'})")


_started: list = []  # the fetchers this process started (subprocess.Popen), until they exit


def _other_protocols(path: str) -> list[str]:
    """The sockets beside ``path`` of this cache folder's fetchers of other protocols (another babelfeed version)."""
    folder, name = os.path.split(path)
    stem = name.rsplit("-p", 1)[0]
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.startswith(stem + "-p") and n.endswith(".sock") and n != name]


class _Hung(Exception):
    """The fetcher did not answer a ping within ``HUNG_SECONDS``."""


def _answers(path: str) -> bool:
    """Whether the fetcher at ``path`` answers a ping within ``HUNG_SECONDS`` (on a connection of its own: the
    one waiting may be waiting for bytes a slow store sends)."""
    try:
        s = _connect(path)
    except BabelfeedError:
        return False
    if s is None:
        return False
    try:
        s.settimeout(HUNG_SECONDS)
        send(s, {"op": "ping"})
        return receive(s) is not None
    except OSError:
        return False
    finally:
        s.close()


def _exchange(conn: socket.socket, msg: dict, path: str):
    """Send ``msg`` and wait for its answer (None: the fetcher closed the connection). While it waits, every
    ``_SLICE`` seconds it asks the fetcher (a ping on another connection) whether it is alive; one that does not
    answer within ``HUNG_SECONDS`` (stopped, or hung) raises :class:`_Hung`. A slow answer from a live fetcher
    (a store retrying) is waited for."""
    conn.settimeout(HUNG_SECONDS)  # (a send blocks only while the fetcher does not read: hung, then)
    try:
        send(conn, msg)
    except TimeoutError:
        raise _Hung() from None
    while not select.select([conn], [], [], _SLICE)[0]:
        if not _answers(path):
            raise _Hung()
    return receive(conn)  # (an answer under way arrives within HUNG_SECONDS, or the fetcher is hung)


def _kill_hung(pid: int | None, path: str) -> None:
    """Kill the hung fetcher ``pid`` (after checking it is this cache's fetcher), so that a new one takes its
    place; an error naming it where it cannot be killed."""
    why = f"the object-store fetcher (pid {pid}) did not answer for {HUNG_SECONDS:.0f} s (stopped or hung)"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            mine = b"babelfeed.storage.remote.server" in f.read()
    except (OSError, TypeError):
        mine = False
    if not mine:
        raise StoreError(f"{why}: kill it (kill -9 {pid}) and the next request starts a new one; "
                         f"BABELFEED_FETCHER_HUNG sets the wait")
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as e:
        raise StoreError(f"{why}, and it could not be killed ({e.strerror}): kill it (kill -9 {pid}); "
                         f"BABELFEED_FETCHER_HUNG sets the wait") from None
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            break
        time.sleep(0.05)
    warnings.warn(f"{why}: killed it and started a new one (its log: fetcher.log in the cache folder; "
                  f"BABELFEED_FETCHER_HUNG sets the wait)", StoreNotice, stacklevel=4)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _client() -> socket.socket:
    """This thread's connection to the fetcher (a new one after fork: a child never shares its parent's)."""
    conn = getattr(_local, "conn", None)
    if conn is not None and _local.pid == os.getpid():
        return conn
    cache = _cache()
    path = socket_path(cache)
    conn, path = _start(cache, path)
    _local.conn, _local.pid, _local.path = conn, os.getpid(), path
    _local.fetcher = (_peer(conn) or (None,))[0]
    return conn


def request(msg: dict) -> dict:
    for attempt in (0, 1, 2):
        conn = _client()
        try:
            reply = _exchange(conn, msg, _local.path)
        except _Hung:
            _local.conn = None
            conn.close()
            _kill_hung(_local.fetcher, _local.path)
            reply = None
        except OSError:
            reply = None
        if reply is not None:
            break
        _local.conn = None  # the fetcher went away (idle exit between two requests, killed): start it again
        _local.covered = None  # (its pins went with it)
        conn.close()
        if attempt == 2:
            raise BabelfeedError("the object-store fetcher closed the connection (see fetcher.log in the cache "
                                 "folder)")
        if attempt:  # (a fetcher killed a moment ago may still take a connection as it goes: wait until it has)
            time.sleep(0.5)
    if "error" in reply:
        err = reply["error"]
        if err.get("type") == "FileNotFoundError" and "not a remote file of this fetcher" in err.get("message", "") \
                and msg.get("op") in ("ensure", "hint"):
            if msg.get("_again"):  # (mirrored again, and still not there: the object is gone from the store)
                gone = re.search(r": '(.*)'$", err.get("message", ""))
                raise DataChangedError(remote_names(gone.group(1)) if gone else "an object of this job",
                                       "removed from the store since the job opened it: restart from the last "
                                       "saved state")
            _mirror_again()  # (a new fetcher: the one that mirrored the folders went away, killed or crashed)
            return request({**msg, "_again": True})
        raise _rebuilt(err)
    return reply


def _mirror_again() -> None:
    """Mirror every folder this process opened again (in a fetcher started since: it knows none of them). The
    shadow files stay where they are, so open mappings stay valid; what they hold is fetched again."""
    with _lock:
        known = list(_folders)
    for url in known:
        request({"op": "mirror", "url": url, **_store_args()})


def _rebuilt(err: dict) -> Exception:
    kind, message = err.get("type"), err.get("message", "")
    if kind == "DataChangedError":
        return DataChangedError(err.get("path"), err.get("reason") or message)
    if kind == "StoreError":
        return StoreError(message)
    if kind == "FileNotFoundError":
        return FileNotFoundError(message)
    return BabelfeedError(f"{kind}: {message}")


_folders: dict[str, str] = {}  # remote folder URL -> its shadow, mirrored once per process
_options: dict = {}  # a config's storage section (data.storage), for the folders it names


def configure(options) -> None:
    """Take a config's storage section (endpoint, region, profile, allow_http; empty ones left to the
    environment) for the remote folders opened from now on in this process."""
    global _options
    _options = {k: v for k, v in dict(options or {}).items() if v not in ("", None, False)}


def _store_args(options: dict | None = None) -> dict:
    """How this process configures a store, for a request that reaches one: the config's storage section (or
    ``options``) and its store environment (the fetcher serves processes with other credentials too)."""
    return {"options": dict(options if options is not None else _options), "env": store_env()}


def local_folder(url: str, options: dict | None = None) -> str:
    """The local shadow folder of remote folder ``url``, mirrored now (small files fetched, ``.bin`` files
    sparse): each call checks the store (one listing) and brings the shadow up to date, except within one
    :func:`opening` (a job being built names its folder several times)."""
    url = str(url).rstrip("/")
    with _lock:
        known = _opened.get(url) if _opened is not None else None
    if known is not None:
        return known
    got = request({"op": "mirror", "url": url, **_store_args(options)})
    for notice in got.get("notices", []):
        warnings.warn(notice, StoreNotice, stacklevel=2)
    with _lock:
        _folders[url] = got["path"]
        if _opened is not None:
            _opened[url] = got["path"]
    return got["path"]


_opened: dict | None = None  # within opening(): the folders mirrored in it (URL -> shadow)
_depth = 0  # openings under way (nested, or in several threads): _opened lives while one is


@contextlib.contextmanager
def opening():
    """Build a job: the remote folders it names are mirrored once, however often it names them. A job built
    later (a second iterator of the same folder in a notebook, a worker process building its own) checks the
    store again, so it reads what the store holds then: remembered per process, a folder replaced in the store
    since (by ``aws s3 cp``, another host) was read as the old version for the whole epoch, and refused as
    'changed in the store while the job reads it' where rows were fetched as batches asked."""
    global _opened, _depth
    with _lock:
        if not _depth:
            _opened = {}
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if not _depth:
                _opened = None


def opening_folders(fn):
    """``fn`` (a builder) run within :func:`opening`."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with opening():
            return fn(*args, **kwargs)
    return wrapped


def resolve(path, options: dict | None = None) -> str:
    """``path`` itself when local; the shadow folder of a remote one."""
    return local_folder(str(path), options) if is_remote(path) else str(path)


def is_shadow(path: str) -> bool:
    """Whether ``path`` lies in a shadow folder of this host's cache (its bytes are fetched on demand). Decided
    from the path alone, so a worker process that never mirrored anything knows it too."""
    path = os.path.abspath(path)
    if f"{os.sep}objects{os.sep}" not in path:  # (no shadow: the cache folder is not resolved for local data)
        return False
    return path.startswith(os.path.join(_cache(), "objects", ""))


def remote_names(text: str) -> str:
    """``text`` with each shadow path in it named as its object's URL (for messages a user reads)."""
    root = os.path.join(_cache(), "objects", "")

    def url(m):
        try:
            with open(os.path.join(root, m.group(1), ".manifest.json")) as f:
                return json.load(f)[""]["url"].rstrip("/") + ("/" if m.group(0).endswith("/") else "")
        except (OSError, ValueError, KeyError, TypeError):
            return m.group(0)

    return re.sub(re.escape(root) + r"([0-9a-f]{20})(?:/|(?=['\"\s:,)]|$))", url, text)


def resolve_prefix(prefix) -> str:
    """A dataset prefix (``DIR/name``, as Megatron's --data-path gives them) with a remote ``DIR`` mirrored."""
    prefix = str(prefix)
    if not is_remote(prefix):
        return prefix
    folder, _, name = prefix.rstrip("/").rpartition("/")
    return os.path.join(local_folder(folder), name)


def ensure(path: str, starts, ends, inode: int = 0) -> dict:
    """Fetch the byte ranges ``[starts, ends)`` of shadow file ``path`` that it does not hold yet. ``inode``: the
    file the reader opened there (``IndexedDataset.bin_inode``; 0: not said): when its object was replaced in the
    store and mirrored again since (by this process or another job on the host), the path names another file, and
    the fetcher refuses rather than fill a file the reader does not read (it would read zeros)."""
    return ensure_many([[path, starts, ends, None, inode]])


def ensure_many(files: list, group: bool = False, due: float | None = None) -> dict:
    """:func:`ensure` for ``[[path, starts, ends(, None, inode)], ...]`` (``TokenSpaces.ranges``), in one request;
    returns when every range is held, and pinned (not evicted) until this thread's next request. ``due``: the
    clock of the batch that reads them (on :func:`hint`'s scale: hints due by then are spent).

    ``group``: the rows of this thread's next batches (the prefetcher's request): the ranges stay pinned until
    the next group, and a later call whose ranges all lie in them returns at once, without a round trip."""
    if not files:
        if group:
            _local.covered = {}
        return {"waited": False}
    covered = getattr(_local, "covered", None) if getattr(_local, "pid", None) == os.getpid() else None
    if not group and covered and _within(files, covered):
        return {"waited": False}
    t0 = time.perf_counter()
    got = request({"op": "ensure", "files": flat_files(files), "clock": due,
                   "keep": bool(covered) and not group})
    _waited["seconds"] += time.perf_counter() - t0
    _waited["calls"] += 1
    if group:
        by_path: dict = {}
        for f in files:
            by_path.setdefault(os.path.abspath(f[0]), []).append((np.asarray(f[1], np.int64),
                                                                  np.asarray(f[2], np.int64)))
        _local.covered = {p: merged(np.concatenate([x for x, _ in v]), np.concatenate([y for _, y in v]))
                          for p, v in by_path.items()}
    return got


def _within(files: list, covered: dict) -> bool:
    """Whether every range of ``files`` lies inside one interval of ``covered`` (path -> sorted starts, ends)."""
    for path, a, b, *_ in files:
        got = covered.get(os.path.abspath(path))
        if got is None or not within(a, b, *got):
            return False
    return True


def hint(files: list, due: float | None = None) -> None:
    """Ask for ``[[path, starts, ends(, dues(, inode))], ...]`` ahead of need: the fetcher starts on them and replies at
    once. ``due`` (or each range's own, the fourth item): the clock (``ensure_many``'s ``due``) of the batch that will
    read them, so that they are fetched in that order, and the cache keeps them and evicts what is needed later,
    or never again."""
    if files:
        request({"op": "hint", "files": flat_files(files, dues=True), "due": due})


def upload(folder: str, url: str, options: dict | None = None, log=print) -> int:
    """Write every file of local folder ``folder`` under remote folder ``url`` (through the host's fetcher, many at
    once), the data files first and ``dict.txt`` and the reports last: a reader never finds a folder that looks
    complete before it is. Hidden names (a binarize run's own state) stay local. Returns the bytes written."""
    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    url = str(url).rstrip("/")
    names = sorted(rel for rel in (os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder)
                                   for f in fs) if not any(p.startswith(".") for p in rel.split(os.sep)))
    last = [n for n in names if not n.endswith((".bin", ".idx"))]
    first = [n for n in names if n.endswith((".bin", ".idx"))]
    store = _store_args(options)
    done = 0
    with tqdm(total=len(names), unit="file", desc=f"upload to {url}", disable=None) as bar:
        for group in (first, last):
            def one(name):
                got = request({"op": "upload", "url": f"{url}/{name.replace(os.sep, '/')}",
                               "path": os.path.abspath(os.path.join(folder, name)), **store})
                bar.update(1)
                return got["bytes"]

            with ThreadPoolExecutor(16) as pool:
                done += sum(pool.map(one, group))
    with _lock:
        _folders.pop(url, None)  # (mirrored again when next read)
    return done


def listing(url: str, options: dict | None = None) -> dict:
    """``{name: size}`` of the objects under remote folder ``url`` (names relative to it, with ``/``)."""
    got = request({"op": "list", "url": str(url).rstrip("/"), **_store_args(options)})
    return {name: int(size) for name, size in got["files"]}


def delete(url: str, options: dict | None = None) -> None:
    """Delete object ``url``."""
    request({"op": "delete", "url": str(url), **_store_args(options)})


def staging(url: str) -> str:
    """The local folder where output for remote folder ``url`` is written before it is uploaded (kept between
    runs, so an interrupted run resumes from it)."""
    key = hashlib.blake2b(str(url).rstrip("/").encode(), digest_size=10).hexdigest()
    path = os.path.join(private_folder(os.path.join(_cache(), "staging"), "staged output"), key)
    private_folders(path)
    return path


def plan(shares: dict, hosts: int = 1, rank: int | None = None, epoch: int | None = None) -> dict:
    """Tell the host's fetcher what share of each shadow ``.bin``'s rows this process's epoch reads (``{path:
    share}``, or ``{path: (share, rows in the file(, inode))}``: the file the reader opened there), with ``hosts`` reading the data: files whose reads,
    joined across short gaps, bring nearly all of them are fetched in large blocks, the others range by range (on
    several hosts, gaps of ``SPARSE_GAP`` bridged: by default as on one host). ``rank``: this process's, of
    ``hosts`` ranks: the fetcher adds up the shares of the ranks on its host (eight ranks of a host read as one
    host of eight)."""
    if not shares:
        return {}
    files = {os.path.abspath(p): [float(v), 0] if np.ndim(v) == 0 else [float(v[0]), int(v[1])]
             for p, v in shares.items()}
    inodes = {os.path.abspath(p): int(v[2]) for p, v in shares.items() if np.ndim(v) and len(v) > 2 and v[2]}
    return request({"op": "plan", "files": files, "hosts": int(hosts), "rank": rank, "epoch": epoch,
                    "inodes": inodes})


_waited = {"seconds": 0.0, "calls": 0}  # this process's time blocked on the fetcher (a gather waiting for bytes)


def stats() -> dict:
    """The host fetcher's counters (:meth:`Fetcher.stats`)."""
    return request({"op": "stats"})


def in_use() -> bool:
    """Whether this process has read a folder of an object store (through the host's fetcher)."""
    return bool(_folders) or getattr(_local, "conn", None) is not None


def telemetry() -> dict:
    """A flat dict of numbers for a training loop's logger: ``fetch/...`` from the host's fetcher, and
    ``fetch/wait_seconds``: how long this process's gathers waited on bytes not yet fetched. Empty when this
    process reads no object store (no fetcher is started for it): :class:`babelfeed.Timed` measures the loop's
    wait on any data."""
    if not in_use():
        return {}
    got = {f"fetch/{k}": v for k, v in stats().items()}
    got["fetch/wait_seconds"] = round(_waited["seconds"], 6)
    got["fetch/wait_calls"] = _waited["calls"]
    return got
