"""Discover a data_bin: ``root/shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx}`` (Open-NLLB's layout).

Also accepted: the same files directly in ``root`` (one unsharded data directory, as ``fairseq-preprocess``
writes it), and monolingual ``{split}.{lang}`` files (or fairseq's ``{split}.{lang}-None.{lang}``).
Discovery lists file names only; the side-count check reads 8 bytes of each index header.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import warnings
from dataclasses import dataclass

from babelfeed.errors import ConfigError, DataError, FormatError, SideMismatchError, UsageError
from babelfeed.sources.dictionary import Dictionary
from babelfeed.storage.indexed import MMIDIDX_MAGIC, TNTIDX_MAGIC, IndexedDataset, data_path, index_path
from babelfeed.storage.remote.client import resolve


_SHARD_DIR = re.compile(r"^shard(\d+)$")


@dataclass(frozen=True, order=True)
class CorpusFile:
    """One side of one shard: ``direction`` is ``"src-tgt"`` for parallel data, None for monolingual."""

    split: str
    direction: str | None
    lang: str
    shard: int
    prefix: str


def parse_name(stem: str) -> tuple[str, str | None, str] | None:
    """``train.eng_Latn-tur_Latn.tur_Latn`` -> (split, direction, lang); ``train.eng_Latn`` -> (split, None, lang)."""
    parts = stem.split(".")
    if len(parts) >= 3 and parts[-2].count("-") == 1:
        src, tgt = parts[-2].split("-")
        lang = parts[-1]
        if lang in (src, tgt) and src and tgt:
            split = ".".join(parts[:-2])
            if tgt == "None":  # fairseq-preprocess --only-source
                return split, None, lang
            return split, parts[-2], lang
        return None
    if len(parts) >= 2 and "-" not in parts[-1] and all(parts):
        return ".".join(parts[:-1]), None, parts[-1]
    return None


def read_sequence_count(prefix) -> int:
    """The sequence count from an index header, without mapping the file."""
    path = os.fspath(prefix) + ".idx"
    with open(path, "rb") as f:
        head = f.read(40)
    if head.startswith(TNTIDX_MAGIC) and len(head) >= 40:
        return struct.unpack_from("<Q", head, 32)[0]
    if head[:9] == MMIDIDX_MAGIC and len(head) >= 26:
        return struct.unpack_from("<Q", head, 18)[0]
    raise FormatError(path, "not a readable fairseq/Megatron index header")


# Datasets (and dictionaries) an iterator being built may take as they are (``reusing``): by path and options
_REUSE: dict = {}
_REUSE_DICTS: dict = {}


def _stat_key(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@contextlib.contextmanager
def reusing(datasets, dictionaries=()):
    """While the block runs, an open of the very same files as one of ``datasets`` (an iterator's) gets that
    dataset, and a load of the same ``dict.txt`` as one of ``dictionaries`` gets that dictionary: an edit builds
    the edited config's iterator beside the run's without opening and parsing its indexes again. The same files:
    the same index file (device, inode, size, modification time) and data file (device, inode, size); a file
    replaced since is opened, and checked, anew."""
    saved, saved_dicts = dict(_REUSE), dict(_REUSE_DICTS)
    for ds in datasets:
        if ds is not None and getattr(ds, "_index", None) is not None:
            _REUSE[(os.path.abspath(ds.prefix), ds._verify, ds._recompute)] = ds
    for d in dictionaries:
        source = getattr(d, "source", None)
        if source is not None:
            _REUSE_DICTS[source[0]] = d
    try:
        yield
    finally:
        _REUSE.clear()
        _REUSE.update(saved)
        _REUSE_DICTS.clear()
        _REUSE_DICTS.update(saved_dicts)


def open_shared(prefix: str, **kwargs) -> IndexedDataset:
    """``IndexedDataset(prefix, **kwargs)``, or, inside ``reusing``, the dataset of the same unchanged files."""
    if _REUSE:
        key = (os.path.abspath(os.fspath(prefix)), kwargs.get("verify", "full"), bool(kwargs.get("recompute_pointers")))
        ds = _REUSE.get(key)
        if ds is not None and set(kwargs) <= {"verify", "recompute_pointers"}:
            try:  # (identities as the dataset recorded them when it opened: [dev, ino, size, mtime, ctime])
                idx, data = ds._ids
                if (_stat_key(index_path(prefix)) == tuple(idx[:4])
                        and _stat_key(data_path(prefix))[:3] == tuple(data[:3])):
                    return ds
            except (OSError, ValueError, TypeError):
                pass
    return IndexedDataset(prefix, **kwargs)


def load_dictionary(path: str) -> Dictionary:
    """``Dictionary.load(path)``, or, inside ``reusing``, the dictionary loaded from the same unchanged file."""
    if _REUSE_DICTS:
        d = _REUSE_DICTS.get(os.path.abspath(path))
        try:
            if d is not None and d.source[1] == _stat_key(path):
                return d
        except OSError:
            pass
    return Dictionary.load(path)


class ShardedCorpus:
    """The splits, directions, languages and shards of a data_bin.

    >>> corpus = ShardedCorpus("data_bin")                                      # doctest: +SKIP
    >>> corpus.splits, corpus.directions("train"), corpus.num_shards("train", "eng_Latn-tur_Latn")  # doctest: +SKIP
    (['train'], ['eng_Latn-tur_Latn'], 2)
    >>> src, tgt = corpus.open_pair("train", "eng_Latn-tur_Latn", shard=1)    # doctest: +SKIP

    ``check=True`` (default) verifies at construction that every index has its ``.bin``, that both sides of
    every direction exist in every shard, and that they hold the same number of sentences.
    """

    def __init__(self, root, check: bool = True):
        self.url = os.fspath(root)  # as given: a local folder, or an object store's (s3://bucket/data_bin)
        self.root = resolve(self.url)  # a remote folder's local shadow (storage/remote/server.py)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(2, "data_bin directory not found", self.root)
        self.files: list[CorpusFile] = []
        self.unrecognized: list[str] = []
        shard_dirs = self._shard_dirs()
        for shard, directory in shard_dirs:
            for name in sorted(os.listdir(directory)):
                if not name.endswith(".idx"):
                    continue
                parsed = parse_name(name[: -len(".idx")])
                if parsed is None:
                    self.unrecognized.append(os.path.join(directory, name))
                    continue
                split, direction, lang = parsed
                prefix = os.path.join(directory, name[: -len(".idx")])
                self.files.append(CorpusFile(split, direction, lang, shard, prefix))
        if self.unrecognized:
            warnings.warn(
                f"{self.root}: {len(self.unrecognized)} .idx file(s) do not follow "
                f"{{split}}.{{src}}-{{tgt}}.{{lang}} or {{split}}.{{lang}} and are ignored, e.g. {self.unrecognized[0]}",
                stacklevel=2,
            )
        if not self.files:
            raise FormatError(self.root, "no .idx files found (expected shardNNN/{split}.{src}-{tgt}.{lang}.idx)")
        self._by_key = {(f.split, f.direction, f.lang, f.shard): f for f in self.files}
        self._shards: dict = {}  # (split, direction or None, lang) -> shards, for lookups in O(1)
        for f in self.files:
            self._shards.setdefault((f.split, f.direction, f.lang), set()).add(f.shard)
        if check:
            self.check()

    def _shard_dirs(self) -> list[tuple[int, str]]:
        shards = []
        has_flat = False
        for name in os.listdir(self.root):
            full = os.path.join(self.root, name)
            m = _SHARD_DIR.match(name)
            if m and os.path.isdir(full):
                shards.append((int(m.group(1)), full))
            elif name.endswith(".idx"):
                has_flat = True
        if shards and has_flat:
            raise FormatError(
                self.root, "mixes .idx files at the top level with shardNNN/ folders; use one layout or the other"
            )
        return sorted(shards) if shards else [(0, self.root)]

    # ----------------------------------------------------------------------------------- listings
    @property
    def splits(self) -> list[str]:
        return sorted({f.split for f in self.files})

    def directions(self, split: str | None = None) -> list[str]:
        """Directions (``src-tgt``) with files in ``split`` (any split when None), sorted."""
        return sorted({f.direction for f in self.files if f.direction and (split is None or f.split == split)})

    def monolingual(self, split: str | None = None) -> list[str]:
        """Languages with monolingual files in ``split`` (any split when None)."""
        return sorted({f.lang for f in self.files if f.direction is None and (split is None or f.split == split)})

    @property
    def languages(self) -> list[str]:
        return sorted({f.lang for f in self.files})

    @property
    def shards(self) -> list[int]:
        return sorted({f.shard for f in self.files})

    def shard_ids(self, split: str, key: str) -> list[int]:
        """Shards holding ``key`` (a direction: either side; or a monolingual language) in ``split``, ascending."""
        if "-" in key:
            src, _, tgt = key.partition("-")
            if "-" in tgt or not src or not tgt:
                raise ConfigError(f"{key!r} is not a direction ('SRC-TGT', one '-': e.g. eng_Latn-deu_Latn) nor a "
                                  f"language of {self.root}; several are separated by commas")
            return sorted(self._shards.get((split, key, src), set()) | self._shards.get((split, key, tgt), set()))
        return sorted(self._shards.get((split, None, key), ()))

    def num_shards(self, split: str, key: str) -> int:
        """How many shards hold ``key`` (a direction or a monolingual language) in ``split``."""
        return len(self.shard_ids(split, key))

    def prefix(self, split: str, key: str, lang: str | None = None, shard: int = 0) -> str:
        """Path prefix of one side: ``prefix("train", "eng_Latn-tur_Latn", "tur_Latn", 1)``, or of a monolingual
        file: ``prefix("train", "eng_Latn", shard=0)``."""
        direction = key if "-" in key else None
        lang = lang or (key if direction is None else None)
        if lang is None:
            raise UsageError(f"{key} is a direction: name the side (one of {key.split('-')})")
        try:
            return self._by_key[(split, direction, lang, shard)].prefix
        except KeyError:
            raise DataError(f"{self.root}: no {split} file for {key} side {lang} in shard {shard}") from None

    def open(self, split: str, key: str, lang: str | None = None, shard: int = 0, **kwargs) -> IndexedDataset:
        """The file's ``IndexedDataset``; the same object where this process already holds one of the very same
        files (an iterator built beside another of the same data: an edit, trace's segments), not opened and
        parsed again."""
        return open_shared(self.prefix(split, key, lang, shard), **kwargs)

    def open_pair(self, split: str, direction: str, shard: int = 0, **kwargs):
        """The source and target ``IndexedDataset`` of ``direction`` in one shard (``kwargs``: ``verify``, ...)."""
        src, tgt = direction.split("-")
        return self.open(split, direction, src, shard, **kwargs), self.open(split, direction, tgt, shard, **kwargs)

    def num_sentences(self, split: str, key: str, shard: int | None = None) -> int:
        """Sentences of ``key`` in ``split`` (one shard, or all), read from index headers."""
        lang = key.split("-")[0] if "-" in key else key
        shards = self.shard_ids(split, key) if shard is None else [shard]
        return sum(read_sequence_count(self.prefix(split, key, lang, s)) for s in shards)

    # ----------------------------------------------------------------------------------- checks
    def check(self) -> None:
        for f in self.files:
            if not os.path.exists(data_path(f.prefix)):
                raise FileNotFoundError(2, f"{f.prefix}.idx has no .bin beside it", data_path(f.prefix))
        pairs = sorted({(f.split, f.direction) for f in self.files if f.direction})
        for split, direction in pairs:
            for shard in self.shard_ids(split, direction):
                self.check_shard(split, direction, shard)

    def check_shard(self, split: str, direction: str, shard: int, counts: tuple[int, int] | None = None) -> None:
        """Both sides of ``direction`` exist in ``shard`` and hold the same number of sentences (``counts``: the
        two sides' counts when the caller has opened them; else read from the index headers)."""
        src, tgt = direction.split("-")
        sides = {lang: self._by_key.get((split, direction, lang, shard)) for lang in (src, tgt)}
        missing = [lang for lang, f in sides.items() if f is None]
        if missing:
            present = next(f for f in sides.values() if f is not None)
            raise SideMismatchError(
                present.prefix + ".idx",
                f"{split} {direction} shard {shard} has no {missing[0]} side beside this file",
            )
        a, b = counts if counts is not None else (read_sequence_count(sides[lang].prefix) for lang in (src, tgt))
        if a != b:
            raise SideMismatchError(
                sides[src].prefix + ".idx",
                f"{a} sentences, but the {tgt} side {sides[tgt].prefix}.idx has {b} "
                f"({split} {direction} shard {shard})",
            )

    def dictionary(self, lang: str | None = None) -> Dictionary:
        """``root/dict.txt``, else ``dict.{lang}.txt`` in the root or the first shard."""
        candidates = [os.path.join(self.root, "dict.txt")]
        langs = [lang] if lang else self.languages
        first = os.path.dirname(self.files[0].prefix)
        for lg in langs:
            candidates += [os.path.join(self.root, f"dict.{lg}.txt"), os.path.join(first, f"dict.{lg}.txt")]
        for path in candidates:
            if os.path.exists(path):
                return load_dictionary(path)
        raise FileNotFoundError(2, "no dictionary (dict.txt or dict.{lang}.txt) in the data_bin", self.root)

    def __repr__(self) -> str:
        return (
            f"ShardedCorpus({self.root!r}, splits={self.splits}, directions={len(self.directions())}, "
            f"monolingual={self.monolingual()}, shards={len(self.shards)})"
        )
