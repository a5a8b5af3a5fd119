"""The planner's settings: the config keys it reads (mixing, batching, filters, seed, compatibility mode), each
declared once as a :class:`~babelfeed.checks.Key` with the parser of its mini-language, and :class:`PlanOptions`,
the frozen options an :class:`~babelfeed.plan.planner.EpochPlanner` plans with, whose fields name the key they
come from.

``babelfeed.config.spec`` puts these keys in the translation key table (the config reference is written from
it) and builds PlanOptions from a parsed config with :meth:`PlanOptions.from_settings`; a PlanOptions built in
Python is checked by the same keys (:meth:`PlanOptions.validate`), which also holds the rules between the
planner's settings (``max_tokens`` against the longest sample, packing against static shapes, ...).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from babelfeed.checks import LONGEST, Key, digits, integers, is_int
from babelfeed.errors import ConfigError, ConfigTypeError
from babelfeed.plan import samplers
from babelfeed.plan.schedule import MixingSchedule

METHODS = ("temperature", "uniform", "weights", "unimax")
COMPAT = ("none", "fairseq")
ON_TOO_LONG = ("skip", "raise")


# -- the mini-languages of the planner's keys: each checks its text and returns what it says ---------------------

def weights(name: str, value, phase: bool = False) -> tuple[tuple[str, float], ...]:
    """``"en-de:0.5,en-fr:0.3"`` (or a mapping, or the pairs) -> ``(("en-de", 0.5), ("en-fr", 0.3))``. ``phase``: a
    schedule's list (all 0 is checked with its phase named, when the run is built)."""
    if isinstance(value, str):
        items = []
        for item in [t.strip() for t in value.split(",") if t.strip()]:
            key, _, w = item.rpartition(":")
            try:
                weight = float(w)
            except ValueError:
                weight = math.nan
            if not key.strip() or not (weight >= 0 and math.isfinite(weight)):
                raise ConfigError(f"{name} entry {item!r} must be 'direction:weight' with a finite weight >= 0")
            items.append((key.strip(), weight))
        pairs = tuple(items)
    else:
        try:
            pairs = tuple((k, v) for k, v in (value.items() if hasattr(value, "items") else value))
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be 'direction:weight,...' or (direction, weight) pairs, "
                              f"got {value!r}") from None
        for k, v in pairs:
            if not isinstance(k, str) or not k or isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{name} entry {(k, v)!r} must be a direction and a finite weight >= 0")
        pairs = tuple((k, float(v)) for k, v in pairs)
    if pairs and not sum(w for _, w in pairs) < math.inf:
        raise ConfigError(f"{name}: the weights add up past the largest number; scale them down")
    if pairs and not phase and not sum(w for _, w in pairs) > 0:
        raise ConfigError(f"{name}: every weight is 0, so nothing would be drawn: give at least one direction a "
                          f"weight above 0")
    seen = [k for i, (k, _) in enumerate(pairs) if k in (p[0] for p in pairs[:i])]
    if seen:
        raise ConfigError(f"{name} gives {seen[0]!r} two weights")
    return pairs


def weight_lists(name: str, value) -> tuple[tuple[tuple[str, float], ...], ...]:
    """``"a:1,b:0 | a:1,b:1"`` -> one weight list per segment, each as :func:`weights` reads it."""
    if isinstance(value, str):
        parts = value.split("|") if value.strip() else []
        if any(not part.strip() for part in parts):
            raise ConfigError(f"{name} holds an empty weight list between '|'s: {value!r}")
        return tuple(weights(name, part, phase=True) for part in parts)
    return tuple(weights(name, part, phase=True) for part in value)


# The most samples an epoch may hold: far past any corpus (2**36 is 69 billion), and a bound on what one epoch's
# plan loops over.
MAX_EPOCH = 2**36


