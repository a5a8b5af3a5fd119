"""Which world size took each step of a run: a component of the run record (``babelfeed.run.record``).

A step is one batch per rank (``split="batches"``) or one global batch split into rows (``split="rows"``). A run
resumed on another world size or split counts its steps from there on the new one; the log keeps a segment per
such resume, ``[steps before, epoch, global batch, world size, split]``, written into the history as ``ranks``
events. trace and skips read it to know which global batches a step of the run held.
"""

from __future__ import annotations

from babelfeed.run.history import check, split_at, world_size_at
from babelfeed.errors import HistoryError


class StepLog:
    """How a run counted its steps: a segment per world size (and split) it ran on."""

    def __init__(self, world_size: int, split: str):
        self.world_size, self.split = int(world_size), split
        self.segments: list = []  # [[steps before, epoch, global batch, world size, split], ...]

    # ------------------------------------------------------------------------------------ component
    def get_state(self) -> list:
        """The ``ranks`` events of the history (the run's first segment when nothing was logged yet)."""
        out = []
        for s, e, c, w, sp in self.segments or [[0, 1, 0, self.world_size, self.split]]:
            event = {"event": "ranks", "step": int(s), "epoch": int(e), "consumed": int(c), "world_size": int(w)}
            if sp is not None:
                event["split"] = sp
            out.append(event)
        return out

    def set_state(self, events: list, total: int, epoch: int, consumed: int) -> None:
        """Resume from a state whose history holds ``events`` (its ``ranks`` events), at step ``total`` and global
        batch ``consumed`` of ``epoch``, on this log's world size and split: a new segment where they differ."""
        self.check(events, total)
        steps = [[e["step"], e["epoch"], e["consumed"], e["world_size"]] for e in events]
        self.resume(steps, [e.get("split") for e in events], total, epoch, consumed)

    @staticmethod
    def check(events: list, total: int | None = None) -> None:
        """Refuse ``ranks`` events that are malformed or out of order (``HistoryError``, naming the event)."""
        check([dict(e) for e in events], total)

    # ------------------------------------------------------------------------------------ the log
    def steps(self) -> list:
        """``[[steps before, epoch, global batch, world size], ...]``."""
        return [list(x[:4]) for x in self.segments] or [[0, 1, 0, self.world_size]]

    def splits(self) -> list:
        """Per segment of :meth:`steps`, how its ranks split the batches (None where an older state did not say)."""
        return [x[4] for x in self.segments] or [self.split]

    def world_size_at(self, step: int | None = None) -> int | None:
        return world_size_at(self.steps(), step)

    def split_at(self, step: int | None = None) -> str | None:
        return split_at(self.steps(), self.splits(), step)

    def resume(self, steps: list, splits: list | None, total: int, epoch: int, consumed: int) -> None:
        """The segments of a run resumed at step ``total`` (``epoch``, global batch ``consumed``) from the segments
        ``steps`` (and their ``splits``) it recorded: a new one where the world size or split differs."""
        splits = list(splits or []) + [None] * (len(steps or []) - len(splits or []))
        log = [list(x[:4]) + [sp] for x, sp in zip(steps, splits)] if steps else []

        def mine(seg) -> bool:  # (a segment whose split an earlier babelfeed did not record: this one's)
            return seg[3] == self.world_size and seg[4] in (None, self.split)

        while log and log[-1][0] == total and len(log) > 1:  # a world size that took no step: no segment
            log.pop()
        if log and log[-1][0] == total and not mine(log[-1]):
            log.pop()  # (the run's first segment, without a step yet)
        if log and mine(log[-1]):
            log[-1][4] = self.split
        else:
            log.append([int(total), int(epoch), int(consumed), int(self.world_size), self.split])
        self.segments = log

    def restart(self, world_size: int, split: str) -> None:
        """Count every step on ``world_size`` ranks split as ``split`` (a loader position that says the world size
        that took its steps)."""
        self.segments = [[0, 1, 0, int(world_size), split]]


__all__ = ["HistoryError", "StepLog"]
