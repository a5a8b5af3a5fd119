"""Build iterators from an ml-collections config (see configs/nllb_like.py for every key)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import warnings

import ml_collections
import numpy as np

from babelfeed.checks import check_rank
from babelfeed.config.files import translation_section
from babelfeed.config.spec import Settings, directions, parse
from babelfeed.errors import (ConfigError, DataError, InconsistentIndexError, UpsamplingNotice, UsageTypeError,
                              user_frame)
from babelfeed.gather.collate import CollateOptions, Collater
from babelfeed.gather.transforms import parse_steps
from babelfeed.iterators.translation import BatchIterator
from babelfeed.lm.iterator import LMIterator
from babelfeed.plan.planner import EpochPlanner, PlanOptions
from babelfeed.plan.schedule import MixingSchedule
from babelfeed.plan.shapes import ShapePlan, plan_shapes, shapes_from_widths, shapes_ordered
from babelfeed.run.edits import snapshot
from babelfeed.sources.corpus import ShardedCorpus
from babelfeed.sources.sources import SourceSet, StreamSpec
from babelfeed.storage.remote.client import configure, opening_folders, resolve


def _keys(corpus: ShardedCorpus, split: str, directions, monolingual) -> list[str]:
    """The corpora a config selects: ``directions`` ("all" or names) and ``monolingual`` (names), as parsed."""
    keys = list(corpus.directions(split)) if directions == "all" else list(directions)
    keys += list(monolingual)
    if not keys:
        raise DataError(f"{corpus.root}: no directions selected for split {split!r}{_pair_hint(corpus, split)}")
    return keys


def _pair_hint(corpus: ShardedCorpus, split: str) -> str:
    """When ``split`` holds only monolingual corpora and two or more of them are the same size, they are most
    likely the sides of a direction that binarize read apart (fairseq's ``train.en``, ``train.de``): say so, with
    the flags that read them as one. Sizes are the raw line counts of binarize's report when it has them (drops
    differ between sides read apart), else the sentences written."""
    mono = corpus.monolingual(split)
    if corpus.directions(split) or len(mono) < 2:
        return ""
    sizes = {}
    try:
        with open(os.path.join(corpus.root, "binarize_report.json")) as f:
            sizes = {e["key"]: e["lines"] for e in json.load(f)["inputs"] if e.get("split") == split}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    by_size: dict[int, list[str]] = {}
    for lang in mono:
        by_size.setdefault(sizes.get(lang, corpus.num_sentences(split, lang)), []).append(lang)
    same = next((langs for n, langs in sorted(by_size.items()) if len(langs) > 1 and n), None)
    if same is None:
        return ""
    a, b = same[:2]
    return (f"; it holds only monolingual corpora ({', '.join(mono)}), and {', '.join(same)} are the same size: if "
            f"they are the sides of one direction (fairseq's naming: {split}.{a} and {split}.{b}), binarize them as "
            f"one with --source-lang {a} --target-lang {b} (or the other way round) and --overwrite")


def _collater(s: Settings, sources, dictionary) -> Collater:
    c = s.collate
    out = np.dtype(c.dtype)
    for ds in {id(ds): ds for comp in sources.components for ds in (comp.src, comp.tgt) if ds is not None}.values():
        stored = getattr(ds, "dtype", None)
        # a wider stored id would wrap into a small, valid-looking id that no check could tell from a real one
        if stored is not None and stored.itemsize > out.itemsize:
            raise ConfigError(f"collate.dtype={c.dtype!r} is narrower than the {stored.name} token ids of "
                              f"{ds.data_file}: a corrupt id could wrap into a valid one. Use int64")
    return Collater(sources, CollateOptions(pad=dictionary.pad(), eos=dictionary.eos(),
                                            left_pad_source=c.left_pad_source, left_pad_target=c.left_pad_target,
                                            pad_to_multiple=c.pad_to_multiple, dtype=c.dtype,
                                            vocab_size=len(dictionary)),
                    seed=s.seed, max_source_positions=s.filter.max_source_positions)


def _noise(s: Settings, dictionary) -> dict:
    """{task or "*": transform steps} from data.noise (every task) and data.noise_by_task ("task=spec|...")."""
    out = {"*": parse_steps(s.data.noise, dictionary)} if s.data.noise.strip() else {}
    out.update({task: parse_steps(spec, dictionary) for task, spec in s.data.noise_by_task.items()})
    return out


def _task_streams(s: Settings, corpus: ShardedCorpus, dictionary, split: str, keep=None) -> list[StreamSpec]:
    """The streams of a config's tasks section: one per (task, corpus), named ``task/corpus``."""
    d = s.data
    monolingual = set(corpus.monolingual(d.train_split))
    streams = []
    for name, t in s.tasks.items():
        text = t.text.strip()
        keys = _keys(corpus, d.train_split, directions(name, t.corpora), ())
        subword = ()
        if text:
            root = resolve(d.path)  # (a store's folder: its shadow, where the model was fetched with the indexes)
            model = os.path.join(root, t.spm_model) if t.spm_model else os.path.join(root, "spm.model")
            if not os.path.exists(model):
                raise FileNotFoundError(2, f"tasks.{name}: SentencePiece model not found (tasks.{name}.spm_model)",
                                        model)
            subword = (model, t.alpha, t.nbest)
        steps = tuple(parse_steps(t.transforms, dictionary)) if t.transforms.strip() else ()
        if t.kind == "denoise":
            pairs = [k for k in keys if "-" in k] if text else [k for k in keys if k not in monolingual]
            if pairs:
                raise ConfigError(f"tasks.{name} is a denoising task over monolingual data, but {pairs} are not "
                                  f"monolingual corpora of {corpus.root}")
        sp = d.source_prefix if t.source_prefix == "inherit" else t.source_prefix
        tp = d.target_prefix if t.target_prefix == "inherit" else t.target_prefix
        for key in keys:
            if keep is None or key in keep or text:
                if text and split != d.train_split and not _text_exists(d.path, text, split, key):
                    continue  # no validation text for this corpus
                streams.append(StreamSpec(f"{name}/{key}", key, name, sp, tp,
                                          steps if split == d.train_split else (), text, subword))
    return streams


