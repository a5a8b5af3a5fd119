"""``babelfeed binarize``: raw text -> SentencePiece -> a sharded data_bin of ``.idx``/``.bin`` files.

Output (Open-NLLB's layout, readable by fairseq and by :class:`babelfeed.ShardedCorpus`)::

    DATA_BIN/dict.txt                                 fairseq dictionary, language tokens __xx__ last
    DATA_BIN/spm.model                                the SentencePiece model used
    DATA_BIN/shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx}   train splits cut into --shards shards
    DATA_BIN/shard000/{split}.{lang}.{bin,idx}        monolingual; valid/test live in shard000 only
    DATA_BIN/binarize_report.json                     kept and dropped counts per split and direction

Every sentence ends with ``</s>`` (id 2). The work is cut into chunks of lines that worker processes encode
in parallel; chunks are merged into their shard, which is then renamed into place atomically and recorded
in ``DATA_BIN/.binarize/`` with a fingerprint of its inputs and settings. A re-run skips every recorded shard
whose fingerprint still matches and redoes the rest, so a killed run resumes where it stopped.

Bad lines follow an explicit policy, applied to the whole pair so that both sides stay aligned:
``empty`` (blank after stripping), ``overlong`` (more than ``max_len`` tokens with ``</s>``) and
``bad_utf8`` (undecodable bytes). Each is counted and reported at the end; none is dropped silently.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from itertools import chain

import numpy as np

from .binarize_options import POLICIES, BinarizeOptions, check_shards
from .dictionary import Dictionary
from .rawtext import BinarizeError, RawInput, count_lines, decode_lines, discover, line_offsets, read_lines
from .fileio import atomic_write, fsync_dir
from .storage.builder import IndexedDatasetBuilder
from .storage.dtypes import dtype_for_vocab
from .storage.indexed import IndexedDataset, dataset_exists

STATE_DIR = ".binarize"
REPORT = "binarize_report.json"
_VERSION = 1


@dataclass
class Stats:
    lines: int = 0
    kept: int = 0
    empty: int = 0
    overlong: int = 0
    bad_utf8: int = 0
    truncated: int = 0
    replaced_utf8: int = 0
    unk_tokens: int = 0
    tokens: dict = field(default_factory=dict)  # lang -> tokens kept (</s> included)

    def add(self, other: "Stats") -> None:
        for k in ("lines", "kept", "empty", "overlong", "bad_utf8", "truncated", "replaced_utf8", "unk_tokens"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for lang, n in other.tokens.items():
            self.tokens[lang] = self.tokens.get(lang, 0) + n

    @property
    def dropped(self) -> int:
        return self.empty + self.overlong + self.bad_utf8


# ---------------------------------------------------------------------------------------------- planning
@dataclass
class Chunk:
    shard_key: tuple  # (split, key, shard)
    index: int  # chunk number within its shard
    line_start: int  # first line (0-based, in the input file)
    byte_ranges: list  # per side: (path, start, end)
    langs: list


@dataclass
class ShardJob:
    split: str
    key: str
    shard: int
    langs: list
    line_range: tuple
    chunks: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.split}.{self.key}"

    def out_prefix(self, output_dir: str, lang: str) -> str:
        stem = f"{self.split}.{self.key}.{lang}" if "-" in self.key else f"{self.split}.{self.key}"
        return os.path.join(output_dir, f"shard{self.shard:03d}", stem)


def plan_jobs(inputs: list[RawInput], shards: int, chunk_lines: int) -> list[ShardJob]:
    jobs = []
    for inp in inputs:
        n_shards = shards if inp.split.startswith("train") else 1
        bounds = [round(k * inp.num_lines / n_shards) for k in range(n_shards + 1)]
        cuts = sorted({b for lo, hi in zip(bounds, bounds[1:]) for b in range(lo, hi, chunk_lines)} | set(bounds))
        offsets = [dict(zip(cuts, line_offsets(p, cuts))) for p in inp.paths]
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            job = ShardJob(inp.split, inp.key, s, inp.langs, (lo, hi))
            starts = [c for c in cuts if lo <= c < hi]
            for i, start in enumerate(starts):
                end = starts[i + 1] if i + 1 < len(starts) else hi
                ranges = [(p, off[start], off[end]) for p, off in zip(inp.paths, offsets)]
                job.chunks.append(Chunk((inp.split, inp.key, s), i, start, ranges, inp.langs))
            jobs.append(job)
    return jobs


# ---------------------------------------------------------------------------------------------- workers
_WORKER: dict = {}


def _init_worker(spm_bytes: bytes, table: np.ndarray, settings: dict) -> None:
    import sentencepiece as spm

    _WORKER["sp"] = spm.SentencePieceProcessor(model_proto=spm_bytes)
    _WORKER["table"] = table
    _WORKER["settings"] = settings


def _encode_chunk(chunk: Chunk, work_dir: str) -> tuple[Chunk, Stats, list[str]]:
    sp, table, cfg = _WORKER["sp"], _WORKER["table"], _WORKER["settings"]
    eos, unk, max_len = cfg["eos"], cfg["unk"], cfg["max_len"]
    sides_text, sides_bad = [], []
    n = None
    for path, start, end in chunk.byte_ranges:
        texts, bad = decode_lines(read_lines(path, start, end))
        if n is not None and len(texts) != n:
            raise BinarizeError(f"{path}: line range from byte {start} holds {len(texts)} lines, its pair {n}")
        n = len(texts)
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
            path = chunk.byte_ranges[side][0]
            what = {"empty": "is empty", "bad_utf8": "is not valid UTF-8",
                    "overlong": f"has more than {max_len} tokens (</s> included)"}[name]
            raise BinarizeError(f"{path}: line {chunk.line_start + i + 1} {what} (policy --on-{name.replace('_', '-')}=error)")

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
        stats.overlong = int(over_any.sum())
        keep &= ~over_any
    elif cfg["overlong"] == "truncate":
        stats.truncated = int(over_any.sum())
    stats.kept = int(keep.sum())

    prefixes = []
    for side, (flat, lengths) in enumerate(encoded):
        lang = chunk.langs[side]
        starts = np.cumsum(lengths) - lengths
        cap = np.minimum(lengths, max_len - 1) if cfg["overlong"] == "truncate" else lengths
        cap = np.where(keep, cap, 0)
        # Gather the kept tokens of every kept sentence and put </s> after each, in one vectorised pass.
        pos = np.arange(len(flat)) - np.repeat(starts, lengths)
        take = pos < np.repeat(cap, lengths)
        tokens = flat[take]
        out_len = cap[keep] + 1
        out = np.empty(int(out_len.sum()), dtype=np.int64)
        ends = np.cumsum(out_len)
        is_eos = np.zeros(len(out), dtype=bool)
        is_eos[ends - 1] = True
        out[is_eos] = eos
        out[~is_eos] = tokens
        stats.unk_tokens += int((tokens == unk).sum())
        stats.tokens[lang] = int(len(out))
        prefix = os.path.join(work_dir, f"{chunk.shard_key[0]}.{chunk.shard_key[1]}.{chunk.shard_key[2]}.{chunk.index}.{lang}")
        builder = IndexedDatasetBuilder(prefix, cfg["dtype"], format=cfg["format"])
        try:
            builder.add_items(out, out_len, one_document_each=True)
            builder.finalize()
        except BaseException:
            builder.abort()
            raise
        prefixes.append(prefix)
    return chunk, stats, prefixes


# ---------------------------------------------------------------------------------------------- SentencePiece
def _sample_for_spm(inputs: list[RawInput], opts: BinarizeOptions) -> list[str]:
    """A temperature-balanced sample of train lines per language, so small languages get pieces too."""
    per_lang: dict[str, list[tuple[str, int]]] = {}
    for inp in inputs:
        if inp.split.startswith("train"):
            for lang, path in zip(inp.langs, inp.paths):
                per_lang.setdefault(lang, []).append((path, inp.num_lines))
    if not per_lang:
        raise BinarizeError(f"{opts.input_dir}: no train split to train SentencePiece on")
    langs = sorted(per_lang)
    totals = np.array([sum(n for _, n in per_lang[lg]) for lg in langs], dtype=np.float64)
    weights = np.where(totals > 0, totals, 0) ** (1.0 / opts.spm_temperature)
    quota = np.minimum(totals, np.ceil(opts.spm_sample * weights / max(weights.sum(), 1e-12))).astype(np.int64)
    rng = np.random.default_rng(opts.seed)
    sample = []
    for lang, q in zip(langs, quota):
        files = per_lang[lang]
        sizes = np.array([n for _, n in files])
        shares = np.floor(q * sizes / max(sizes.sum(), 1)).astype(np.int64)
        for (path, n), k in zip(files, shares):
            if k <= 0:
                continue
            chosen = np.sort(rng.choice(n, size=min(int(k), n), replace=False))
            starts = line_offsets(path, chosen.tolist())
            with open(path, "rb") as f:  # one open per file, one seek per sampled line
                for a in starts:
                    f.seek(a)
                    text = f.readline().decode("utf-8", errors="replace").strip()
                    if text:
                        sample.append(text)
    return sample


def train_spm(inputs: list[RawInput], opts: BinarizeOptions, model_path: str, log) -> None:
    import sentencepiece as spm

    sample = _sample_for_spm(inputs, opts)
    log(f"training SentencePiece ({opts.spm_model_type}, vocab {opts.train_spm}) on {len(sample):,} sampled sentences "
        f"(no progress is shown until it ends)")
    t0 = time.perf_counter()
    model = io.BytesIO()
    spm.set_random_generator_seed(opts.seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=model,
            vocab_size=opts.train_spm,
            model_type=opts.spm_model_type,
            character_coverage=opts.spm_character_coverage,
            hard_vocab_limit=False,  # small corpora cannot always fill the requested vocabulary
            num_threads=max(1, opts.workers or os.cpu_count() or 1),
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


def _fingerprint(job: ShardJob, common: dict) -> str:
    files = []
    for ch in job.chunks[:1] + job.chunks[-1:]:
        for path, _, _ in ch.byte_ranges:
            st = os.stat(path)
            files.append((os.path.abspath(path), st.st_size, st.st_mtime_ns))
    payload = {"version": _VERSION, "job": [job.split, job.key, job.shard, list(job.line_range)],
               "files": sorted(set(files)), **common}
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
            if len(IndexedDataset(prefix, verify="quick")) != stats.kept:
                return None
        except (ValueError, OSError):
            return None
    return stats


def _merge(job: ShardJob, parts: list[list[str]], output_dir: str, cfg: dict) -> None:
    os.makedirs(os.path.join(output_dir, f"shard{job.shard:03d}"), exist_ok=True)
    for side, lang in enumerate(job.langs):
        builder = IndexedDatasetBuilder(job.out_prefix(output_dir, lang), cfg["dtype"], format=cfg["format"])
        try:
            for chunk_parts in parts:
                builder.add_index(chunk_parts[side])
            builder.finalize()
        except BaseException:
            builder.abort()
            raise
        for chunk_parts in parts:
            for ext in (".bin", ".idx"):
                os.unlink(chunk_parts[side] + ext)


def _existing_outputs(output_dir: str) -> set[str]:
    found = set()
    for name in os.listdir(output_dir):
        sub = os.path.join(output_dir, name)
        if name.startswith("shard") and os.path.isdir(sub):
            for f in os.listdir(sub):
                if f.endswith(".idx"):
                    found.add(os.path.join(sub, f[:-4]))
    return found


def binarize(opts: BinarizeOptions, log=print) -> dict:
    """Run the whole job; returns the report (also written to ``DATA_BIN/binarize_report.json``)."""
    import sentencepiece as spm
    from tqdm.auto import tqdm

    opts.validate()
    workers = opts.workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    inputs, ignored = discover(opts.input_dir)
    if ignored:
        log(f"ignored {len(ignored)} file(s) in {opts.input_dir} that are not named like inputs: {', '.join(ignored[:5])}")
    if not inputs:
        raise BinarizeError(f"{opts.input_dir}: no input files ({{src}}-{{tgt}}.{{lang}} or {{split}}.{{lang}})")
    for inp in inputs:
        counts = [count_lines(p) for p in inp.paths]
        if len(set(counts)) > 1:
            raise BinarizeError(
                f"line counts differ in {inp.split} {inp.key}: {inp.paths[0]} has {counts[0]:,} lines, "
                f"{inp.paths[1]} has {counts[1]:,}"
            )
        inp.num_lines = counts[0]
    check_shards(inputs, opts.shards)

    out = opts.output_dir
    os.makedirs(os.path.join(out, STATE_DIR), exist_ok=True)
    jobs = plan_jobs(inputs, opts.shards, opts.chunk_lines)
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
                              "coverage": opts.spm_character_coverage,
                              "inputs": [(p, os.path.getsize(p)) for i in inputs for p in i.paths]}, sort_keys=True)
        reuse = os.path.exists(model_path) and os.path.exists(spm_record) and open(spm_record).read() == spm_key
        if reuse:
            log(f"reusing {model_path} trained by an earlier run with the same settings")
        else:
            train_spm(inputs, opts, model_path, log)
            atomic_write(spm_record, spm_key.encode())
    elif os.path.abspath(opts.spm_model) != os.path.abspath(model_path):
        with open(opts.spm_model, "rb") as f:
            proto = f.read()
        try:  # refuse a file that is no model before it replaces the data_bin's own
            spm.SentencePieceProcessor(model_proto=proto)
        except Exception:
            raise ValueError(f"--spm {opts.spm_model}: not a SentencePiece model") from None
        atomic_write(model_path, proto)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    langs = sorted({lg for inp in inputs for lg in inp.langs})
    dictionary, table = build_dictionary(sp, opts.dict_path, langs)
    dictionary.save(os.path.join(out, "dict.txt"))
    dtype = dtype_for_vocab(len(dictionary), opts.format)
    cfg = {"eos": dictionary.eos(), "unk": dictionary.unk(), "max_len": opts.max_len, "empty": opts.empty,
           "overlong": opts.overlong, "bad_utf8": opts.bad_utf8, "dtype": dtype.name, "format": opts.format}
    common = {**cfg, "spm": _sha256(model_path), "dict": _sha256(os.path.join(out, "dict.txt")),
              "chunk_lines": opts.chunk_lines}

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
    work_dir = os.path.join(out, STATE_DIR, "work")
    shutil.rmtree(work_dir, ignore_errors=True)  # chunks of a killed run are redone
    os.makedirs(work_dir)

    pending = {(job.split, job.key, job.shard): (job, fp, [None] * len(job.chunks), Stats()) for job, fp in todo}
    chunks = [ch for job, _ in todo for ch in job.chunks]
    for job, fp in todo:
        if not job.chunks:  # an empty input still gets its (empty) files
            _finish(job, fp, [], Stats(), out, cfg, totals)
    total_lines = sum(job.line_range[1] - job.line_range[0] for job, _ in todo)
    bar = tqdm(total=total_lines, unit="sent", unit_scale=True, desc="binarize", disable=opts.progress is False
               if opts.progress is not None else None)
    args = (sp.serialized_model_proto(), table, cfg)
    t_encode = time.perf_counter()
    try:
        if workers == 1 or len(chunks) <= 1:
            _init_worker(*args)
            results = (_encode_chunk(ch, work_dir) for ch in chunks)
            _consume(results, pending, out, cfg, totals, bar)
        else:
            ctx = mp.get_context("spawn")
            with ctx.Pool(min(workers, len(chunks)), initializer=_init_worker, initargs=args) as pool:
                results = pool.imap_unordered(_EncodeCall(work_dir), chunks)
                _consume(results, pending, out, cfg, totals, bar)
    finally:
        bar.close()
    shutil.rmtree(work_dir, ignore_errors=True)

    elapsed = time.perf_counter() - t0
    report = _report(totals, inputs, opts, dictionary, dtype, elapsed, workers, total_lines)
    report["encode_seconds"] = round(time.perf_counter() - t_encode, 3)  # without SentencePiece training
    atomic_write(os.path.join(out, REPORT), json.dumps(report, indent=2).encode())
    return report


class _EncodeCall:
    """Picklable callable for Pool.imap_unordered (spawned workers cannot receive lambdas)."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir

    def __call__(self, chunk: Chunk):
        return _encode_chunk(chunk, self.work_dir)


