"""``babelfeed binarize``: raw text -> SentencePiece -> a sharded data_bin of ``.idx``/``.bin`` files.

Output (Open-NLLB's layout, readable by fairseq and by :class:`babelfeed.ShardedCorpus`)::

    DATA_BIN/dict.txt                                 fairseq dictionary, language tokens __xx__ last
    DATA_BIN/spm.model                                the SentencePiece model used
    DATA_BIN/shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx}   train splits cut into --shards shards
    DATA_BIN/shard000/{split}.{lang}.{bin,idx}        monolingual; valid/test live in shard000 only
    DATA_BIN/binarize_report.json                     kept and dropped counts per split and direction

Every sentence ends with ``</s>`` (id 2). The work is cut into chunks of lines that workers encode in
parallel (an engine of :mod:`babelfeed.preprocess.engines`: local processes or Ray tasks); chunks are merged into their
shard, which is then renamed into place atomically and recorded in ``DATA_BIN/.binarize/`` with a fingerprint
of its inputs and settings. A re-run skips every recorded shard whose fingerprint still matches and redoes the
rest, so a killed run resumes where it stopped. The plan of chunks and the merge order depend only on the
inputs and settings, so every engine and worker count writes the same bytes.

Inputs may be many files per direction and compressed (:mod:`babelfeed.preprocess.rawtext`); they are streamed, never read
whole. A plain file is cut into chunks of ``chunk_lines`` lines that enter it at a byte offset; a compressed
file cannot be entered in the middle, so each shard's part of it is one chunk, read from the file's start
(parallelism then comes from the number of files).

With ``documents=True`` (:mod:`babelfeed.preprocess.documents`) the inputs are JSONL or plain-text documents and the output
is Megatron-LM's ``.bin``/``.idx`` with a document index, as Megatron's ``preprocess_data.py`` writes it.

Bad lines follow an explicit policy, applied to the whole pair so that both sides stay aligned:
``empty`` (blank after stripping), ``overlong`` (more than ``max_len`` tokens with ``</s>``) and
``bad_utf8`` (undecodable bytes). Each is counted and reported at the end; none is dropped silently.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from itertools import chain, islice

import numpy as np

from babelfeed.errors import BinarizeError, FormatError, TextInputError
from babelfeed.fileio import atomic_write, fsync_dir
from babelfeed.preprocess import engines
from babelfeed.preprocess.documents import _fields, document_settings, document_texts, encode_documents
from babelfeed.preprocess.options import POLICIES, BinarizeOptions, check_shards
from babelfeed.preprocess.rawtext import (Part, RawInput, _doc_format, decode_lines, discover, discover_documents,
                                          looks_paired, pair_prefixes)
from babelfeed.preprocess.stats import Stats, _work_prefix  # noqa: F401  (part of this module's face)
from babelfeed.preprocess.textio import RecordReader, count_records, strip_compression
from babelfeed.sources.dictionary import Dictionary
from babelfeed.storage import remote
from babelfeed.storage.builder import IndexedDatasetBuilder
from babelfeed.storage.dtypes import dtype_for_vocab
from babelfeed.storage.indexed import IndexedDataset, dataset_exists
from babelfeed.storage.objects import is_remote


STATE_DIR = ".binarize"
REPORT = "binarize_report.json"
_VERSION = 1
# SentencePiece's trainer splits its work by thread, and the model it learns depends on the split: a fixed
# count (not --workers, not the machine's cores) keeps the model, and so every token, the same everywhere.
SPM_THREADS = 16


# ---------------------------------------------------------------------------------------------- planning
@dataclass
class Chunk:
    shard_key: tuple  # (split, key, shard)
    index: int  # chunk number within its shard
    sides: list  # per side: (path, start_byte, start_line, skip, end_byte) -- where the reader enters, records to
    # pass, and where a plain file's next mark after the chunk is (None: read on to the end)
    count: int  # records to read
    langs: list
    format: str = "lines"  # "lines", "jsonl" or "text"

    @property
    def name(self) -> str:
        split, key, shard = self.shard_key
        return f"{split}.{key}.shard{shard:03d}.chunk{self.index}"

    def reader(self, side: int) -> RecordReader:
        path, start_byte, start_line, skip, end_byte = self.sides[side]
        return RecordReader(path, "block" if self.format == "text" else "line", start_byte, start_line, skip,
                            end_byte)


@dataclass
class ShardJob:
    split: str
    key: str
    shard: int
    langs: list
    line_range: tuple
    chunks: list = field(default_factory=list)
    files: list = field(default_factory=list)  # every input file this shard reads
    documents: bool = False
    level: str = "document"

    @property
    def name(self) -> str:
        return f"{self.split}.{self.key}"

    def out_prefix(self, output_dir: str, lang: str) -> str:
        if self.documents:  # Megatron's naming: {corpus}_{json key}_{document|sentence}
            stem = f"{self.key}_{lang}_{self.level}"
        else:
            stem = f"{self.split}.{self.key}.{lang}" if "-" in self.key else f"{self.split}.{self.key}"
        return os.path.join(output_dir, f"shard{self.shard:03d}", stem)


def plan_jobs(inputs: list[RawInput], shards: int, chunk_lines: int, level: str = "document") -> list[ShardJob]:
    """Shards and their chunks. Shard ``s`` of an input holds its records ``[round(s n / S), round((s+1) n / S))``
    across its parts; a plain part is cut at its marks (every ``chunk_lines`` records), a compressed one is one
    chunk per shard it overlaps. The cut does not change the bytes written, only how the work is spread."""
    jobs = []
    for inp in inputs:
        n_shards = shards if inp.split.startswith("train") else 1
        total = sum(p.records for p in inp.parts)
        bounds = [round(k * total / n_shards) for k in range(n_shards + 1)]
        part_start = np.concatenate([[0], np.cumsum([p.records for p in inp.parts])]).tolist()
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            job = ShardJob(inp.split, inp.key, s, inp.langs, (lo, hi), documents=inp.documents, level=level)
            for part, p0 in zip(inp.parts, part_start):
                a, b = max(lo, p0) - p0, min(hi, p0 + part.records) - p0
                if a >= b:
                    continue
                job.files.extend(part.paths)
                seekable = part.marks and all(m is not None for m in part.marks)
                starts = [a] + ([c for c in range(-(-(a + 1) // chunk_lines) * chunk_lines, b, chunk_lines)]
                                if seekable else [])
                for i, c in enumerate(starts):
                    end = starts[i + 1] if i + 1 < len(starts) else b
                    if seekable:
                        m, m_end = c // chunk_lines, -(-end // chunk_lines)
                        sides = [(path, marks[m][0], marks[m][1], c - m * chunk_lines,
                                  marks[m_end][0] if m_end < len(marks) else None)
                                 for path, marks in zip(part.paths, part.marks)]
                    else:
                        sides = [(path, 0, 0, c, None) for path in part.paths]
                    job.chunks.append(Chunk((inp.split, inp.key, s), len(job.chunks), sides, end - c, inp.langs,
                                            part.format))
            jobs.append(job)
    return jobs


# ---------------------------------------------------------------------------------------------- workers
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
    prefixes = [_work_prefix(work_dir, chunk, lang) for lang in chunk.langs]
    builders = [IndexedDatasetBuilder(p, cfg["dtype"], format=cfg["format"]) for p in prefixes]
    readers = [chunk.reader(side) for side in range(len(chunk.sides))]
    stats = Stats()
    try:
        left = chunk.count
        while left:
            where = [(r.path, r.line) for r in readers]
            sides_lines = [r.take(min(left, cfg["block_lines"])) for r in readers]
            counts = [len(x) for x in sides_lines]
            if min(counts) < min(left, cfg["block_lines"]):
                short = int(np.argmin(counts))
                raise BinarizeError(f"{readers[short].path}: ended at line {readers[short].line:,}, before the line "
                                    f"counted earlier (was it changed while binarize ran?)")
            block_stats, outs = _encode_lines(sides_lines, where, chunk.langs, sp, table, cfg)
            stats.add(block_stats)
            for builder, (out, out_len) in zip(builders, outs):
                builder.add_items(out, out_len, one_document_each=True)
            left -= counts[0]
            engines.fault_point(f"encode:{chunk.name}", cfg.get("fault"))
        for builder in builders:
            builder.finalize()
    except BaseException:
        for builder in builders:
            builder.abort()
        raise
    finally:
        for r in readers:
            r.close()
    return chunk.shard_key, chunk.index, stats, prefixes


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


# ---------------------------------------------------------------------------------------------- SentencePiece
def _sample_task(path: str, fmt: str, keys: list[str], records: list[int]) -> list[str]:
    """The texts of the given records (sorted record numbers) of one file, for SentencePiece training: a line
    each, or each non-blank line of a document's text."""
    kind = "block" if fmt == "text" else "line"
    out: list[str] = []
    with RecordReader(path, kind) as reader:
        at = 0
        for r in records:
            reader.take(r - at, keep=False)
            got = reader.take(1)
            at = r + 1
            if not got:
                break
            if fmt == "lines":
                text = got[0].decode("utf-8", errors="replace").strip()
                if text:
                    out.append(text)
            else:
                for text in document_texts(got[0], fmt, keys):
                    out.extend(t.strip() for t in text.split("\n") if t.strip())
    return out


