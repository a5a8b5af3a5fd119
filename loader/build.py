"""Build iterators from an ml-collections config (see configs/nllb_like.py for every key)."""

from __future__ import annotations

import dataclasses

import numpy as np

from .collate import CollateOptions
from .corpus import ShardedCorpus
from .pipeline import BatchIterator, Collater, EpochPlanner, PlanOptions
from .shapes import ShapePlan, plan_shapes, shapes_from_widths
from .sources import SourceSet


def _list(value: str) -> list[str]:
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _weights(value) -> tuple:
    if not value:
        return ()
    if isinstance(value, str):
        pairs = []
        for item in _list(value):
            key, _, w = item.rpartition(":")
            if not key:
                raise ValueError(f"mixing.weights entry {item!r} must be 'direction:weight'")
            pairs.append((key, float(w)))
        return tuple(pairs)
    return tuple((k, float(v)) for k, v in dict(value).items())


def _overrides(value: str) -> dict:
    out: dict = {}
    for item in [v for v in str(value or "").split(";") if v.strip()]:
        head, _, tokens = item.partition("=")
        key, _, side = head.strip().rpartition(":")
        if side not in ("source", "target") or not key:
            raise ValueError(f"data.prefix_overrides entry {item!r} must be 'direction:source=tokens' or ':target='")
        out.setdefault(key, {})[side] = tokens.strip()
    return out


def _virtual(value):
    value = str(value)
    if value in ("fairseq", "sum"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"mixing.virtual_size must be 'fairseq', 'sum' or an integer, got {value!r}") from None


def _keys(corpus: ShardedCorpus, split: str, directions: str, monolingual: str) -> list[str]:
    keys = corpus.directions(split) if str(directions).strip() == "all" else _list(directions)
    keys += _list(monolingual)
    if not keys:
        raise ValueError(f"{corpus.root}: no directions selected for split {split!r}")
    return keys


def _collater(config, sources, dictionary) -> Collater:
    c = config.collate
    return Collater(sources, CollateOptions(pad=dictionary.pad(), eos=dictionary.eos(),
                                            left_pad_source=c.left_pad_source, left_pad_target=c.left_pad_target,
                                            pad_to_multiple=c.pad_to_multiple, dtype=c.dtype),
                    seed=config.seed, max_source_positions=config.filter.max_source_positions)


def _noise(config, dictionary) -> dict:
    """{task or "*": transform steps} from data.noise (every task) and data.noise_by_task ("task=spec|...")."""
    from .transforms import parse_steps

    out = {}
    if str(config.data.noise).strip():
        out["*"] = parse_steps(config.data.noise, dictionary)
    for item in [p for p in str(config.data.noise_by_task or "").split("|") if p.strip()]:
        task, sep, spec = item.partition("=")
        if not sep:
            raise ValueError(f"data.noise_by_task entry {item!r} must look like 'task=transform:params;...'")
        out[task.strip()] = parse_steps(spec, dictionary)
    return out


def _sources(config, split: str, shards: str, keys=None) -> tuple[SourceSet, object]:
    d = config.data
    corpus = ShardedCorpus(d.path)
    dictionary = corpus.dictionary()
    keys = keys or _keys(corpus, split, d.directions, d.monolingual)
    sources = SourceSet(corpus, dictionary, split, keys, source_prefix=d.source_prefix,
                        target_prefix=d.target_prefix, prefix_overrides=_overrides(d.prefix_overrides),
                        shards=shards, verify=d.verify, length_cache_mb=d.length_cache_mb,
                        noise=_noise(config, dictionary) if split == d.train_split else None)
    return sources, dictionary


def train_plan_options(config) -> PlanOptions:
    m, b, f = config.mixing, config.batching, config.filter
    return PlanOptions(
        seed=config.seed, sampler=m.sampler, method=m.method, temperature=m.temperature, weights=_weights(m.weights),
        virtual_size=_virtual(m.virtual_size), max_scale_up=m.max_scale_up, probabilities_from=m.probabilities_from,
        max_tokens=b.max_tokens, max_sentences=b.max_sentences, multiple=b.required_batch_size_multiple,
        window=b.window, max_source_positions=f.max_source_positions, max_target_positions=f.max_target_positions,
        on_too_long=f.on_too_long, balance_block=b.balance_block, compat=config.compat,
        fairseq_drop_last=b.fairseq_drop_last, pack_shape=_pack_shape(b.pack))


def _pack_shape(value: str) -> tuple:
    value = str(value or "").strip()
    if not value:
        return ()
    try:
        ls, lt = (int(x) for x in value.split("x"))
    except ValueError:
        raise ValueError(f"batching.pack must look like '256x256' (source x target), got {value!r}") from None
    return (ls, lt)