def virtual_size(name: str, value) -> str | int:
    """``"fairseq"``, ``"sum"`` or a positive integer (as text or a number) below :data:`MAX_EPOCH`."""
    if value in ("fairseq", "sum"):
        return value
    if is_int(value) and 0 < value < MAX_EPOCH:
        return int(value)
    if digits(value.strip() if isinstance(value, str) else value) and 0 < int(value) < MAX_EPOCH:
        return int(value)
    raise ConfigError(f"{name} must be 'fairseq', 'sum' or a positive integer below 2**36, got {value!r}")


def pack(name: str, value) -> tuple[int, ...]:
    """``"256x256"`` -> ``(256, 256)`` (source x target); ``""`` -> ``()`` (no packing)."""
    if isinstance(value, (tuple, list)):
        parts = list(value)
    elif not str(value).strip():
        return ()
    else:
        parts = [p.strip() for p in str(value).strip().split("x")]
        parts = [int(p) if digits(p) else p for p in parts]
    if len(parts) not in (0, 2) or not all(is_int(p) and 0 < p <= LONGEST for p in parts):
        raise ConfigError(f"{name} must be 'SRCxTGT' such as '256x256' (positive integers up to {LONGEST}), "
                          f"got {value!r}")
    return tuple(int(p) for p in parts)


def widths(name: str, value) -> tuple[tuple[int, int], ...]:
    """``"32,64"`` or ``"32x48,64x80"`` -> ``((32, 32), (64, 64))`` / ``((32, 48), (64, 80))``: the (source,
    target) widths of explicit static shapes; ``""`` -> ``()``."""
    out = []
    if isinstance(value, str) and value.strip() and not value.replace(",", "").strip():
        raise ConfigError(f"{name} must be widths such as '32,64,128' ('' for dynamic batches), got {value!r}")
    for item in [t.strip() for t in str(value).split(",") if t.strip()] if isinstance(value, str) else value:
        parts = item.split("x") if isinstance(item, str) else list(item)
        parts = [int(p) if digits(p.strip() if isinstance(p, str) else p) else p for p in parts]
        if len(parts) not in (1, 2) or not all(is_int(p) and 0 < p <= LONGEST for p in parts):
            raise ConfigError(f"{name} must be widths such as '32,64,128' or 'SRCxTGT' pairs such as '32x48,64x80' "
                              f"(positive integers up to {LONGEST}), got {value!r}")
        out.append((int(parts[0]), int(parts[-1])))
    return tuple(out)


SEED = Key("seed", "int", 1, "every draw, order and shuffle derives from it (fairseq mode: its --seed)", 0, 2**32)
COMPAT_KEY = Key("compat", "str", "none", "'fairseq': the same batches as fairseq's translation_multi_simple_epoch",
                 choices=COMPAT)

FILTER = (
    Key("filter.max_source_positions", "int", 1024, "longest source kept, prefixes and </s> included", 1, LONGEST + 1),
    Key("filter.max_target_positions", "int", 1024, "longest target kept", 1, LONGEST + 1),
    Key("filter.on_too_long", "str", "skip", "train: 'skip' (counted, reported) or 'raise'", choices=ON_TOO_LONG),
    Key("filter.on_too_long_valid", "str", "raise", "validation: 'raise' (it must see every sample) or 'skip'",
        choices=ON_TOO_LONG),
)

MIXING = (
    Key("mixing.method", "str", "temperature", "how corpora are weighted", choices=METHODS),
    Key("mixing.temperature", "float", 5.0, "p_i ~ n_i^(1/T)", above=0),
    Key("mixing.max_upsample", "float", 0.0, "no corpus served more than this many times its size in an epoch; the "
        "excess goes to the others (0: no cap; method='unimax': its cap in epochs, the paper's N)", 0),
    Key("mixing.warn_upsample", "float", 10.0, "a warning names every direction served more than this many times its "
        "data in an epoch (0: never)", 0),
    Key("mixing.weights", "str", "", "method='weights': 'eng_Latn-deu_Latn:0.5,eng_Latn-fra_Latn:0.3,...'",
        parse=weights),
    Key("mixing.sampler", "str", "auto", "'auto' ('stream' with a changing schedule, else 'stratified'), "
        "'stratified' (per-epoch draw), 'stream' (every corpus cycles its own data), 'fairseq', 'concat'",
        choices=lambda: ("auto", *samplers.names())),
    Key("mixing.virtual_size", "str|int", "fairseq", "epoch size: 'fairseq' (largest corpus x max_scale_up), 'sum' "
        "or an integer", parse=virtual_size),
    Key("mixing.max_scale_up", "float", 1.5, "virtual_size='fairseq': the cap on the largest corpus's scale",
        above=0),
    Key("mixing.probabilities_from", "str", "total", "corpus sizes over all shards ('total') or the epoch's ('shard')",
        choices=("total", "shard")),
    Key("mixing.schedule.boundaries", "str", "", "optimizer updates where the weights change, e.g. '40000,80000'",
        parse=integers),
    Key("mixing.schedule.weights", "str", "", "n + 1 weight lists 'task:w,task:w | task:w,task:w | ...'",
        parse=weight_lists),
    Key("mixing.schedule.mode", "str", "step", "'step' switches at each boundary, 'linear' interpolates",
        choices=("step", "linear")),
)

