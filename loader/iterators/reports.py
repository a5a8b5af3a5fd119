"""What the translation iterator reports: per-direction epoch statistics and per-task positions."""

from __future__ import annotations

import numpy as np

from babelfeed.errors import UsageError


class Reports:
    """Part of :class:`~babelfeed.iterators.translation.BatchIterator` (uses its planner, epoch, served counts and position)."""

    def update(self) -> float:
        """Stream sampler: the optimizer update the next batch belongs to, as the mixing schedule counts it
        (global batches since training began / batches per update)."""
        if not self.planner.sampler.streams:
            raise UsageError("the update count is kept by mixing.sampler='stream' (or 'auto' with a schedule)")
        return self.planner.update_at(self.planner.since_start(self.epoch, self.consumed))

    def task_stats(self) -> dict:
        """Per task: its probability now, the samples drawn from it since training began (up to the current
        global position, every rank's batches included; too-long samples count when their window is entered),
        its size, its epochs (passes over its own data: each task cycles its data independently), and the
        samples this rank served in this run. Stream sampler only."""
        planner = self.planner
        if not planner.sampler.streams:
            raise UsageError("per-task positions exist with mixing.sampler='stream' (or 'auto' with a schedule)")
        setup = planner.setup(self.epoch)
        where = planner.locate(self.epoch, self.consumed, self._hint)
        if where is None:  # the epoch is over: every stream stands where the next epoch starts
            positions = planner.epoch_start(self.epoch + 1)[0]
            mark = planner.stream_mark(self.epoch, max(setup.num_windows - 1, 0))
        else:  # the window's start, plus the samples of its batches served so far (by every rank)
            w, j = where
            mark, win = planner.stream_mark(self.epoch, w), planner.window(self.epoch, w)
            taken = [win.direction[win.batch(k)] for k in range(j)]
            done = np.concatenate(taken) if taken else np.zeros(0, np.int64)
            positions = mark.positions + np.bincount(done, minlength=len(mark.positions))
        probs = planner.probabilities(setup.directions, mark.update, batches=mark.batches)
        sizes = np.array([d.size for d in setup.directions], np.int64)
        served = np.zeros(len(sizes), np.int64)
        for per_epoch in self.served.values():
            served += per_epoch
        task_of = planner.sources.task_of
        out = {}
        for t, name in enumerate(planner.sources.tasks):
            m = task_of == t
            samples, size = int(positions[m].sum()), int(sizes[m].sum())
            out[name] = {"probability": float(probs[m].sum()), "samples": samples, "size": size,
                         "epochs": samples / size if size else 0.0, "served": int(served[m].sum())}
        return out

    def stats(self, epoch: int | None = None) -> dict:
        """Per direction, for ``epoch`` (default: the current one): its probability, the samples planned, those
        filtered as too long (in the windows planned so far), and those this rank served."""
        epoch = self.epoch if epoch is None else epoch
        setup = self.planner.setup(epoch)
        served = self.served.get(epoch, np.zeros(len(setup.directions), np.int64))
        return {d.key: {"probability": float(p), "planned": int(c), "filtered": int(f), "served": int(served[i])}
                for i, (d, p, c, f) in enumerate(zip(setup.directions, setup.probs, setup.counts,
                                                     self.planner.filtered(epoch)))}