def _text_exists(root, template: str, split: str, key: str) -> bool:
    src, _, tgt = key.partition("-")
    tgt = tgt or src
    return all(os.path.exists(os.path.join(root, template.format(split=split, key=key, src=src, tgt=tgt, lang=lang)))
               for lang in {src, tgt})


def _storage(section: Settings) -> None:
    """An object store's settings (``data.storage``; ``storage`` in an LM config) for the remote folders it
    names."""
    configure(dict(section.storage))


def _cache_dir(s: Settings) -> str:
    return s.data.cache_dir.strip() or os.path.join(resolve(s.data.path), ".babelfeed-cache")


def _sources(s: Settings, split: str, shards: str, keys=None) -> tuple[SourceSet, object]:
    d = s.data
    _storage(d)
    corpus = ShardedCorpus(d.path, check=False)  # the sides of what is used are checked as they are opened
    dictionary = corpus.dictionary()
    if s.tasks:
        streams = _task_streams(s, corpus, dictionary, split, keep=keys)
        if not streams:
            raise DataError(f"{corpus.root}: no task has {split!r} data")
        sources = SourceSet(corpus, dictionary, split, shards=shards, verify=d.verify,
                            length_cache_mb=d.length_cache_mb, streams=streams, seed=s.seed,
                            sampling=split == d.train_split, cache_dir=_cache_dir(s))
        return sources, dictionary
    keys = keys or _keys(corpus, split, d.directions, d.monolingual)
    sources = SourceSet(corpus, dictionary, split, keys, source_prefix=d.source_prefix,
                        target_prefix=d.target_prefix, prefix_overrides=d.prefix_overrides,
                        shards=shards, verify=d.verify, length_cache_mb=d.length_cache_mb,
                        noise=_noise(s, dictionary) if split == d.train_split else None)
    return sources, dictionary


def _named_weights(pairs: tuple, names: list[str], what: str) -> tuple:
    given = dict(pairs)
    missing = [n for n in names if n not in given]
    extra = [n for n in given if n not in names]
    if missing or extra:
        raise ConfigError(f"{what} must give a weight to every task {names}; missing {missing}, unknown {extra}")
    return tuple(given[n] for n in names)


