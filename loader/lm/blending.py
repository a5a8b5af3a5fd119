"""Megatron-style blending, data paths, train/valid/test splits, and a safe cache for computed index arrays.

Blending (Megatron's ``build_blending_indices``) is greedy and has no randomness: sample s goes to the
dataset furthest behind its target share, ``argmax_i (w_i * max(s, 1) - count_i)`` with ties to the lowest
index. Example, ``w = [.5, .3, .2]``, 20 samples: ``0 1 2 0 1 0 2 0 1 0 0 1 2 0 1 0 2 0 1 0``. Counts track
``w * n`` closely: within 1 for two datasets; with more, the largest-deficit greedy can overshoot 1 slightly.
Megatron aims sample s at ``w * max(s, 1)``, one step behind (Fast-LLM PR #133 calls it "arguably wrong"), which
measured up to 1.28 from ``w * n``; ``megatron=False`` aims at ``w * (s + 1)``: up to 1.03 (3,000 random blends
of at most 8 datasets).

Splits (Megatron's ``parse_and_normalize_split``): ``"969,30,1"`` normalises to ``[.969, .030, .001]``;
split i covers ``[round(lo_i * N), round(hi_i * N))`` of the N documents (contiguous, not random), and a
zero-width split is None.
"""

from __future__ import annotations

import math
import re

import numpy as np

from babelfeed.gather.engine import KERNEL
from babelfeed.sources.cache import IndexCache  # noqa: F401  (part of this module's face)
from babelfeed.errors import ConfigError


