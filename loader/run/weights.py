"""A run's weights over time: a component of the run record, which the plan that mixes with them reads.

* a translation run: the task weights fed back during the run (``set_weights``: from the stream window that starts
  at a global batch on, these weights) and how a mixing schedule counted its optimizer updates (a segment per world
  size or accumulation, ``[first global batch, its update, batches per update]``);
* an LM run: its blend's segments (``babelfeed.lm.mixture``): from a global sample on, these weights per dataset
  and where every dataset stood.

The planner plans with the data (``planner.weights`` is this object once the iterator binds it); this component
writes it into the state's history and reads it back, checked.
"""

from __future__ import annotations

import numpy as np

from babelfeed.plan.stream import WeightChanges
from babelfeed.errors import HistoryError


class Weights(WeightChanges):
    """Weight changes and update counts (translation; ``changes``, ``updates``) or blend segments (LM;
    ``blend``)."""

    def __init__(self, changes=(), updates=(), tasks=(), counts_updates: bool = False, blend=()):
        super().__init__(list(changes), list(updates))
        self.tasks = list(tasks)
        self.counts_updates = counts_updates  # a changing schedule: the update counts are part of the run
        self.blend: list = [dict(e) for e in blend]

    @classmethod
    def bind(cls, planner) -> "Weights":
        """The component over ``planner``'s weight changes and update counts (the planner reads it from now on)."""
        w = cls(planner.weights.changes, planner.weights.updates, planner.sources.tasks,
                planner.sampler.streams and planner.changing_schedule)
        planner.weights = w
        return w

    # ------------------------------------------------------------------------------------ component
    def get_state(self) -> dict:
        """The history's ``weights``, ``updates`` and ``blend`` events, as :func:`~babelfeed.run.history.compose`
        takes them."""
        return {"weights": [[int(at), dict(zip(self.tasks, w.tolist()))] for at, w in self.changes],
                "updates": [[b, u, p] for b, u, p in self.updates] if self.counts_updates else [],
                "blend": [dict(e) for e in self.blend]}

    def set_state(self, views, planner, per: int) -> None:
        """A translation state's weight changes and update counts (``views``: its history's), checked and given to
        ``planner`` (plans made with others are dropped); ``per``: the global batches of this run's update."""
        changes = self.check(views.weights, self.tasks)
        if changes or self.changes:  # plans made with other weights are not this state's
            planner.forget_plans()
            self.changes = []
            for at, w in changes:
                planner.set_weights(at, w)
        if self.counts_updates:
            saved = [tuple(x) for x in views.updates] or [(0, 0.0, per)]  # (an older state: its fingerprint held it)
            # (two counts from one window mark: an earlier babelfeed wrote one per resume; the last one counts)
            saved = [x for i, x in enumerate(saved) if i + 1 == len(saved) or saved[i + 1][0] != x[0]]
            if [tuple(x) for x in self.updates] != saved:  # plans counted otherwise are not this state's
                planner.forget_plans()
                self.updates = [(int(b), float(u), int(p)) for b, u, p in saved]

    @staticmethod
    def check(changes, tasks: list) -> list:
        """The weight changes of a state's history: ``[[global batch, {task: weight}], ...]`` in order, for the
        tasks ``tasks``; as ``(global batch, [weight per task])``."""
        out = []
        if not isinstance(changes, list):
            raise HistoryError(f"weight changes are a list of [global batch, {{task: weight}}], got "
                               f"{str(changes)[:200]}")
        for change in changes:
            ok = (isinstance(change, list) and len(change) == 2 and isinstance(change[0], int)
                  and not isinstance(change[0], bool) and change[0] >= 0 and isinstance(change[1], dict)
                  and sorted(change[1]) == sorted(tasks)
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                          for v in change[1].values()))
            if not ok:
                raise HistoryError(f"iterator state field 'history' holds the weight change {str(change)[:200]}: "
                                   f"each must give a weight >= 0 at a global batch >= 0 for the tasks {tasks}")
            out.append((change[0], [float(change[1][t]) for t in tasks]))
        return out

    def as_lists(self) -> dict:
        """The weight changes as ``[[batch, {task: weight}]]`` and the update counts (the segment before an edit
        keeps them, so trace can plan that segment again)."""
        state = self.get_state()
        return {"weights": state["weights"], "updates": [list(u) for u in self.updates] if self.counts_updates
                else []}

    def last(self) -> np.ndarray | None:
        return self.changes[-1][1] if self.changes else None
