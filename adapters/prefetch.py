"""A background thread that converts an iterator's batches ahead of use, keeping its exact position.

Framework-neutral: the JAX and torch adapters pass their conversion (global arrays, device tensors).
``get_state()`` is the wrapped iterator's state after the last batch handed out (not the read-ahead), and
``set_state`` drops the read-ahead and restarts from there. Errors raised by the loader surface in the
consuming thread. When the wrapped iterator finishes an epoch, StopIteration is raised once and the next
call starts the next epoch (its thread starts then, not at the end of the epoch: a script that runs one epoch
and exits leaves no thread inside a framework's transfer). Threads still running at interpreter exit are
stopped and joined first, so exiting never kills one in the middle of a device transfer.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref

from babelfeed.errors import UsageError, UsageTypeError
from babelfeed.stages import STAGES

_live: "weakref.WeakSet[Prefetcher]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for prefetcher in list(_live):
        prefetcher.close()


class Prefetcher:
    _DONE = object()

    def __init__(self, iterator, convert, depth: int = 2, name: str = "babelfeed-prefetch"):
        if depth < 1:
            raise UsageError(f"prefetch depth must be >= 1, got {depth}")
        self.iterator, self.convert, self.depth, self.name = iterator, convert, depth, name
        self._state = iterator.get_state() if hasattr(iterator, "get_state") else None
        # where the ledger counts to is taken per batch in the read-ahead thread (the iterator is that thread's)
        self._tracks = hasattr(iterator, "ledger_at")
        self._ledger = iterator.ledger_at() if self._tracks else None
        self._start()

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._dropped = False
        _live.add(self)

    def _run(self) -> None:
        try:
            for batch in self.iterator:
                if self._stop.is_set():
                    return
                state = self.iterator.get_state() if hasattr(self.iterator, "get_state") else None
                if self._tracks:  # taken here: the iterator is this thread's
                    state = (state, self.iterator.ledger_at())
                t0 = time.perf_counter()
                item = (self.convert(batch), state)
                STAGES.add("transfer", time.perf_counter() - t0)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
            self._queue.put((self._DONE, None))
        except BaseException as e:  # surface loader errors in the training loop, not in a dead thread
            self._queue.put((e, None))

    def __iter__(self):
        return self

    def __next__(self):
        if self._thread is None:
            if self._dropped and self._state is not None:  # closed with batches read ahead: back to the last one
                self.iterator.set_state(self._state)
            self._start()  # the next epoch, or after close()
        item, state = self._queue.get()
        if item is self._DONE:
            self._thread.join()
            self._thread = None
            _live.discard(self)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        if self._tracks:
            state, self._ledger = state
        self._state = state
        return self.ready(item)

    def ready(self, item):
        """Hook run in the consuming thread before a batch is handed out (torch waits on its copy event)."""
        return item

    def get_state(self):
        return self._state

    def set_weights(self, weights: dict):
        """The wrapped iterator's ``set_weights``, at the position of the last batch handed out: the read-ahead is
        dropped (it may hold batches the change re-plans) and made again from there."""
        return self._at_last_batch("set_weights", weights)

    def edit(self, config=None, **changes):
        """The wrapped iterator's ``edit`` (``babelfeed.run.edits``) at the position of the last batch handed
        out, from the next batch on: the read-ahead is dropped and made again. Returns the ``EditReport``."""
        return self._at_last_batch("edit", config, **changes)

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """The wrapped iterator's ``skip`` (``babelfeed.run.skips``) at the position of the last batch handed
        out: the read-ahead is dropped and made again with it. Returns the skip's event."""
        return self._at_last_batch("skip", steps=steps, ids=ids, where=where, reason=reason, world_size=world_size)

    def _at_last_batch(self, method: str, *args, **kwargs):
        """The wrapped iterator's ``method`` called where the last batch handed out left it (the read-ahead
        dropped; the next batch starts it again)."""
        if not hasattr(self.iterator, method):
            raise UsageTypeError(f"{type(self.iterator).__name__} has no {method}")
        self.close()
        if self._dropped and self._state is not None:
            self.iterator.set_state(self._state)
        self._dropped = False
        out = getattr(self.iterator, method)(*args, **kwargs)
        self._state = self.iterator.get_state()
        self._ledger = self.iterator.ledger_at() if self._tracks else None
        return out

    def ledger(self, prefix: str = "ledger") -> dict:
        """The wrapped iterator's ledger after the last batch handed out (not the read-ahead)."""
        if not self._tracks:
            raise UsageTypeError(f"{type(self.iterator).__name__} keeps no ledger")
        return self.iterator.ledger(prefix, at=self._ledger)

    def set_state(self, state, mixture_change: str = "refuse") -> None:
        """Resume after the batch of ``state``: any babelfeed state (``babelfeed.iterators.state``: this adapter's, another
        adapter's, a StatefulDataLoader checkpoint, an older babelfeed's loader position). ``mixture_change``: what
        to do with a state of another config (``"allow"``: an edited mixture, every stream on from its position;
        ``babelfeed.iterators.protocol.MIXTURE_CHANGES``)."""
        self.close()
        self.iterator.set_state(state, mixture_change=mixture_change)
        self._state = self.iterator.get_state() if hasattr(self.iterator, "get_state") else state
        self._ledger = self.iterator.ledger_at() if self._tracks else None
        self._start()

    def close(self) -> None:
        """Stop the read-ahead thread (the position stays: the next call resumes after the last batch)."""
        _live.discard(self)
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._thread = None
        self._dropped = True
