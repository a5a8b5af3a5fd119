"""grain adapter: the pipeline as a grain dataset, so grain's worker processes do the gathering.

    ds = babelfeed.adapters.grain.batch_dataset(config, epoch=1, rank=r, world_size=w, num_workers=2)  # MT or LM config
    it = iter(ds)
    for batch in it: ...
    state = it.get_state()          # grain's checkpoint; it.set_state(state) (or orbax's
                                    # grain.checkpoint.CheckpointSave/Restore) resumes at the exact batch

    it = iter(babelfeed.adapters.grain.EpochsDataset(config, num_workers=2))   # every epoch, one after another;
    state = it.get_state()          # the run's iterator state: any num_workers, any world size, any adapter

The source is this rank's batches of one epoch, by index, as a grain ``IterDataset`` (:class:`BatchDataset`):
grain's ``MapDataset`` must know its length before it hands out a record (its prefetch iterator and its worker
slices call ``len``), and the length of a translation epoch is known only once every window is planned (1.6 s
per 20M samples). The ``IterDataset`` yields batch k, k + n, ... until the epoch ends, planning each window when
its first batch is asked for, so the first batch comes after window 0 is planned, whatever the epoch's size.
With ``num_workers`` > 0, ``mp_prefetch`` gives worker i the batches ``i, i + n, ...`` (``set_slice``), and its
round-robin reads put them back in order. The state is the next batch's index (per worker under
``mp_prefetch``). Four grain 0.2.x traps are handled here rather than in your script:

* ``mp_prefetch`` reads absl flags and raises ``UnparsedFlagAccessError`` in a plain script: flags are marked
  parsed when nobody parsed them;
* worker processes re-import ``__main__``: the source is picklable and opens nothing until a worker uses it,
  but build the pipeline under ``if __name__ == "__main__":`` in your script;
* grain's default 16 read threads made cheap reads ~12x slower on a 2-core machine: ``num_threads=0`` unless
  asked otherwise;
* grain sends every array through a shared-memory segment of its own (~0.7 ms each here): with workers, a
  batch crosses as one block (``babelfeed.adapters.transfer``) and is a plain dict again after ``mp_prefetch``.
"""

from __future__ import annotations

import ast
import atexit
import os
import pickle
import sys
import threading
import weakref

import grain
import numpy as np

from babelfeed.adapters import transfer
from babelfeed.adapters.position import Position, pinned, resumed_iterator
from babelfeed.build import is_lm_config
from babelfeed.errors import CallOrderError, ConfigError, StateError, UsageError
from babelfeed.iterators.protocol import check_rank