def _sample_for_spm(inputs: list[RawInput], opts: BinarizeOptions, engine) -> list[str]:
    """A temperature-balanced sample of train records per language (per corpus for documents), so small
    languages get pieces too."""
    per_lang: dict[str, list[tuple[Part, int]]] = {}
    for inp in inputs:
        if inp.split.startswith("train"):
            if inp.documents:
                for part in inp.parts:
                    per_lang.setdefault(inp.key, []).append((part, 0))
            else:
                for side, lang in enumerate(inp.langs):
                    for part in inp.parts:
                        per_lang.setdefault(lang, []).append((part, side))
    if not per_lang:
        raise BinarizeError(f"{opts.input_dir}: no train split to train SentencePiece on")
    langs = sorted(per_lang)
    totals = np.array([sum(p.records for p, _ in per_lang[lg]) for lg in langs], dtype=np.float64)
    weights = np.where(totals > 0, totals, 0) ** (1.0 / opts.spm_temperature)
    quota = np.minimum(totals, np.ceil(opts.spm_sample * weights / max(weights.sum(), 1e-12))).astype(np.int64)
    rng = np.random.default_rng(opts.seed)
    tasks = []
    for lang, q in zip(langs, quota):
        files = per_lang[lang]
        sizes = np.array([p.records for p, _ in files])
        shares = np.floor(q * sizes / max(sizes.sum(), 1)).astype(np.int64)
        for (part, side), k in zip(files, shares):
            if k <= 0:
                continue
            chosen = np.sort(rng.choice(part.records, size=min(int(k), part.records), replace=False))
            tasks.append((len(tasks), _sample_task, (part.paths[side], part.format, list(part_keys(inputs, part)),
                                                       chosen.tolist())))
    results: dict[int, list[str]] = {}

    def done(tag, texts):
        results[tag] = texts

    engines.run_tasks(engine, tasks, done)
    return [t for i in range(len(tasks)) for t in results[i]]


