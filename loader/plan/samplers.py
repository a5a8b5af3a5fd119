"""How an epoch's samples are drawn from the corpora: one object per sampler, chosen once from ``mixing.sampler``.

A sampler answers, for the planner:

* ``ratios``: per corpus, the mixture's sampling ratios (for most samplers the probabilities; fairseq's are its
  unnormalised ratios, which its virtual size and draw take) and ``probabilities``, which normalises them;
* ``epoch_total``: how many samples an epoch holds (``mixing.virtual_size``), where the sampler sizes epochs;
* ``draw``: per corpus, how many samples the epoch takes and how (a ``StratifiedDraw``, fairseq's index array,
  or ``None``: its rows in order);
* ``streams``: whether every corpus is a stream whose position carries across epochs (``"stream"``), planned
  window by window, which is what lets weights change during a run (``set_weights``, mixing schedules).

Adding a sampler is a class here (or in a module of its own) and one :func:`register` call; the config's
``mixing.sampler`` choices and the planner's checks read the registry.
"""

from __future__ import annotations

import numpy as np

from babelfeed.plan.mixing import (StratifiedDraw, fairseq_draw, fairseq_estimated_total, fairseq_ratios,
                                   fairseq_virtual_size, sampling_probabilities, stratified_counts,
                                   task_probabilities, virtual_size, weight_probabilities)
from babelfeed.errors import ConfigError


class Sampler:
    """The stratified sampler: every corpus's count in an epoch is its probability times the epoch size
    (largest remainders), its rows a keyed permutation, drawn again each epoch."""

    name = "stratified"
    streams = False  # every corpus a stream across epochs, planned window by window
    sizes_epochs = True  # the epoch size comes from mixing.virtual_size (concat: the corpora's sizes)

    def probability_sizes(self, opts, directions, epoch: int, cycling: bool) -> list[int]:
        """The sizes the probabilities are computed from: the epoch's shard (``probabilities_from="shard"``,
        Open-NLLB's ``--use-local-shard-size``) or every shard."""
        if opts.probabilities_from != "total":
            return [d.size for d in directions]
        return [d.total_size for d in directions]

    def ratios(self, opts, sizes, keys, task_of, task_weights=None) -> np.ndarray:
        """Per-stream sampling probabilities for ``opts`` (``method``, ``temperature``, ``weights``), or with
        per-task ``task_weights`` (a schedule, ``set_weights``) split by temperature within each task."""
        if task_weights is not None:
            return task_probabilities(task_weights, task_of, sizes, opts.temperature)
        if opts.method in ("uniform", "unimax"):  # (unimax: uniform, capped by the planner's mixture)
            return np.full(len(sizes), 1.0 / len(sizes))
        if opts.method == "weights":
            return weight_probabilities([dict(opts.weights)[k] for k in keys])
        return sampling_probabilities(sizes, opts.temperature)

    def probabilities(self, ratios: np.ndarray) -> np.ndarray:
        return ratios

    def epoch_total(self, opts, sizes, ratios) -> int:
        if opts.virtual_size != "fairseq":
            return int(sizes.sum()) if opts.virtual_size == "sum" else int(opts.virtual_size)
        return virtual_size(sizes, ratios, opts.max_scale_up)

    def draw(self, opts, epoch: int, directions, sizes, ratios, total: int) -> tuple[np.ndarray, list]:
        most = None if not opts.max_upsample else \
            np.floor(np.array([d.size for d in directions], np.float64) * opts.max_upsample).astype(np.int64)
        counts = stratified_counts(self.probabilities(ratios), total, most)
        return counts, [StratifiedDraw(d.size, int(c), (opts.seed, "mix", epoch, d.key)) if c else None
                        for d, c in zip(directions, counts)]


class StreamSampler(Sampler):
    """Every corpus cycles its own data: positions carry across epochs and windows, so the mixture can change
    window by window (``babelfeed.plan.stream``)."""

    name = "stream"
    streams = True


class FairseqSampler(Sampler):
    """fairseq's ``translation_multi_simple_epoch`` draw: its ratios, virtual size and per-epoch resampling."""

    name = "fairseq"

    def probability_sizes(self, opts, directions, epoch: int, cycling: bool) -> list[int]:
        """With ``compat="fairseq"`` and cycled shards, fairseq's estimate of every shard
        (``fairseq_estimated_total``) when the epoch is known."""
        if opts.probabilities_from == "total" and opts.compat == "fairseq" and cycling and epoch:
            return [fairseq_estimated_total(d.shard_sizes, epoch) if d.shard_sizes else d.total_size
                    for d in directions]
        return super().probability_sizes(opts, directions, epoch, cycling)

    def ratios(self, opts, sizes, keys, task_of, task_weights=None) -> np.ndarray:
        """fairseq's ratios, unnormalised and computed as fairseq computes them (``[1.0] * k`` for uniform; the
        weights as given)."""
        if task_weights is not None:
            return task_probabilities(task_weights, task_of, sizes, opts.temperature)
        if opts.method in ("uniform", "unimax"):  # (unimax: uniform, capped by the planner's mixture)
            return np.ones(len(sizes))
        if opts.method == "weights":
            raw = [dict(opts.weights)[k] for k in keys]
            weight_probabilities(raw)  # checks them
            return np.asarray(raw, np.float64)
        return fairseq_ratios(sizes, opts.temperature)

    def probabilities(self, ratios: np.ndarray) -> np.ndarray:
        return ratios / ratios.sum()

    def epoch_total(self, opts, sizes, ratios) -> int:
        if opts.virtual_size != "fairseq":
            return super().epoch_total(opts, sizes, ratios)
        return fairseq_virtual_size(sizes, ratios, opts.max_scale_up)

    def draw(self, opts, epoch: int, directions, sizes, ratios, total: int) -> tuple[np.ndarray, list]:
        idx = fairseq_draw(sizes, ratios, total, epoch, seed=opts.fairseq_sampling_seed)
        return np.array([len(i) for i in idx], dtype=np.int64), list(idx)


class ConcatSampler(Sampler):
    """No resampling: every corpus once per epoch (shuffled, or in order with ``compat="fairseq"``)."""

    name = "concat"
    sizes_epochs = False

    def ratios(self, opts, sizes, keys, task_of, task_weights=None) -> np.ndarray:
        return np.asarray(sizes, np.float64) / max(sum(sizes), 1)

    def draw(self, opts, epoch: int, directions, sizes, ratios, total: int) -> tuple[np.ndarray, list]:
        draws = []
        for d in directions:
            shuffled = opts.shuffle and d.size and opts.compat != "fairseq"  # fairseq: rows in order, then permuted
            draws.append(StratifiedDraw(d.size, d.size, (opts.seed, "concat", epoch, d.key)) if shuffled else None)
        return sizes.copy(), draws


_REGISTRY: dict[str, Sampler] = {}


def register(sampler: Sampler) -> None:
    """Make ``sampler`` choosable as ``mixing.sampler = sampler.name``."""
    _REGISTRY[sampler.name] = sampler


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def choose(name: str) -> Sampler:
    if name not in _REGISTRY:
        raise ConfigError(f"mixing.sampler must be one of {names()}, got {name!r}")
    return _REGISTRY[name]


for _s in (Sampler(), FairseqSampler(), ConcatSampler(), StreamSampler()):
    register(_s)
