"""Mixture policies: task weights computed from what training reports, for ``it.set_weights``.

    policy = babelfeed.policy.ExponentiatedGradient(it.planner.sources.tasks, eta=0.5)
    for step, batch in enumerate(it, 1):
        ...
        if step % 500 == 0:
            it.set_weights(policy.update(mean_loss_per_task))   # {task: loss} since the last update

The iterator records every change in its state, so a resumed run replays the same weights (see
``BatchIterator.set_weights``); the policy itself holds nothing the state does not: ``ExponentiatedGradient.
from_state(tasks, state)`` continues from the last weights a state recorded. A static schedule
(``mixing.schedule``) is the policy that ignores losses.
"""

from __future__ import annotations

import math


def as_number(value) -> float | None:
    """``value`` as a float when it is a real number: a Python or numpy number, a 0-d array, a one-element tensor
    (``float()`` takes them all); None for a bool, a string or anything else."""
    if isinstance(value, (bool, str, bytes)) or type(value).__name__ == "bool_":
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def scaled_weights(weights, names: list, noun: str) -> dict:
    """``set_weights``' argument checked and scaled: ``{name: weight}`` for exactly ``names`` (``noun``: what a
    name is, "task" or "dataset"), finite numbers >= 0 (numpy's too), not all 0; divided by the largest, so
    their sum stays finite. Raises ValueError naming what is wrong."""
    if not isinstance(weights, dict) or sorted(weights) != sorted(names):
        have = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
        raise ValueError(f"set_weights takes {{{noun}: weight}} for every {noun} {names}; got {have}")
    values = {k: as_number(v) for k, v in weights.items()}
    bad = {k: weights[k] for k, v in values.items() if v is None or not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"set_weights: weights must be finite numbers >= 0, got {bad}")
    top = max(values.values())
    if not top > 0:
        raise ValueError(f"set_weights: weights must be not all 0, got {weights}")
    return {k: v / top for k, v in values.items()}


class ExponentiatedGradient:
    """Multiplicative weights toward the tasks whose loss is high (as in DoReMi's and online data mixing's
    updates): ``w_t <- w_t * exp(eta * loss_t)``, normalised, then mixed with the uniform distribution by
    ``floor`` so that no task is starved. ``losses`` may leave out a task (it moves as if its loss were the
    mean of the others)."""

    def __init__(self, tasks, eta: float = 0.5, floor: float = 0.05, weights: dict | None = None):
        self.tasks = list(tasks)
        if not self.tasks:
            raise ValueError("ExponentiatedGradient needs at least one task")
        if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta >= 0):
            raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")
        if not (isinstance(floor, (int, float)) and 0 <= floor < 1):
            raise ValueError(f"floor must be in [0, 1), got {floor!r}")
        self.eta, self.floor = float(eta), float(floor)
        start = weights or {t: 1.0 for t in self.tasks}
        self.weights = self._normalised({t: float(start.get(t, 0.0)) for t in self.tasks})

    @classmethod
    def from_state(cls, tasks, state: dict, **kwargs) -> "ExponentiatedGradient":
        """The policy where a run's state left it: its last recorded weights (uniform if none). ``tasks``: a
        translation run's tasks, or an LM run's dataset names (its blend's weights since its first change)."""
        from babelfeed.iterators.history import check, upgrade

        if not isinstance(state, dict):
            raise ValueError(f"a state is a dict (an iterator's get_state()), got {type(state).__name__}")
        state = upgrade(state)
        views = check(state["history"]) if "history" in state else None
        changes = views.weights if views is not None else []
        if views is not None and len(views.blend) > 1:  # an LM run steered: its last blend, by dataset name
            last = views.blend[-1]
            changes = [[last["sample"], {last["names"].get(k, k): w for k, w in last["weights"].items()}]]
        policy = cls(tasks, **kwargs)
        if changes and set(changes[-1][1]) != set(policy.tasks):
            raise ValueError(f"the state's weights name {sorted(changes[-1][1])}; the policy's tasks are "
                             f"{sorted(policy.tasks)}: pass the run's tasks (an LM run's dataset names)")
        if changes:  # as the policy returned them (already floored), normalised by set_weights
            last = {t: as_number(changes[-1][1].get(t, 0.0)) for t in policy.tasks}
            if any(v is None or not (math.isfinite(v) and v >= 0) for v in last.values()) or not sum(last.values()) > 0:
                raise ValueError(f"the state's last weights {changes[-1][1]} are not finite numbers >= 0 for the "
                                 f"tasks {policy.tasks} (not all 0)")
            total = sum(last.values())
            policy.weights = {t: v / total for t, v in last.items()}
        return policy

    def _normalised(self, w: dict) -> dict:
        total = sum(w.values())
        if not total > 0:
            raise ValueError(f"weights must not all be 0: {w}")
        k = len(self.tasks)
        return {t: (1 - self.floor) * w[t] / total + self.floor / k for t in self.tasks}

    def update(self, losses: dict) -> dict:
        """New weights from ``{task: loss}`` (finite numbers); returns them, ready for ``it.set_weights``."""
        unknown = sorted(set(losses) - set(self.tasks))
        if unknown:
            raise ValueError(f"losses name tasks {unknown} that are not among {self.tasks}")
        values = {t: as_number(v) for t, v in losses.items()}
        bad = {t: losses[t] for t, v in values.items() if v is None or not math.isfinite(v)}
        if bad:
            raise ValueError(f"losses must be finite numbers, got {bad}")
        losses = values
        mean = sum(losses.values()) / len(losses) if losses else 0.0
        full = {t: float(losses.get(t, mean)) for t in self.tasks}  # a task not reported: as the mean
        top = max(full.values())  # subtracted: exp stays in range, the ratios are the same
        raised = {t: w * math.exp(self.eta * (full[t] - top)) for t, w in self.weights.items()}
        self.weights = self._normalised(raised)
        return dict(self.weights)
