"""``babelfeed inspect``: per split, direction and side: sentences, tokens, shards, length percentiles, dtype.

Percentiles are exact (nearest rank) and come from a length histogram accumulated shard by shard, so memory
is bounded by the longest sentence, not by the corpus.
"""

from __future__ import annotations

import os

import numpy as np

from babelfeed.errors import BabelfeedError, FormatError
from babelfeed.sources.corpus import ShardedCorpus
from babelfeed.storage.indexed import IndexedDataset
from babelfeed.storage.remote.client import ensure, is_shadow, stats


PERCENTILES = (50, 90, 99)


def _percentile(hist: np.ndarray, q: float) -> int:
    n = int(hist.sum())
    if n == 0:
        return 0
    rank = max(1, int(np.ceil(q / 100.0 * n)))
    return int(np.searchsorted(np.cumsum(hist), rank))


def check_token_ids(ds, vocab_size: int, chunk: int = 1 << 24) -> None:
    """Raise a FormatError naming the file and record when a stored token id is outside a dictionary of
    ``vocab_size`` symbols (the whole ``.bin`` is read, in bounded chunks)."""
    tokens, shift = ds.tokens, ds.token_shift
    for start in range(0, len(tokens), chunk):
        part = tokens[start:start + chunk]
        if int(part.max()) - shift < vocab_size and int(part.min()) - shift >= 0:
            continue
        pos = start + int(np.flatnonzero((part.astype(np.int64) - shift >= vocab_size) | (part.astype(np.int64) < shift))[0])
        record = int(np.searchsorted(np.asarray(ds.pointers) // ds.dtype.itemsize, pos, side="right")) - 1
        raise FormatError(ds.data_file, f"record {record} holds token id {int(tokens[pos]) - shift}, outside the "
                                        f"dictionary of {vocab_size} symbols")


def _dictionary_size(corpus: ShardedCorpus, lang: str | None) -> int:
    try:
        return len(corpus.dictionary(lang))
    except FileNotFoundError:
        return 0


def _fetched_whole(ds) -> None:
    """A ``.bin`` in an object store, fetched whole before its tokens are checked (its shadow holds only what
    was fetched: the rest reads as zeros)."""
    if is_shadow(ds.data_file):
        size = os.path.getsize(ds.data_file)
        if size > stats()["cache_limit"] // 2:
            raise BabelfeedError(f"{ds.data_file}: checking every token of a {size / 1e9:.1f} GB object needs a "
                                 f"fetcher cache twice its size (BABELFEED_FETCH_CACHE_MB), or a local copy")
        ensure(ds.data_file, [0], [size], inode=ds.bin_inode)


def corpus_stats(root, verify: str = "full", check_tokens: bool = False, histograms: bool = False) -> list[dict]:
    """Per split, direction and side: sentences, tokens, shards, length percentiles, dtype. ``check_tokens``
    also reads every token and refuses ids outside the dictionary; ``histograms`` adds each row's sentence count
    per length (``"histogram"``, a list: entry L counts sentences of L tokens)."""
    corpus = ShardedCorpus(root)
    rows = []
    for split in corpus.splits:
        keys = [(d, d.split("-")) for d in corpus.directions(split)] + [(m, [m]) for m in corpus.monolingual(split)]
        for key, langs in keys:
            shards = corpus.shard_ids(split, key)
            for lang in langs:
                hist = np.zeros(1, dtype=np.int64)
                sentences = tokens = 0
                dtypes = set()
                for shard in shards:
                    ds = corpus.open(split, key, lang if "-" in key else None, shard, verify=verify)
                    if check_tokens and len(ds):
                        _fetched_whole(ds)
                        vocab = _dictionary_size(corpus, lang)
                        if vocab:
                            check_token_ids(ds, vocab)
                            # every record a sentence ending with </s> (as the training iterators check)
                            ds.check_ends_with(corpus.dictionary(lang).eos() + ds.token_shift, fetched=True)
                    sizes = np.asarray(ds.sizes)
                    dtypes.add(ds.dtype.name)
                    sentences += len(ds)
                    tokens += ds.num_tokens
                    if len(sizes):
                        h = np.bincount(sizes)
                        if len(h) > len(hist):
                            hist = np.pad(hist, (0, len(h) - len(hist)))
                        hist[: len(h)] += h
                row = {"split": split, "key": key, "lang": lang, "sentences": sentences, "tokens": tokens,
                       "shards": len(shards), "dtype": "/".join(sorted(dtypes))}
                for q in PERCENTILES:
                    row[f"p{q}"] = _percentile(hist, q)
                row["max"] = int(np.flatnonzero(hist)[-1]) if hist.any() else 0
                if histograms:
                    row["histogram"] = hist.tolist()
                rows.append(row)
    return rows


def format_stats(rows: list[dict]) -> str:
    cols = ["split", "key", "lang", "sentences", "tokens", "shards", "p50", "p90", "p99", "max", "dtype"]
    heads = ["split", "direction", "side", "sentences", "tokens", "shards", "p50", "p90", "p99", "max", "dtype"]
    cells = [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    numeric = {3, 4, 5, 6, 7, 8, 9}

    def fmt(values):
        return "  ".join(v.rjust(w) if i in numeric else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths)))

    lines = [fmt(heads), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells]
    return "\n".join(lines)


def document_stats(root, verify: str = "full") -> list[dict]:
    """Per dataset of a ``binarize --documents`` output (``shardNNN/{corpus}_{key}_document.{bin,idx}``, or
    Megatron prefixes anywhere under ``root``): documents, sequences, tokens, shards, document length
    percentiles (tokens), dtype. The shards of one name are one dataset."""
    found: dict = {}
    for folder, _, files in sorted(os.walk(os.fspath(root))):
        for f in sorted(files):
            if f.endswith(".idx"):
                found.setdefault(f[:-4], []).append(os.path.join(folder, f[:-4]))
    if not found:
        raise FormatError(os.fspath(root), "no .idx files found (a data_bin: shardNNN/{split}.{src}-{tgt}.{lang}.idx; "
                                           "documents: shardNNN/{corpus}_{key}_document.idx)")
    rows = []
    for name, prefixes in sorted(found.items()):
        docs = seqs = tokens = 0
        lengths, dtypes = [], set()
        for prefix in prefixes:
            ds = IndexedDataset(prefix, verify=verify)
            dtypes.add(ds.dtype.name)
            bounds = np.asarray(ds.doc_idx, dtype=np.int64)
            per_seq = np.concatenate([[0], np.cumsum(np.asarray(ds.sizes, dtype=np.int64))])
            lengths.append(per_seq[bounds[1:]] - per_seq[bounds[:-1]])
            docs += len(bounds) - 1
            seqs += len(ds)
            tokens += ds.num_tokens
        doc_len = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        row = {"dataset": name, "documents": docs, "sequences": seqs, "tokens": tokens, "shards": len(prefixes),
               "dtype": "/".join(sorted(dtypes))}
        for q in PERCENTILES:
            row[f"p{q}"] = int(np.percentile(doc_len, q)) if len(doc_len) else 0
        row["max"] = int(doc_len.max()) if len(doc_len) else 0
        rows.append(row)
    return rows


def format_document_stats(rows: list[dict]) -> str:
    cols = ["dataset", "documents", "sequences", "tokens", "shards", "p50", "p90", "p99", "max", "dtype"]
    cells = [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(cols)]

    def fmt(values):
        return "  ".join(v.ljust(w) if i in (0, 9) else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))

    return "\n".join([fmt(cols), fmt(["-" * w for w in widths]), *(fmt(c) for c in cells),
                      "(document lengths p50/p90/p99/max in tokens)"])
