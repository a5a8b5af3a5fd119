"""PyTorch adapter: batches as torch tensors, copied to the GPU ahead of time, and a DataLoader path.

    batches = babelfeed.adapters.torch.TorchBatches(babelfeed.build_train_iterator(config, rank, world), prefetch=2)
    for batch in batches:            # tensors on cuda (pinned host memory, non_blocking copies on a side stream)
        loss = model(**batch["net_input"]) ...
    state = batches.get_state()

    loader = babelfeed.adapters.torch.BatchLoader(config, num_workers=4, pin_memory=True)  # a torch DataLoader;
    for batch in loader: ...                                   # rank/world from torch.distributed if initialised
    state = loader.state_dict()                                # resume: loader.load_state_dict(state)

    dataset = babelfeed.adapters.torch.BatchDataset(config)    # the dataset under it, for a DataLoader of your own
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4, pin_memory=True)
    state = dataset.state_dict(batches_seen)                   # resume: BatchDataset(config, state=state)
    dl = torchdata.stateful_dataloader.StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    state = dl.state_dict()                                    # torchdata's protocol: dl.load_state_dict(state)

Without CUDA the same code runs on the CPU (tests do), with zero-copy ``torch.from_numpy`` tensors.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np
import torch

from babelfeed.adapters import transfer
from babelfeed.adapters.position import Position, _int, pinned, resumed_iterator
from babelfeed.adapters.prefetch import Prefetcher
from babelfeed.build import is_lm_config
from babelfeed.errors import CallOrderError, ConfigError, InternalError, StateError, UsageError
from babelfeed.gather import engine
from babelfeed.iterators.state import find_state, is_position
from babelfeed.run.record import no_strict


def to_torch(batch, device=None, non_blocking: bool = True, pin: bool = False, stream=None):
    """numpy leaves -> tensors (zero-copy on the CPU); with ``device`` cuda, pinned and copied asynchronously."""
    if isinstance(batch, dict):
        return {k: to_torch(v, device, non_blocking, pin, stream) for k, v in batch.items()}
    if isinstance(batch, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(batch))
        if pin:
            t = t.pin_memory()
        if device is not None and torch.device(device).type != "cpu":
            if stream is not None:
                with torch.cuda.stream(stream):
                    t = t.to(device, non_blocking=non_blocking)
            else:
                t = t.to(device, non_blocking=non_blocking)
        return t
    return batch


class TorchBatches(Prefetcher):
    """Converts batches to tensors on ``device`` up to ``prefetch`` ahead, on a background thread.

    With CUDA: host tensors are pinned and copied with ``non_blocking=True`` on a side stream; each batch
    carries an event that the consuming stream waits on before use. ``get_state()`` is the loader position
    after the last batch handed out.
    """

    def __init__(self, iterator, device=None, prefetch: int = 2, pin_memory: bool | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.cuda = self.device.type == "cuda"
        self.pin = self.cuda if pin_memory is None else pin_memory
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        super().__init__(iterator, self._convert, prefetch, "babelfeed-torch-prefetch")

    def _convert(self, batch):
        tensors = to_torch(batch, self.device, True, self.pin, self.stream)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record(self.stream)
        return tensors, event

    def ready(self, item):
        tensors, event = item
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        return tensors


class _Ring:
    """In a DataLoader worker: slots of one shared-memory tensor, reused batch after batch.

    torch sends each tensor of a worker's batch through shared memory that the training process maps anew for
    every batch: about 1 ms per 400 KB on this machine even for an already shared tensor, 5 ms for a translation
    batch of seven arrays, more than gathering it. Here the slots are shared once (with the first batch) and each
    batch is copied into a slot; only its slot number and layout travel, and the training process copies it out
    as it receives it (so a batch it hands out is never written over). A sequence number per slot proves the
    slot still holds that batch: ``slots`` must exceed the DataLoader's ``prefetch_factor``, or the copy-out
    raises instead of returning another batch's tokens.
    """

    def __init__(self, slots: int, slot_bytes: int):
        self.slots, self.slot_bytes = slots, slot_bytes
        self.tensor = torch.empty(slots * slot_bytes, dtype=torch.uint8).share_memory_()
        self.seq = torch.full((slots,), -1, dtype=torch.int64).share_memory_()
        self.block, self.seq_np = self.tensor.numpy(), self.seq.numpy()
        self.pid = os.getpid()
        self.id = f"{self.pid}-{id(self)}-{time.monotonic_ns()}"
        self.count = 0
        self.shared = False

    def put(self, batch: dict, layout: tuple, last: bool = False) -> "_InRing":
        plan, scalars, size = layout
        slot = self.count % self.slots
        self.count += 1
        self.seq_np[slot] = -1  # being written
        _FENCE()
        at = slot * self.slot_bytes
        transfer.fill(self.block[at:at + size], batch, plan)
        _FENCE()
        self.seq_np[slot] = self.count
        return _InRing(self, slot, self.count, plan, scalars, size, last)


class _InRing:
    """A batch in a worker's ring, as it is sent: its pickled form is (slot, sequence number, layout), plus the
    ring itself the first time."""

    __slots__ = ("ring", "slot", "seq", "plan", "scalars", "size", "last")

    def __init__(self, ring, slot, seq, plan, scalars, size, last):
        self.ring, self.slot, self.seq, self.plan, self.scalars, self.size = ring, slot, seq, plan, scalars, size
        self.last = last

    def __reduce__(self):
        r = self.ring
        shared = (r.pid, r.tensor, r.seq) if not r.shared else None
        r.shared = True
        return _from_ring, (r.id, shared, r.slot_bytes, self.slot, self.seq, self.plan, self.scalars, self.size,
                            self.last)


def _fence_function():
    """A memory barrier for the ring's sequence numbers: the kernel's, or none needed on x86 (stores are seen in
    order); None where neither holds, and the ring is not used."""
    if engine.KERNEL is not None and hasattr(engine.KERNEL, "fence"):
        return engine.KERNEL.fence
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return lambda: None
    return None


_FENCE = _fence_function()

# In the training process: ring id -> (worker pid, slots, sequence numbers). A ring is dropped after its worker's
# last batch, or once its worker has exited (an iteration abandoned half way), so shared memory does not pile up.
_RINGS: dict = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _from_ring(ring_id, shared, slot_bytes, slot, seq, plan, scalars, size, last) -> dict:
    if shared is not None:
        for stale in [k for k, (pid, _, _) in _RINGS.items() if not _alive(pid)]:
            del _RINGS[stale]
        _RINGS[ring_id] = (shared[0], shared[1].numpy(), shared[2].numpy())
    if ring_id not in _RINGS:
        raise InternalError("a DataLoader worker's batch arrived before its shared slots (or after they were "
                            "dropped): the worker's messages were reordered")
    _, block, seqs = _RINGS[ring_id]
    at = slot * slot_bytes
    first = int(seqs[slot])
    _FENCE()
    copy = block[at:at + size].copy() if first == seq else None
    _FENCE()
    if copy is None or int(seqs[slot]) != seq:
        raise ConfigError(f"a DataLoader worker wrote over batch {seq} before the training process copied it out: "
                          f"give BatchDataset(ring_slots=...) more slots than the DataLoader's prefetch_factor")
    if last:
        del _RINGS[ring_id]
    return transfer.unpack(copy, plan, scalars, wrap=torch.from_numpy)


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _refuse_batching_again() -> None:
    """Refuse a DataLoader that batches the batches again (its default ``batch_size=1``): each item of a
    BatchDataset is already a whole batch, which a batch size would stack into [1, B, L] arrays or fail on
    deep inside ``default_collate``. The DataLoader's fetcher calls ``iter(dataset)``; it says whether it collates."""
    try:
        from torch.utils.data._utils.fetch import _IterableDatasetFetcher  # optional: babelfeed[torch]
    except ImportError:  # another torch layout: no check, the DataLoader behaves as it does
        return
    frame = sys._getframe(1)
    for _ in range(4):
        if frame is None:
            return
        fetcher = frame.f_locals.get("self")
        if isinstance(fetcher, _IterableDatasetFetcher):
            if fetcher.auto_collation:
                raise UsageError("DataLoader(BatchDataset(...)) needs batch_size=None: each item is already a "
                                 "whole batch (token budget, padding and order come from the config), and the "
                                 "DataLoader's default batch_size=1 would batch the batches again. Use "
                                 "DataLoader(dataset, batch_size=None, num_workers=N), or "
                                 "babelfeed.adapters.torch.BatchLoader(config, num_workers=N)")
            return
        frame = frame.f_back


