"""Checks of the settings a user gives, run before any work: one function per section of a translation config
(configs/nllb_like.py), and the rank and world size of every iterator.

Each raises ValueError naming the key (with its section, e.g. ``train.mixing.temperature`` for the demo
config's pipeline) and the value it got, so nonsense is refused where it was written instead of surfacing as
an empty epoch or a numpy error further down.
"""

from __future__ import annotations

import math
import numbers

from babelfeed.errors import ConfigError

SHARDS = ("cycle", "all")
VERIFY = ("quick", "full")
ON_TOO_LONG = ("skip", "raise")
METHODS = ("temperature", "uniform", "weights")
SAMPLERS = ("auto", "stratified", "fairseq", "concat", "stream")
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
        raise ConfigError(f"{key} must be an integer >= {low}" + (f" and < 2**40" if is_int(value) and value >= low
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


def check_rank(rank, world_size) -> None:
    """``world_size`` a positive integer and ``rank`` an integer in ``[0, world_size)``."""
    if not is_int(world_size) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an integer in [0, {world_size}), got {rank!r}")


def check_data(d, where: str = "data") -> None:
    if not isinstance(d.path, str) or not d.path.strip():
        raise ConfigError(f"{where}.path must name a data_bin directory, got {d.path!r}")
    for key in ("train_split", "valid_split"):
        if not isinstance(d[key], str) or not d[key].strip():
            raise ConfigError(f"{where}.{key} must be a split name such as 'train', got {d[key]!r}")
    one_of(f"{where}.shards", d.shards, SHARDS)
    one_of(f"{where}.verify", d.verify, VERIFY)
    at_least(f"{where}.length_cache_mb", d.length_cache_mb, 0)


# The planner orders samples by 16-bit lengths: a longer sample must be filtered, never planned.
LONGEST = 65535


def check_filter(f, where: str = "filter") -> None:
    for key in ("max_source_positions", "max_target_positions"):
        at_least(f"{where}.{key}", f[key], 1)
        if f[key] > LONGEST:
            raise ConfigError(f"{where}.{key} must be at most {LONGEST} (the planner's longest sample), "
                             f"got {f[key]!r}")
    one_of(f"{where}.on_too_long", f.on_too_long, ON_TOO_LONG)
    one_of(f"{where}.on_too_long_valid", f.on_too_long_valid, ON_TOO_LONG)


def check_mixing(m, where: str = "mixing") -> None:
    one_of(f"{where}.method", m.method, METHODS)
    positive(f"{where}.temperature", m.temperature)
    one_of(f"{where}.sampler", m.sampler, SAMPLERS)
    positive(f"{where}.max_scale_up", m.max_scale_up)
    one_of(f"{where}.probabilities_from", m.probabilities_from, ("total", "shard"))
    if "schedule" in m:
        one_of(f"{where}.schedule.mode", m.schedule.mode, ("step", "linear"))
        integers(f"{where}.schedule.boundaries", m.schedule.boundaries)


def check_batching(b, where: str = "batching") -> None:
    at_least(f"{where}.max_tokens", b.max_tokens, 1)
    at_least(f"{where}.max_sentences", b.max_sentences, 0)
    at_least(f"{where}.required_batch_size_multiple", b.required_batch_size_multiple, 1)
    at_least(f"{where}.accumulation", b.accumulation, 1)
    at_least(f"{where}.window", b.window, 0)
    at_least(f"{where}.num_shapes", b.num_shapes, 0)
    at_least(f"{where}.balance_block", b.balance_block, 1)
    flag(f"{where}.fairseq_drop_last", b.fairseq_drop_last)
    for item in [t.strip() for t in str(b.get("shapes", "")).split(",") if t.strip()]:
        parts = item.split("x")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() and 0 < int(p) < LARGEST for p in parts):
            raise ConfigError(f"{where}.shapes must be widths such as '32,64,128' or 'SRCxTGT' pairs such as "
                             f"'32x48,64x80' (positive integers), got {b.shapes!r}")


def check_collate(c, where: str = "collate") -> None:
    flag(f"{where}.left_pad_source", c.left_pad_source)
    flag(f"{where}.left_pad_target", c.left_pad_target)
    at_least(f"{where}.pad_to_multiple", c.pad_to_multiple, 1)
    one_of(f"{where}.dtype", c.dtype, DTYPES)


SECTIONS = {"data": check_data, "filter": check_filter, "mixing": check_mixing, "batching": check_batching,
            "collate": check_collate}


def check_translation_config(config, where: str = "") -> None:
    """Every section of a translation config; ``where`` is the path of ``config`` inside the file's config
    (``"train"`` for configs/demo.py), put before every key named in a message."""
    prefix = f"{where}." if where else ""
    missing = [s for s in SECTIONS if s not in config]
    if missing:
        raise ConfigError(f"{where or 'the config'} is not a translation config: it has no "
                         f"{', '.join(prefix + s for s in missing)} section (see configs/nllb_like.py)")
    if not is_int(config.seed) or not 0 <= config.seed < 2**32:
        raise ConfigError(f"{prefix}seed must be an integer in [0, 2**32), got {config.seed!r}")
    one_of(f"{prefix}compat", config.compat, COMPAT)
    for section, check in SECTIONS.items():
        check(config[section], prefix + section)