BATCHING = (
    Key("batching.max_tokens", "int", 4096, "B * max(len) of the longer side, per batch", 1, 1 << 24),
    Key("batching.max_sentences", "int", 0, "sentences per batch at most (0: no limit)", 0),
    Key("batching.required_batch_size_multiple", "int", 8, "every batch size a multiple of it", 1),
    Key("batching.accumulation", "int", 1, "forward passes per optimizer update on each rank (for the schedule)", 1),
    Key("batching.window", "int", 1_000_000, "samples planned at once (memory bound); 0: the whole epoch", 0),
    Key("batching.num_shapes", "int", 0, "> 0: every batch takes one of this many static shapes, chosen from the data",
        0, 1025),
    Key("batching.shapes", "str", "", "or explicit widths '32x32,64x64,128x128' (source x target)", parse=widths),
    Key("batching.pack", "str", "", "'256x256': pack pairs side by side into rows of this shape", parse=pack),
    Key("batching.spread_copies", "bool", True, "copies of one sample (an up-sampled corpus) go to different "
        "batches; False: the length order puts them side by side, as fairseq does"),
    Key("batching.max_repeats", "float", 0.04, "dynamic batches with spread_copies: about this share of a window's "
        "rows may stay beside a copy where parting them costs the most padding (0: none), besides the copies no "
        "placement can part (docs/concepts/pipeline.md)", 0.0, 0.5),
    Key("batching.balance_block", "int", 16, "batches of similar cost shuffled together (rank balance)", 1),
    Key("batching.fairseq_drop_last", "bool", False, "compat='fairseq': drop a last batch off the multiple"),
)

KEYS = {k.path: k for k in (SEED, COMPAT_KEY, *FILTER, *MIXING, *BATCHING)}


def _opt(default, key: str | None = None, named: str | None = None):
    """A PlanOptions field read from the config key ``key`` (checked by it), or named ``named`` in messages (a
    field the config does not give as one key)."""
    return field(default=default, metadata={"key": key, "named": named or key})