class BatchSource:
    """A grain RandomAccessDataSource: record k is this rank's k-th batch of ``epoch`` (a dict of arrays)."""

    def __init__(self, config, epoch: int = 1, rank: int = 0, world_size: int = 1, split: str | None = None,
                 packed: bool = False, base: int = 0, resume: dict | None = None, expect: dict | None = None):
        self.config, self.epoch, self.rank, self.world_size, self.split = config, epoch, rank, world_size, split
        self.expect = expect  # the data the job started with (adapters.position.pinned): other data is refused
        self.resume = resume  # the state a run was resumed from: its history plans the same batches
        self.base = int(base)  # record k is this rank's k-th batch from global batch base of the epoch
        self.packed = packed  # one block per batch (babelfeed.adapters.transfer), for the trip out of a worker process
        self._iterator = None
        self._len = None
        # grain's read threads call one source at once: an iterator plans windows lazily and is not thread-safe,
        # so its calls are serialised (the batch's packing for transfer still runs in parallel)
        self._lock = threading.RLock()

    def _it(self):
        if self._iterator is None:  # opened lazily, in the process that reads
            self._iterator = resumed_iterator(self.config, self.rank, self.world_size, self.split, self.epoch,
                                              self.resume, expect=self.expect)
        return self._iterator

    def __len__(self) -> int:
        """This rank's batches in the epoch: plans every window the first time (grain's MapDataset needs it;
        :class:`BatchDataset` does not)."""
        with self._lock:
            if self._len is None:
                self._len = self._it().steps_after(self.base)
            return self._len

    def __getitem__(self, k: int) -> dict:
        with self._lock:
            batch = self._it().batch_at(int(k), base=self.base)
        if not self.packed:
            return batch
        block, plan, scalars = transfer.pack(batch)
        return {"block": block, "layout": pickle.dumps((plan, scalars))}

    def has(self, k: int) -> bool:
        """Whether batch k exists, planning only the windows up to it."""
        with self._lock:
            return self._it().has_batch(int(k), base=self.base)

    def get(self, k: int) -> dict | None:
        """Batch k, or None past the epoch's end (one lookup of the batch's window, where ``has`` and then
        ``[k]`` take two)."""
        try:
            return self[k]
        except IndexError:
            if self.has(k):  # not the epoch's end: a real error
                raise
            return None

    def __getstate__(self):
        return {"config": self.config, "epoch": self.epoch, "rank": self.rank, "world_size": self.world_size,
                "split": self.split, "len": self._len, "packed": self.packed, "base": self.base,
                "resume": self.resume, "expect": self.expect}

    def __setstate__(self, state):
        self.__init__(state["config"], state["epoch"], state["rank"], state["world_size"], state["split"],
                      state["packed"], state.get("base", 0), state.get("resume"), state.get("expect"))
        self._len = state["len"]

    def __repr__(self) -> str:  # grain writes it into its checkpoints
        return (f"BatchSource(epoch={self.epoch}, rank={self.rank}, world_size={self.world_size}, split={self.split}"
                + (f", base={self.base})" if self.base else ")"))


class BatchDataset(grain.IterDataset):
    """This rank's batches of one epoch as a grain ``IterDataset``: batches ``start, start + step, ...`` until the
    epoch ends, each window planned when first needed (no length up front). ``mp_prefetch`` slices it per worker
    (``set_slice``); the iterator's state is the index of the next batch."""

    def __init__(self, source: BatchSource, start: int = 0, step: int = 1):
        super().__init__()
        self.source, self.start, self.step = source, int(start), int(step)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        if sequential_slice:
            raise UsageError("a BatchDataset cannot be sliced sequentially: that needs the epoch's length, which "
                             "is known only once every window is planned; use mp_prefetch's default slicing")
        if sl.stop is not None:
            raise UsageError(f"a BatchDataset can be sliced with start and step only, got {sl}")
        start, step = sl.start or 0, sl.step or 1
        self.start, self.step = self.start + start * self.step, self.step * step

    def __iter__(self) -> "BatchDatasetIterator":
        return BatchDatasetIterator(self)

    def __str__(self) -> str:
        return f"BatchDataset({self.source!r}, start={self.start}, step={self.step})"


class BatchDatasetIterator(grain.DatasetIterator):
    def __init__(self, ds: BatchDataset):
        super().__init__()
        self._ds = ds
        self._next = ds.start

    def __next__(self) -> dict:
        k = self._next
        batch = self._ds.source.get(k)
        if batch is None:
            raise StopIteration
        self._next = k + self._ds.step
        return batch

    def get_state(self) -> dict:
        return {"next_index": self._next}

    def set_state(self, state: dict) -> None:
        k = state["next_index"]
        if (k - self._ds.start) % self._ds.step or k < self._ds.start:
            raise StateError(f"state {state} is not a position of this iterator (batches {self._ds.start}, "
                             f"{self._ds.start} + {self._ds.step}, ...)")
        self._next = int(k)


# Iterators over worker processes still open when the interpreter exits: closed first, while the modules their
# cleanup needs are still there (grain's own __del__ then runs during teardown and prints tracebacks and
# "leaked shared_memory objects" warnings).
_OPEN = weakref.WeakSet()