class BatchDataset(torch.utils.data.IterableDataset):
    """One epoch of this rank's batches for a DataLoader with ``batch_size=None`` and any ``num_workers``.

    Any config: translation (``build_train_iterator``) or language model (``LMIterator``), through
    ``babelfeed.build_iterator``. Worker w of N takes this rank's batches k with ``k % N == w``, gathering them by
    random access (``batch_at``); the DataLoader hands out the workers' batches in turn, so the batches arrive in
    exactly the order the iterator serves them in-process, whatever N. ``state_dict(k)`` /
    ``BatchDataset(config, state=...)`` resumes after this rank's k-th batch, with any number of workers and on any
    world size (the state counts global batches).

    If the process has loaded a multithreaded library such as JAX, give the DataLoader
    ``multiprocessing_context="forkserver"`` (or ``"spawn"``): forking a multithreaded process can deadlock.
    The dataset pickles, so every context works.
    """

    def __init__(self, config, epoch: int = 1, rank: int | None = None, world_size: int | None = None,
                 num_workers: int | None = None, state: dict | None = None, tensors: bool = True,
                 split: str | None = None, ring_slots: int = 8, transform=None):
        super().__init__()
        # num_workers: accepted for older callers; the batches no longer depend on the number of workers
        if not (_int(ring_slots) and ring_slots >= 0):
            raise UsageError(f"ring_slots must be an int >= 0 (0: no shared slots), got {ring_slots!r}")
        self.ring_slots = ring_slots  # shared slots per worker (> the DataLoader's prefetch_factor); 0: off
        r, w = dist_rank_world()
        self.config = config
        self.rank = r if rank is None else rank
        self.world_size = w if world_size is None else world_size
        self.split = split
        self.epoch, self.base, self.batches_seen = int(epoch), 0, 0
        self.tensors = tensors
        self.transform = transform  # numpy batch -> numpy batch, in the worker (picklable), e.g. babelfeed.adapters.hf_view.HFView
        if hasattr(transform, "check_config"):  # what a transform takes, said here rather than in a worker
            transform.check_config(config)
        self._len = None
        self._position = None
        self.resume: dict | None = None  # the state loaded: every process rebuilds the run's history from it
        # an iteration in this process (torchdata's Stateful protocol): [next k, last k handed out, fingerprint]
        self._progress = None
        self._worker_next = None  # a StatefulDataLoader worker's own next batch, from its saved position
        if state is not None:
            self.load_state_dict(state)
        # the data the job starts with, pinned now: forked workers (the default start on Linux) copy this object
        # without pickling it, so a pin taken later, on first use, never reached them and replaced data was served
        self._expect = None
        self._pinned()

    def position(self) -> Position:
        if self._position is None:
            self._position = Position(self.config, self.rank, self.world_size, self.split, "BatchDataset")
        return self._position

    def __getstate__(self):  # to the workers: without the training process's iterator
        state = {k: (None if k in ("_position", "_progress") else v) for k, v in self.__dict__.items()}
        state["_expect"] = self._pinned()  # the data the job started with: a worker finding other data refuses
        return state

    def _pinned(self) -> dict:
        """The data's fingerprint and identity as the training process first opened it (``adapters.position``)."""
        if getattr(self, "_expect", None) is None:
            self._expect = pinned(self.position().current())
        return self._expect

    @property
    def batches_per_step(self) -> int:
        if is_lm_config(self.config):
            return 1
        return self.world_size if (self.split or "batches") == "batches" else 1

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` from the next iteration on (from its start)."""
        self.epoch, self.base, self.batches_seen = int(epoch), 0, 0
        self._len = None
        self._progress, self._worker_next = None, None

    def consumed(self, batches_seen: int | None = None) -> int:
        """Global batches of the epoch taken once this rank has taken ``batches_seen`` (default: those counted)."""
        seen = self.batches_seen if batches_seen is None else batches_seen
        return self.base + seen * self.batches_per_step

    def _workers(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return 0, 1
        return info.id, info.num_workers

    def _iterator(self):
        # (a worker has the training process's pin; the training process pins the data on first use)
        expect = getattr(self, "_expect", None) if torch.utils.data.get_worker_info() is not None else self._pinned()
        return resumed_iterator(self.config, self.rank, self.world_size, self.split, self.epoch, self.resume,
                                expect=expect)

    def __iter__(self):
        _refuse_batching_again()
        worker, n = self._workers()
        in_worker = torch.utils.data.get_worker_info() is not None
        it = self._iterator()
        ring = None
        base = self.base
        # The DataLoader takes one batch from each worker in turn, starting with worker 0: batch k of this run is
        # this rank's batch batches_seen + k (counted from global batch base), made by worker k % n. has_batch
        # plans only the windows up to k, so a worker starts without planning the whole epoch (len(it) would).
        k = self.batches_seen + worker if self._worker_next is None else self._worker_next
        if hasattr(it, "fetch_stride"):  # (remote data: this worker fetches ahead only the batches it makes)
            it.fetch_stride = n
        self._progress = [k, None, it.fingerprint(), base]
        while it.has_batch(k, base=base):
            batch = it.batch_at(k, base=base)
            self._progress[:2] = [k + n, k]  # (a state taken once this batch is handed out counts it)
            if self.transform is not None:
                batch = self.transform(batch)
            last = not it.has_batch(k + n, base=base)
            if not self.tensors:
                yield batch
            elif in_worker and self.ring_slots and _FENCE is not None:  # through the worker's shared slots (_Ring)
                layout = transfer.layout(batch)
                if ring is None or layout[2] > ring.slot_bytes:  # (a ring outgrown stays until its worker exits)
                    ring = _Ring(self.ring_slots, max(2 * layout[2], 1 << 20))
                yield ring.put(batch, layout, last=last)
            else:
                yield to_torch(batch)
            k += n

    def state_dict(self, batches_seen: int | None = None) -> dict:
        """The run's state (``babelfeed.iterators.state``: what ``get_state()`` gives in-process) once this rank has taken
        ``batches_seen`` batches of this iteration from the DataLoader. Without ``batches_seen``, torchdata's
        Stateful protocol: in the training process (``num_workers=0``), the position after the last batch this
        dataset handed out; in a DataLoader worker, that worker's position (``StatefulDataLoader`` keeps one per
        worker and gives each back to its worker; ``babelfeed.iterators.state.find_state`` reads the loader's position
        from them). With a plain ``DataLoader`` and workers, pass the batches your loop received."""
        if batches_seen is not None:
            return self.position().state(self.epoch, self.consumed(batches_seen))
        info = torch.utils.data.get_worker_info()
        progress = self._progress
        seen = self.batches_seen if progress is None or progress[1] is None else progress[1] + 1
        if info is None:
            return self.position().state(self.epoch, self.consumed(seen))
        base = self.base if progress is None else progress[3]
        fingerprint = progress[2] if progress is not None else self._iterator().fingerprint()
        k_next = progress[0] if progress is not None else (
            self._worker_next if self._worker_next is not None else self.batches_seen + info.id)
        return {"epoch": self.epoch, "consumed": base + seen * self.batches_per_step, "fingerprint": fingerprint,
                "base": self.resume, "world_size": self.world_size,
                "worker": {"id": info.id, "of": info.num_workers, "next": k_next, "from": base}}

    def load_state_dict(self, state: dict, mixture_change: str = "refuse") -> None:
        """Continue after the batch of ``state`` from the next iteration on (any world size, any workers): any
        babelfeed state (``babelfeed.iterators.state.find_state``: another adapter's, an older babelfeed's position, a
        ``StatefulDataLoader`` checkpoint). In a DataLoader worker, its own position (torchdata's protocol).
        ``mixture_change="allow"``: a state of another config of the same data goes on under this one (an edit,
        from its next step: ``babelfeed.run.edits``)."""
        found = find_state(state, "BatchDataset state")
        info = torch.utils.data.get_worker_info()
        worker = found.get("worker") if is_position(found) else None
        if info is not None and isinstance(worker, dict):  # StatefulDataLoader gives each worker its position
            if (worker.get("id"), worker.get("of")) != (info.id, info.num_workers):
                raise StateError(f"this worker position was saved by worker {worker.get('id')} of {worker.get('of')}; "
                                 f"this is worker {info.id} of {info.num_workers}: resume a StatefulDataLoader with "
                                 f"as many workers, or load its state into BatchLoader (any number of workers)")
            self.set_epoch(int(found["epoch"]))
            self.resume = found.get("base")
            self.base, self._worker_next = int(worker["from"]), int(worker["next"])
            return
        epoch, consumed = self.position().load(found, mixture_change)
        self.position().adopt_edits(self)  # (the run's own set_weights: its config carries the weights)
        self.set_epoch(epoch)
        self.base = consumed
        self.resume = self.position().resume

    def __len__(self) -> int:
        """The batches an iteration yields: this rank's batches of the epoch after the position held."""
        if self._len is None:
            self._len = self._iterator().steps_after(self.base)
        return max(self._len - self.batches_seen, 0)


class BatchLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` over ``BatchDataset`` that knows its position: ``state_dict()`` and
    ``load_state_dict()`` as torchdata's ``StatefulDataLoader`` has them, counting the batches the loop has
    received (not those the workers made ahead), and ``len()`` = the batches the next pass yields (the rest of
    the epoch after a ``break``), whatever ``num_workers``.

        loader = BatchLoader(config, num_workers=4, pin_memory=True)    # rank/world from torch.distributed
        for epoch in range(3):
            for batch in loader:          # this rank's batches of the current epoch; then the next epoch
                ...
                checkpoint["data"] = loader.state_dict()
        # resume, in a fresh process, with any num_workers and on any world size:
        loader = BatchLoader(config, num_workers=2); loader.load_state_dict(checkpoint["data"])

    A pass that ends moves the loader to the next epoch; ``set_epoch(e)`` chooses one. An LM config is one pass
    over its ``num_samples``: a pass after it raises. The state (the run's iterator state, ``babelfeed.iterators.state``)
    stands where every rank together has taken as many batches, so it restores on another world size; a state of
    other data (another tokenizer, other files) is refused. ``ring_slots``: shared-memory slots per worker, more
    than ``prefetch_factor``.
    """

    def __init__(self, config, *, epoch: int = 1, rank: int | None = None, world_size: int | None = None,
                 split: str | None = None, tensors: bool = True, transform=None, ring_slots: int = 8,
                 **dataloader_kwargs):
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
            if key in dataloader_kwargs:
                raise UsageError(f"BatchLoader makes its own batches: {key}= does not apply (batch size, order and "
                                 f"padding come from the config)")
        if dataloader_kwargs.get("persistent_workers"):
            raise UsageError("BatchLoader starts its workers at each pass, from the position it holds: "
                             "persistent_workers=True would keep the first pass's position in them")
        prefetch = dataloader_kwargs.get("prefetch_factor")
        if dataloader_kwargs.get("num_workers", 0) and ring_slots and (prefetch or 2) >= ring_slots:
            raise UsageError(f"ring_slots={ring_slots} must exceed prefetch_factor={prefetch or 2}: a worker has "
                             f"that many batches in flight, each in a slot of its own (ring_slots=0 turns the slots "
                             f"off, at ~5 ms a batch)")
        self.batches = BatchDataset(config, epoch=epoch, rank=rank, world_size=world_size, split=split,
                                    tensors=tensors, transform=transform, ring_slots=ring_slots)
        super().__init__(self.batches, batch_size=None, **dataloader_kwargs)
        self._passes = 0  # passes over the loader running now (iterators taken and not yet finished or closed)
        self._changed = False  # a change made during a pass (skip, set_weights, edit): its workers start again

    def __iter__(self):
        ds = self.batches
        pos = ds.position()
        if pos.is_lm and not pos.iterator(1).has_batch(0, base=ds.consumed()):
            raise CallOrderError(f"this LM run is over: it is one pass of {len(pos.iterator(1))} global batches "
                                 f"(num_samples), all taken; raise num_samples in the config for a longer run")
        self._passes += 1
        try:
            while True:
                inner = super().__iter__()
                for batch in inner:
                    ds.batches_seen += 1  # the loop has it now
                    self._changed = False
                    yield batch
                    if self._changed:  # a change made after this batch: the workers' read-ahead is the old run's
                        break
                else:
                    break
                shutdown = getattr(inner, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
                del inner  # (the next batch comes from workers started at the changed run's state)
            if not pos.is_lm:
                ds.set_epoch(ds.epoch + 1)
        finally:
            self._passes -= 1

    def _change(self, method: str, *args, **kwargs):
        """The run's iterator's ``method`` at the position the loop has reached; during a pass, the workers start
        again from the next batch on (their read-ahead was made before the change)."""
        ds = self.batches
        pos = ds.position()
        state, out = pos.apply(ds.epoch, ds.consumed(), method, *args, **kwargs)
        pos.adopt_edits(ds)  # (an edit, or set_weights made as one: the workers build the edited config's iterator)
        ds.load_state_dict(state)
        if self._passes:
            self._changed = True
        return out

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """The iterator's ``skip`` (``babelfeed.run.skips``) at the position the loop has reached: from the
        next batch on (during a pass its workers start again there), or, after ``load_state_dict(checkpoint)`` of
        a rollback, from the first. Call it on every rank at the same step. Returns the skip's event."""
        return self._change("skip", steps=steps, ids=ids, where=where, reason=reason, world_size=world_size)

    def set_weights(self, weights: dict):
        """The iterator's ``set_weights`` at the position the loop has reached (during a pass, its workers start
        again at the next batch). Call it on every rank at the same step."""
        return self._change("set_weights", weights)

    def edit(self, config=None, **changes):
        """Change the run's config from the next batch on (``babelfeed.run.edits``): ``config`` (a whole
        config of the same data) or ``changes`` (``{"mixing.temperature": 2.0}``, ``mixing__temperature=2.0``).
        Every stream goes on from its position; during a pass the workers start again at the next batch. Call it
        on every rank at the same step. Returns the edit's report (``EditReport``), which is also printed."""
        return self._change("edit", config, **changes)

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    def fingerprint(self) -> str:
        return self.batches.position().current().fingerprint()

    def state_dict(self) -> dict:
        """The run's state (``babelfeed.iterators.state``) once every rank has received as many batches as this rank's loop:
        the iterator state ``get_state()`` gives in-process, which every adapter and ``babelfeed trace`` take."""
        return self.batches.state_dict(self.batches.batches_seen)

    def load_state_dict(self, state: dict, mixture_change: str = "refuse", *, strict=None) -> None:
        """Continue after ``state_dict()``'s batch, from the next iteration on (refused while a pass is running:
        its workers would go on serving the old position). ``mixture_change="allow"``: a state of another config
        of the same data (this loader's config is the edited one) goes on under this config from its next step,
        every stream from its position (``babelfeed.run.edits``); the edit is printed and recorded in the
        state. ``"keep_position"``: this config's plan at the state's position, samples repeated or skipped (said).
        """
        no_strict(strict)
        self._no_pass_running("load_state_dict")
        self.batches.load_state_dict(state, mixture_change)

    def _no_pass_running(self, what: str) -> None:
        if self._passes:
            raise CallOrderError(f"{what} while a pass over this loader is running: its workers have made batches "
                                 f"ahead from the old position. Finish the pass, break out of the loop, or close the "
                                 f"iterator you took with iter(loader) (its .close()), then call {what}")

    def ledger(self, prefix: str = "ledger") -> dict:
        """What every rank together has consumed, per stream, once every rank has received as many batches as
        this loop: a flat dict to log (``babelfeed.iterators.ledger``; translation configs)."""
        ds = self.batches
        return ds.position().ledger(ds.epoch, ds.consumed(), prefix)
