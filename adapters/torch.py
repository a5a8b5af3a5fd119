"""PyTorch adapter: batches as torch tensors, copied to the GPU ahead of time, and a DataLoader path.

    batches = loader.adapters.torch.TorchBatches(loader.build_train_iterator(config, rank, world), prefetch=2)
    for batch in batches:            # tensors on cuda (pinned host memory, non_blocking copies on a side stream)
        loss = model(**batch["net_input"]) ...
    state = batches.get_state()

    dataset = loader.adapters.torch.BatchDataset(config)       # rank/world from torch.distributed if initialised;
                                                               # a translation or an LM config
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4, pin_memory=True)
    for batch in dl: ...
    state = dataset.state_dict(batches_seen)                   # resume: BatchDataset(config, state=state)

Without CUDA the same code runs on the CPU (tests do), with zero-copy ``torch.from_numpy`` tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from loader.prefetch import Prefetcher


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


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class BatchDataset(torch.utils.data.IterableDataset):
    """One epoch of this rank's batches for a DataLoader with ``batch_size=None`` and any ``num_workers``.

    Any config: translation (``build_train_iterator``) or language model (``LMIterator``), through
    ``loader.build_iterator``. Worker w of N takes this rank's batches k with ``k % N == w``, gathering them by
    random access (``batch_at``); the DataLoader hands out the workers' batches in turn, so the batches arrive in
    exactly the order the iterator serves them in-process, whatever N. ``state_dict(k)`` /
    ``BatchDataset(config, state=...)`` resumes after this rank's k-th batch, with any number of workers.

    If the process has loaded a multithreaded library such as JAX, give the DataLoader
    ``multiprocessing_context="forkserver"`` (or ``"spawn"``): forking a multithreaded process can deadlock.
    The dataset pickles, so every context works.
    """

    def __init__(self, config, epoch: int = 1, rank: int | None = None, world_size: int | None = None,
                 num_workers: int | None = None, state: dict | None = None, tensors: bool = True,
                 split: str | None = None):
        super().__init__()
        r, w = dist_rank_world()
        self.config = config
        self.rank = r if rank is None else rank
        self.world_size = w if world_size is None else world_size
        self.epoch = int(state["epoch"]) if state else epoch
        self.batches_seen = int(state["batches_seen"]) if state else 0
        self.tensors = tensors
        self.split = split
        self._len = None

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` from the next iteration on (from its start)."""
        self.epoch, self.batches_seen = int(epoch), 0

    def _workers(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return 0, 1
        return info.id, info.num_workers

    def _iterator(self):
        from loader.build import build_iterator

        return build_iterator(self.config, rank=self.rank, world_size=self.world_size, epoch=self.epoch,
                              split=self.split)

    def __iter__(self):
        worker, n = self._workers()
        it = self._iterator()
        # The DataLoader takes one batch from each worker in turn, starting with worker 0: batch k of this run is
        # this rank's batch batches_seen + k, made by worker k % n.
        for k in range(self.batches_seen + worker, len(it), n):
            batch = it.batch_at(k)
            yield to_torch(batch) if self.tensors else batch

    def state_dict(self, batches_seen: int) -> dict:
        """The position after this rank has taken ``batches_seen`` batches of the epoch from the DataLoader."""
        return {"epoch": self.epoch, "batches_seen": int(batches_seen)}

    def __len__(self) -> int:
        if self._len is None:
            self._len = len(self._iterator())
        return self._len