def mixing_schedule(s: Settings, tasks: list[str]) -> MixingSchedule | None:
    """The per-task weight schedule: ``mixing.schedule`` if given, else the tasks section's constant weights,
    else None (``mixing.method`` decides)."""
    sched = s.mixing.schedule
    if sched.weights:
        return MixingSchedule(sched.boundaries, tuple(_named_weights(w, tasks, "mixing.schedule.weights")
                                                     for w in sched.weights), sched.mode)
    if s.tasks:
        if not sum(t.weight for t in s.tasks.values()) > 0:
            raise ConfigError(f"every task's weight is 0 ({', '.join(f'{s.where}tasks.{n}.weight' for n in s.tasks)}): "
                              f"give one task a weight above 0")
        return MixingSchedule.constant([t.weight for t in s.tasks.values()])
    return None


def train_plan_options(s: Settings, tasks: list[str] | None = None, world_size: int = 1,
                       split: str = "batches") -> PlanOptions:
    """The planner's options of a parsed config. ``tasks``: the task names (a SourceSet's ``tasks``), needed when
    the config has a schedule or tasks."""
    schedule = mixing_schedule(s, list(tasks or [])) if tasks is not None else None
    return PlanOptions.from_settings(
        s, schedule=schedule,
        batches_per_update=s.batching.accumulation * (world_size if split == "batches" else 1),
        spread_copies=s.batching.spread_copies and s.compat != "fairseq")


def is_lm_config(config) -> bool:
    """A language-model config (configs/lm_packing.py: ``data_path``, ``seq_len``, ...) rather than a translation
    config (configs/nllb_like.py: ``data``, ``mixing``, ``batching``, ...)."""
    return "data_path" in config


def check_config_object(config) -> None:
    """Refuse what is not a config (a config's name or path, None): ``load_config`` makes one."""
    if not isinstance(config, ml_collections.ConfigDict):
        hint = (f": babelfeed.load_config({config!r}) reads a config's file or a shipped config's name"
                if isinstance(config, (str, os.PathLike)) else "")
        raise UsageTypeError(f"a config is an ml_collections.ConfigDict (babelfeed.load_config gives one), got "
                             f"{type(config).__name__}{hint}")


@opening_folders
def build_iterator(config, rank: int = 0, world_size: int = 1, epoch: int = 1, split: str | None = None):
    """The training iterator of any config: :class:`~babelfeed.lm.iterator.LMIterator` for a language-model config, else
    :func:`build_train_iterator`. ``split=None`` takes the iterator's own default: ``"batches"`` for translation
    (a whole batch per rank), ``"rows"`` for LM (every global batch split into rows per rank).

    Both follow one protocol (``loader/iterators/protocol.py``), so the JAX, torch and grain adapters take either."""
    check_config_object(config)
    check_rank(rank, world_size)
    if is_lm_config(config):
        if split not in (None, "rows"):
            raise ConfigError(f"an LM config splits every global batch into rows per rank; split={split!r} does not "
                              f"apply (global_batch counts the samples of one step over all ranks)")
        if epoch != 1:
            raise ConfigError("an LM iterator is one pass over num_samples (epochs happen inside each dataset)")
        return build_lm_iterator(config, rank=rank, world_size=world_size)  # (checks the config)

    config, _ = translation_section(config)  # configs/demo.py keeps its pipeline under train
    return build_train_iterator(config, rank=rank, world_size=world_size, epoch=epoch, split=split or "batches")


@opening_folders
def train_sources(config, world_size: int = 1, split: str = "batches") -> tuple[SourceSet, object, PlanOptions]:
    """The training data and plan options of ``config`` (a config or its Settings), with every check a training
    run makes before planning (the ``plan`` command goes through here too, so it refuses what training refuses)."""
    return _train_sources(config if isinstance(config, Settings) else parse(config), world_size, split)


def _train_sources(s: Settings, world_size: int, split: str) -> tuple[SourceSet, object, PlanOptions]:
    sources, dictionary = _sources(s, s.data.train_split, s.data.shards)
    sources.check_limits(s.filter.max_source_positions, s.filter.max_target_positions)
    noised = sorted({c.key for c in sources.components if c.src_noise})
    if noised and s.batching.pack:
        raise ConfigError(f"batching.pack places sources as stored, without transforms, but {noised[:5]} have "
                          f"source noise (data.noise, data.noise_by_task or a denoise task): leave batching.pack "
                          f"empty for them")
    return sources, dictionary, train_plan_options(s, sources.tasks, world_size, split)