def blending_indices(weights, size: int, megatron: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(dataset index int16[size], sample index within that dataset int64[size]), Megatron's greedy blend
    (``megatron=False``: the same greedy aimed at ``w * (s + 1)``).

    The compiled kernel (``_gather.c``'s ``blend``) blends 100M samples in 0.5 s over two datasets and 5 s over
    50, 2 to 5 times faster than Megatron's loop compiled alike (``benchmarks/bench_blending.py``); without it
    (or with ``BABELFEED_KERNEL=0``) the numpy fallback gives the same arrays, slower (``_blend_fallback``)."""
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        w = np.zeros((0, 0))
    with np.errstate(over="ignore"):
        total = w.sum() if w.ndim == 1 else 0.0
    if w.ndim != 1 or not len(w) or (w < 0).any() or not np.isfinite(w).all():
        raise ConfigError(f"weights must be a non-empty list of finite non-negative numbers, got {weights!r}")
    if not total > 0:
        raise ConfigError(f"weights {weights!r} are all 0: nothing to draw from; give at least one dataset a weight "
                          f"above 0")
    if not np.isfinite(total):  # normalising would turn every weight into 0 (and blend round-robin)
        raise ConfigError(f"weights add up past the largest float ({weights!r}): scale them down")
    if len(w) > np.iinfo(np.int16).max:
        raise ConfigError(f"at most {np.iinfo(np.int16).max} datasets can be blended, got {len(w)}")
    w = np.ascontiguousarray(w / w.sum())  # Megatron normalises the same way, in float64
    dataset = np.empty(size, dtype=np.int16)
    sample = np.empty(size, dtype=np.int64)
    if KERNEL is not None:
        KERNEL.blend(w, bool(megatron), dataset, sample)
    else:
        _blend_fallback(w, int(size), bool(megatron), dataset, sample)
    return dataset, sample


def _blend_fallback(w: np.ndarray, size: int, megatron: bool, dataset: np.ndarray, sample: np.ndarray) -> None:
    """The greedy in Python, every error the same float64 expression as helpers.cpp's. The choices are made
    in blocks of a Python list (one dataset: none at all); the sample indices are derived afterwards: a
    stable sort by dataset numbers each dataset's positions 0, 1, 2, ... Two datasets compare two errors
    inline, a few are scanned in Python, many (from 18, where that costs more than three numpy calls) take
    ``argmax`` of the error vector. 100M samples: about 30 s over two datasets, 4 minutes over 50."""
    k = len(w)
    if k == 1 or size == 0:
        dataset[:] = 0
        sample[:] = np.arange(size)
        return
    wl = w.tolist()
    counts = [0] * k
    block = 1 << 16
    err = np.empty(k)
    cnt = np.zeros(k)
    for lo in range(0, size, block):
        chosen = []
        append = chosen.append
        for s in range(lo, min(size, lo + block)):
            x = (s if s > 1 else 1.0) if megatron else s + 1.0  # Megatron: max(s, 1), steps 0 and 1 target 1
            if k == 2:
                best = 1 if wl[1] * x - counts[1] > wl[0] * x - counts[0] else 0
            elif k < 18:  # measured: a Python scan costs less than three numpy calls up to ~18 datasets
                best, best_err = 0, wl[0] * x - counts[0]
                for i in range(1, k):
                    err_i = wl[i] * x - counts[i]
                    if err_i > best_err:  # strict: the lowest index wins ties
                        best, best_err = i, err_i
            else:
                np.subtract(np.multiply(w, x, out=err), cnt, out=err)
                best = int(err.argmax())  # the first of equal maxima, as the strict scan; no error is NaN
                cnt[best] += 1.0
            counts[best] += 1
            append(best)
        dataset[lo:lo + len(chosen)] = chosen
    per = np.bincount(dataset, minlength=k)
    starts = np.cumsum(per) - per
    sample[np.argsort(dataset, kind="stable")] = np.arange(size) - np.repeat(starts, per)


def parse_data_path(spec, name: str = "data path") -> list[tuple[float, str]]:
    """``"0.3 prefixA 0.7 prefixB"`` (or a list of tokens) -> [(0.3, "prefixA"), (0.7, "prefixB")].

    Without weights (``"prefixA prefixB"``) every prefix gets weight 1.0, as Megatron does. Given its own output
    (the pairs), it checks and returns them. Weights are finite, >= 0, not all 0, and their sum is finite.
    ``name``: how errors name it (``data_path``, the config key).
    """
    if not isinstance(spec, str) and spec and all(isinstance(t, tuple) and len(t) == 2 for t in spec):
        spec = [str(x) for pair in spec for x in pair]
    tokens = spec.split() if isinstance(spec, str) else [str(t) for t in spec]
    if not tokens:
        raise ConfigError(f"{name} is empty")

    def number(t):
        try:
            return float(t)
        except ValueError:
            return None

    if number(tokens[0]) is None:
        if any(number(t) is not None for t in tokens):
            raise ConfigError(f"{name} {spec!r} mixes weighted and unweighted entries")
        return [(1.0, t) for t in tokens]
    if len(tokens) % 2:
        raise ConfigError(f"{name} {spec!r} must alternate weight and prefix")
    out = []
    for weight, prefix in zip(tokens[::2], tokens[1::2]):
        if number(weight) is None or number(prefix) is not None:
            raise ConfigError(f"{name} {spec!r}: expected a weight then a prefix, got {weight!r} {prefix!r}")
        if not float(weight) >= 0 or math.isinf(float(weight)):
            raise ConfigError(f"{name} {spec!r}: a weight must be a finite number >= 0, got {weight}")
        out.append((float(weight), prefix))
    total = sum(w for w, _ in out)  # (a float sum: past the largest float it is inf)
    if not 0 < total < math.inf:
        raise ConfigError(f"{name} {spec!r}: the weights must add up to a finite number above 0")
    return out


def parse_split(split: str) -> list[float]:
    """``"969,30,1"`` (or ``"969/30/1"``, as Megatron takes it) -> [0.969, 0.03, 0.001]: one to three shares >= 0,
    padded to 3 with zeros, normalised."""
    try:
        values = [float(x) for x in re.split(r"[,/]", str(split))]
    except ValueError:
        values = []
    if not values or len(values) > 3 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ConfigError(f"split {split!r} must be one to three shares >= 0 separated by ',' (or '/'), "
                          f"e.g. '969,30,1'")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    if total <= 0:
        raise ConfigError(f"split {split!r} adds up to 0")
    return [v / total for v in values]


def split_ranges(split: str, num_elements: int) -> list[tuple[int, int] | None]:
    """[(begin, end) or None] for train/valid/test over ``num_elements`` (contiguous, Megatron's rounding)."""
    shares = parse_split(split)
    bounds = np.concatenate([[0.0], np.cumsum(shares)])
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi - lo == 0:
            out.append(None)
        else:
            out.append((int(round(lo * num_elements)), int(round(hi * num_elements))))
    return out


def document_splits(dataset, split: str) -> dict[str, tuple[range, range] | None]:
    """Split an indexed dataset by documents: {"train"|"valid"|"test": (document range, sequence range)}."""
    doc_idx = np.asarray(dataset.doc_idx)
    names = ("train", "valid", "test")
    out = {}
    for name, r in zip(names, split_ranges(split, len(doc_idx) - 1)):
        if r is None:
            out[name] = None
        else:
            out[name] = (range(r[0], r[1]), range(int(doc_idx[r[0]]), int(doc_idx[r[1]])))
    return out


