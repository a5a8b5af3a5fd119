"""How long a training loop waits on data: :class:`Timed` wraps any iterable of batches (a babelfeed iterator, a
torch ``BatchLoader``, a JAX adapter's iterator, a grain loader) and measures the time each ``next`` blocks, as
the loop sees it, for local data and object stores alike.

    batches = babelfeed.Timed(loader)
    for step, batch in enumerate(batches):
        ...
        if step % 100 == 0:
            wandb.log(batches.telemetry(), step=step)   # or a TensorBoard SummaryWriter, as it is

``telemetry()`` is a flat dict of numbers: ``data/wait_seconds`` (total), ``data/batches``, the share of the
wall time spent waiting since the first batch (``data/wait_share``), percentiles of the wait per batch (ms) over
the last 10,000, the seconds this process spent in each stage of making batches (``stage/...``, :data:`STAGES`:
plan, gather, collate, transfer to the device, fetch wait), and, when this process has read data in an object
store, the host fetcher's ``fetch/...`` counters (bytes, requests, cache, latency).

On several ranks, :func:`reduce_over_ranks` turns any such dict into each number's maximum and mean over the ranks
(``.../max``, ``.../mean``: the slowest rank is the one the others wait for), through ``torch.distributed`` or
JAX's multi-host utilities, whichever the job runs::

    if step % 100 == 0:
        stats = babelfeed.reduce_over_ranks(batches.telemetry())   # every rank calls it
        if rank == 0:
            writer.add_scalars("data", stats, step)

Stages run where batches are made: with DataLoader or grain worker processes, the workers' plan, gather and
collate are theirs, and a main process's dict holds the transfer and the waits only.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from babelfeed.stages import STAGES
from babelfeed.storage.remote import client as remote


def reduce_over_ranks(stats: dict) -> dict:
    """Each number of ``stats`` (a flat dict, as ``telemetry()`` gives) as its maximum and mean over the job's ranks:
    ``{key/max, key/mean}``; other values are dropped. Every rank must call it (a collective): through
    ``torch.distributed`` when it is initialized, else JAX's multi-host utilities when JAX runs several
    processes; a single process gets its own numbers as both."""
    keys = sorted(k for k, v in stats.items() if isinstance(v, (int, float, np.integer, np.floating))
                  and not isinstance(v, bool))
    mine = np.array([float(stats[k]) for k in keys], np.float64)
    every = _gather_ranks(mine)  # (ranks, keys)
    out = {}
    for i, k in enumerate(keys):
        out[f"{k}/max"] = float(every[:, i].max()) if len(every) else float(mine[i])
        out[f"{k}/mean"] = float(every[:, i].mean()) if len(every) else float(mine[i])
    return out


def _gather_ranks(mine: np.ndarray) -> np.ndarray:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        import torch  # (only where torch.distributed runs the job: already imported)

        device = "cpu"
        if dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        t = torch.as_tensor(mine, dtype=torch.float64, device=device)
        out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        return np.stack([x.cpu().numpy() for x in out])
    jax = sys.modules.get("jax")
    if jax is not None and jax.process_count() > 1:
        from jax.experimental import multihost_utils  # (only where JAX runs several processes)

        return np.asarray(multihost_utils.process_allgather(mine))
    return mine[None, :]


class Timed:
    """An iterable of batches, timed (``telemetry()``); iterating it iterates the wrapped one."""

    def __init__(self, batches):
        self.batches = batches
        self._it = None
        self.waits: list[float] = []
        self.total = 0.0
        self.count = 0
        self.since: float | None = None

    def __iter__(self):
        self._it = iter(self.batches)
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self.batches)
        t0 = time.perf_counter()
        if self.since is None:
            self.since = t0
        batch = next(self._it)
        waited = time.perf_counter() - t0
        self.total += waited
        self.count += 1
        self.waits.append(waited)
        if len(self.waits) > 20_000:
            del self.waits[:10_000]
        return batch

    def __len__(self):
        return len(self.batches)

    def __getattr__(self, name):  # (state_dict, set_epoch ... of the wrapped loader)
        if name == "batches":
            raise AttributeError(name)
        return getattr(self.batches, name)

    def telemetry(self) -> dict:
        recent = np.asarray(self.waits[-10_000:]) * 1e3
        wall = time.perf_counter() - self.since if self.since is not None else 0.0
        out = {"data/wait_seconds": round(self.total, 6), "data/batches": self.count,
               "data/wait_share": round(self.total / wall, 6) if wall > 0 else 0.0}
        for q in (50, 90, 99):
            out[f"data/wait_p{q}_ms"] = round(float(np.percentile(recent, q)), 3) if len(recent) else 0.0
        out.update(STAGES.telemetry())
        out["stage/fetch_wait_seconds"] = round(remote._waited["seconds"], 6)
        out.update(remote.telemetry())  # (empty unless this process reads a store)
        return out
