"""Build iterators from an ml-collections config (see configs/nllb_like.py for every key)."""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import numpy as np

from babelfeed.checks import check_rank
from babelfeed.config.files import TASK_KINDS, task, translation_section
from babelfeed.config.spec import check_known_keys, check_translation_config, validate
from babelfeed.errors import ConfigError, DataError, UsageTypeError
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
from babelfeed.storage.remote.client import configure, resolve


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
                raise ConfigError(f"mixing.weights entry {item!r} must be 'direction:weight'")
            pairs.append((key, float(w)))
        return tuple(pairs)
    return tuple((k, float(v)) for k, v in dict(value).items())


def _overrides(value: str) -> dict:
    out: dict = {}
    for item in [v for v in str(value or "").split(";") if v.strip()]:
        head, _, tokens = item.partition("=")
        key, _, side = head.strip().rpartition(":")
        if side not in ("source", "target") or not key:
            raise ConfigError(f"data.prefix_overrides entry {item!r} must be 'direction:source=tokens' or ':target='")
        out.setdefault(key, {})[side] = tokens.strip()
    return out


def _virtual(value):
    value = str(value)
    if value in ("fairseq", "sum"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"mixing.virtual_size must be 'fairseq', 'sum' or an integer, got {value!r}") from None


def _keys(corpus: ShardedCorpus, split: str, directions: str, monolingual: str) -> list[str]:
    keys = corpus.directions(split) if str(directions).strip() == "all" else _list(directions)
    keys += _list(monolingual)
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


def _collater(config, sources, dictionary) -> Collater:
    c = config.collate
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
                    seed=config.seed, max_source_positions=config.filter.max_source_positions)


def _noise(config, dictionary) -> dict:
    """{task or "*": transform steps} from data.noise (every task) and data.noise_by_task ("task=spec|...")."""
    out = {}
    if str(config.data.noise).strip():
        out["*"] = parse_steps(config.data.noise, dictionary)
    for item in [p for p in str(config.data.noise_by_task or "").split("|") if p.strip()]:
        task, sep, spec = item.partition("=")
        if not sep:
            raise ConfigError(f"data.noise_by_task entry {item!r} must look like 'task=transform:params;...'")
        out[task.strip()] = parse_steps(spec, dictionary)
    return out


def _tasks(config) -> dict:
    """The tasks section, each entry with task()'s defaults for the keys it leaves out (its keys were checked)."""
    if "tasks" not in config or not config.tasks:
        return {}
    return {name: task(**dict(entry)) for name, entry in config.tasks.items()}


def _task_streams(config, corpus: ShardedCorpus, dictionary, split: str, keep=None) -> list[StreamSpec]:
    """The streams of a config's tasks section: one per (task, corpus), named ``task/corpus``."""
    d = config.data
    if str(d.noise).strip() or str(d.noise_by_task).strip() or str(d.prefix_overrides).strip():
        raise ConfigError("with a tasks section, give transforms and prefixes per task (tasks.NAME.transforms, "
                          ".source_prefix), not data.noise / data.noise_by_task / data.prefix_overrides")
    monolingual = set(corpus.monolingual(d.train_split))
    streams = []
    for name, t in _tasks(config).items():
        if "/" in name:
            raise ConfigError(f"task name {name!r} must not contain '/'")
        if t.kind not in TASK_KINDS:
            raise ConfigError(f"tasks.{name}.kind must be one of {TASK_KINDS}, got {t.kind!r}")
        text = str(t.get("text", "")).strip()
        if text and str(t.corpora).strip() == "all":
            raise ConfigError(f"tasks.{name} reads raw text: name its corpora (directions or languages), not 'all'")
        keys = _keys(corpus, d.train_split, t.corpora, "") if str(t.corpora).strip() else []
        if not keys:
            raise ConfigError(f"tasks.{name}.corpora names no corpus")
        subword = ()
        if text:
            root = resolve(d.path)  # (a store's folder: its shadow, where the model was fetched with the indexes)
            model = os.path.join(root, t.spm_model) if t.spm_model else os.path.join(root, "spm.model")
            if not os.path.exists(model):
                raise FileNotFoundError(2, f"tasks.{name}: SentencePiece model not found (tasks.{name}.spm_model)",
                                        model)
            if not 0 < t.alpha <= 1 or not 2 <= t.nbest <= 1024:
                raise ConfigError(f"tasks.{name}: alpha must be in (0, 1] and nbest in [2, 1024], got "
                                  f"{t.alpha}, {t.nbest}")
            if str(config.batching.pack).strip():
                raise ConfigError(f"tasks.{name} reads raw text, whose lengths are known only when sampled: it "
                                  f"cannot be packed (batching.pack)")
            subword = (model, float(t.alpha), int(t.nbest))
        steps = tuple(parse_steps(t.transforms, dictionary)) if str(t.transforms).strip() else ()
        if t.kind == "denoise":
            if not steps:
                raise ConfigError(f"tasks.{name} is a denoising task but has no transforms")
            pairs = [k for k in keys if "-" in k] if text else [k for k in keys if k not in monolingual]
            if pairs:
                raise ConfigError(f"tasks.{name} is a denoising task over monolingual data, but {pairs} are not "
                                  f"monolingual corpora of {corpus.root}")
        if not t.weight >= 0:
            raise ConfigError(f"tasks.{name}.weight must be >= 0, got {t.weight}")
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


