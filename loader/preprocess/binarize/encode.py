"""What a binarize worker runs: a chunk of lines encoded with SentencePiece into work files, and a shard's
chunks merged into its datasets."""

from __future__ import annotations

import os
import re
from itertools import chain, islice

import numpy as np

from babelfeed.errors import BinarizeError
from babelfeed.preprocess import engines
from babelfeed.preprocess.binarize.jobs import Chunk, ShardJob
from babelfeed.preprocess.chunks import encode_chunk
from babelfeed.preprocess.documents import encode_documents
from babelfeed.preprocess.rawtext import decode_lines
from babelfeed.preprocess.stats import Stats
from babelfeed.preprocess.textio import count_records
from babelfeed.storage.builder import IndexedDatasetBuilder


_WORKER: dict = {}


def _init_worker(spm_bytes: bytes, table: np.ndarray | None, settings: dict) -> None:
    import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)

    _WORKER["sp"] = spm.SentencePieceProcessor(model_proto=spm_bytes)
    _WORKER["table"] = table
    _WORKER["settings"] = settings
    _WORKER["key"] = None


def _worker():
    """The SentencePiece processor, id table and settings of this job, loaded once per worker process."""
    key = engines.context_key()
    if key is not None and _WORKER.get("key") != key:
        _init_worker(*engines.context())
        _WORKER["key"] = key
    return _WORKER["sp"], _WORKER["table"], _WORKER["settings"]


_MODEL_FACTS: dict = {}  # id(SentencePieceProcessor) -> (most bytes a piece covers, unknown-run pattern or None)


