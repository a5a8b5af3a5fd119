"""The planner's settings, checked once: mixing, batching, filters, shapes, packing, compatibility mode."""

from __future__ import annotations

from dataclasses import dataclass

from babelfeed.checks import METHODS
from babelfeed.errors import ConfigError
from babelfeed.plan import samplers


@dataclass(frozen=True)
class PlanOptions:
    seed: int = 1
    sampler: str = "stratified"  # stratified | fairseq | concat | stream
    method: str = "temperature"  # temperature | uniform | weights
    temperature: float = 1.0
    weights: tuple = ()  # ((key, weight), ...) for method="weights"
    virtual_size: str | int = "fairseq"  # "fairseq" | "sum" | an int
    max_scale_up: float = 1.5
    probabilities_from: str = "total"  # sizes over all shards ("total", fairseq) or the epoch's shard ("shard")
    fairseq_sampling_seed: int = 2  # fairseq's multilingual sampler ignores --seed and uses 2
    max_tokens: int = 4096
    max_sentences: int = 0  # 0: no limit
    multiple: int = 8
    window: int = 1_000_000  # samples planned at once; 0: the whole epoch (a global sort)
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    on_too_long: str = "skip"  # skip (count and report) | raise
    balance_block: int = 16  # batches of similar cost shuffled as one block
    shuffle: bool = True  # False: validation order (deterministic, by length)
    shapes: tuple = ()  # static shapes ((B, L_src, L_tgt), ...) or ((B, L), ...); () = dynamic batches
    pack_shape: tuple = ()  # (L_src, L_tgt): pack pairs side by side into rows of this shape
    compat: str = "none"  # "fairseq": reproduce fairseq's multilingual epoch batch for batch
    fairseq_drop_last: bool = False  # fairseq main (after d871f616) drops a last batch that misses the multiple
    schedule: object = None  # a MixingSchedule of per-task weights (sources.tasks order), or None
    batches_per_update: int = 1  # global batches per optimizer update (ranks x accumulation with split="batches")
    spread_copies: bool = False  # copies of one sample to different batches (plan.copies; training's default)

    def validate(self) -> None:
        if self.sampler not in samplers.names():
            raise ConfigError(f"mixing.sampler must be one of {samplers.names()}, got {self.sampler!r}")
        if self.method not in METHODS:
            raise ConfigError(f"mixing.method must be one of {METHODS}, got {self.method!r}")
        if not self.temperature > 0:
            raise ConfigError(f"mixing.temperature must be > 0, got {self.temperature}")
        if self.max_tokens <= 0:
            raise ConfigError(f"batching.max_tokens must be > 0, got {self.max_tokens}")
        if self.max_sentences < 0 or self.multiple < 1 or self.window < 0 or self.balance_block < 1:
            raise ConfigError("batching.max_sentences >= 0, required_batch_size_multiple >= 1, window >= 0 and "
                             f"balance_block >= 1 are required, got {self.max_sentences}, {self.multiple}, "
                             f"{self.window}, {self.balance_block}")
        longest = max(self.max_source_positions, self.max_target_positions)
        if longest > self.max_tokens:
            raise ConfigError(f"batching.max_tokens={self.max_tokens} is smaller than the longest allowed sample "
                             f"({longest} tokens): lower max_source/target_positions or raise max_tokens")
        if self.on_too_long not in ("skip", "raise"):
            raise ConfigError(f"filter.on_too_long must be 'skip' or 'raise', got {self.on_too_long!r}")
        if self.compat not in ("none", "fairseq"):
            raise ConfigError(f"compat must be 'none' or 'fairseq', got {self.compat!r}")
        if self.pack_shape:
            if len(self.pack_shape) != 2 or min(self.pack_shape) < 1 or max(self.pack_shape) > self.max_tokens:
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
        if samplers.choose(self.sampler).streams and self.compat == "fairseq":
            raise ConfigError("compat='fairseq' cannot use mixing.sampler='stream' (fairseq redraws every epoch)")
        if self.schedule is not None and self.schedule.boundaries and not samplers.choose(self.sampler).streams:
            raise ConfigError(f"a mixing schedule that changes during training needs mixing.sampler='stream' (or "
                             f"'auto'), got {self.sampler!r}")
        if self.batches_per_update < 1:
            raise ConfigError(f"batches per optimizer update must be >= 1, got {self.batches_per_update}")
        if self.probabilities_from not in ("total", "shard"):
            raise ConfigError(f"mixing.probabilities_from must be 'total' or 'shard', got {self.probabilities_from!r}")
        if not (self.virtual_size in ("fairseq", "sum") or (isinstance(self.virtual_size, int) and self.virtual_size > 0)):
            raise ConfigError(f"mixing.virtual_size must be 'fairseq', 'sum' or a positive int, got {self.virtual_size!r}")


# The config key each plan option comes from (what a fingerprint mismatch names).
OPTION_KEYS = {
    "seed": "seed", "sampler": "mixing.sampler", "method": "mixing.method", "temperature": "mixing.temperature",
    "weights": "mixing.weights", "virtual_size": "mixing.virtual_size", "max_scale_up": "mixing.max_scale_up",
    "probabilities_from": "mixing.probabilities_from", "fairseq_sampling_seed": "compat (fairseq sampling seed)",
    "max_tokens": "batching.max_tokens", "max_sentences": "batching.max_sentences",
    "multiple": "batching.required_batch_size_multiple", "window": "batching.window",
    "max_source_positions": "filter.max_source_positions", "max_target_positions": "filter.max_target_positions",
    "on_too_long": "filter.on_too_long", "balance_block": "batching.balance_block",
    "shuffle": "shuffle (train or valid)", "shapes": "batching.shapes / batching.num_shapes",
    "pack_shape": "batching.pack", "compat": "compat", "fairseq_drop_last": "batching.fairseq_drop_last",
    "schedule": "mixing.schedule", "spread_copies": "batching.spread_copies",
}