def _consume(results, pending, out, cfg, totals, bar) -> None:
    for chunk, stats, prefixes in results:
        job, fp, parts, shard_stats = pending[chunk.shard_key]
        parts[chunk.index] = prefixes
        shard_stats.add(stats)
        bar.update(stats.lines)
        if all(p is not None for p in parts):
            _finish(job, fp, parts, shard_stats, out, cfg, totals)


def _finish(job, fp, parts, stats, out, cfg, totals) -> None:
    _merge(job, parts, out, cfg)  # an empty input gets its (empty) files too
    record = {"fingerprint": fp, "stats": asdict(stats)}
    atomic_write(_record_path(out, job), json.dumps(record).encode())
    fsync_dir(os.path.join(out, STATE_DIR))
    totals.setdefault((job.split, job.key), Stats()).add(stats)


def _report(totals, inputs, opts, dictionary, dtype, elapsed, workers, processed) -> dict:
    entries = []
    for inp in inputs:
        st = totals.get((inp.split, inp.key), Stats())
        entries.append({"split": inp.split, "key": inp.key, "files": inp.paths, **asdict(st), "dropped": st.dropped})
    return {
        "output": opts.output_dir,
        "format": opts.format,
        "dtype": dtype.name,
        "vocab_size": len(dictionary),
        "shards": opts.shards,
        "policies": {"empty": opts.empty, "overlong": opts.overlong, "bad_utf8": opts.bad_utf8,
                     "max_len": opts.max_len},
        "workers": workers,
        "seconds": round(elapsed, 3),
        "lines_processed_this_run": processed,
        "inputs": entries,
    }


