"""Checks of the values a user gives, run before any work: the allowed values of the config's choices, value
checks that name the key (``babelfeed.config.spec`` runs them over every config key), and the rank and world
size of every iterator.

Each raises ConfigError (a ValueError) naming the key (with its section, e.g. ``train.mixing.temperature`` for
the demo config's pipeline) and the value it got, so nonsense is refused where it was written instead of
surfacing as an empty epoch or a numpy error further down.
"""

from __future__ import annotations

import math
import numbers

from babelfeed.errors import ConfigError

SHARDS = ("cycle", "all")
VERIFY = ("quick", "full")
ON_TOO_LONG = ("skip", "raise")
METHODS = ("temperature", "uniform", "weights")
COMPAT = ("none", "fairseq")
DTYPES = ("int32", "int64")


def is_int(value) -> bool:
    """An integer and not a bool (``True`` is an ``int`` to Python, never a count to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# Counts in a config (tokens, sentences, positions, windows) stay below this: beyond it they are typos, and
# numpy's int32/int64 arithmetic further down would overflow instead of saying so.
LARGEST = 2**40


def at_least(key: str, value, low: int) -> None:
    if not is_int(value) or not low <= value < LARGEST:
        raise ConfigError(f"{key} must be an integer >= {low}" + (" and < 2**40" if is_int(value) and value >= low
                                                                 else "") + f", got {value!r}")


def integers(key: str, text, low: int = 0, sep: str = ",") -> list[int]:
    """A comma-separated list of integers >= ``low`` (e.g. schedule boundaries), named by ``key`` when not."""
    items = [t.strip() for t in str(text).split(sep) if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise ConfigError(f"{key} must be {sep!r}-separated integers, got {text!r}") from None
    if any(not low <= v < LARGEST for v in values):
        raise ConfigError(f"{key} must hold integers >= {low}, got {text!r}")
    return values


def positive(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key} must be > 0, got {value!r}")


def one_of(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def flag(key: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be True or False, got {value!r}")


# The most ranks a run may have: far beyond any cluster, and a bound on what trace and replay loop over.
MAX_WORLD_SIZE = 1 << 20


def check_rank(rank, world_size) -> None:
    """``world_size`` a positive integer (at most :data:`MAX_WORLD_SIZE`) and ``rank`` an integer in
    ``[0, world_size)``."""
    if not is_int(world_size) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError(f"world_size must be an integer in [1, {MAX_WORLD_SIZE:,}], got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an integer in [0, {world_size}), got {rank!r}")


# The planner orders samples by 16-bit lengths: a longer sample must be filtered, never planned.
LONGEST = 65535
