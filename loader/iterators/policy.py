"""Training-loop policies: task weights computed from what training reports, for ``it.set_weights``, and a guard
that rolls a run back past a loss spike and skips the data before it, for ``it.skip``.

    policy = babelfeed.iterators.policy.ExponentiatedGradient(it.planner.sources.tasks, eta=0.5)
    for step, batch in enumerate(it, 1):
        ...
        if step % 500 == 0:
            it.set_weights(policy.update(mean_loss_per_task))   # {task: loss} since the last update

The iterator records every change in its state, so a resumed run replays the same weights (see
``BatchIterator.set_weights``); the policy itself holds nothing the state does not: ``ExponentiatedGradient.
from_state(tasks, state)`` continues from the last weights a state recorded. A static schedule
(``mixing.schedule``) is the policy that ignores losses.

:class:`SpikeGuard` is fed the loss of every step; on a spike (a loss that is not finite, or far above the median
of the recent losses: see its docstring for the exact rule) it returns a :class:`Rollback`, and the loop restores
one of its own checkpoints, skips the steps before the spike and goes on:

    guard = babelfeed.iterators.policy.SpikeGuard.from_state(it.get_state())   # or SpikeGuard(): a run's first start
    checkpoints = {0: (model_and_optimizer_state, it.get_state())}   # the loop's own, every k steps
    step = 0
    while step < last_step:
        batch = next(it); step += 1
        loss = train_step(batch)
        action = guard.update(step, loss)      # None, or a Rollback; SpikeGuardError when skipping will not help
        if action is not None:
            ckpt_step = max(s for s in checkpoints if s <= action.to_step)
            model_state, data_state = checkpoints[ckpt_step]
            restore(model_state); it.set_state(data_state)
            it.skip(steps=action.skip, reason=action.reason)   # recorded in the iterator's state
            guard.rolled_back(ckpt_step)
            checkpoints = {s: c for s, c in checkpoints.items() if s < ckpt_step}
            checkpoints[ckpt_step] = (model_state, it.get_state())   # now with the skip
            step = ckpt_step
            log(action.as_dict())
        elif step % k == 0:
            checkpoints[step] = (save(), it.get_state())

The skip is in the iterator's state (its history), with its reason, so a run resumed later makes it too and
``SpikeGuard.from_state(state)`` knows the rollbacks already made (``max_rollbacks`` holds across restarts). The
restored checkpoint is saved again with the skip: a second rollback to it would otherwise forget the first skip
(its data state was taken before it), and the checkpoints taken after it belong to the steps that are taken
again.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from itertools import islice

import numpy as np

from babelfeed.errors import BabelfeedError, StateError, UsageError, UsageTypeError
from babelfeed.run.history import check, upgrade


def as_number(value) -> float | None:
    """``value`` as a float when it is a real number: a Python or numpy number, a 0-d array, a one-element tensor
    (``float()`` takes them all); None for a bool, a string or anything else."""
    if isinstance(value, (bool, str, bytes)) or type(value).__name__ == "bool_":
        return None
    if getattr(value, "size", None) == 1 and hasattr(value, "item") and getattr(value, "ndim", 0) > 0:
        value = value.item()  # (a one-element array: numpy refuses float() of it)
        if isinstance(value, bool):
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
        raise UsageError(f"set_weights takes {{{noun}: weight}} for every {noun} {names}; got {have}")
    values = {k: as_number(v) for k, v in weights.items()}
    bad = {k: weights[k] for k, v in values.items() if v is None or not (math.isfinite(v) and v >= 0)}
    if bad:
        raise UsageError(f"set_weights: weights must be finite numbers >= 0, got {bad}")
    top = max(values.values())
    if not top > 0:
        raise UsageError(f"set_weights: weights must be not all 0, got {weights}")
    return {k: v / top for k, v in values.items()}


class ExponentiatedGradient:
    """Multiplicative weights toward the tasks whose loss is high (as in DoReMi's and online data mixing's
    updates): ``w_t <- w_t * exp(eta * loss_t)``, normalised, then mixed with the uniform distribution by
    ``floor`` so that no task is starved. ``losses`` may leave out a task (it moves as if its loss were the
    mean of the others)."""

    def __init__(self, tasks, eta: float = 0.5, floor: float = 0.05, weights: dict | None = None):
        self.tasks = list(tasks)
        if not self.tasks:
            raise UsageError("ExponentiatedGradient needs at least one task")
        if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta >= 0):
            raise UsageError(f"eta must be a finite number >= 0, got {eta!r}")
        if not (isinstance(floor, (int, float)) and 0 <= floor < 1):
            raise UsageError(f"floor must be in [0, 1), got {floor!r}")
        self.eta, self.floor = float(eta), float(floor)
        start = weights or {t: 1.0 for t in self.tasks}
        self.weights = self._normalised({t: float(start.get(t, 0.0)) for t in self.tasks})

    @classmethod
    def from_state(cls, tasks, state: dict, **kwargs) -> "ExponentiatedGradient":
        """The policy where a run's state left it: its last recorded weights (uniform if none). ``tasks``: a
        translation run's tasks, or an LM run's dataset names (its blend's weights since its first change)."""
        if not isinstance(state, dict):
            raise UsageTypeError(f"a state is a dict (an iterator's get_state()), got {type(state).__name__}")
        state = upgrade(state)
        views = check(state["history"]) if "history" in state else None
        changes = views.weights if views is not None else []
        if views is not None and len(views.blend) > 1:  # an LM run steered: its last blend, by dataset name
            last = views.blend[-1]
            changes = [[last["sample"], {last["names"].get(k, k): w for k, w in last["weights"].items()}]]
        elif views is not None and not changes and views.edits and \
                "mixing.schedule.weights" in views.edits[-1].get("changes", {}):
            # set_weights on a sampler where it is an edit: the weights are the config's since
            text = views.edits[-1]["changes"]["mixing.schedule.weights"][1] or ""
            if text and "|" not in text:
                pairs = [p.rpartition(":") for p in text.split(",") if p.strip()]
                changes = [[0, {k.strip(): float(v) for k, _, v in pairs}]]
        policy = cls(tasks, **kwargs)
        if changes and set(changes[-1][1]) != set(policy.tasks):
            raise StateError(f"the state's weights name {sorted(changes[-1][1])}; the policy's tasks are "
                             f"{sorted(policy.tasks)}: pass the run's tasks (an LM run's dataset names)")
        if changes:  # as the policy returned them (already floored), normalised by set_weights
            last = {t: as_number(changes[-1][1].get(t, 0.0)) for t in policy.tasks}
            if any(v is None or not (math.isfinite(v) and v >= 0) for v in last.values()) or not sum(last.values()) > 0:
                raise StateError(f"the state's last weights {changes[-1][1]} are not finite numbers >= 0 for the "
                                 f"tasks {policy.tasks} (not all 0)")
            total = sum(last.values())
            policy.weights = {t: v / total for t, v in last.items()}
        return policy

    def _normalised(self, w: dict) -> dict:
        total = sum(w.values())
        if not total > 0:
            raise UsageError(f"weights must not all be 0: {w}")
        k = len(self.tasks)
        return {t: (1 - self.floor) * w[t] / total + self.floor / k for t in self.tasks}

    def update(self, losses: dict) -> dict:
        """New weights from ``{task: loss}`` (finite numbers); returns them, ready for ``it.set_weights``."""
        unknown = sorted(set(losses) - set(self.tasks))
        if unknown:
            raise UsageError(f"losses name tasks {unknown} that are not among {self.tasks}")
        values = {t: as_number(v) for t, v in losses.items()}
        bad = {t: losses[t] for t, v in values.items() if v is None or not math.isfinite(v)}
        if bad:
            raise UsageError(f"losses must be finite numbers, got {bad}")
        losses = values
        mean = sum(losses.values()) / len(losses) if losses else 0.0
        full = {t: float(losses.get(t, mean)) for t in self.tasks}  # a task not reported: as the mean
        top = max(full.values())  # subtracted: exp stays in range, the ratios are the same
        raised = {t: w * math.exp(self.eta * (full[t] - top)) for t, w in self.weights.items()}
        self.weights = self._normalised(raised)
        return dict(self.weights)


class SpikeGuardError(BabelfeedError, RuntimeError):
    """The loss spiked again near the same step after the guard had rolled back and skipped the data before it
    ``max_rollbacks`` times: the data is not the cause, and skipping more of it will not help."""


SPIKE_PREFIX = "SpikeGuard:"
KEEP = 10_000  # losses kept besides the window, so that a rollback to an older checkpoint still finds a full window


@dataclass(frozen=True)
class Rollback:
    """What :meth:`SpikeGuard.update` asks of the loop after a spike at step ``step`` (its loss ``loss``): restore
    the newest checkpoint saved at or before step ``to_step`` (after ``to_step`` steps; 0: the run's start), call
    ``it.skip(steps=skip, reason=reason)``, then ``guard.rolled_back(checkpoint_step)``."""

    step: int
    loss: float
    to_step: int
    skip: range
    reason: str

    def as_dict(self) -> dict:
        """The rollback as plain values, to log (``skip`` as ``[first, stop]``, stop excluded)."""
        return {"step": self.step, "loss": self.loss, "to_step": self.to_step,
                "skip": [self.skip.start, self.skip.stop], "reason": self.reason}


def _count(value, name: str, smallest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < smallest:
        raise UsageError(f"{name} must be an integer >= {smallest}, got {value!r}")
    return int(value)


class SpikeGuard:
    """Rolls a run back past a loss spike: fed the loss of every step (:meth:`update`), it answers a spike at step
    ``s`` with a :class:`Rollback` and records it in :attr:`events`: restore a checkpoint taken at or before step
    ``to_step = max(s - rollback, 0)``, skip steps ``range(max(s - rollback + 1, 1), s + 1 + skip_after)`` (the
    ``rollback`` steps up to the spike, its own batch included, and ``skip_after`` more), go on. The module's
    docstring shows the loop.

    The rule. A loss is a spike when it is not finite (NaN, inf), always; or, once the guard holds ``window``
    earlier losses (before that, its warm-up, only a non-finite loss is one), when

        (loss - median) / sd > threshold,   sd = max(1.4826 * MAD, 1e-3 * |median|)

    ``median`` and ``MAD`` (the median of ``|l - median|``) over the last ``window`` losses (numpy's median: for an
    even count, the mean of the two middle values). 1.4826 * MAD is the standard deviation of normal noise,
    estimated without being pulled by outliers; the floor at 1e-3 * |median| keeps a flat curve (MAD ~ 0) from
    firing on rounding noise. When sd is 0 (a window of losses of exactly 0) any loss above the median is a spike.
    A spike's loss never enters the window: the next loss is judged against the same window.

    Worked example, ``window=5, threshold=6``: losses ``2.0, 2.1, 1.9, 2.2, 2.0`` give median 2.0, deviations
    ``0, 0.1, 0.1, 0.2, 0`` so MAD 0.1 and sd = max(0.14826, 0.002) = 0.14826; the next loss is a spike above
    2.0 + 6 * 0.14826 = 2.88956: as the sixth loss, 3.0 is one (6.74 robust SDs), 2.8 is not (5.40). After five
    losses of exactly 2.0, sd is the floor 0.002 and a spike lies above 2.012.

    Defaults: ``threshold=6`` (normal noise passes 6 SDs about once in 10^9 steps, so the heavier tails of a real
    loss curve still rarely do, while a spike worth a rollback is tens of SDs), ``window=100`` (enough losses for
    a stable median and MAD, recent enough to follow the curve: the trend of a decreasing curve only widens the
    MAD and keeps the median above the current loss, so the guard errs toward not firing), ``rollback=50`` (the
    updates that may have led to the spike, and the batches that may have carried the bad data), ``skip_after=0``,
    ``max_rollbacks=3``.

    After :meth:`rolled_back` to step ``c`` the window is what it was after step ``c`` (the guard keeps the last
    ``window + rollback + 10,000`` losses, so a checkpoint up to that far back still leaves a full window): the
    steps taken again are judged as if the run had never gone past ``c``.

    ``max_rollbacks``: when ``max_rollbacks`` rollbacks were already issued for spikes within ``rollback`` steps
    of this one (``|step - spike| <= rollback``, the rollbacks a state recorded included: :meth:`from_state`), the
    spike came back after its data was skipped: it is not the data's fault, and :meth:`update` raises
    :class:`SpikeGuardError` instead of rolling back again.
    """

    def __init__(self, threshold: float = 6.0, window: int = 100, rollback: int = 50, skip_after: int = 0,
                 max_rollbacks: int = 3):
        t = as_number(threshold)
        if t is None or not (math.isfinite(t) and t > 0):
            raise UsageError(f"threshold must be a finite number > 0 (robust standard deviations), got {threshold!r}")
        self.threshold = t
        self.window_size = _count(window, "window", 2)
        self.rollback = _count(rollback, "rollback", 1)
        self.skip_after = _count(skip_after, "skip_after", 0)
        self.max_rollbacks = _count(max_rollbacks, "max_rollbacks", 1)
        self._losses: deque = deque(maxlen=self.window_size + self.rollback + KEEP)  # (step, loss), not spikes
        self._last = 0  # the last step fed (or rolled back to)
        self._events: list[Rollback] = []

    @classmethod
    def from_state(cls, state: dict, **kwargs) -> "SpikeGuard":
        """A guard that knows the rollbacks a run's state (an iterator's ``get_state()``, any version) recorded:
        its step skips whose reason starts with "SpikeGuard:" become :attr:`events`, so ``max_rollbacks`` holds
        across restarts (each with ``step`` and ``loss`` read back from its reason, ``skip`` its steps and ``to_step``
        the step before them; a skip by ids or ``where`` is no rollback). Its loss window starts empty (a warm-up
        of ``window`` steps). ``kwargs``: the guard's arguments."""
        if not isinstance(state, dict):
            raise UsageTypeError(f"a state is a dict (an iterator's get_state()), got {type(state).__name__}")
        state = upgrade(state)
        views = check(state["history"]) if "history" in state else None
        guard = cls(**kwargs)
        for e in views.skips if views is not None else []:
            if "steps" not in e or not e["reason"].startswith(SPIKE_PREFIX):
                continue
            a, b = e["steps"]
            at = re.search(r"\bat step (\d+)", e["reason"])
            loss = re.search(r"\bloss (\S+?),? at step", e["reason"])
            try:
                value = float(loss.group(1)) if loss else math.nan
            except ValueError:
                value = math.nan
            step = int(at.group(1)) if at else b - 1
            guard._events.append(Rollback(step, value, a - 1, range(a, b), e["reason"]))
        return guard

    @property
    def window(self) -> tuple:
        """The losses the next loss is judged against: the last ``window`` fed that were not spikes, at steps up to
        the last rolled back to (fewer during the warm-up). The size asked for is :attr:`window_size`."""
        return tuple(loss for _, loss in reversed(list(islice(reversed(self._losses), self.window_size))))

    @property
    def events(self) -> list:
        """The rollbacks so far, oldest first, as dicts (:meth:`Rollback.as_dict`): what a loop logs."""
        return [e.as_dict() for e in self._events]

    @property
    def last_step(self) -> int:
        """The last step fed, or rolled back to (0: none)."""
        return self._last

    def update(self, step: int, loss) -> Rollback | None:
        """Feed the loss of training step ``step`` (1-based, greater than the last fed or rolled back to):
        None, or a :class:`Rollback` when it is a spike. Raises :class:`SpikeGuardError` when the spike came back
        after ``max_rollbacks`` rollbacks near it, ValueError for a step out of order or a loss that is not a
        number."""
        s = _count(step, "step", 1)
        if s <= self._last:
            raise UsageError(f"SpikeGuard.update: step {s} is not after the last step fed, {self._last}; steps "
                             f"increase (after a rollback, call rolled_back(checkpoint_step) first)")
        x = as_number(loss)
        if x is None:
            raise UsageError(f"SpikeGuard.update: the loss must be a real number (a float, a 0-d array, a "
                             f"one-element tensor), got {type(loss).__name__} {str(loss)[:80]}")
        self._last = s
        if not math.isfinite(x):
            return self._spike(s, x, f"{SPIKE_PREFIX} loss {x} at step {s}, not finite")
        window = self.window
        if len(window) < self.window_size:
            self._losses.append((s, x))
            return None
        w = np.asarray(window, np.float64)
        median = float(np.median(w))
        sd = max(1.4826 * float(np.median(np.abs(w - median))), 1e-3 * abs(median))
        z = (x - median) / sd if sd > 0 else (math.inf if x > median else 0.0)
        if z > self.threshold:
            return self._spike(s, x, f"{SPIKE_PREFIX} loss {x:.6g} at step {s}, {z:.3g} robust SDs above the median "
                                     f"{median:.6g} of the last {self.window_size} steps")
        self._losses.append((s, x))
        return None

    def _spike(self, step: int, loss: float, reason: str) -> Rollback:
        near = [e.step for e in self._events if abs(e.step - step) <= self.rollback]
        if len(near) >= self.max_rollbacks:
            raise SpikeGuardError(
                f"SpikeGuard: the loss spiked at step {step} ({loss:.6g}) after {len(near)} rollbacks for spikes "
                f"within {self.rollback} steps of it (at steps {', '.join(map(str, near))}; max_rollbacks="
                f"{self.max_rollbacks}): each time the steps before it were skipped and it came back, so the data "
                f"is not the cause and skipping more data will not help. Lower the learning rate (or warm it up "
                f"again from the last good checkpoint), look at the optimizer state (Adam's second moments, the "
                f"loss scale, the gradient norms) and the model's numerics (precision, clipping)")
        rollback = Rollback(step, loss, max(step - self.rollback, 0),
                            range(max(step - self.rollback + 1, 1), step + 1 + self.skip_after), reason)
        self._events.append(rollback)
        return rollback

    def rolled_back(self, step: int) -> None:
        """The loop restored a checkpoint taken after ``step`` steps: the losses of later steps leave the window
        (those steps are taken again, on other data), and the next step fed is ``step + 1`` or later."""
        s = _count(step, "rolled_back's step", 0)
        if s > self._last:
            raise UsageError(f"SpikeGuard.rolled_back: step {s} lies after the last step fed, {self._last}: a "
                             f"checkpoint restored is one taken at or before it")
        while self._losses and self._losses[-1][0] > s:
            self._losses.pop()
        self._last = s