@atexit.register
def _close_open_iterators() -> None:
    for it in list(_OPEN):
        try:
            it.close()
        except Exception:  # exiting anyway; the worker processes end with the interpreter
            pass


class _ClosedAtExit(grain.IterDataset):
    """Its parent, whose iterators are closed at interpreter exit if the program has not closed them."""

    def __init__(self, parent):
        super().__init__(parent)

    def __iter__(self) -> "_ClosingIterator":
        return _ClosingIterator(self._parent.__iter__())

    def __str__(self) -> str:
        return str(self._parent)


class _ClosingIterator(grain.DatasetIterator):
    """grain's iterator, let go of once closed: closed at exit, it is collected while the modules its own cleanup
    needs are still loaded (a global iterator is otherwise cleaned up during teardown, printing tracebacks)."""

    def __init__(self, inner):
        super().__init__()
        self._inner = inner
        _OPEN.add(self)

    def __next__(self):
        if self._inner is None:
            raise CallOrderError("this iterator was closed")
        return next(self._inner)

    def get_state(self):
        return self._inner.get_state()

    def set_state(self, state) -> None:
        self._inner.set_state(state)

    def close(self) -> None:
        inner, self._inner = getattr(self, "_inner", None), None
        if inner is not None:
            inner.close()

    def __str__(self) -> str:
        return str(self._inner)


def _check_main_guard(what: str) -> None:
    """grain starts its workers with "spawn": each re-runs the script as ``__mp_main__``, so a script that builds
    the pipeline at its top level, outside ``if __name__ == "__main__":``, starts workers from every worker, and
    Python stops that with 100 lines of tracebacks from every process. Said here in one line, before a worker
    starts: the statement of the script that led here is read from the script's source."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame, top = sys._getframe(1), None
    while frame is not None:  # the outermost frame running the script's own top-level code
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in ("__main__", "__mp_main__"):
            top = frame
        frame = frame.f_back
    if top is None or not path or os.path.abspath(top.f_code.co_filename) != os.path.abspath(path):
        return  # a notebook, python -c, a test runner: no script to re-run
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = top.f_lineno
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            guarded = isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) \
                and "__main__" in ast.unparse(node.test)
            if not guarded:
                raise CallOrderError(f"{what} with num_workers > 0 is built at the top level of {path} (line {line}): "
                                     f"grain starts its workers by re-running the script, so put the pipeline under "
                                     f"`if __name__ == \"__main__\":` (or in a function called from there)")
            return


def _flags_parsed() -> None:
    try:
        from absl import flags  # optional: absl, when jax brings it
    except ImportError:
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _counts(**values) -> None:
    """Each ``name=(value, least)``: an int (not a bool, a float or a string) of at least ``least``, or a
    ValueError naming it (grain's own errors for these are bare TypeErrors, and -1 workers was accepted)."""
    for name, (value, least) in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"{name} must be an int >= {least}" + (" (0: batches made in this process)"
                                                                    if name == "num_workers" else "")
                             + f", got {value!r}")


def batch_dataset(config, epoch: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                  per_worker_buffer_size: int = 2, read_threads: int = 0, split: str | None = None):
    """This rank's batches of one epoch as a grain IterDataset (``num_workers`` > 0: gathered in worker
    processes via ``mp_prefetch``). ``config``: a translation or a language-model config (``split=None``: the
    iterator's own default, whole batches per rank for translation, rows of every global batch for LM).

    Nothing is planned before the first batch is asked for, and then only its window. ``read_threads`` > 0 reads
    through grain's ``MapDataset`` with that many threads instead, which plans the whole epoch first to know its
    length (and made cheap reads slower on a 2-core machine)."""
    _counts(num_workers=(num_workers, 0), per_worker_buffer_size=(per_worker_buffer_size, 1),
            read_threads=(read_threads, 0), epoch=(epoch, 1))
    source = BatchSource(config, epoch, rank, world_size, split, packed=num_workers > 0)
    if read_threads > 0:
        len(source)  # plan once here, so workers inherit the length instead of each planning the epoch
        ds = grain.MapDataset.source(source).to_iter_dataset(
            grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(1, per_worker_buffer_size)))
    else:
        ds = BatchDataset(source)
    if num_workers > 0:
        _check_main_guard("batch_dataset")
        _flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                        per_worker_buffer_size=per_worker_buffer_size))
        ds = _ClosedAtExit(ds.map(_unpack))  # each batch crossed as one shared-memory block; a plain dict again
    return ds