@dataclass(frozen=True)
class PlanOptions:
    seed: int = _opt(1, "seed")
    sampler: str = _opt("stratified", "mixing.sampler")  # a registered sampler (the config's "auto" resolved)
    method: str = _opt("temperature", "mixing.method")
    temperature: float = _opt(1.0, "mixing.temperature")
    max_upsample: float = _opt(0.0, "mixing.max_upsample")  # 0: no cap
    weights: tuple = _opt((), "mixing.weights")  # ((key, weight), ...) for method="weights"
    virtual_size: str | int = _opt("fairseq", "mixing.virtual_size")  # "fairseq" | "sum" | an int
    max_scale_up: float = _opt(1.5, "mixing.max_scale_up")
    # sizes over all shards ("total", fairseq) or the epoch's shard ("shard")
    probabilities_from: str = _opt("total", "mixing.probabilities_from")
    # fairseq's multilingual sampler ignores --seed and uses 2
    fairseq_sampling_seed: int = _opt(2, named="compat (fairseq sampling seed)")
    max_tokens: int = _opt(4096, "batching.max_tokens")
    max_sentences: int = _opt(0, "batching.max_sentences")  # 0: no limit
    multiple: int = _opt(8, "batching.required_batch_size_multiple")
    window: int = _opt(1_000_000, "batching.window")  # samples planned at once; 0: the whole epoch (a global sort)
    max_source_positions: int = _opt(1024, "filter.max_source_positions")
    max_target_positions: int = _opt(1024, "filter.max_target_positions")
    on_too_long: str = _opt("skip", "filter.on_too_long")  # skip (count and report) | raise
    balance_block: int = _opt(16, "batching.balance_block")  # batches of similar cost shuffled as one block
    shuffle: bool = _opt(True, named="shuffle (train or valid)")  # False: validation order (deterministic, by length)
    # static shapes ((B, L_src, L_tgt), ...) or ((B, L), ...); () = dynamic batches
    shapes: tuple = _opt((), named="batching.shapes / batching.num_shapes")
    pack_shape: tuple = _opt((), "batching.pack")  # (L_src, L_tgt): pack pairs side by side into rows of this shape
    compat: str = _opt("none", "compat")  # "fairseq": reproduce fairseq's multilingual epoch batch for batch
    # fairseq main (after d871f616) drops a last batch that misses the multiple
    fairseq_drop_last: bool = _opt(False, "batching.fairseq_drop_last")
    schedule: object = _opt(None, named="mixing.schedule")  # a MixingSchedule of per-task weights, or None
    # global batches per optimizer update (ranks x accumulation with split="batches")
    batches_per_update: int = _opt(1, named="batching.accumulation (x ranks)")
    # copies of one sample to different batches (plan.copies; training's default)
    spread_copies: bool = _opt(False, "batching.spread_copies")
    max_repeats: float = _opt(0.04, "batching.max_repeats")  # with spread_copies, dynamic batches (plan.copies)

    @property
    def too_long_key(self) -> str:
        """The key that says what a too-long sample does: training's, or validation's (its order unshuffled)."""
        return "filter.on_too_long" if self.shuffle else "filter.on_too_long_valid"

    @classmethod
    def from_settings(cls, settings, **given) -> PlanOptions:
        """The options of a parsed config (``settings[key]``: a key's parsed value, as
        ``babelfeed.config.spec.parse`` gives it): every field read from the key it names, unless ``given``;
        ``mixing.sampler='auto'`` resolved."""
        values = {f.name: settings[f.metadata["key"]] for f in dataclasses.fields(cls)
                  if f.metadata["key"] and f.name not in given}
        if values.get("sampler") == "auto":  # a mixing schedule that changes needs the stream sampler
            values["sampler"] = "stream" if settings["mixing.schedule.boundaries"] else "stratified"
        return cls(**values, **given)

    def checked(self) -> PlanOptions:
        """These options with every keyed field as its key's parser reads it (``weights="en-de:1"`` becomes
        ``(("en-de", 1.0),)``), after :meth:`validate`: what the planner plans with."""
        parsed = {f.name: KEYS[f.metadata["key"]].parsed(getattr(self, f.name)) for f in dataclasses.fields(self)
                  if f.metadata["key"]}
        out = dataclasses.replace(self, **parsed)
        out.validate()
        return out

    def validate(self) -> None:
        """Each field by its key's rule (or, for the fields no key gives, its type), then the rules between the
        planner's settings."""
        for f in dataclasses.fields(self):
            if f.metadata["key"]:
                KEYS[f.metadata["key"]].parsed(getattr(self, f.name))
        samplers.choose(self.sampler)  # (a registered one: "auto" is resolved before the options are made)
        if not is_int(self.batches_per_update) or self.batches_per_update < 1:
            raise ConfigError(f"batches per optimizer update must be >= 1, got {self.batches_per_update}")
        if not isinstance(self.shuffle, bool):
            raise ConfigTypeError(f"shuffle must be True or False, got {self.shuffle!r}")
        if not is_int(self.fairseq_sampling_seed) or not 0 <= self.fairseq_sampling_seed < 2**32:
            raise ConfigError(f"fairseq_sampling_seed must be an integer in [0, 2**32), got "
                              f"{self.fairseq_sampling_seed!r}")
        if self.schedule is not None and not isinstance(self.schedule, MixingSchedule):
            raise ConfigTypeError(f"schedule must be a babelfeed.plan.schedule.MixingSchedule or None, got "
                                  f"{type(self.schedule).__name__}")
        if not isinstance(self.shapes, (tuple, list)) or not all(
                isinstance(sh, (tuple, list)) and 2 <= len(sh) <= 3 and all(is_int(x) and x > 0 for x in sh)
                for sh in self.shapes):
            raise ConfigError(f"shapes must be static shapes ((batch, length) or (batch, source, target), positive "
                              f"integers), got {self.shapes!r}")
        longest = max(self.max_source_positions, self.max_target_positions)
        if longest > self.max_tokens:
            raise ConfigError(f"batching.max_tokens={self.max_tokens} is smaller than the longest allowed sample "
                              f"({longest} tokens): lower max_source/target_positions or raise max_tokens")
        if self.method == "unimax" and not self.max_upsample > 0:
            raise ConfigError("mixing.method='unimax' spreads the epoch uniformly over the corpora, each capped at "
                              "mixing.max_upsample times its size: set mixing.max_upsample (e.g. 5; UniMax's N)")
        if self.max_upsample and (self.compat == "fairseq" or self.sampler in ("fairseq", "concat")):
            raise ConfigError(f"mixing.max_upsample caps the stratified and stream samplers' draw; "
                              f"mixing.sampler={self.sampler!r} (compat={self.compat!r}) draws as fairseq does or not "
                              f"at all: leave mixing.max_upsample at 0")
        if self.weights and self.method != "weights":
            raise ConfigError(f"mixing.weights is set but mixing.method is {self.method!r}, which ignores it: set "
                              f"mixing.method='weights' to use the weights, or leave them empty")
        if self.pack_shape:
            if max(self.pack_shape) > self.max_tokens:
                raise ConfigError(f"batching.pack must be 'L_srcxL_tgt' within max_tokens, got {self.pack_shape}")
            if self.shapes or self.compat == "fairseq":
                raise ConfigError("batching.pack cannot be combined with static shapes or compat='fairseq'")
            if self.max_source_positions > self.pack_shape[0] or self.max_target_positions > self.pack_shape[1]:
                raise ConfigError(f"filter.max_source/target_positions ({self.max_source_positions}, "
                                  f"{self.max_target_positions}) must fit the packed row {tuple(self.pack_shape)}")
        if self.compat == "fairseq" and self.shapes:
            raise ConfigError("static shapes cannot be combined with compat='fairseq' (fairseq has no such batches)")
        for shape in self.shapes:
            if len(shape) < 2 or shape[0] < 1 or shape[0] * max(shape[1:]) > self.max_tokens:
                raise ConfigError(f"shape {tuple(shape)} must be (batch, length...) within max_tokens={self.max_tokens}")
        if self.compat == "fairseq" and self.sampler not in ("fairseq", "concat"):
            raise ConfigError("compat='fairseq' needs mixing.sampler 'fairseq' (resampling) or 'concat' (no resampling)")
        if self.schedule is not None and self.schedule.boundaries and not samplers.choose(self.sampler).streams:
            raise ConfigError(f"a mixing schedule that changes during training needs mixing.sampler='stream' (or "
                              f"'auto'), got {self.sampler!r}")


# The config key each plan option comes from (what a fingerprint mismatch names).
OPTION_KEYS = {f.name: f.metadata["named"] for f in dataclasses.fields(PlanOptions)}
# Options added after states were first written: at their default (off) a plan is the one babelfeed planned before
# them, so they are left out of what the fingerprint and the identity hold, as states written then have it.
LATER_OPTIONS = ("spread_copies", "max_upsample")
# ... and so an identity that lacks one stands at its default
UNSTATED = {f.name: f.default for f in dataclasses.fields(PlanOptions) if f.name in LATER_OPTIONS}