def format_report(report: dict) -> str:
    """A human summary of a binarize report: one line per input, then the drop totals and their policy."""
    lines = []
    w = max([len(f"{e['split']}.{e['key']}") for e in report["inputs"]] + [10])
    lines.append(f"{'input':<{w}}  {'lines':>10} {'kept':>10} {'empty':>7} {'overlong':>8} {'bad utf8':>8} {'unk tok':>8}")
    tot = Stats()
    for e in report["inputs"]:
        st = Stats(**{k: e[k] for k in ("lines", "kept", "empty", "overlong", "bad_utf8", "truncated",
                                          "replaced_utf8", "unk_tokens", "tokens")})
        tot.add(st)
        lines.append(f"{e['split'] + '.' + e['key']:<{w}}  {st.lines:>10,} {st.kept:>10,} {st.empty:>7,} "
                     f"{st.overlong:>8,} {st.bad_utf8:>8,} {st.unk_tokens:>8,}")
    encode = report.get("encode_seconds", report["seconds"])
    rate = report["lines_processed_this_run"] / encode if encode else 0.0
    p = report["policies"]
    lines.append(
        f"{tot.kept:,} of {tot.lines:,} sentences (pairs) kept; dropped {tot.empty:,} empty, {tot.overlong:,} over "
        f"{p['max_len']} tokens, {tot.bad_utf8:,} undecodable (policies: empty={p['empty']}, "
        f"overlong={p['overlong']}, bad_utf8={p['bad_utf8']}); truncated {tot.truncated:,}, replaced {tot.replaced_utf8:,}"
    )
    lines.append(
        f"{report['lines_processed_this_run']:,} lines encoded in {encode:.1f} s ({rate:,.0f} sentences/s, "
        f"{report['workers']} worker(s); {report['seconds']:.1f} s in all); vocabulary {report['vocab_size']:,} -> "
        f"{report['dtype']} {report['format']} files in {report['output']}"
    )
    return "\n".join(lines)