def _storage(section) -> None:
    """An object store's settings (``data.storage``; ``storage`` in an LM config) for the remote folders it
    names."""
    if "storage" in section:
        configure(section.storage.to_dict() if hasattr(section.storage, "to_dict") else section.storage)


def _cache_dir(config) -> str:
    return str(config.data.cache_dir).strip() or os.path.join(resolve(config.data.path), ".babelfeed-cache")


def _sources(config, split: str, shards: str, keys=None) -> tuple[SourceSet, object]:
    d = config.data
    _storage(d)
    corpus = ShardedCorpus(d.path, check=False)  # the sides of what is used are checked as they are opened
    dictionary = corpus.dictionary()
    if _tasks(config):
        streams = _task_streams(config, corpus, dictionary, split, keep=keys)
        if not streams:
            raise DataError(f"{corpus.root}: no task has {split!r} data")
        sources = SourceSet(corpus, dictionary, split, shards=shards, verify=d.verify,
                            length_cache_mb=d.length_cache_mb, streams=streams, seed=config.seed,
                            sampling=split == d.train_split, cache_dir=_cache_dir(config))
        return sources, dictionary
    keys = keys or _keys(corpus, split, d.directions, d.monolingual)
    sources = SourceSet(corpus, dictionary, split, keys, source_prefix=d.source_prefix,
                        target_prefix=d.target_prefix, prefix_overrides=_overrides(d.prefix_overrides),
                        shards=shards, verify=d.verify, length_cache_mb=d.length_cache_mb,
                        noise=_noise(config, dictionary) if split == d.train_split else None)
    return sources, dictionary


def _named_weights(text: str, names: list[str], what: str) -> tuple:
    given = dict(_weights(text))
    missing = [n for n in names if n not in given]
    extra = [n for n in given if n not in names]
    if missing or extra:
        raise ConfigError(f"{what} must give a weight to every task {names}; missing {missing}, unknown {extra}")
    return tuple(given[n] for n in names)


def mixing_schedule(config, tasks: list[str]) -> MixingSchedule | None:
    """The per-task weight schedule: ``mixing.schedule`` if given, else the tasks section's constant weights,
    else None (``mixing.method`` decides)."""
    sched = config.mixing.schedule
    lists = [p for p in str(sched.weights).split("|") if p.strip()]
    if lists:
        bounds = [int(b) for b in _list(sched.boundaries)]
        return MixingSchedule(tuple(bounds), tuple(_named_weights(w, tasks, "mixing.schedule.weights")
                                                   for w in lists), sched.mode)
    if str(sched.boundaries).strip():
        raise ConfigError("mixing.schedule.boundaries is set but mixing.schedule.weights is empty")
    if _tasks(config):
        return MixingSchedule.constant([float(t.weight) for t in _tasks(config).values()])
    return None