class EpochsDataset(grain.IterDataset):
    """This rank's batches of every epoch from ``epoch`` on (``num_epochs`` of them, or without end), gathered in
    ``num_workers`` grain worker processes. Its iterator's state is the run's iterator state (``babelfeed.iterators.state``) at
    the global batches of the epoch taken once every rank has received as many as this consumer, so a state saved with
    2 workers restores with 0 or 4 (grain's own ``mp_prefetch`` state holds one entry per worker and restores only
    with as many), and one saved on 8 ranks restores on 6. A state of other data (another tokenizer, other files)
    is refused. An LM config is one pass over its ``num_samples`` (one epoch). The state is the run's iterator
    state at the consumer's position (``babelfeed.iterators.state``), which every other adapter and ``babelfeed trace``
    take; ``set_state`` takes theirs too.

        if __name__ == "__main__":                 # grain's workers re-run the script: build under the guard
            ds = EpochsDataset(config, num_workers=2)
            it = iter(ds)
            for step, batch in zip(range(steps), it): ...
            state = it.get_state()                 # JSON; or orbax through grain.checkpoint.CheckpointSave
            it = iter(EpochsDataset(config, num_workers=0)); it.set_state(state)   # the next batch, exactly
    """

    def __init__(self, config, epoch: int = 1, num_epochs: int | None = None, rank: int = 0, world_size: int = 1,
                 num_workers: int = 0, per_worker_buffer_size: int = 2, split: str | None = None):
        super().__init__()

        check_rank(rank, world_size)
        if num_epochs is not None and not (isinstance(num_epochs, int) and num_epochs >= 1):
            raise UsageError(f"num_epochs must be an int >= 1 (or None: no end), got {num_epochs!r}")
        _counts(num_workers=(num_workers, 0), per_worker_buffer_size=(per_worker_buffer_size, 1), epoch=(epoch, 1))
        if num_workers > 0:
            _check_main_guard("EpochsDataset")
        if is_lm_config(config):
            if epoch != 1:
                raise ConfigError("an LM config is one pass over num_samples: epoch must be 1")
            num_epochs = 1
        self.config, self.epoch, self.num_epochs = config, int(epoch), num_epochs
        self.rank, self.world_size, self.split = rank, world_size, split
        self.num_workers, self.per_worker_buffer_size = num_workers, per_worker_buffer_size
        self._position = None

    def position(self):
        if self._position is None:
            self._position = Position(self.config, self.rank, self.world_size, self.split, "EpochsDataset")
        return self._position

    def fingerprint(self) -> str:
        return self.position().current().fingerprint()

    def epoch_batches(self, epoch: int, base: int):
        """One epoch's grain pipeline from global batch ``base`` on."""
        if getattr(self, "_expect", None) is None:  # the data this job started with: every epoch's source checks it
            self._expect = pinned(self.position().current())
        source = BatchSource(self.config, epoch, self.rank, self.world_size, self.split,
                             packed=self.num_workers > 0, base=base, resume=self.position().resume,
                             expect=self._expect)
        ds = BatchDataset(source)
        if self.num_workers > 0:
            _flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.num_workers,
                                                            per_worker_buffer_size=self.per_worker_buffer_size))
            ds = ds.map(_unpack)
        return ds

    def __iter__(self) -> "EpochsIterator":
        return EpochsIterator(self)

    def __str__(self) -> str:
        return (f"EpochsDataset(epoch={self.epoch}, num_epochs={self.num_epochs}, rank={self.rank}, "
                f"world_size={self.world_size}, num_workers={self.num_workers})")


