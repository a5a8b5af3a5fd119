"""Where ``babelfeed binarize`` runs its units of work: in this process, in local worker processes, or on Ray.

The boundary is small on purpose. The encoding code is plain functions of (the job's context, one unit of work)
that read their input files and write their output files, so an engine only has to

* ``set_context(obj)``: hand every worker the job's context (the SentencePiece model, the id table, the
  settings) once; a task reads it with :func:`context`;
* ``submit(fn, *args)``: run ``fn(*args)`` on some worker and return a ``concurrent.futures.Future``;
* ``close()``.

The driver (:func:`run_tasks`) decides what to run and in which order and merges the results; what it gets back
does not depend on which worker ran what, so every engine writes the same bytes. A Beam or Spark runner would be
another class with these three methods (or a pipeline calling the same functions).

Engines:

* ``inline``: in this process, one task at a time (``--workers 1``).
* ``local``: spawned worker processes (``concurrent.futures.ProcessPoolExecutor``). A worker that dies (killed,
  out of memory) breaks the pool: the pool is started again and the unfinished tasks are submitted again, up to
  :data:`MAX_RESTARTS` times.
* ``ray``: Ray tasks (``pip install 'babelfeed[ray]'``) on the cluster at ``address`` (``"auto"``, ``HOST:PORT``,
  ``ray://HOST:PORT``), or on a local Ray instance started here when no address is given. Ray itself runs a task
  again when its worker dies (``max_retries``); a task's own error (bad input) is not retried.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections import deque
from concurrent.futures.process import BrokenProcessPool

from babelfeed.errors import BabelfeedError, MissingExtraError, UsageError, WorkerDied


ENGINES = ("local", "ray")
MAX_RESTARTS = 3
TASK_RETRIES = 3  # Ray: runs of a task whose worker died

_CONTEXT: dict = {"key": None, "value": None}
_FAIL_ENV = "_BABELFEED_TEST_FAIL"  # test hook: "WHERE=MARKER" makes the first worker that reaches WHERE die


def context():
    """The job's context in a worker (what the driver gave ``set_context``)."""
    return _CONTEXT["value"]


def context_key():
    """An identity of the context in this worker (changes when the driver sets another)."""
    return _CONTEXT["key"]


def _set(key, value) -> None:
    _CONTEXT["key"], _CONTEXT["value"] = key, value


def fault_spec() -> str | None:
    """The driver's ``$_BABELFEED_TEST_FAIL``, handed to the workers with the job's context."""
    return os.environ.get(_FAIL_ENV) or None


def fault_point(where: str, spec: str | None) -> None:
    """Fault injection for tests: when ``spec`` (the driver's ``$_BABELFEED_TEST_FAIL``) is ``WHERE=MARKER`` and
    ``where`` contains ``WHERE``, the first process to get here (the one that creates the file ``MARKER``) dies on
    the spot, as a worker killed by the kernel would. Unset, it costs nothing."""
    if not spec:
        return
    what, _, marker = spec.partition("=")
    if what and what in where:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os._exit(17)


class InlineEngine:
    """Every task in this process, when it is submitted."""

    name = "inline"

    def __init__(self):
        self.workers = 1

    def set_context(self, value) -> None:
        _set(uuid.uuid4().hex, value)

    def submit(self, fn, *args) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # KeyboardInterrupt and the like go straight up
            fut.set_exception(e)
        return fut

    def restart(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


def _local_call(key, path, fn, *args):
    if _CONTEXT["key"] != key:  # a context set after this worker started: read it once from its file
        with open(path, "rb") as f:
            _set(key, pickle.load(f))
    return fn(*args)


ORPHAN_POLL = 0.5  # seconds between a worker's looks at its parent


def _die_with_parent(parent: int) -> None:
    """A worker's initializer: a thread that ends the worker once its parent is gone (``kill -9``, the OOM killer,
    a scheduler's preemption), which leaves it reparented and its pipe to nobody. Polling the parent's pid works
    where ``prctl(PR_SET_PDEATHSIG)`` does not (macOS) and does not depend on which of the parent's threads
    started the worker."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="babelfeed-parent-watch", daemon=True).start()


ENGINE_DIR = "babelfeed-engine-"


def _remove_orphaned_dirs(root: str) -> list[str]:
    """The work folders of local engines whose process is gone (killed before it could remove them: their name
    holds its pid), removed; a folder of a live process, or of another user, is left alone."""
    gone = []
    try:
        names = os.listdir(root)
    except OSError:
        return gone
    for name in names:
        pid = name[len(ENGINE_DIR):].split("-", 1)[0]
        if not name.startswith(ENGINE_DIR) or not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
            continue  # alive (or a pid taken again since: left alone)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
        except OSError:  # another user's process, or a folder that went away
            continue
    return gone


class LocalEngine:
    """Spawned worker processes on this machine; they end when this process does, however it ends."""

    name = "local"

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._key = None
        self._path = None
        _remove_orphaned_dirs(tempfile.gettempdir())
        self._dir = tempfile.mkdtemp(prefix=f"{ENGINE_DIR}{os.getpid()}-")
        self._pool = None
        self.restarts = 0

    def set_context(self, value) -> None:
        """Workers already running read the new context from a file once; workers started later get it too."""
        self._key = uuid.uuid4().hex
        self._path = os.path.join(self._dir, self._key + ".pkl")
        with open(self._path, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)

    def submit(self, fn, *args) -> cf.Future:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                                initializer=_die_with_parent, initargs=(os.getpid(),))
        return self._pool.submit(_local_call, self._key, self._path, fn, *args)

    def restart(self) -> bool:
        """After a worker died: a fresh pool, if restarts are left (the caller submits its tasks again)."""
        if self.restarts >= MAX_RESTARTS:
            return False
        self.restarts += 1
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        return True

    def abort(self) -> None:
        """Stop the worker processes at once (the job is being given up: Ctrl-C, SIGTERM, an error)."""
        pool = self._pool
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for proc in procs:  # (SIGTERM reaches only the main process; Ctrl-C reaches them too)
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
        pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        shutil.rmtree(self._dir, ignore_errors=True)


def _ray_call(key, value, fn, *args):
    if _CONTEXT["key"] != key:
        _set(key, value)
    return fn(*args)


class RayAddressError(BabelfeedError, ValueError):
    """A --ray-address where no Ray cluster answers."""


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Refuse, within ``timeout`` seconds, an address ``HOST:PORT`` (or ``ray://HOST:PORT``) where nothing
    listens: ``ray.init`` would retry for minutes, printing its RPC warnings. ``auto`` and ``local`` are Ray's."""
    text = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        if address in ("auto", "local"):
            return
        raise RayAddressError(f"--ray-address {address!r}: give HOST:PORT (the head node's GCS port, e.g. "
                              f"10.0.0.5:6379), ray://HOST:PORT, or auto")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayAddressError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}; tried for "
                              f"{timeout:g} s): start one (ray start --head) or check the address") from None