def _sampler(config, schedule: MixingSchedule | None) -> str:
    sampler = config.mixing.sampler
    if sampler == "auto":
        return "stream" if schedule is not None and schedule.boundaries else "stratified"
    return sampler


def train_plan_options(config, tasks: list[str] | None = None, world_size: int = 1,
                       split: str = "batches") -> PlanOptions:
    """``tasks``: the task names (a SourceSet's ``tasks``), needed when the config has a schedule or tasks."""
    m, b, f = config.mixing, config.batching, config.filter
    schedule = mixing_schedule(config, list(tasks or [])) if tasks is not None else None
    if schedule is not None and _tasks(config) and m.method != "temperature":
        raise ConfigError(f"with a tasks section, task weights (or mixing.schedule) set the mix and "
                          f"mixing.temperature splits a task among its corpora; mixing.method must stay "
                          f"'temperature', got {m.method!r}")
    if b.accumulation < 1:
        raise ConfigError(f"batching.accumulation must be >= 1, got {b.accumulation}")
    return PlanOptions(
        seed=config.seed, sampler=_sampler(config, schedule), method=m.method, schedule=schedule,
        batches_per_update=b.accumulation * (world_size if split == "batches" else 1), temperature=m.temperature, weights=_weights(m.weights),
        virtual_size=_virtual(m.virtual_size), max_scale_up=m.max_scale_up, probabilities_from=m.probabilities_from,
        max_tokens=b.max_tokens, max_sentences=b.max_sentences, multiple=b.required_batch_size_multiple,
        window=b.window, max_source_positions=f.max_source_positions, max_target_positions=f.max_target_positions,
        on_too_long=f.on_too_long, balance_block=b.balance_block, compat=config.compat,
        fairseq_drop_last=b.fairseq_drop_last, pack_shape=_pack_shape(b.pack),
        spread_copies=b.get("spread_copies", True) and config.compat != "fairseq")


def _pack_shape(value: str) -> tuple:
    value = str(value or "").strip()
    if not value:
        return ()
    try:
        ls, lt = (int(x) for x in value.split("x"))
    except ValueError:
        raise ConfigError(f"batching.pack must look like '256x256' (source x target), got {value!r}") from None
    return (ls, lt)


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


def train_sources(config, world_size: int = 1, split: str = "batches") -> tuple[SourceSet, object, PlanOptions]:
    """The training data and plan options of ``config``, with every check a training run makes before planning
    (the ``plan`` command goes through here too, so it refuses what training refuses)."""
    check_known_keys(config)
    check_translation_config(config)
    sources, dictionary = _sources(config, config.data.train_split, config.data.shards)
    sources.check_limits(config.filter.max_source_positions, config.filter.max_target_positions)
    noised = sorted({c.key for c in sources.components if c.src_noise})
    if noised and str(config.batching.pack).strip():
        raise ConfigError(f"batching.pack places sources as stored, without transforms, but {noised[:5]} have "
                          f"source noise (data.noise, data.noise_by_task or a denoise task): leave batching.pack "
                          f"empty for them")
    return sources, dictionary, train_plan_options(config, sources.tasks, world_size, split)


def build_train_iterator(config, rank: int = 0, world_size: int = 1, epoch: int = 1,
                         split: str = "batches") -> BatchIterator:
    """The training iterator of ``config`` for one rank (raises ValueError on invalid settings).

    ``split="batches"``: one whole batch per rank and step (torch DDP). ``split="rows"``: every rank takes its
    rows of each global batch (JAX global arrays; see ``babelfeed.adapters.jax``)."""
    check_config_object(config)
    check_rank(rank, world_size)
    sources, dictionary, opts = train_sources(config, world_size, split)
    planner = EpochPlanner(sources, opts)
    plan = shape_plan(config, planner, stats=False)
    if plan is not None:
        planner = EpochPlanner(sources, dataclasses.replace(opts, shapes=tuple(plan.shapes)))
    it = BatchIterator(planner, _collater(config, sources, dictionary), rank, world_size, epoch, name="train",
                       split=split)
    it.source_config = config  # (not in the state) trace builds iterators of other world sizes from it
    it.config_snapshot = snapshot(config)  # the state carries it: an edit says what changed, trace undoes edits
    it.rebuild = build_iterator  # (an edit, trace and the loaders build the run's iterators as this one was)
    return it


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
            lengths.append(np.stack([src, tgt], axis=1))
            weights.append(np.full(len(rows), rate * stride))
    return np.concatenate(lengths), np.concatenate(weights), stride > 1


