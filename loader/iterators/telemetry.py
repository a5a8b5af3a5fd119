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
the last 10,000, and, when this process has read data in an object store, the host fetcher's ``fetch/...``
counters (bytes, requests, cache, latency).
"""

from __future__ import annotations

import time

import numpy as np

from babelfeed.storage.remote import client as remote


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
        out.update(remote.telemetry())  # (empty unless this process reads a store)
        return out