class RayEngine:
    """Ray tasks, one CPU each."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int = 0):
        try:
            import ray  # optional: babelfeed[ray]
        except ImportError:
            raise MissingExtraError("--engine ray needs Ray: pip install 'babelfeed[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            if address:
                check_ray_address(address)
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
            else:  # a local instance for this job; the object store only carries the context
                ray.init(num_cpus=workers or None, object_store_memory=256 << 20, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=True)
            self._started = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(_ray_call).options(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)
        self._key = None
        self._ref = None

    def set_context(self, value) -> None:
        self._key, self._ref = uuid.uuid4().hex, self._ray.put(value)

    def submit(self, fn, *args) -> cf.Future:
        ref = self._remote.remote(self._key, self._ref, fn, *args)
        outer: cf.Future = cf.Future()
        inner = ref.future()

        def relay(f: cf.Future) -> None:
            try:
                outer.set_result(f.result())
            except BaseException as e:  # Ray wraps a task's error; hand on the error the task raised
                cause = getattr(e, "cause", None)
                if isinstance(e, self._ray.exceptions.RayTaskError) and isinstance(cause, Exception):
                    outer.set_exception(cause)
                elif isinstance(e, (self._ray.exceptions.WorkerCrashedError,
                                    getattr(self._ray.exceptions, "NodeDiedError", ()),
                                    self._ray.exceptions.TaskCancelledError)):
                    outer.set_exception(WorkerDied(f"a Ray worker died {TASK_RETRIES + 1} times running "
                                                   f"{getattr(fn, '__name__', fn)} ({type(e).__name__}: {e})"))
                else:
                    outer.set_exception(e)

        inner.add_done_callback(relay)
        return outer

    def restart(self) -> bool:
        return False  # Ray runs a task again itself when its worker dies

    def abort(self) -> None:
        pass  # (close() shuts down a Ray instance this job started; a cluster's tasks end with the driver)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_engine(name: str = "local", workers: int = 0, address: str | None = None):
    """``local`` (``workers`` processes, 0: every core; 1: in this process) or ``ray`` (at ``address``, or a
    local Ray instance of ``workers`` CPUs, 0: every core)."""
    if name == "local":
        n = workers or os.cpu_count() or 1
        return InlineEngine() if n == 1 else LocalEngine(n)
    if name == "ray":
        return RayEngine(address, workers)
    raise UsageError(f"--engine must be one of {ENGINES}, got {name!r}")


def run_tasks(engine, tasks, on_done, limit: int | None = None) -> None:
    """Run ``tasks`` (``(tag, fn, args)``) on ``engine``; ``on_done(tag, result)`` returns follow-up tasks.

    At most ``limit`` tasks are in flight (default: twice the engine's workers), so results are taken as they
    come and a failure stops the job quickly. A task's error is raised here. A dead local worker restarts the
    pool and resubmits the tasks that were in flight.
    """
    queue = deque(tasks)
    limit = limit or 2 * engine.workers
    inflight: dict[cf.Future, tuple] = {}
    try:
        while queue or inflight:
            while queue and len(inflight) < limit:
                task = queue.popleft()
                inflight[engine.submit(task[1], *task[2])] = task
            done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                task = inflight.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    lost = [task] + [t for f, t in inflight.items()]
                    inflight.clear()
                    if not engine.restart():
                        raise WorkerDied(f"a worker process died more than {MAX_RESTARTS} times (killed, out of "
                                         f"memory, or a script that runs its work on import: worker processes are "
                                         f"spawned and import the main script, so guard it with "
                                         f"`if __name__ == \"__main__\":`); the last time it was running "
                                         f"{', '.join(str(t[0]) for t in lost[:4])}") from None
                    queue.extendleft(reversed(lost))
                    break
                queue.extend(on_done(task[0], result) or ())
    finally:
        for fut in inflight:
            fut.cancel()