def shape_plan(config, planner: EpochPlanner, stats: bool = True) -> ShapePlan | None:
    """The static shape plan of ``config.batching`` (explicit ``shapes`` or ``num_shapes`` chosen from the
    mixture's length histogram), or None for dynamic batches. ``stats=False`` (the iterator, which needs only
    the shapes): explicit shapes of which one holds the filter's limits are taken as they are, without reading
    the mixture's lengths (about 1 s for 20M samples) for a report nobody reads and a check that cannot fail."""
    b, f = config.batching, config.filter
    explicit = str(b.shapes).strip()
    if not explicit and b.num_shapes <= 0:
        return None
    limits = (f.max_source_positions, f.max_target_positions)
    if explicit:
        widths = [[int(x) for x in item.split("x")] for item in explicit.split(",")]
        if any(len(w) == 1 for w in widths):
            widths = [[w[0], w[0]] for w in widths]
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


def build_valid_iterator(config, rank: int = 0, world_size: int = 1, split: str | None = None) -> BatchIterator:
    """Every sample of the validation split once, in a fixed order, nothing dropped; one epoch."""
    check_config_object(config)
    check_rank(rank, world_size)
    check_known_keys(config)
    check_translation_config(config)
    split = split or config.data.valid_split
    _storage(config.data)
    corpus = ShardedCorpus(config.data.path, check=False)
    available = set(corpus.directions(split)) | set(corpus.monolingual(split))
    if _tasks(config):  # every task corpus with validation data (raw-text ones: where the template's file exists)
        wanted, keys = "the tasks' corpora", sorted(available)
    else:
        wanted = _keys(corpus, config.data.train_split, config.data.directions, config.data.monolingual)
        keys = [k for k in wanted if k in available]
    if not keys and not _tasks(config):
        raise DataError(f"{corpus.root}: no {split!r} data for the training directions {wanted}")
    sources, dictionary = _sources(config, split, "all", keys)
    b, f = config.batching, config.filter
    opts = PlanOptions(seed=config.seed, sampler="concat", max_tokens=b.max_tokens, max_sentences=b.max_sentences,
                       multiple=b.required_batch_size_multiple, window=0, max_source_positions=f.max_source_positions,
                       max_target_positions=f.max_target_positions, on_too_long=f.on_too_long_valid,
                       shuffle=False)
    planner = EpochPlanner(sources, opts)
    return BatchIterator(planner, _collater(config, sources, dictionary), rank, world_size, 1, name=split,
                         max_epochs=1)




def _check_lm_config(config) -> None:
    check_known_keys(config, kind="lm")
    validate(config, "lm")


def _check_lm_config_and_storage(config) -> None:
    _check_lm_config(config)
    _storage(config)


def build_lm_iterator(config, rank: int = 0, world_size: int = 1) -> LMIterator:
    """The LM iterator of a config like configs/lm_packing.py for one rank, its config checked first (every key
    known: a typo is refused with a suggestion; every value of its type and range; its storage section)."""
    check_rank(rank, world_size)
    _check_lm_config_and_storage(config)
    it = LMIterator.build(config.data_path, seq_len=config.seq_len, global_batch=config.global_batch,
                          num_samples=config.num_samples, split=config.split, split_name=config.split_name,
                          mode=config.mode, seed=config.seed, cache_dir=config.cache_dir or None, rank=rank,
                          world_size=world_size, verify=config.get("verify", "full"),
                          vocab_size=config.get("vocab_size", 0))
    it.config_snapshot, it.source_config = snapshot(config), config
    it.rebuild = build_iterator  # (an edit, trace and the loaders build the run's iterators as this one was)
    return it
