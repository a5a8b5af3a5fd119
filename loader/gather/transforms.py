"""On-the-fly noise on token ids, vectorised over a whole batch (noise sampled anew each time a sample is used).

A batch is *ragged*: ``tokens`` (every sentence's ids back to back) and ``lengths``. Each transform maps a
ragged batch to a ragged batch with numpy, without a Python loop over sentences. Every random choice is a
counter-based hash of (seed, epoch, sample id, transform name, token position): the same sample gets the same
noise when a run resumes, and different noise every epoch.

The first ``protect_prefix`` tokens of a sentence (language tokens, markers) and its last token (``</s>``) are
never noised.

* ``token_drop(rate)``: delete each token with probability ``rate``.
* ``token_replace(rate, low, high)``: SwitchOut-style, replace a token by a random id in ``[low, high)``.
* ``insert_tokens(rate, low, high)``: after each token, insert a random id with probability ``rate``.
* ``local_reorder(k)``: a permutation where no token moves more than ``k`` places (sort of ``i + U(0, k+1)``).
* ``span_mask(ratio, mask_id, mean_span=3, infill=True)``: BART: spans of Poisson(``mean_span``) length
  starting at rate ``ratio / mean_span``; ``infill=True`` replaces each span by one mask token (text infilling),
  ``False`` masks token by token.
* ``filter_too_long(max_len)``: after the transforms that change lengths, the samples that now fit.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from babelfeed.errors import ConfigError
from babelfeed.permute import derive_key
from babelfeed.sources.ragged import Ragged  # noqa: F401  (part of this module's face)


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_G = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class NoiseContext:
    """Where the randomness comes from: seed, epoch and one id per sample (stable across runs)."""

    seed: int
    epoch: int
    ids: np.ndarray
    protect_prefix: int = 1

    def uniform(self, name: str, batch: Ragged, salt: int = 0) -> np.ndarray:
        """One U[0, 1) per token, a pure function of (seed, epoch, sample id, name, salt, position)."""
        key = derive_key(self.seed, self.epoch, name, salt)[0]
        ids = np.asarray(self.ids, dtype=np.int64)[batch.sentence].astype(np.uint64)
        with np.errstate(over="ignore"):
            x = ids * _G ^ (batch.position.astype(np.uint64) + np.uint64(1)) * _M2 ^ key
            x = (x ^ (x >> np.uint64(30))) * _M1
            x = (x ^ (x >> np.uint64(27))) * _M2
            x = x ^ (x >> np.uint64(31))
        return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)

    def noisable(self, batch: Ragged) -> np.ndarray:
        """Tokens that may be noised: not in the protected prefix, not the last token."""
        pos = batch.position
        return (pos >= self.protect_prefix) & (pos < np.repeat(batch.lengths, batch.lengths) - 1)


def _select(batch: Ragged, keep: np.ndarray) -> Ragged:
    lengths = np.bincount(batch.sentence[keep], minlength=len(batch.lengths)).astype(np.int64)
    return Ragged(batch.tokens[keep], lengths)


def token_drop(batch: Ragged, ctx: NoiseContext, rate: float) -> Ragged:
    drop = ctx.noisable(batch) & (ctx.uniform("drop", batch) < rate)
    return _select(batch, ~drop)


def token_replace(batch: Ragged, ctx: NoiseContext, rate: float, low: int, high: int) -> Ragged:
    hit = ctx.noisable(batch) & (ctx.uniform("replace", batch) < rate)
    new = low + (ctx.uniform("replace-id", batch) * (high - low)).astype(np.int64)
    return Ragged(np.where(hit, new, batch.tokens), batch.lengths.copy())


def insert_tokens(batch: Ragged, ctx: NoiseContext, rate: float, low: int, high: int) -> Ragged:
    after = ctx.noisable(batch) & (ctx.uniform("insert", batch) < rate)
    new = low + (ctx.uniform("insert-id", batch) * (high - low)).astype(np.int64)
    out_len = 1 + after.astype(np.int64)  # each token, plus one inserted after it where chosen
    dest = np.cumsum(out_len) - out_len
    tokens = np.empty(int(out_len.sum()), dtype=np.int64)
    tokens[dest] = batch.tokens
    tokens[dest[after] + 1] = new[after]
    lengths = np.bincount(batch.sentence, weights=out_len, minlength=len(batch.lengths)).astype(np.int64)
    return Ragged(tokens, lengths)


def local_reorder(batch: Ragged, ctx: NoiseContext, k: int) -> Ragged:
    """Each noisable token moves at most ``k`` places; protected tokens stay where they are."""
    pos = batch.position.astype(np.float64)
    jitter = ctx.uniform("reorder", batch) * (k + 1)
    movable = ctx.noisable(batch)
    key = np.where(movable, pos + jitter, pos)
    # protected tokens keep their slots: sort the movable ones among themselves, sentence by sentence
    idx = np.flatnonzero(movable)
    order = idx[np.lexsort((key[idx], batch.sentence[idx]))]
    tokens = batch.tokens.copy()
    tokens[idx] = batch.tokens[order]
    return Ragged(tokens, batch.lengths.copy())


def _poisson_lengths(u: np.ndarray, mean: float, cap: int = 64) -> np.ndarray:
    """Inverse-CDF Poisson(mean) draws (at least 1) from uniforms."""
    k = np.arange(cap + 1)
    log_pmf = k * np.log(mean) - mean - np.cumsum(np.log(np.maximum(k, 1)))
    cdf = np.cumsum(np.exp(log_pmf))
    return np.maximum(np.searchsorted(cdf, u * cdf[-1]), 1)


def span_mask(batch: Ragged, ctx: NoiseContext, ratio: float, mask_id: int, mean_span: float = 3.0,
              infill: bool = True) -> Ragged:
    noisable = ctx.noisable(batch)
    start = noisable & (ctx.uniform("span", batch) < ratio / mean_span)
    span = _poisson_lengths(ctx.uniform("span-len", batch), mean_span)
    # the end of each span, clipped to the sentence's noisable part; a running max marks covered tokens
    n = len(batch.tokens)
    last_noisable = np.repeat(np.cumsum(batch.lengths) - 1, batch.lengths)  # the </s> position of the sentence
    flat = np.arange(n)
    end = np.where(start, np.minimum(flat + span, last_noisable), -1)
    covered = (np.maximum.accumulate(end) > flat) & noisable if n else np.zeros(0, bool)
    if not infill:
        return Ragged(np.where(covered, mask_id, batch.tokens), batch.lengths.copy())
    first = covered & ~np.concatenate([[False], covered[:-1]])
    keep = ~covered | first
    tokens = np.where(first, mask_id, batch.tokens)
    return _select(Ragged(tokens, batch.lengths), keep)


def filter_too_long(batch: Ragged, max_len: int) -> np.ndarray:
    """Boolean mask of the samples that still fit ``max_len`` after length-changing transforms."""
    return batch.lengths <= max_len


TRANSFORMS = {
    "token_drop": token_drop,
    "token_replace": token_replace,
    "insert_tokens": insert_tokens,
    "local_reorder": local_reorder,
    "span_mask": span_mask,
}


def apply(batch: Ragged, ctx: NoiseContext, steps) -> Ragged:
    """Apply ``[(name, {params}), ...]`` in order."""
    for name, params in steps:
        if name not in TRANSFORMS:
            raise ConfigError(f"unknown transform {name!r}; known: {sorted(TRANSFORMS)}")
        batch = TRANSFORMS[name](batch, ctx, **params)
    return batch


# What each parameter may be: (kind, low, high) with kind "rate" (a float in [low, high]), "int" (an integer in
# [low, high]; None: unbounded), "positive" (a float > 0), "flag" (0 or 1), "symbol" (an id or a dictionary symbol).
PARAMETERS = {"rate": ("rate", 0.0, 1.0), "ratio": ("rate", 0.0, 1.0), "k": ("int", 0, None),
              "low": ("int", 0, None), "high": ("int", 1, None), "mean_span": ("positive", None, None),
              "infill": ("flag", None, None), "mask_id": ("symbol", None, None)}


def _parameter(name: str, key: str, value: str, spec: str, dictionary):
    kind, low, high = PARAMETERS[key]
    text = value.strip()
    where = f"transform {name}: {key}={text!r} in {spec!r}"
    if kind == "symbol":
        if text.isascii() and text.isdigit():
            number = int(text)
        elif dictionary is not None and text in dictionary:
            return dictionary.index(text)
        else:
            raise ConfigError(f"{where} is neither a token id nor a dictionary symbol")
        if dictionary is not None and number >= len(dictionary):
            raise ConfigError(f"{where} is past the dictionary's {len(dictionary)} symbols")
    else:
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"{where} must be a number") from None
        if not np.isfinite(number):
            raise ConfigError(f"{where} must be a finite number")
    if kind == "rate" and not low <= number <= high:
        raise ConfigError(f"{where} must be a probability in [{low}, {high}]")
    if kind == "positive" and not number > 0:
        raise ConfigError(f"{where} must be > 0")
    if kind in ("int", "flag", "symbol"):
        if number != int(number) or number < (low or 0) or (kind == "flag" and number not in (0, 1)):
            raise ConfigError(f"{where} must be " + ("0 or 1" if kind == "flag" else f"an integer >= {low or 0}"))
        return int(number)
    return number


def parse_steps(spec: str, dictionary=None) -> list[tuple[str, dict]]:
    """``"token_drop:rate=0.1;local_reorder:k=3;span_mask:ratio=0.3,mask_id=<mask>"`` -> [(name, params), ...].

    Every parameter is checked now, not when the first batch is noised: its name (each transform takes the
    parameters of its signature), its value (rates in [0, 1], counts integers >= 0, ``mask_id`` a token id or a
    dictionary symbol such as ``<mask>``), the required ones present and ``low < high``.
    """
    steps = []
    for part in [p.strip() for p in str(spec or "").split(";") if p.strip()]:
        name, _, args = part.partition(":")
        name = name.strip()
        if name not in TRANSFORMS:
            raise ConfigError(f"unknown transform {name!r} in {spec!r}; known: {sorted(TRANSFORMS)}")
        signature = list(inspect.signature(TRANSFORMS[name]).parameters.values())[2:]
        accepted = {p.name for p in signature}
        params = {}
        for item in [a.strip() for a in args.split(",") if a.strip()]:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep:
                raise ConfigError(f"transform parameter {item!r} in {spec!r} must look like name=value")
            if key not in accepted:
                raise ConfigError(f"transform {name} has no parameter {key!r} (it takes {sorted(accepted)})")
            if key in params:
                raise ConfigError(f"transform {name} in {spec!r} sets {key!r} twice")
            params[key] = _parameter(name, key, value, spec, dictionary)
        missing = [p.name for p in signature if p.default is inspect.Parameter.empty and p.name not in params]
        if missing:
            raise ConfigError(f"transform {name} in {spec!r} needs {missing}")
        if "low" in params and params["low"] >= params["high"]:
            raise ConfigError(f"transform {name} in {spec!r}: low={params['low']} must be below high={params['high']}")
        if dictionary is not None and params.get("high", 0) > len(dictionary):
            raise ConfigError(f"transform {name} in {spec!r}: high={params['high']} is past the dictionary's "
                              f"{len(dictionary)} symbols")
        steps.append((name, params))
    return steps
