"""Where a process spends its time making batches, by stage (:data:`STAGES`): the iterators, the planner and the
adapters add to it; ``Timed.telemetry()`` (``babelfeed.iterators.telemetry``) reports it. Imports nothing of
babelfeed's: every layer may time itself here.
"""

from __future__ import annotations

import functools
import threading
import time


class Stages:
    """Seconds spent per stage of making batches in this process (the iterators and adapters add to it): ``plan``
    (a window's order and cut), ``fetch`` (remote data: asking the host's fetcher for the next batches' rows,
    and waiting for the ones a batch reads now), ``gather`` (token rows read into the batch's arrays),
    ``collate`` (the rest of making a batch), ``transfer`` (to the device, in the JAX and torch adapters); and
    ``fetch_wait``: of fetch and gather, the time blocked on bytes not yet fetched (0 for local data)."""

    def __init__(self):
        self.seconds = {"plan": 0.0, "fetch": 0.0, "gather": 0.0, "transfer": 0.0}
        self.making = 0.0  # batches made, whole (their plan, fetch and gather inside)
        self.inside = 0.0  # of that, the stages timed directly inside a batch being made
        self.batches = 0
        self.local = threading.local()  # per thread: how deep in timed calls, and where a batch began

    def add(self, name: str, seconds: float, inside: bool = False) -> None:
        self.seconds[name] += seconds
        if inside:
            self.inside += seconds

    def in_batch(self) -> bool:
        """Whether this thread is making a batch now (outside any other timed stage of it)."""
        at = getattr(self.local, "batch_at", None)
        return at is not None and getattr(self.local, "depth", 0) == at + 1

    def made(self, seconds: float) -> None:
        """A batch was made in ``seconds`` (its stages inside counted apart: the rest is collate)."""
        self.batches += 1
        self.making += seconds

    def telemetry(self) -> dict:
        s = self.seconds
        collate = max(0.0, self.making - self.inside)
        out = {f"stage/{k}_seconds": round(v, 6) for k, v in {**s, "collate": collate}.items()}
        out["stage/batches"] = self.batches
        return out


STAGES = Stages()


def timed(name: str):
    """A decorator adding each call's seconds to stage ``name`` of :data:`STAGES` (``"batch"``: a batch made
    whole, its stages inside)."""
    def wrap(fn):
        def timed_call(*args, **kwargs):
            local = STAGES.local
            depth = getattr(local, "depth", 0)
            at = getattr(local, "batch_at", None)
            if name == "batch":
                local.batch_at = depth
            local.depth = depth + 1
            t0 = time.perf_counter()
            ok = False
            try:
                got = fn(*args, **kwargs)
                ok = True
                return got
            finally:
                local.depth = depth
                if name != "batch":  # (a stage directly inside a batch: not its collate)
                    STAGES.add(name, time.perf_counter() - t0, inside=at is not None and depth == at + 1)
                else:
                    local.batch_at = at
                    if ok:  # (an epoch's end, an error: no batch made)
                        STAGES.made(time.perf_counter() - t0)
        return functools.wraps(fn)(timed_call)
    return wrap