@opening_folders
def build_train_iterator(config, rank: int = 0, world_size: int = 1, epoch: int = 1,
                         split: str = "batches") -> BatchIterator:
    """The training iterator of ``config`` for one rank (raises ConfigError on invalid settings).

    ``split="batches"``: one whole batch per rank and step (torch DDP). ``split="rows"``: every rank takes its
    rows of each global batch (JAX global arrays; see ``babelfeed.adapters.jax``)."""
    check_config_object(config)
    check_rank(rank, world_size)
    config, where = translation_section(config)  # (configs/demo.py keeps its pipeline under train)
    s = parse(config, "translation", where)
    sources, dictionary, opts = _train_sources(s, world_size, split)
    planner = EpochPlanner(sources, opts)
    plan = shape_plan(s, planner, stats=False)
    if plan is not None:
        planner = EpochPlanner(sources, dataclasses.replace(opts, shapes=tuple(plan.shapes)))
    it = BatchIterator(planner, _collater(s, sources, dictionary), rank, world_size, epoch, name="train",
                       split=split)
    _say_upsampling(s, planner, rank, epoch)
    it.source_config = config  # (not in the state) trace builds iterators of other world sizes from it
    it.config_snapshot = snapshot(config)  # the state carries it: an edit says what changed, trace undoes edits
    it.rebuild = build_iterator  # (an edit, trace and the loaders build the run's iterators as this one was)
    return it


def _say_upsampling(s: Settings, planner: EpochPlanner, rank: int, epoch: int) -> None:
    """Name the directions the epoch serves more than ``mixing.warn_upsample`` times their data, once: by the
    process that builds rank 0's iterator (not its loader's worker processes, which build it again)."""
    if rank != 0 or not s.mixing.warn_upsample or multiprocessing.parent_process() is not None:
        return
    notice = planner.setup(epoch).upsampling_notice(s.mixing.warn_upsample, s.where, s.mixing.method,
                                                    s.mixing.max_upsample)
    if notice:
        warnings.warn(notice, UpsamplingNotice, stacklevel=user_frame())


MAX_HISTOGRAM_SAMPLES = 4_000_000


