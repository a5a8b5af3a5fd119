"""Corpus components: a direction (or monolingual language) in one shard, with the prefix tokens of each side.

A *component* is what a sample reference points into: ``(component, row)``. Its lengths include the prefix
tokens (NLLB: ``__src__`` before the source, ``__tgt__`` before the target), as fairseq's PrependTokenDataset
counts them, so filtering and budgets see the lengths the model sees.

Prefixes are strings of space-separated tokens with placeholders ``{src}``, ``{tgt}`` (and ``{lang}`` for
monolingual data): the default source prefix ``"__{src}__"`` gives ``__eng_Latn__``; a back-translation
direction can use ``"__bt__ __{src}__"``. Every token must exist in the dictionary.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.errors import ConfigError, ConfigTypeError, DataChangedError, DataError
from babelfeed.sources.cache import IndexCache
from babelfeed.sources.corpus import ShardedCorpus
from babelfeed.sources.dictionary import Dictionary
from babelfeed.sources.rows import LengthCache, RowTable, check_records, distinct_datasets
from babelfeed.sources.subword import SampledText, SubwordSampler
from babelfeed.storage import stamps
from babelfeed.storage.indexed import IndexedDataset
from babelfeed.storage.remote.client import is_shadow, remote_names
from babelfeed.storage.spaces import TokenSpaces


def resolve_prefix(template: str, dictionary: Dictionary, key: str, **langs) -> np.ndarray:
    """Token ids of a prefix template such as ``"__bt__ __{src}__"`` (empty template: no prefix)."""
    if not isinstance(template, str):
        raise ConfigTypeError(f"the prefix of {key} must be a string of tokens (a template such as '__bt__ "
                              f"__{{src}}__'), got {template!r}")
    try:
        text = template.format(**langs)
    except KeyError as e:
        raise ConfigError(f"prefix {template!r} for {key} uses an unknown placeholder {e}") from None
    except (ValueError, IndexError) as e:  # a brace not closed, '{0}' (str.format's words, then what to do)
        raise ConfigError(f"prefix {template!r} for {key} is not a template: {e}; placeholders are {{src}} and "
                          f"{{tgt}} (write a literal brace twice: '{{{{')") from None
    ids = []
    for tok in text.split():
        if tok not in dictionary:
            raise ConfigError(f"prefix token {tok!r} for {key} is not in the dictionary ({len(dictionary)} symbols)")
        ids.append(dictionary.index(tok))
    return np.asarray(ids, dtype=np.int64)


def data_digest(ds) -> str | None:
    """What identifies a dataset's data whatever its path: an indexed dataset's ``content_digest`` (remembered
    by file identity), else a hash of its planning lengths (raw text: the text and the segmentation model)."""
    if ds is None:
        return None
    digest = getattr(ds, "content_digest", None)
    if digest is None:
        digest = hashlib.blake2b(np.ascontiguousarray(ds.sizes, dtype=np.int32).data, digest_size=16).hexdigest()
    return digest


def _shortest(ds) -> int:
    """A dataset's shortest record: remembered with an index's stamp, else the minimum of its sizes."""
    value = getattr(ds, "shortest", None)
    return int(np.asarray(ds.sizes).min()) if value is None else int(value)


@dataclass
class Component:
    """One shard of one direction: ``src``/``tgt`` datasets (``tgt`` is ``src`` for monolingual data)."""

    key: str
    shard: int
    src: IndexedDataset
    tgt: IndexedDataset | None
    src_prefix: np.ndarray
    tgt_prefix: np.ndarray
    cache: LengthCache | None = None
    _lengths: dict = field(default_factory=dict)
    src_noise: tuple = ()  # transforms applied to the source at collate time: ((name, params), ...)
    # where each side's tokens live (set by SourceSet): (token space id, the file's first token there); -1 for
    # raw text, which is segmented at gather time
    src_at: tuple = (-1, 0)
    tgt_at: tuple = (-1, 0)

    def __len__(self) -> int:
        return len(self.src)

    @property
    def raw(self) -> bool:
        """Raw text (segmented when gathered) rather than a binarized dataset."""
        return self.src_at[0] < 0

    def _sizes(self, side: str) -> np.ndarray:
        if side not in self._lengths:
            ds = self.src if side == "src" else self.tgt
            copied = self.cache.copy(ds.sizes) if self.cache is not None else None
            self._lengths[side] = ds.sizes if copied is None else copied
            self._lengths["copies"] = self._lengths.get("copies", 0) + (copied is not None)
        return self._lengths[side]

    def _paired_sizes(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Both sides' lengths; where both are in-memory copies of one dtype, interleaved in one [n, 2] array
        (the same bytes), so that looking a row up reads one cache line, not two."""
        if self.tgt is not None and self.cache is not None and not {"src", "tgt"} & set(self._lengths):
            pair = self.cache.copy_pair(self.src.sizes, self.tgt.sizes)  # both copies written interleaved at once
            if pair is not None:
                self._lengths.update(src=pair[:, 0], tgt=pair[:, 1], copies=-1)
        src = self._sizes("src")
        if self.tgt is None:
            return src, None
        tgt = self._sizes("tgt")
        if self._lengths["copies"] == 2 and src.dtype == tgt.dtype and len(src) == len(tgt):
            pair = np.stack([src, tgt], axis=1)
            src = self._lengths["src"] = pair[:, 0]
            tgt = self._lengths["tgt"] = pair[:, 1]
            self._lengths["copies"] = -1  # paired
        return src, tgt

    def src_lengths(self, rows) -> np.ndarray:
        return self._sizes("src")[rows].astype(np.int64) + len(self.src_prefix)

    def tgt_lengths(self, rows) -> np.ndarray:
        return self._sizes("tgt")[rows].astype(np.int64) + len(self.tgt_prefix)

    def lengths(self, rows, pairs: np.ndarray) -> None:
        """Write ``rows``' lengths (prefixes included) into int32 ``pairs[:, -2:]`` (source, target): the last two
        columns of the planner's sample table, or a window's [n, 2] lengths."""
        if "src" in self._lengths or self._lengths.get("read_in_place"):
            src, tgt = self._paired_sizes()
        else:  # the first lookup (the first window drawing from this corpus) reads the index in place: copying
            # every length of the corpus first held the first batch back (~0.3 s per 20M rows); later ones copy
            self._lengths["read_in_place"] = True
            src, tgt = self.src.sizes, (self.tgt.sizes if self.tgt is not None else None)
        tgt_plen = len(self.tgt_prefix) if tgt is not None else 0
        if plan_kernel.take_lengths(src, tgt, rows, len(self.src_prefix), tgt_plen, pairs):
            return  # the compiled kernel: both sides in one pass, random reads prefetched
        pairs[:, -2] = src[rows]
        pairs[:, -2] += len(self.src_prefix)
        if tgt is not None:
            pairs[:, -1] = tgt[rows]
            pairs[:, -1] += len(self.tgt_prefix)

    def addresses(self, rows, side: str) -> np.ndarray:
        """Token-space addresses of ``rows``' tokens on one side (prefix not included; 0 for raw text). A record
        that lies outside its ``.bin`` raises (an index corrupted where the checks at open did not look)."""
        ds, at = (self.src, self.src_at) if side == "src" else (self.tgt, self.tgt_at)
        if ds is None or at[0] < 0:
            return np.zeros(len(rows), np.int64)
        ptr = np.asarray(ds.pointers[rows], dtype=np.int64)
        check_records(ds, rows, ds.sizes[rows], ptr)
        ptr //= ds.dtype.itemsize
        ptr += at[1]
        return ptr


