"""Mixing-weight schedules over training (OpenNMT-py's ``mixing_weight_schedule``).

A schedule has boundaries ``b_1 < ... < b_n`` (in optimizer updates) and ``n + 1`` weight lists: ``weights[0]``
applies before ``b_1``, ``weights[i]`` from ``b_i`` on. ``mode="linear"`` instead interpolates between
consecutive lists: ``weights[0]`` at update 0, ``weights[i]`` at ``b_i``, the last list held after ``b_n``.

Steps are optimizer updates, not loader batches: one update consumes ``world_size x accumulation`` global
batches in the ``split="batches"`` layout (one batch per rank per forward pass) or ``accumulation`` global
batches in the ``split="rows"`` layout. ``update_of(global_batches)`` does that conversion, so a boundary at 40k
updates is the same point of training whatever the batch split - a caveat of OpenNMT-py's schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from babelfeed.errors import ConfigError, UsageError


@dataclass(frozen=True)
class MixingSchedule:
    boundaries: tuple  # optimizer updates, strictly increasing
    weights: tuple  # len(boundaries) + 1 lists of per-task weights
    mode: str = "step"  # "step" (piecewise constant) | "linear"

    def __post_init__(self):
        b = [int(x) for x in self.boundaries]
        if any(x < 0 for x in b) or any(y <= x for x, y in zip(b, b[1:])):
            raise ConfigError(f"mixing.schedule.boundaries must be non-negative and strictly increasing, got {b}")
        if len(self.weights) != len(b) + 1:
            raise ConfigError(f"mixing.schedule.weights: a schedule with {len(b)} boundaries needs {len(b) + 1} "
                              f"weight lists ('w0 | w1 | ...', the weights before the first boundary first), got "
                              f"{len(self.weights)}")
        widths = {len(w) for w in self.weights}
        if len(widths) != 1:
            raise ConfigError(f"mixing.schedule.weights: every weight list must name the same tasks, got lengths {sorted(widths)}")
        for i, w in enumerate(self.weights):
            arr = np.asarray(w, dtype=np.float64)
            if (arr < 0).any() or not np.isfinite(arr).all() or arr.sum() <= 0:
                raise ConfigError(f"mixing.schedule weight list {i}: weights must be finite, non-negative and not all "
                                  f"0, got {list(w)}")
        if self.mode not in ("step", "linear"):
            raise ConfigError(f"mixing.schedule.mode must be 'step' or 'linear', got {self.mode!r}")
        object.__setattr__(self, "boundaries", tuple(b))
        object.__setattr__(self, "weights", tuple(tuple(float(x) for x in w) for w in self.weights))

    @classmethod
    def constant(cls, weights) -> "MixingSchedule":
        return cls((), (tuple(weights),))

    def weights_at(self, update: float) -> np.ndarray:
        """Normalised task probabilities at this optimizer update."""
        if self.mode == "step":
            w = np.asarray(self.weights[int(np.searchsorted(self.boundaries, update, side="right"))])
        else:  # anchors (0, weights[0]), (b_1, weights[1]), ...; held beyond the last
            x = [0, *self.boundaries]
            y = np.asarray(self.weights, dtype=np.float64)
            w = np.array([np.interp(update, x, y[:, j]) for j in range(y.shape[1])])
        return w / w.sum()


def update_of(global_batches: int, world_size: int = 1, accumulation: int = 1, split: str = "batches") -> float:
    """The optimizer update a loader position corresponds to (fractional within an accumulation cycle)."""
    if world_size < 1 or accumulation < 1:
        raise UsageError(f"world_size and accumulation must be >= 1, got {world_size}, {accumulation}")
    per_update = accumulation * (world_size if split == "batches" else 1)
    return global_batches / per_update