def _why_no_text(inputs: list[RawInput], opts: BinarizeOptions) -> str:
    """What the first train record of documents lacks (a --json-keys key no record has), as encoding says it."""
    for inp in inputs:
        if inp.documents and inp.split.startswith("train") and inp.parts and inp.parts[0].format != "text":
            path = inp.parts[0].paths[0]
            with RecordReader(path) as reader:
                first = reader.take(1)
            if first:
                texts, why = _fields(first[0].decode("utf-8", errors="replace"), list(inp.langs))
                if texts is None:
                    return f" ({path}: line 1 {why}; --json-keys {','.join(inp.langs)})"
    return ""


def part_keys(inputs, part) -> list[str]:
    for inp in inputs:
        if any(p is part for p in inp.parts):
            return inp.langs if inp.documents else []
    return []


def train_spm(inputs: list[RawInput], opts: BinarizeOptions, model_path: str, log, engine=None) -> None:
    import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)

    sample = _sample_for_spm(inputs, opts, engine or engines.InlineEngine())
    if not sample:
        raise BinarizeError(f"no text to train SentencePiece on: the sampled train records hold none"
                            f"{_why_no_text(inputs, opts)}")
    log(f"training SentencePiece ({opts.spm_model_type}, vocab {opts.train_spm}, character coverage "
        f"{opts.character_coverage:g}) on {len(sample):,} sampled "
        f"{'lines of documents' if opts.documents else 'sentences'} (no progress is shown until it ends)")
    t0 = time.perf_counter()
    model = io.BytesIO()
    spm.set_random_generator_seed(opts.seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=model,
            vocab_size=opts.train_spm,
            model_type=opts.spm_model_type,
            character_coverage=opts.character_coverage,
            hard_vocab_limit=False,  # small corpora cannot always fill the requested vocabulary
            num_threads=SPM_THREADS,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise BinarizeError(f"SentencePiece training failed: {e}") from None
    pieces = spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
    fewer = f", fewer than the {opts.train_spm:,} asked: the sample holds no more" if pieces < opts.train_spm else ""
    log(f"SentencePiece trained in {time.perf_counter() - t0:.1f} s: {pieces:,} pieces{fewer}")
    atomic_write(model_path, model.getvalue())


def build_dictionary(sp, dict_path: str | None, langs: list[str]) -> tuple[Dictionary, np.ndarray]:
    """The fairseq dictionary and the table mapping SentencePiece ids to its ids.

    Without ``dict_path``: every piece except SentencePiece's control/unknown symbols, in SentencePiece
    order, then ``__lang__`` tokens for ``langs`` (sorted). With it: that dictionary (pieces it lacks map to
    ``<unk>``), plus any missing language tokens appended.
    """
    if dict_path:
        d = Dictionary.load(dict_path)
    else:
        d = Dictionary()
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                d.add_symbol(sp.id_to_piece(i), 1)
    d.add_language_tokens(sorted(langs))
    table = np.array([d.index(sp.id_to_piece(i)) for i in range(sp.get_piece_size())], dtype=np.int64)
    return d, table


# ---------------------------------------------------------------------------------------------- driver
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _identity(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def _fingerprint(job: ShardJob, common: dict) -> str:
    payload = {"version": _VERSION, "job": [job.split, job.key, job.shard, list(job.line_range)],
               "files": sorted({tuple(_identity(p)) for p in job.files}), **common}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _record_path(output_dir: str, job: ShardJob) -> str:
    return os.path.join(output_dir, STATE_DIR, f"{job.name}.shard{job.shard:03d}.json")


def _is_done(output_dir: str, job: ShardJob, fingerprint: str) -> Stats | None:
    try:
        with open(_record_path(output_dir, job)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if rec.get("fingerprint") != fingerprint:
        return None
    stats = Stats(**rec["stats"])
    for lang in job.langs:
        prefix = job.out_prefix(output_dir, lang)
        if not dataset_exists(prefix):
            return None
        try:
            ds = IndexedDataset(prefix, verify="quick")
            if (len(ds.doc_idx) - 1 if job.documents else len(ds)) != (stats.kept if job.documents else stats.sequences):
                return None
        except (ValueError, OSError):
            return None
    return stats


def _existing_outputs(output_dir: str) -> set[str]:
    found = set()
    for name in os.listdir(output_dir):
        sub = os.path.join(output_dir, name)
        if name.startswith("shard") and os.path.isdir(sub):
            for f in os.listdir(sub):
                if f.endswith(".idx"):
                    found.add(os.path.join(sub, f[:-4]))
    return found


def _sweep_partials(out: str) -> int:
    """Remove the temporaries (``*.partial``) of writers that died (a killed worker cannot remove its own); run
    when no writer of this job is left. Returns how many were removed."""
    removed = 0
    for d in [out, os.path.join(out, STATE_DIR)] + [os.path.join(out, n) for n in os.listdir(out) if n.startswith("shard")]:
        if os.path.isdir(d):
            for n in os.listdir(d):
                if n.endswith(".partial"):
                    try:
                        os.unlink(os.path.join(d, n))
                        removed += 1
                    except FileNotFoundError:
                        pass
    return removed


def _count_inputs(inputs: list[RawInput], opts: BinarizeOptions, engine, log) -> None:
    """Records of every file (in parallel on the engine), remembered in ``.binarize/counts.json`` by the file's
    identity so a resumed run does not read its inputs again; then the sides of every part must agree."""
    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    cache_path = os.path.join(opts.output_dir, STATE_DIR, "counts.json")
    try:
        with open(cache_path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    files = {}
    for inp in inputs:
        for part in inp.parts:
            for p in part.paths:
                files[p] = part.kind
    results, tasks = {}, []
    for path, kind in files.items():
        key = json.dumps([_identity(path), kind, opts.chunk_lines])
        if key in cache:
            results[path] = cache[key]
        else:
            tasks.append((path, _count_task, (path, kind, opts.chunk_lines)))
    bar = tqdm(total=len(tasks), unit="file", desc="count", disable=(opts.progress is False or len(tasks) < 2)
               if opts.progress is not None else None)

    def done(path, result):
        results[path] = result
        cache[json.dumps([_identity(path), files[path], opts.chunk_lines])] = result
        bar.update(1)

    try:
        engines.run_tasks(engine, tasks, done)
    finally:
        bar.close()
    atomic_write(cache_path, json.dumps(cache).encode())
    for inp in inputs:
        for part in inp.parts:
            counts = [results[p]["records"] for p in part.paths]
            if len(set(counts)) > 1:
                raise BinarizeError(
                    f"line counts differ in {inp.split} {inp.key}: {part.paths[0]} has {counts[0]:,} lines, "
                    f"{part.paths[1]} has {counts[1]:,}"
                )
            part.records = counts[0]
            part.marks = [results[p]["marks"] for p in part.paths]
        inp.num_lines = sum(p.records for p in inp.parts)


def binarize(opts: BinarizeOptions, log=print) -> dict:
    """Run the whole job; returns the report (also written to ``DATA_BIN/binarize_report.json``). An output in an
    object store (``s3://bucket/prefix``) is written to a local staging folder in the cache first (kept: a run
    interrupted there resumes from it, as a local one does), then uploaded, ``dict.txt`` and the report last."""
    if is_remote(opts.output_dir):
        url = str(opts.output_dir).rstrip("/")
        remote.listing(url)  # (a bucket missing or credentials refused: said now, before any encoding)
        stage = remote.staging(url)
        log(f"writing to {stage} first (staging), then uploading to {url}")
        report = binarize(dataclasses.replace(opts, output_dir=stage), log)
        _replace_remote(stage, url, opts.overwrite, log)
        written = remote.upload(stage, url, log=log)
        log(f"uploaded {written / 1e6:,.1f} MB to {url}")
        return report
    return _binarize(opts, log)


def _replace_remote(stage: str, url: str, overwrite: bool, log) -> None:
    """Before ``stage`` is uploaded to ``url``: the datasets there that this run did not write (another run's
    inputs or --shards) are refused, as a local output folder's are, or deleted first with ``overwrite`` (with
    ``dict.txt`` first: a folder being replaced never looks complete). Never a folder mixing two runs' shards."""
    mine = {os.path.relpath(os.path.join(d, f), stage).replace(os.sep, "/") for d, _, fs in os.walk(stage)
            for f in fs}
    there = remote.listing(url)
    stale = sorted(n for n in there if n.endswith((".bin", ".idx")) and n not in mine)
    if not stale:
        return
    if not overwrite:
        raise BinarizeError(f"{url} holds {len(stale)} file(s) of datasets this run does not write (another run's "
                            f"inputs or --shards?), e.g. {url}/{stale[0]}; nothing was uploaded (the output is "
                            f"staged in {stage}). Use an empty prefix or --overwrite (which deletes them)")
    log(f"deleting {len(stale)} file(s) under {url} that this run does not write (--overwrite)")
    for name in [n for n in ("dict.txt",) if n in there] + stale:
        remote.delete(f"{url}/{name}")


def _binarize(opts: BinarizeOptions, log=print) -> dict:
    import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)
    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    opts.validate()
    t0 = time.perf_counter()
    if opts.documents:
        inputs, ignored = discover_documents(opts.input_dir, opts.inputs, opts.json_keys)
        what = "document files (NAME.jsonl, NAME.json or NAME.txt, compressed or not, or folders of them)"
    else:
        inputs, ignored = discover(opts.input_dir, opts.inputs, opts.pair_langs,
                                   pair_prefixes(opts.trainpref, opts.validpref, opts.testpref))
        what = "input files ({src}-{tgt}.{lang} or {split}.{lang}, compressed or not, or folders of them)"
    where = opts.input_dir or "--input"
    if ignored:
        log(f"ignored {len(ignored)} name(s) in {where} that are not named like inputs: {', '.join(ignored[:5])}"
            + (f", … ({len(ignored) - 5} more)" if len(ignored) > 5 else "") + _prefix_hint(ignored, opts)
            + _dash_hint(ignored))
    if not inputs:
        hint = ""
        if not opts.documents and any(_doc_format(n) for n in ignored):
            hint = "; for documents (JSONL, or text with blank lines between documents) add --documents"
        hint += _dash_hint(ignored)
        raise BinarizeError(f"{where}: no {what}{hint}")
    out = opts.output_dir
    os.makedirs(os.path.join(out, STATE_DIR), exist_ok=True)
    lock = _lock_output(out)
    try:
        engine = engines.make_engine(opts.engine, opts.workers, opts.ray_address)
        try:
            return _run(opts, inputs, engine, t0, log)
        except BaseException:  # interrupted, terminated or failed: the workers stop now, not after their chunks
            engine.abort()
            raise
        finally:
            engine.close()
    finally:
        os.close(lock)  # (the lock goes with the descriptor, and with the process if it dies)


def _dash_hint(ignored: list[str]) -> str:
    """Ignored names whose language holds a dash (``train.pt-BR``, ``en-pt-BR.en``): the dash separates the two
    languages of a direction, so a language code writes ``_`` (``pt_BR``), as the language flags say."""
    dashed = [n for n in ignored if len(strip_compression(n)[0].rpartition(".")[2].split("-")) == 2
              or strip_compression(n)[0].count("-") > 1]
    return (f" (a language code with a dash, as in {dashed[0]}, cannot be told from a direction src-tgt: write "
            f"it with _, e.g. pt_BR)" if dashed else "")


def _prefix_hint(ignored: list[str], opts) -> str:
    """With --source-lang/--target-lang, ignored files named PREFIX.{src} or PREFIX.{tgt} (``train.tok.en``): the
    flag that reads them."""
    langs = opts.pair_langs
    if not langs:
        return ""
    hits = sorted({strip_compression(n)[0].rpartition(".")[0] for n in ignored
                   if strip_compression(n)[0].rpartition(".")[2] in langs and "." in n})
    if not hits:
        return ""
    flag = "--testpref" if hits[0].startswith("test") else "--validpref" if hits[0].startswith(("valid", "dev")) \
        else "--trainpref"
    return (f" (fairseq's naming reads {{split}}.{langs[0]} and {{split}}.{langs[1]} where the split is train, valid "
            f"or test...; give other prefixes with --trainpref, --validpref or --testpref: {flag} "
            f"{os.path.join(opts.input_dir or '', hits[0])})")


def _lock_output(out: str) -> int:
    """An exclusive lock on the output folder for this run (two runs into one folder broke each other's work
    files): a second run is refused, naming the first (its pid, host and start)."""
    path = os.path.join(out, STATE_DIR, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
        raise BinarizeError(f"{out}: another binarize is writing into it ({holder}): wait for it to end, or write "
                            f"to another -o folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
              .encode(), 0)
    return fd


def _run(opts, inputs, engine, t0, log) -> dict:
    import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)
    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    out = opts.output_dir
    try:
        _count_inputs(inputs, opts, engine, log)
    except TextInputError as e:
        raise BinarizeError(str(e)) from None
    check_shards(inputs, opts.shards)
    paired = _paired_warnings(inputs, opts)
    for w in paired:
        log(f"WARNING: {w}")
    level = "sentence" if opts.split_sentences else "document"
    jobs = plan_jobs(inputs, opts.shards, opts.chunk_lines, level)
    planned = {job.out_prefix(out, lang) for job in jobs for lang in job.langs}
    stale = sorted(_existing_outputs(out) - planned)
    if stale and not opts.overwrite:
        raise BinarizeError(
            f"{out} holds {len(stale)} dataset(s) this run would not write (another run's inputs or --shards?), "
            f"e.g. {stale[0]}; use an empty output directory or --overwrite"
        )
    for prefix in stale:
        for ext in (".idx", ".bin"):
            os.unlink(prefix + ext)

    # SentencePiece model and dictionary
    model_path = os.path.join(out, "spm.model")
    if opts.train_spm:
        spm_record = os.path.join(out, STATE_DIR, "spm.json")
        spm_key = json.dumps({"vocab": opts.train_spm, "type": opts.spm_model_type, "seed": opts.seed,
                              "sample": opts.spm_sample, "T": opts.spm_temperature,
                              "coverage": opts.character_coverage,
                              "inputs": [(p, os.path.getsize(p)) for i in inputs for p in i.paths]}, sort_keys=True)
        reuse = os.path.exists(model_path) and os.path.exists(spm_record) and open(spm_record).read() == spm_key
        if reuse:
            log(f"reusing {model_path} trained by an earlier run with the same settings")
        else:
            try:
                train_spm(inputs, opts, model_path, log, engine)
            except TextInputError as e:
                raise BinarizeError(str(e)) from None
            atomic_write(spm_record, spm_key.encode())
    elif os.path.abspath(opts.spm_model) != os.path.abspath(model_path):
        with open(opts.spm_model, "rb") as f:
            proto = f.read()
        try:  # refuse a file that is no model before it replaces the data_bin's own
            pieces = spm.SentencePieceProcessor(model_proto=proto)
            pieces.unk_id()  # (an empty file loads as a model of no pieces, which fails later: "unk is not defined")
            usable = pieces.get_piece_size() > 0
        except Exception:
            usable = False
        if not usable:
            raise FormatError(f"--spm {opts.spm_model}: not a SentencePiece model"
                              + (" (the file is empty)" if not proto else "")) from None
        atomic_write(model_path, proto)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    if opts.documents:
        dictionary, table = None, None
        cfg = document_settings(sp, model_path, opts)
        vocab_size, dtype = cfg["vocab_size"], np.dtype(cfg["dtype"])
    else:
        langs = sorted({lg for inp in inputs for lg in inp.langs})
        dictionary, table = build_dictionary(sp, opts.dict_path, langs)
        dictionary.save(os.path.join(out, "dict.txt"))
        dtype = dtype_for_vocab(len(dictionary), opts.format)
        vocab_size = len(dictionary)
        cfg = {"eos": dictionary.eos(), "unk": dictionary.unk(), "max_len": opts.max_len, "empty": opts.empty,
               "overlong": opts.overlong, "bad_utf8": opts.bad_utf8, "dtype": dtype.name, "format": opts.format}
    cfg["block_lines"] = opts.chunk_lines
    common = {**{k: v for k, v in cfg.items()}, "spm": _sha256(model_path),
              "chunk_lines": opts.chunk_lines}
    if dictionary is not None:
        common["dict"] = _sha256(os.path.join(out, "dict.txt"))

    # Resume: skip shards recorded with the same fingerprint; redo the others from scratch.
    totals: dict[tuple, Stats] = {}
    todo = []
    for job in jobs:
        fp = _fingerprint(job, common)
        done = _is_done(out, job, fp)
        if done is not None:
            totals.setdefault((job.split, job.key), Stats()).add(done)
        else:
            todo.append((job, fp))
    skipped = len(jobs) - len(todo)
    if skipped:
        log(f"resuming: {skipped} of {len(jobs)} shard(s) already finalized, {len(todo)} to do")
    # Each run writes its chunks in a folder of its own: a worker of a killed run that is still going cannot
    # write into this run's files, and the folders of earlier runs are removed.
    work_root = os.path.join(out, STATE_DIR, "work")
    shutil.rmtree(work_root, ignore_errors=True)
    work_dir = os.path.join(work_root, uuid.uuid4().hex[:12])
    os.makedirs(work_dir)

    pending = {(job.split, job.key, job.shard): (job, fp, [None] * len(job.chunks), Stats()) for job, fp in todo}
    total_lines = sum(job.line_range[1] - job.line_range[0] for job, _ in todo)
    bar = tqdm(total=total_lines, unit="doc" if opts.documents else "sent", unit_scale=True, desc="binarize",
               disable=opts.progress is False if opts.progress is not None else None)
    cfg = {**cfg, "fault": engines.fault_spec()}  # a test hook, not part of the fingerprint
    engine.set_context((sp.serialized_model_proto(), table, cfg))
    t_encode = time.perf_counter()
    tasks = []
    for job, fp in todo:
        if job.chunks:
            tasks.extend((("chunk", ch.shard_key), _encode_chunk, (ch, work_dir)) for ch in job.chunks)
        else:  # an empty input still gets its (empty) files
            tasks.append((("merge", (job.split, job.key, job.shard)), _merge, (job, [], out, cfg)))

    def done(tag, result):
        if tag[0] == "chunk":
            key, index, stats, prefixes = result
            job, fp, parts, shard_stats = pending[key]
            parts[index] = prefixes
            shard_stats.add(stats)
            bar.update(stats.lines)
            if all(p is not None for p in parts):
                return [(("merge", key), _merge, (job, parts, out, cfg))]
            return ()
        job, fp, parts, shard_stats = pending.pop(result)
        _finish(job, fp, shard_stats, out, totals)
        for chunk_parts in parts:
            for prefix in chunk_parts:
                for ext in (".bin", ".idx"):
                    os.unlink(prefix + ext)
        return ()

    try:
        try:
            engines.run_tasks(engine, tasks, done)
        except TextInputError as e:
            raise BinarizeError(str(e)) from None
    finally:
        bar.close()
    shutil.rmtree(work_root, ignore_errors=True)
    _sweep_partials(out)

    elapsed = time.perf_counter() - t0
    report = _report(totals, inputs, opts, vocab_size, dtype, elapsed, engine, total_lines)
    report["encode_seconds"] = round(time.perf_counter() - t_encode, 3)  # without SentencePiece training
    report["warnings"] = paired + report["warnings"] + _output_warnings(jobs, out, report["inputs"], opts)
    report["shards_done_before"] = skipped  # shards a resumed run found done: their counts are the recorded ones
    report["shards_total"] = len(jobs)
    if opts.documents:
        report["documents"] = {"json_keys": list(opts.json_keys), "level": level, "eod": cfg["eod"],
                               "append_eod": cfg["append_eod"],
                               "data_path": megatron_data_path(jobs, out, totals)}
    atomic_write(os.path.join(out, REPORT), json.dumps(report, indent=2).encode())
    return report


def megatron_data_path(jobs: list[ShardJob], out: str, totals) -> dict:
    """Per JSON key, a Megatron ``--data-path`` string over every corpus and shard, weighted by tokens (so the
    blend follows the data's own proportions; edit the weights to change them)."""
    paths: dict[str, list[str]] = {}
    for job in jobs:
        for lang in job.langs:
            prefix = job.out_prefix(out, lang)
            tokens = IndexedDataset(prefix, verify="quick").num_tokens if dataset_exists(prefix) else 0
            if tokens:
                paths.setdefault(lang, []).append(f"{tokens} {os.path.abspath(prefix)}")
    return {k: " ".join(v) for k, v in paths.items()}


def _finish(job, fp, stats, out, totals) -> None:
    record = {"fingerprint": fp, "stats": asdict(stats)}
    atomic_write(_record_path(out, job), json.dumps(record).encode())
    fsync_dir(os.path.join(out, STATE_DIR))
    totals.setdefault((job.split, job.key), Stats()).add(stats)


def _report(totals, inputs, opts, vocab_size, dtype, elapsed, engine, processed) -> dict:
    entries = []
    for inp in inputs:
        st = totals.get((inp.split, inp.key), Stats())
        entries.append({"split": inp.split, "key": inp.key, "files": inp.paths, **asdict(st), "dropped": st.dropped,
                        "unk_chars": st.top_unk(UNK_TOP), "unk_char_kinds": len(st.unk_chars)})
    policies = {"empty": opts.empty, "bad_utf8": opts.bad_utf8}
    if opts.documents:
        policies["bad_record"] = opts.bad_record
    else:
        policies.update(overlong=opts.overlong, max_len=opts.max_len)
    return {
        "output": opts.output_dir,
        "format": "megatron" if opts.documents else opts.format,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "shards": opts.shards,
        "policies": policies,
        "engine": engine.name,
        "workers": engine.workers,
        "seconds": round(elapsed, 3),
        "lines_processed_this_run": processed,
        # the model's origin, for what the report says about <unk>
        "spm": {"trained": bool(opts.train_spm), "dict": bool(opts.dict_path),
                "character_coverage": opts.character_coverage if opts.train_spm else None},
        "inputs": entries,
        "warnings": _drop_warnings(entries, opts),
    }


def _paired_warnings(inputs: list[RawInput], opts) -> list[str]:
    """Monolingual inputs of one split with the same line count (fairseq's ``train.en`` and ``train.de``): most
    likely the two sides of a direction, read apart. The binarize succeeded and the mistake showed only at plan
    (no directions), so it is said here, with the command that reads them as a direction."""
    by_langs: dict[tuple, list] = {}
    for group in looks_paired(inputs):
        by_langs.setdefault(tuple(i.key for i in group), []).append(group)
    out = []
    for langs, groups in by_langs.items():
        files = [p for g in groups for i in g for p in i.paths]
        seen = "; ".join(f"{', '.join(f'{g[0].split}.{i.key}' for i in g)}: {g[0].num_lines:,} lines each"
                         for g in groups)
        head = (f"{', '.join(files[:6])}{' ...' if len(files) > 6 else ''} were read as monolingual text, one "
                f"corpus per language ({seen}), but they look like the sides of parallel text (fairseq's naming, "
                f"PREFIX.SRC and PREFIX.TGT), which plan cannot use as a direction")
        if len(langs) != 2:
            out.append(f"{head}: to read two of them as a direction, binarize with --source-lang SRC --target-lang TGT "
                       f"naming those two")
            continue
        a, b = langs
        replace = " (--overwrite replaces the monolingual datasets written here)"
        if not all(i.origin == i.paths[0] for g in groups for i in g):  # a folder or --input: the flags read files
            fix = (f"name them as a direction: {{split}}.{a}-{b}.{{lang}} files, a {{split}}.{a}-{b}/ folder of "
                   f"NAME.{a} and NAME.{b} files, or --input {{split}}.{a}-{b}=GLOB with {{lang}} in the glob")
        elif opts.source_lang is not None:  # a direction is given already: one per run
            fix = (f"binarize them in a run of their own with --source-lang {a} --target-lang {b} (one direction "
                   f"per run of these flags)")
        elif opts.command:
            cmd = list(opts.command) + ["--source-lang", a, "--target-lang", b]
            cmd += [] if "--overwrite" in cmd else ["--overwrite"]
            fix = f"rerun as: {shlex.join(cmd)}{replace}"
        else:
            fix = (f"binarize again with BinarizeOptions(..., source_lang={a!r}, target_lang={b!r}, overwrite=True)"
                   f"{replace}")
        out.append(f"{head}. If they are the direction {a}-{b} (or {b}-{a}: swap the two), {fix}")
    return out


def _drop_warnings(entries: list[dict], opts) -> list[str]:
    """An input that lost more than ``--max-dropped`` of its lines (or documents) for any reason: said loudly at
    the end of the report, with the reasons (a wrong encoding, a --max-len too small, an export gone wrong)."""
    out = []
    unit = "documents" if opts.documents else "lines"
    for e in entries:
        n, dropped = e.get("lines", 0), e.get("dropped", 0)
        if n and dropped / n > opts.max_dropped:
            why = ", ".join(f"{e.get(k, 0):,} {name}" for k, name in (("empty", "empty"), ("overlong", "overlong"),
                                                                      ("bad_utf8", "undecodable or NUL"),
                                                                      ("bad_record", "bad records")) if e.get(k))
            out.append(f"{e['split']}.{e['key']} lost {dropped:,} of its {n:,} {unit} ({dropped / n:.1%}: {why}), "
                       f"more than --max-dropped {opts.max_dropped:g}: check its files ({', '.join(e['files'][:2])})")
    return out


UNK_SHARE = 0.05  # an input more <unk> than this: the SentencePiece model does not cover its text
UNK_TOP = 20  # what became <unk> most often, per input, kept in the report


def _output_warnings(jobs: list[ShardJob], out: str, entries: list[dict], opts) -> list[str]:
    """What the counts table shows but nobody reads: an input whose tokens are largely ``<unk>`` (a model trained
    on other scripts), and shards left empty (more shards than a small input's kept lines; training under
    ``data.shards='cycle'`` refuses an empty shard at build)."""
    out_warnings = []
    for e in entries:
        tokens = sum(e.get("tokens", {}).values()) if isinstance(e.get("tokens"), dict) else 0
        unk = e.get("unk_tokens", 0)
        if tokens and unk / tokens > UNK_SHARE:
            fix = ("train one on this data (--train-spm)" if opts.spm_model else
                   "the characters the trained model left out are rare in the training sample: "
                   "--character-coverage 1.0 gives each of the sample's characters a piece")
            out_warnings.append(f"{e['split']}.{e['key']}: {unk:,} of its {tokens:,} tokens ({unk / tokens:.1%}) are "
                                f"<unk>: the SentencePiece model does not cover this text (another script or "
                                f"language?); {fix}")
    empty = []
    for job in jobs:
        prefix = job.out_prefix(out, job.langs[0])
        if dataset_exists(prefix) and len(IndexedDataset(prefix, verify="quick")) == 0:
            empty.append(f"{job.split}.{job.key} shard{job.shard:03d}")
    if empty:
        out_warnings.append(f"{len(empty)} shard(s) hold no {'documents' if opts.documents else 'sentences'}: "
                            f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''} (more shards than kept "
                            f"lines); data.shards='cycle' refuses an empty shard: binarize with fewer --shards")
    return out_warnings


def format_report(report: dict) -> str:
    """A human summary of a binarize report: one line per input, then the drop totals and their policy."""
    docs = "documents" in report
    lines = []
    w = max([len(f"{e['split']}.{e['key']}") for e in report["inputs"]] + [10])
    if docs:
        lines.append(f"{'corpus':<{w}}  {'documents':>10} {'kept':>10} {'empty':>7} {'bad json':>8} {'bad utf8':>8} "
                     f"{'sequences':>10} {'tokens':>12}")
    else:
        lines.append(f"{'input':<{w}}  {'lines':>10} {'kept':>10} {'empty':>7} {'overlong':>8} {'bad utf8':>8} "
                     f"{'unk tok':>8}")
    tot = Stats()
    for e in report["inputs"]:
        st = Stats(**{k: e.get(k, 0) for k in Stats._COUNTS}, tokens=e["tokens"])
        tot.add(st)
        name = e["key"] if docs else e["split"] + "." + e["key"]
        if docs:
            lines.append(f"{name:<{w}}  {st.lines:>10,} {st.kept:>10,} {st.empty:>7,} {st.bad_record:>8,} "
                         f"{st.bad_utf8:>8,} {st.sequences:>10,} {sum(st.tokens.values()):>12,}")
        else:
            lines.append(f"{name:<{w}}  {st.lines:>10,} {st.kept:>10,} {st.empty:>7,} {st.overlong:>8,} "
                         f"{st.bad_utf8:>8,} {st.unk_tokens:>8,}")
    p = report["policies"]
    if docs:
        d = report["documents"]
        lines.append(
            f"{tot.kept:,} of {tot.lines:,} documents kept; dropped {tot.empty:,} empty, {tot.bad_record:,} bad "
            f"records, {tot.bad_utf8:,} undecodable (policies: empty={p['empty']}, bad_record={p['bad_record']}, "
            f"bad_utf8={p['bad_utf8']}); replaced {tot.replaced_utf8:,}; one sequence per {d['level']}, "
            + (f"end-of-document id {d['eod']} appended" if d["append_eod"] else "no end-of-document token"))
        lines.append(f"{_work_done(report, 'documents')}; vocabulary {report['vocab_size']:,} -> {report['dtype']} "
                     f"megatron files in {report['output']}")
        for key, path in d["data_path"].items():
            lines.append(f"Megatron --data-path ({key}, weighted by tokens): {path}")
        lines += [f"WARNING: {w}" for w in report.get("warnings", [])]
        return "\n".join(lines)
    for e in report["inputs"]:
        if e["lines"] and not e["kept"]:
            lines.append(f"warning: {e['split']}.{e['key']} kept nothing: the policies below dropped all its "
                         f"{e['lines']:,} lines")
    lines.append(
        f"{tot.kept:,} of {tot.lines:,} sentences (pairs) kept; dropped {tot.empty:,} empty, {tot.overlong:,} over "
        f"{p['max_len']} tokens, {tot.bad_utf8:,} undecodable (policies: empty={p['empty']}, "
        f"overlong={p['overlong']}, bad_utf8={p['bad_utf8']}); truncated {tot.truncated:,}, replaced {tot.replaced_utf8:,}"
    )
    lines += _unk_notes(report, tot)
    lines.append(f"{_work_done(report, 'lines')}; vocabulary {report['vocab_size']:,} -> {report['dtype']} "
                 f"{report['format']} files in {report['output']}")
    lines += [f"WARNING: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def _work_done(report: dict, unit: str) -> str:
    """What this run encoded and how fast; a resumed run that found shards done says so, and a run that found
    them all done encoded nothing (its table is the counts recorded when the shards were written)."""
    encode = report.get("encode_seconds", report["seconds"])
    processed = report["lines_processed_this_run"]
    done, total = report.get("shards_done_before", 0), report.get("shards_total", 0)
    where = f"{report['workers']} worker(s) on {report.get('engine', 'local')}"
    if done and done == total:
        return (f"all {total:,} shard(s) were already done by an earlier run: nothing encoded, the table is the "
                f"counts recorded then ({report['seconds']:.1f} s in all)")
    rate = f"{processed / encode:,.0f} {'documents' if unit == 'documents' else 'sentences'}/s, " if encode else ""
    before = (f"; {done:,} of {total:,} shard(s) were already done by an earlier run (their counts in the table are "
              f"the recorded ones)" if done else "")
    return (f"{processed:,} {unit} encoded in {encode:.1f} s ({rate}{where}; {report['seconds']:.1f} s in all)"
            f"{before}")


def _shown(ch: str) -> str:
    """A character (or piece) of the <unk> notes, quoted; an invisible one by its code point."""
    if len(ch) == 1 and (not ch.isprintable() or ch.isspace()):
        return f"U+{ord(ch):04X}"
    return repr(ch)


def _unk_notes(report: dict, tot: Stats) -> list[str]:
    """The footnote of the ``unk tok`` column: what it counts, what became <unk> in each input, and how to lower
    it (a trained model: --character-coverage 1.0; any model: byte fallback)."""
    what = "unk tok: tokens encoded as <unk>, text the SentencePiece model has no piece for"
    if not tot.unk_tokens:
        return [f"{what}: none"]
    sp = report.get("spm") or {}
    dict_too = ", or a piece of it that --dict lacks (listed with its \u2581 for a space)" if sp.get("dict") else ""
    out = [f"{what} (a run of such characters is one <unk>){dict_too}; what became <unk>, with its occurrences:"]
    for e in report["inputs"]:
        chars = e.get("unk_chars") or {}
        if e.get("unk_tokens") and chars:
            shown = ", ".join(f"{_shown(ch)} {n:,}" for ch, n in list(chars.items())[:10])
            kinds = e.get("unk_char_kinds", len(chars))
            more = f" and {kinds - 10:,} more" if kinds > 10 else ""
            out.append(f"  {e['split']}.{e['key']}: {shown}{more}")
    coverage = sp.get("character_coverage")
    if sp.get("trained") and coverage is not None and coverage < 1:
        fix = (f"train with --character-coverage 1.0 (this model covers {coverage:g} of the sample's characters: "
               f"the rarest are left out; a character absent from the sample stays <unk> even then), or use a model "
               f"with byte fallback (--spm)")
    elif sp.get("trained"):
        fix = ("these characters are not in the training sample (--spm-sample, drawn from the train split) even at "
               "--character-coverage 1.0: use a model with byte fallback (--spm)")
    else:
        fix = ("the model given with --spm lacks them: train one on this data (--train-spm VOCAB "
               "--character-coverage 1.0), or use a model with byte fallback")
    out.append(f"  to lower it: {fix}")
    return out