@dataclass
class Direction:
    """A direction (or monolingual key) for one epoch: the shards it reads, concatenated into one row space."""

    key: str
    index: int
    components: list[Component]
    component_ids: list[int]  # global ids of the components, for the gather
    total_size: int  # sentences over every shard, for probabilities
    shard_sizes: tuple = ()  # sentences of each of its shards, in cycling order (fairseq's estimate in epoch 1)
    offsets: np.ndarray = field(init=False)

    def __post_init__(self):
        self.offsets = np.concatenate([[0], np.cumsum([len(c) for c in self.components])]).astype(np.int64)

    @property
    def size(self) -> int:
        return int(self.offsets[-1])

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Direction rows -> (global component id, row within that component)."""
        if len(self.components) == 1:
            return np.full(len(rows), self.component_ids[0], dtype=np.int64), rows
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        return np.asarray(self.component_ids, dtype=np.int64)[which], rows - self.offsets[which]


def locate_many(directions: list[Direction], dirs: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(global component id, row within it) of samples (direction index, direction row), for every direction at
    once: the directions' row spaces laid end to end, one binary search over every component's start."""
    if all(len(d.components) == 1 for d in directions):
        single = np.array([d.component_ids[0] for d in directions], dtype=np.int64)
        return single[dirs], np.asarray(rows, dtype=np.int64)
    sizes = np.array([d.size for d in directions], dtype=np.int64)
    dir_base = np.cumsum(sizes) - sizes
    starts = np.concatenate([dir_base[i] + d.offsets[:-1] for i, d in enumerate(directions)])
    ids = np.concatenate([np.asarray(d.component_ids, dtype=np.int64) for d in directions])
    flat = dir_base[dirs] + rows
    which = np.searchsorted(starts, flat, side="right") - 1
    return ids[which], flat - starts[which]