def _fewest_tokens(sp, text: str) -> int:
    """The fewest tokens ``text`` can encode to: the bytes of its normalized characters that some piece holds
    (spaces as one byte; a run of characters no piece holds can become one <unk>, so they count for nothing),
    over the most bytes one piece covers. A line whose fewest is above ``--max-len`` is dropped without encoding
    it: a 30 MB line took 1.8 GB to encode, only to be dropped."""
    key = id(sp)
    if key not in _MODEL_FACTS:
        longest, chars, fallback = 1, {"\u2581"}, False
        for i in range(sp.get_piece_size()):
            if sp.is_byte(i):
                fallback = True  # every character has pieces (its bytes): nothing becomes <unk>
            elif not (sp.is_control(i) or sp.is_unknown(i)):
                piece = sp.id_to_piece(i)
                chars.update(piece)
                longest = max(longest, len(piece.replace("\u2581", " ").encode()))
        unknown = None if fallback else re.compile("[^" + "".join(re.escape(c) for c in sorted(chars)) + "]+")
        _MODEL_FACTS[key] = (longest, unknown)
    longest, unknown = _MODEL_FACTS[key]
    norm = sp.normalize(text)
    if unknown is not None:
        norm = unknown.sub("", norm)
    covered = len(norm.encode()) - 2 * norm.count("\u2581")  # (U+2581, 3 bytes, stands for one space)
    return -(-covered // longest)


def _encode_lines(sides_lines: list[list[bytes]], where: list[tuple[str, int]], langs: list[str], sp, table, cfg
                  ) -> tuple[Stats, list[tuple[np.ndarray, np.ndarray]]]:
    """Encode aligned lines of every side; ``where`` is (path, 0-based line of the first) per side. Returns the
    counts and, per side, the kept sentences' tokens (``</s>`` after each) and lengths."""
    eos, unk, max_len = cfg["eos"], cfg["unk"], cfg["max_len"]
    sides_text, sides_bad = [], []
    n = len(sides_lines[0])
    for lines in sides_lines:
        texts, bad = decode_lines(lines)
        sides_text.append(texts)
        sides_bad.append(bad)
    stats = Stats(lines=n)
    keep = np.ones(n, dtype=bool)

    def apply(name: str, mask: np.ndarray, side: int) -> None:
        if not mask.any():
            return
        policy = cfg[name]
        if policy == "error":
            i = int(np.flatnonzero(mask)[0])
            path, first = where[side]
            what = {"empty": "is empty", "bad_utf8": "is not valid UTF-8 text (or holds a NUL byte)",
                    "overlong": f"has more than {max_len} tokens (</s> included)"}[name]
            raise BinarizeError(f"{path}: line {first + i + 1} {what} (policy --on-{name.replace('_', '-')}=error)")

    for side, bad in enumerate(sides_bad):
        apply("bad_utf8", bad, side)
    bad_any = np.logical_or.reduce(sides_bad)
    if cfg["bad_utf8"] == "drop":
        stats.bad_utf8 = int((bad_any & keep).sum())
        keep &= ~bad_any
    else:
        stats.replaced_utf8 = int(bad_any.sum())
    empty_any = np.zeros(n, dtype=bool)
    for side, texts in enumerate(sides_text):
        empty = np.fromiter((not t.strip() for t in texts), dtype=bool, count=n)
        apply("empty", empty & keep, side)
        empty_any |= empty
    if cfg["empty"] == "drop":
        stats.empty = int((empty_any & keep).sum())
        keep &= ~empty_any

    hopeless_any = np.zeros(n, dtype=bool)
    if cfg["overlong"] != "truncate":  # lines too long for max_len whatever their pieces: never encoded
        for side, texts in enumerate(sides_text):
            hopeless = keep & np.fromiter((len(t) > max_len and _fewest_tokens(sp, t) + 1 > max_len for t in texts),
                                          dtype=bool, count=n)
            apply("overlong", hopeless, side)
            hopeless_any |= hopeless
        keep &= ~hopeless_any

    encoded = []
    for side, texts in enumerate(sides_text):
        idx = np.flatnonzero(keep)
        # One thread per worker: --workers N means N cores (SentencePiece would otherwise use them all).
        ids = sp.encode([texts[i] for i in idx], out_type=int, num_threads=1) if len(idx) else []
        lengths = np.zeros(n, dtype=np.int64)
        lengths[idx] = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        encoded.append((table[flat], lengths))
    over_any = np.zeros(n, dtype=bool)
    for side, (_, lengths) in enumerate(encoded):
        over = keep & (lengths + 1 > max_len)
        apply("overlong", over, side)
        over_any |= over
    if cfg["overlong"] == "drop":
        stats.overlong = int(over_any.sum() + hopeless_any.sum())
        keep &= ~over_any
    elif cfg["overlong"] == "truncate":
        stats.truncated = int(over_any.sum())
    stats.kept = stats.sequences = int(keep.sum())

    out_sides = []
    for side, (flat, lengths) in enumerate(encoded):
        starts = np.cumsum(lengths) - lengths
        cap = np.minimum(lengths, max_len - 1) if cfg["overlong"] == "truncate" else lengths
        cap = np.where(keep, cap, 0)
        # Gather the kept tokens of every kept sentence and put </s> after each, in one vectorised pass.
        pos = np.arange(len(flat)) - np.repeat(starts, lengths)
        tokens = flat[pos < np.repeat(cap, lengths)]
        out_len = cap[keep] + 1
        out = np.empty(int(out_len.sum()), dtype=np.int64)
        is_eos = np.zeros(len(out), dtype=bool)
        is_eos[np.cumsum(out_len) - 1] = True
        out[is_eos] = eos
        out[~is_eos] = tokens
        stats.unk_tokens += int((tokens == unk).sum())
        unk_at = (flat == unk) & (pos < np.repeat(cap, lengths))
        if unk_at.any():  # only the lines holding <unk> are looked at again
            lines = np.unique(np.repeat(np.arange(n), lengths)[unk_at])
            _count_unk(sp, table, unk, [sides_text[side][i] for i in lines], cap[lines], stats.unk_chars)
        stats.tokens[langs[side]] = int(len(out))
        out_sides.append((out, out_len))
    return stats, out_sides


_PROTO: list = []  # SentencePiece's name of its pieces-with-offsets output, once known


def _pieces(sp, texts: list[str]) -> list:
    """SentencePiece's pieces of each text with their ``id`` and ``surface`` (the input text they cover)."""
    if not _PROTO:
        try:  # sentencepiece >= 0.2.1 ("immutable_proto" before)
            sp.encode([""], out_type="proto")
            _PROTO.append("proto")
        except (ValueError, RuntimeError, TypeError):
            _PROTO.append("immutable_proto")
    return [p.pieces for p in sp.encode(texts, out_type=_PROTO[0], num_threads=1)]


def _count_unk(sp, table, unk: int, texts: list[str], caps, into: dict) -> None:
    """Add what became ``<unk>`` in the first ``caps[i]`` pieces of each text to ``into``: every character of an
    unknown run (SentencePiece makes a run of characters it has no piece for one ``<unk>``), and a piece the
    dictionary lacks (``--dict``) as itself."""
    for pieces, cap in zip(_pieces(sp, texts), caps):
        for piece in islice(pieces, int(cap)):
            if table[piece.id] != unk:
                continue
            for ch in (piece.surface if sp.is_unknown(piece.id) else [piece.piece]):
                into[ch] = into.get(ch, 0) + 1


def _encode_chunk(chunk: Chunk, work_dir: str) -> tuple[tuple, int, Stats, list[str]]:
    """Encode one chunk into work files (one pair per side); returns (shard key, chunk index, counts, prefixes)."""
    sp, table, cfg = _worker()
    if chunk.format != "lines":
        return encode_documents(chunk, work_dir, sp, cfg)

    def block(sides_lines, where, builders, stats):
        block_stats, outs = _encode_lines(sides_lines, where, chunk.langs, sp, table, cfg)
        stats.add(block_stats)
        for builder, (out, out_len) in zip(builders, outs):
            builder.add_items(out, out_len, one_document_each=True)

    return encode_chunk(chunk, work_dir, chunk.langs, cfg["format"], cfg, block)


def _count_task(path: str, kind: str, every: int) -> dict:
    return count_records(path, kind, every)


def _merge(job: ShardJob, parts: list[list[str]], output_dir: str, cfg: dict) -> tuple:
    """Concatenate a shard's chunk files into its datasets (the chunk files are left for the driver to delete:
    a merge run again after a lost worker must find them)."""
    os.makedirs(os.path.join(output_dir, f"shard{job.shard:03d}"), exist_ok=True)
    for side, lang in enumerate(job.langs):
        builder = IndexedDatasetBuilder(job.out_prefix(output_dir, lang), cfg["dtype"], format=cfg["format"])
        try:
            for chunk_parts in parts:
                builder.add_index(chunk_parts[side])
            engines.fault_point(f"merge:{job.name}.shard{job.shard:03d}", cfg.get("fault"))
            builder.finalize()
        except BaseException:
            builder.abort()
            raise
    return job.split, job.key, job.shard