def build_train_iterator(config, rank: int = 0, world_size: int = 1, epoch: int = 1,
                         split: str = "batches") -> BatchIterator:
    """The training iterator of ``config`` for one rank (raises ValueError on invalid settings).

    ``split="batches"``: one whole batch per rank and step (torch DDP). ``split="rows"``: every rank takes its
    rows of each global batch (JAX global arrays; see ``loader.adapters.jax``)."""
    sources, dictionary = _sources(config, config.data.train_split, config.data.shards)
    opts = train_plan_options(config)
    planner = EpochPlanner(sources, opts)
    plan = shape_plan(config, planner)
    if plan is not None:
        planner = EpochPlanner(sources, dataclasses.replace(opts, shapes=tuple(plan.shapes)))
    return BatchIterator(planner, _collater(config, sources, dictionary), rank, world_size, epoch, name="train",
                         split=split)


MAX_HISTOGRAM_SAMPLES = 4_000_000


def mixture_lengths(planner: EpochPlanner) -> tuple[np.ndarray, np.ndarray, bool]:
    """(source, target) lengths of every shard of every direction, weighted by how often the mixture draws
    each direction (count / size in epoch 1). Corpora above 4M sentences are read with a stride."""
    setup = planner.setup(1)
    sources = planner.sources
    total = sum(len(c) for c in sources.components)
    stride = max(1, -(-total // MAX_HISTOGRAM_SAMPLES))
    lengths, weights = [], []
    for direction, count in zip(setup.directions, setup.counts):
        rate = count / max(direction.size, 1)
        for comp in (c for c in sources.components if c.key == direction.key):
            rows = np.arange(0, len(comp), stride)
            src = comp.src_lengths(rows)
            tgt = comp.tgt_lengths(rows) if comp.tgt is not None else src
            lengths.append(np.stack([src, tgt], axis=1))
            weights.append(np.full(len(rows), rate * stride))
    return np.concatenate(lengths), np.concatenate(weights), stride > 1


def shape_plan(config, planner: EpochPlanner) -> ShapePlan | None:
    """The static shape plan of ``config.batching`` (explicit ``shapes`` or ``num_shapes`` chosen from the
    mixture's length histogram), or None for dynamic batches."""
    b, f = config.batching, config.filter
    explicit = str(b.shapes).strip()
    if not explicit and b.num_shapes <= 0:
        return None
    lengths, weights, sampled = mixture_lengths(planner)
    limits = (f.max_source_positions, f.max_target_positions)
    fits = (lengths[:, 0] <= limits[0]) & (lengths[:, 1] <= limits[1])
    lengths, weights = lengths[fits], weights[fits]
    if explicit:
        widths = [[int(x) for x in item.split("x")] for item in explicit.split(",")]
        if any(len(w) == 1 for w in widths):
            widths = [[w[0], w[0]] for w in widths]
        return shapes_from_widths(widths, lengths, b.max_tokens, b.required_batch_size_multiple,
                                  b.max_sentences or None)
    plan = plan_shapes(lengths, b.num_shapes, b.max_tokens, b.required_batch_size_multiple, b.max_sentences or None,
                       weights=weights)
    if sampled:  # a strided histogram may miss the longest samples: the last shape takes everything allowed
        widths = plan.widths.copy()
        widths[-1] = np.maximum(widths[-1], limits)
        plan = shapes_from_widths(widths, lengths, b.max_tokens, b.required_batch_size_multiple,
                                  b.max_sentences or None)
    return plan


def build_valid_iterator(config, rank: int = 0, world_size: int = 1, split: str | None = None) -> BatchIterator:
    """Every sample of the validation split once, in a fixed order, nothing dropped; one epoch."""
    split = split or config.data.valid_split
    corpus = ShardedCorpus(config.data.path)
    wanted = _keys(corpus, config.data.train_split, config.data.directions, config.data.monolingual)
    available = set(corpus.directions(split)) | set(corpus.monolingual(split))
    keys = [k for k in wanted if k in available]
    if not keys:
        raise ValueError(f"{corpus.root}: no {split!r} data for the training directions {wanted}")
    sources, dictionary = _sources(config, split, "all", keys)
    b, f = config.batching, config.filter
    opts = PlanOptions(seed=config.seed, sampler="concat", max_tokens=b.max_tokens, max_sentences=b.max_sentences,
                       multiple=b.required_batch_size_multiple, window=0, max_source_positions=f.max_source_positions,
                       max_target_positions=f.max_target_positions, on_too_long=f.on_too_long_valid,
                       shuffle=False)
    planner = EpochPlanner(sources, opts)
    return BatchIterator(planner, _collater(config, sources, dictionary), rank, world_size, 1, name=split,
                         max_epochs=1)