@dataclass(frozen=True)
class StreamSpec:
    """One stream of samples: a corpus key (a direction or a monolingual language) read for one task.

    Two streams may read the same key (two autoencoder tasks over one monolingual corpus): the files are
    opened once and shared, never copied. ``name`` is what reports and weights call it."""

    name: str
    key: str
    task: str
    source_prefix: str = "__{src}__"
    target_prefix: str = "__{tgt}__"
    noise: tuple = ()  # source transforms ((name, params), ...)
    text: str = ""  # raw text instead of a data_bin: a path template with {split} {key} {src} {tgt} {lang}
    subword: tuple = ()  # raw text: (SentencePiece model path, alpha, nbest), sampled at gather time


class SourceSet:
    """Every component of a split, opened lazily, and the per-epoch choice of shards.

    ``shards="cycle"``: epoch e (1-based) reads shard ``(e - 1) % k`` of a direction with k shards (Open-NLLB);
    ``shards="all"``: every shard every epoch.

    Either ``keys`` (one stream per key, named after it, its own task) with ``source_prefix``/``target_prefix``,
    ``prefix_overrides`` and ``noise`` per key, or ``streams`` (``StreamSpec``s, from a config's tasks section).
    """

    def __init__(self, corpus: ShardedCorpus, dictionary: Dictionary, split: str, keys: list[str] | None = None,
                 source_prefix: str = "__{src}__", target_prefix: str = "__{tgt}__", prefix_overrides=None,
                 shards: str = "cycle", verify: str = "full", with_target: bool = True,
                 length_cache_mb: int = 512, noise: dict | None = None, streams: list[StreamSpec] | None = None,
                 seed: int = 1, sampling: bool = True, cache_dir: str | None = None):
        if shards not in ("cycle", "all"):
            raise ConfigError(f"shards must be 'cycle' or 'all', got {shards!r}")
        self.corpus, self.dictionary, self.split, self.shards = corpus, dictionary, split, shards
        self.with_target = with_target
        if streams is None:
            streams = _streams_of_keys(list(keys or []), source_prefix, target_prefix, prefix_overrides, noise)
        names = [s.name for s in streams]
        if len(set(names)) != len(names):
            raise ConfigError(f"stream names must be unique, got {names}")
        self.streams = list(streams)
        self.keys = names  # stream names (= corpus keys unless tasks name them)
        self.tasks = list(dict.fromkeys(s.task for s in streams))
        task_index = {t: i for i, t in enumerate(self.tasks)}
        self.task_of = np.array([task_index[s.task] for s in streams], dtype=np.int64)
        self.components: list[Component] = []
        self._by_key: dict[str, list[int]] = {}
        cache = LengthCache(length_cache_mb * 2**20) if length_cache_mb > 0 else None
        self.length_cache = cache
        self._rows: RowTable | None | bool = False  # built on first use (False: not yet decided)
        opened: dict = {}  # (key, lang, shard) -> IndexedDataset, shared by the streams that read it
        lengths: dict = {}  # id(dataset) -> the lengths dict its components share

        def open_(key, lang, shard):
            if (key, lang, shard) not in opened:
                ds = corpus.open(split, key, lang, shard, verify=verify)
                # every record a sentence: it ends with </s> (a zeroed tail after a crash does not)
                ds.check_ends_with(dictionary.eos() + ds.token_shift)
                opened[(key, lang, shard)] = ds
            return opened[(key, lang, shard)]

        def open_text(spec, lang, langs):
            fields = {**langs, "split": split, "key": spec.key, "lang": lang}
            try:
                path = os.path.join(corpus.root, spec.text.format(**fields))
            except KeyError as e:
                raise ConfigError(f"raw text template {spec.text!r} of stream {spec.name!r} uses an unknown "
                                  f"placeholder {e} (known: {sorted(fields)})") from None
            except (ValueError, IndexError, AttributeError) as e:
                raise ConfigError(f"raw text template {spec.text!r} of stream {spec.name!r} is not a template: "
                                  f"{e} (placeholders: {sorted(fields)})") from None
            model, alpha, nbest = spec.subword
            if ("text", path, spec.subword) not in opened:
                if not os.path.exists(path):
                    raise FileNotFoundError(2, f"raw text of stream {spec.name!r} ({spec.text!r}) not found", path)
                sampler = SubwordSampler(model, dictionary, alpha=alpha, nbest=nbest, seed=seed)
                cache = IndexCache(cache_dir) if cache_dir else None
                opened[("text", path, spec.subword)] = SampledText(path, sampler, cache, sampling=sampling,
                                                                   salt=f"{spec.key}.{lang}")
            return opened[("text", path, spec.subword)]

        self.total_sizes = {}
        with stamps.deferred():  # each index's stamp written once, when all are opened (its check, its </s> endings)
            for spec in self.streams:
                key = spec.key
                ids = [0] if spec.text else corpus.shard_ids(split, key)
                if not ids:
                    raise DataError(f"{corpus.root}: no {split} data for {key!r} (stream {spec.name!r}); available: "
                                    f"{corpus.directions(split) + corpus.monolingual(split)}")
                if "-" in key:
                    src_lang, tgt_lang = key.split("-")
                    langs = {"src": src_lang, "tgt": tgt_lang}
                else:
                    src_lang = tgt_lang = key
                    langs = {"src": key, "tgt": key, "lang": key}
                sp = resolve_prefix(spec.source_prefix, dictionary, spec.name, **langs)
                tp = resolve_prefix(spec.target_prefix, dictionary, spec.name, **langs)
                self._by_key[spec.name] = []
                for shard in ids:
                    if spec.text:
                        src = open_text(spec, src_lang, langs)
                        tgt = (open_text(spec, tgt_lang, langs) if "-" in key else src) if with_target else None
                    else:
                        if "-" in key:
                            corpus.check_shard(split, key, shard, counts=(0, 0))  # both sides exist (no reading)
                        src = open_(key, src_lang if "-" in key else None, shard)
                        tgt = None
                        if with_target:
                            tgt = open_(key, tgt_lang, shard) if "-" in key else src
                            if "-" in key:
                                corpus.check_shard(split, key, shard, counts=(len(src), len(tgt)))
                    self._by_key[spec.name].append(len(self.components))
                    comp = Component(spec.name, shard, src, tgt, sp, tp, cache, src_noise=tuple(spec.noise))
                    comp._lengths = lengths.setdefault(id(src), {})  # one length copy per file, however many streams
                    self.components.append(comp)
                self.total_sizes[spec.name] = sum(len(self.components[i]) for i in self._by_key[spec.name])
            # every binarized file's tokens in token spaces (mapped when first gathered): addresses are planned here
            binarized = [ds for c in self.components for ds in (c.src, c.tgt) if isinstance(ds, IndexedDataset)]
            self.spaces = TokenSpaces(binarized)
            for c in self.components:
                if isinstance(c.src, IndexedDataset):
                    c.src_at = self.spaces.address(c.src)
                if isinstance(c.tgt, IndexedDataset):
                    c.tgt_at = self.spaces.address(c.tgt)

    def check_unchanged(self) -> None:
        """Refuse to go on when the data of a file this source set opened was replaced since (a data folder
        renamed into place under a running job, as ``binarize --overwrite`` does): the processes that open files
        anew (DataLoader and grain workers) would read the new data and this one the old. Another file at the path
        is refused even with the same sizes (data binarized again with another dictionary: the content digest
        reads the index alone); a file only touched (same file, same content digest) is fine. Two ``stat`` calls
        per file."""
        seen: set = set()
        known = self.__dict__.setdefault("_identities", {})  # index path -> identity last found to hold the data
        for c in self.components:
            for ds in (c.src, c.tgt):
                ids = getattr(ds, "_ids", None)
                if ds is None or ids is None or id(ds) in seen:
                    continue
                seen.add(id(ds))
                try:
                    now = [stamps.identity(ds.index_file), stamps.identity(ds.data_file)]
                except OSError:
                    now = None
                was = known.get(ds.index_file, ids)
                if now == was:
                    continue
                try:
                    same = now is not None and [i[:2] for i in now] == [i[:2] for i in was] and \
                        IndexedDataset(ds.prefix, verify="quick").content_digest == ds.content_digest
                except (OSError, ValueError):
                    same = False
                if not same:
                    path = ds.data_file if now is not None and now[0] == was[0] else ds.index_file
                    how = "a data folder renamed into place, binarize --overwrite?"
                    if is_shadow(path):  # (named as the object)
                        path, how = remote_names(path), "replaced in the store, and the folder opened again"
                    raise DataChangedError(path, f"replaced or changed while the job ran ({how}): the rest of the run "
                                                 f"would read other data than its plan. Restart from the last saved "
                                                 f"state: with the same data it resumes exactly; with new data its "
                                                 f"fingerprint names what changed")
                known[ds.index_file] = now

    def row_table(self) -> "RowTable | None":
        """Every row's lengths and token addresses in flat arrays, when there are enough components for it to pay
        (more than ``RowTable.MIN_COMPONENTS``) and it fits what is left of the length budget; else None."""
        if self._rows is False:
            self._rows = None
            budget = self.length_cache.budget - self.length_cache.used if self.length_cache is not None else 0
            if len(self.components) > RowTable.MIN_COMPONENTS:
                rows = sum(len(ds) for ds in distinct_datasets(self.components))
                if RowTable.BYTES_PER_ROW * rows <= budget:
                    self._rows = RowTable(self.components, self.spaces)
                    self.length_cache.used += self._rows.nbytes
        return self._rows

    def directions(self, epoch: int) -> list[Direction]:
        out = []
        for d, key in enumerate(self.keys):
            ids = self._by_key[key]
            shard_sizes = tuple(len(self.components[i]) for i in ids)
            if self.shards == "cycle":
                ids = [ids[(epoch - 1) % len(ids)]]
            out.append(Direction(key, d, [self.components[i] for i in ids], ids, self.total_sizes[key], shard_sizes))
        return out

    @property
    def max_shards(self) -> int:
        return max(len(v) for v in self._by_key.values())

    def check_limits(self, max_source: int, max_target: int) -> None:
        """Refuse limits under which a whole stream would be filtered out (every epoch silently without it)."""
        for key, ids in self._by_key.items():
            comps = [self.components[i] for i in ids if not self.components[i].raw and len(self.components[i])]
            if not comps:
                continue
            for side, limit, name in (("src", max_source, "max_source_positions"),
                                      ("tgt", max_target, "max_target_positions")):
                if side == "tgt" and comps[0].tgt is None:
                    continue
                shortest = min(_shortest(c.src if side == "src" else c.tgt)
                               + len(c.src_prefix if side == "src" else c.tgt_prefix) for c in comps)
                if shortest > limit:
                    raise ConfigError(f"filter.{name}={limit} filters out every sample of {key}: its shortest "
                                      f"{'source' if side == 'src' else 'target'} has {shortest} tokens (prefix "
                                      f"and </s> included)")


def _streams_of_keys(keys, source_prefix, target_prefix, prefix_overrides, noise) -> list[StreamSpec]:
    overrides = dict(prefix_overrides or {})
    unknown = set(overrides) - set(keys)
    if unknown:
        raise ConfigError(f"prefix overrides name directions that are not used: {sorted(unknown)}")
    noise = dict(noise or {})
    unknown = set(noise) - set(keys) - {"*"}
    if unknown:
        raise ConfigError(f"noise settings name tasks that are not used: {sorted(unknown)}")
    return [StreamSpec(k, k, k, overrides.get(k, {}).get("source", source_prefix),
                       overrides.get(k, {}).get("target", target_prefix), tuple(noise.get(k, noise.get("*", ()))))
            for k in keys]