class EpochsIterator(grain.DatasetIterator):
    def __init__(self, ds: EpochsDataset):
        super().__init__()
        self._ds = ds
        self._epoch, self._base, self._seen, self._inner = ds.epoch, 0, 0, None
        _OPEN.add(self)
        self._per_step = ds.position().current().batches_per_step

    def __next__(self) -> dict:
        ds = self._ds
        while True:
            if ds.num_epochs is not None and self._epoch >= ds.epoch + ds.num_epochs:
                raise StopIteration
            if self._inner is None:
                self._inner = iter(ds.epoch_batches(self._epoch, self._base + self._seen * self._per_step))
                self._base, self._seen = self._base + self._seen * self._per_step, 0
            try:
                batch = next(self._inner)
            except StopIteration:
                self._close()
                self._epoch, self._base, self._seen = self._epoch + 1, 0, 0
                continue
            self._seen += 1
            return batch

    def _close(self) -> None:
        inner, self._inner = self._inner, None
        close = getattr(inner, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        """Stop the current epoch's worker processes (also done at interpreter exit); the position is kept, and
        the next batch starts them again."""
        self._close()

    def get_state(self) -> dict:
        return self._ds.position().state(self._epoch, self._base + self._seen * self._per_step)

    def ledger(self, prefix: str = "ledger") -> dict:
        """What every rank together has consumed, per stream, at this position (``babelfeed.iterators.ledger``)."""
        return self._ds.position().ledger(self._epoch, self._base + self._seen * self._per_step, prefix)

    def set_state(self, state: dict, mixture_change: str = "refuse") -> None:
        """Resume after the batch of ``state`` (any adapter's state). ``mixture_change="allow"``: a state of another
        config of the same data goes on under this one from its next step (``babelfeed.run.edits``)."""
        epoch, consumed = self._ds.position().load(state, mixture_change)
        self._ds.position().adopt_edits(self._ds)  # (the run's own set_weights: its config carries the weights)
        self._close()
        self._epoch, self._base, self._seen = epoch, consumed, 0

    def _change(self, method: str, *args, **kwargs):
        """The run's iterator's ``method`` at this position; the workers' read-ahead is dropped and made again
        from the next batch on."""
        ds = self._ds
        pos = ds.position()
        state, out = pos.apply(self._epoch, self._base + self._seen * self._per_step, method, *args, **kwargs)
        pos.adopt_edits(ds)  # (an edit, or set_weights made as one: the workers build the edited config's iterator)
        self.set_state(state)
        return out

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """The iterator's ``skip`` (``babelfeed.run.skips``) at this position: the workers' read-ahead is
        dropped and made again with it. Call it on every rank. Returns the skip's event."""
        return self._change("skip", steps=steps, ids=ids, where=where, reason=reason, world_size=world_size)

    def set_weights(self, weights: dict):
        """The iterator's ``set_weights`` at this position (the workers' read-ahead is made again). Call it on
        every rank at the same step."""
        return self._change("set_weights", weights)

    def edit(self, config=None, **changes):
        """Change the run's config from the next batch on (``babelfeed.run.edits``): every stream goes on
        from its position. Call it on every rank at the same step. Returns the ``EditReport``."""
        return self._change("edit", config, **changes)


def _unpack(element: dict) -> dict:
    """A batch from its shared-memory block, copied out (one memcpy of the batch): views of the block would keep
    grain's SharedMemoryArray alive as long as the program holds the batch, and one still held when the
    interpreter exits is deleted after the modules its cleanup needs (a traceback at exit, a leaked segment)."""
    plan, scalars = pickle.loads(element["layout"])
    return transfer.unpack(np.array(element["block"], copy=True), plan, scalars)
