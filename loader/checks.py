"""Checks of the values a user gives, run before any work: :class:`Key` (one config key: its type, range or
choices, default, doc and the parser of its mini-language), value checks that name the key, and the rank and
world size of every iterator.

A component declares the keys it reads (``babelfeed.plan.options`` the planner's); ``babelfeed.config.spec``
puts them in the key tables and parses a whole config with them. Each check raises ConfigError (a ValueError;
ConfigTypeError for a value of the wrong type) naming the key (with its section, e.g.
``train.mixing.temperature`` for the demo config's pipeline) and the value it got, so nonsense is refused where
it was written instead of surfacing as an empty epoch or a numpy error further down.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from babelfeed.errors import ConfigError, ConfigTypeError


def digits(text) -> bool:
    """Text of ASCII digits only (``str.isdigit`` also takes ``'²'``, which ``int()`` refuses)."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


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


def integers(key: str, text, low: int = 0, sep: str = ",") -> tuple[int, ...]:
    """A comma-separated list of integers >= ``low`` (e.g. schedule boundaries), named by ``key`` when not."""
    if isinstance(text, (tuple, list)):
        text = sep.join(map(str, text))
    items = [t.strip() for t in str(text).split(sep) if t.strip()]
    try:
        values = tuple(int(t) for t in items)
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


@dataclass(frozen=True)
class Key:
    """One config key. ``kind``: "int", "float", "bool", "str" or "str|int"; ``low``/``high``: the range of a
    number (``low`` included, ``high`` excluded); ``above``: a number must be above it; ``choices``: the values allowed (a callable:
    choices a registry holds, asked when checked); ``nonempty``: a string that must say something; ``parse``: the
    parser of the key's mini-language, ``parse(name, value) -> value``, which checks the text and returns what it
    says (raising ConfigError naming ``name``); given its own output it returns it unchanged, so a value built in
    Python (``PlanOptions(weights=(("en-de", 1.0),))``) is checked by the same rule."""

    path: str
    kind: str
    default: object
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple | Callable | None = None
    nonempty: bool = False
    parse: Callable | None = None
    above: float | None = None

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def describe(self) -> str:
        """The values allowed, in words (the key reference's "allowed" column)."""
        if self.choices:
            return " \\| ".join(repr(c) for c in self.allowed())
        if self.kind in ("int", "float"):
            low = f"> {self.above:g}" if self.above is not None else "" if self.low is None else f">= {self.low:g}"
            high = "" if self.high is None else f"< {_power(self.high)}"
            return ", ".join(x for x in (low, high) if x) or "any"
        if self.kind == "bool":
            return "True \\| False"
        return "non-empty text" if self.nonempty else "text"

    def value(self, value, name: str | None = None):
        """``value`` checked (ConfigTypeError for the wrong type, ConfigError out of range) and parsed: what the
        code reads for this key. ``name``: the key as the user wrote it (default: its path)."""
        name = name or self.path
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigTypeError(f"{name} must be True or False, got {value!r}")
            return value
        if self.choices is not None:
            if not _hashable(value) or value not in self.allowed():
                raise ConfigError(f"{name} must be one of {', '.join(map(repr, self.allowed()))}, got {value!r}")
            return value
        if self.kind == "int":
            if not is_int(value):
                raise ConfigTypeError(f"{name} must be an integer {self.describe()}, got {value!r}")
            if (self.low is not None and value < self.low) or not value < (self.high or LARGEST):
                raise ConfigError(f"{name} must be an integer {self.describe()}, got {value!r}")
            value = int(value)
        elif self.kind == "float":
            what = "a finite number" + ("" if self.describe() == "any" else f" {self.describe()}")
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigTypeError(f"{name} must be {what}, got {value!r}")
            if not math.isfinite(value) or (self.low is not None and not value >= self.low) or (
                    self.above is not None and not value > self.above) or (
                    self.high is not None and not value < self.high):
                hint = "; for a uniform mixture (the limit T -> inf) set mixing.method='uniform'" if (
                    name.endswith("temperature") and isinstance(value, float) and math.isinf(value)) else ""
                raise ConfigError(f"{name} must be {what}, got {value!r}{hint}")
            value = float(value)
        elif self.kind == "str":
            if not isinstance(value, str):
                raise ConfigTypeError(f"{name} must be {'non-empty ' if self.nonempty else ''}text, got {value!r}")
            if self.nonempty and not value.strip():
                raise ConfigError(f"{name} must be non-empty text, got {value!r}")
        elif self.kind == "str|int":
            if not (isinstance(value, str) or is_int(value)):
                raise ConfigTypeError(f"{name} must be text or an integer, got {value!r}")
        return self.parse(name, value) if self.parse is not None else value

    def parsed(self, value, name: str | None = None):
        """A value as the code holds it (the parser's output, or a value built in Python) checked by this key's
        rule: what ``PlanOptions.validate`` asks of each field."""
        if self.parse is None:
            return self.value(value, name)
        try:
            return self.parse(name or self.path, value)
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigTypeError(f"{name or self.path} cannot be {value!r} ({self.doc})") from None


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _power(x) -> str:
    p = int(math.log2(x)) if x > 0 else 0
    return f"2**{p}" if 2 ** p == x and p >= 8 else f"{x:g}"  # a power of two where it is a large one


def names(key: str, text) -> tuple[str, ...]:
    """A comma-separated list of names (directions, languages): its non-empty items, stripped."""
    if isinstance(text, (tuple, list)):
        text = ",".join(map(str, text))
    return tuple(t.strip() for t in str(text).split(",") if t.strip())