def mixture_lengths(planner: EpochPlanner) -> tuple[np.ndarray, np.ndarray, bool]:
    """(source, target) lengths of every shard of every direction, weighted by how often the mixture draws
    each direction (count / size in epoch 1). Corpora above 4M sentences are read with a stride."""
    setup = planner.setup(1)
    sources = planner.sources
    total = sum(len(c) for c in sources.components)
    stride = max(1, -(-total // MAX_HISTOGRAM_SAMPLES))
    lengths, weights = [], []
    counts = setup.expected if setup.expected is not None else setup.counts
    for direction, count in zip(setup.directions, counts):
        rate = count / max(direction.size, 1)
        for comp in (c for c in sources.components if c.key == direction.key):
            rows = np.arange(0, len(comp), stride)
            src = comp.src_lengths(rows)
            tgt = comp.tgt_lengths(rows) if comp.tgt is not None else src
            for ds, got, plen in ((comp.src, src, len(comp.src_prefix)), (comp.tgt, tgt, len(comp.tgt_prefix))):
                if ds is not None and len(got) and int(got.min()) < plen:  # a negative size (data.verify='quick')
                    i = int(np.argmin(got))
                    raise InconsistentIndexError(ds.index_file, f"record {int(rows[i])} has a negative size "
                                                                f"({int(got[i]) - plen})")
            lengths.append(np.stack([src, tgt], axis=1))
            weights.append(np.full(len(rows), rate * stride))
    return np.concatenate(lengths), np.concatenate(weights), stride > 1


def shape_plan(config, planner: EpochPlanner, stats: bool = True) -> ShapePlan | None:
    """The static shape plan of ``config.batching`` (explicit ``shapes`` or ``num_shapes`` chosen from the
    mixture's length histogram), or None for dynamic batches; ``config``: a config or its Settings. ``stats=False``
    (the iterator, which needs only the shapes): explicit shapes of which one holds the filter's limits are taken as
    they are, without reading the mixture's lengths (about 1 s for 20M samples) for a report nobody reads and a
    check that cannot fail."""
    s = config if isinstance(config, Settings) else parse(config)
    b, f = s.batching, s.filter
    explicit = bool(b.shapes)
    if not explicit and b.num_shapes <= 0:
        return None
    limits = (f.max_source_positions, f.max_target_positions)
    if explicit:
        widths = [list(w) for w in b.shapes]
        if not stats and any(w[0] >= limits[0] and w[1] >= limits[1] for w in widths):
            return shapes_ordered(widths, b.max_tokens, b.required_batch_size_multiple, b.max_sentences or None)
    lengths, weights, sampled = mixture_lengths(planner)
    fits = (lengths[:, 0] <= limits[0]) & (lengths[:, 1] <= limits[1])
    lengths, weights = lengths[fits], weights[fits]
    o = planner.opts  # each window ends every shape with a partial batch (masked rows): the plan prices them
    windows = max(1, -(-int(round(weights.sum())) // o.window)) if o.window else 1
    if explicit:
        return shapes_from_widths(widths, lengths, b.max_tokens, b.required_batch_size_multiple,
                                  b.max_sentences or None, weights=weights, windows=windows)
    if sampled:  # a strided histogram may miss the longest samples: some shape must hold every allowed one
        lengths = np.concatenate([lengths, [limits]])
        weights = np.concatenate([weights, [0.0]])
    return plan_shapes(lengths, b.num_shapes, b.max_tokens, b.required_batch_size_multiple, b.max_sentences or None,
                       weights=weights, windows=windows)


@opening_folders
def build_valid_iterator(config, rank: int = 0, world_size: int = 1, split: str | None = None) -> BatchIterator:
    """Every sample of the validation split once, in a fixed order, nothing dropped; one epoch."""
    check_config_object(config)
    check_rank(rank, world_size)
    config, where = translation_section(config)  # (configs/demo.py keeps its pipeline under train)
    s = parse(config, "translation", where)
    split = split or s.data.valid_split
    _storage(s.data)
    corpus = ShardedCorpus(s.data.path, check=False)
    available = set(corpus.directions(split)) | set(corpus.monolingual(split))
    if s.tasks:  # every task corpus with validation data (raw-text ones: where the template's file exists)
        wanted, keys = "the tasks' corpora", sorted(available)
    else:
        wanted = _keys(corpus, s.data.train_split, s.data.directions, s.data.monolingual)
        keys = [k for k in wanted if k in available]
    if not keys and not s.tasks:
        raise DataError(f"{corpus.root}: no {split!r} data for the training directions {wanted}")
    sources, dictionary = _sources(s, split, "all", keys)
    opts = PlanOptions.from_settings(s, sampler="concat", method="temperature", temperature=1.0, weights=(),
                                     window=0, on_too_long=s.filter.on_too_long_valid, shuffle=False, pack_shape=(),
                                     spread_copies=False, fairseq_drop_last=False, compat="none")
    planner = EpochPlanner(sources, opts)
    return BatchIterator(planner, _collater(s, sources, dictionary), rank, world_size, 1, name=split,
                         max_epochs=1)


def _lm_settings(config) -> Settings:
    s = parse(config, "lm")
    _storage(s)
    return s


@opening_folders
def build_lm_iterator(config, rank: int = 0, world_size: int = 1) -> LMIterator:
    """The LM iterator of a config like configs/lm_packing.py for one rank, its config checked first (every key
    known: a typo is refused with a suggestion; every value of its type and range; its storage section)."""
    check_rank(rank, world_size)
    s = _lm_settings(config)
    it = LMIterator.build(s.data_path, seq_len=s.seq_len, global_batch=s.global_batch, num_samples=s.num_samples,
                          split=s.split, split_name=s.split_name, mode=s.mode, seed=s.seed,
                          cache_dir=s.cache_dir or None, rank=rank, world_size=world_size, verify=s.verify,
                          vocab_size=s.vocab_size, blend=s.blend, max_upsample=s.max_upsample)
    it.config_snapshot, it.source_config = snapshot(config), config
    it.rebuild = build_iterator  # (an edit, trace and the loaders build the run's iterators as this one was)
    return it
