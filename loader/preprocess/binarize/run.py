"""The binarize driver: inputs found and counted, SentencePiece trained, shards encoded by an engine and
recorded, the report written."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict

import numpy as np

from babelfeed.errors import BinarizeError, FormatError, TextInputError
from babelfeed.fileio import atomic_write, fsync_dir
from babelfeed.preprocess import engines
from babelfeed.preprocess.binarize.encode import _count_task, _encode_chunk, _merge
from babelfeed.preprocess.binarize.jobs import plan_jobs
from babelfeed.preprocess.binarize.records import (STATE_DIR, _existing_outputs, _fingerprint, _identity, _is_done,
                                                   _lock_output, _record_path, _sha256, _sweep_partials)
from babelfeed.preprocess.binarize.report import REPORT, _output_warnings, _paired_warnings, _report, megatron_data_path
from babelfeed.preprocess.binarize.spm import build_dictionary, train_spm
from babelfeed.preprocess.documents import document_settings
from babelfeed.preprocess.options import BinarizeOptions, check_shards
from babelfeed.preprocess.rawtext import RawInput, _doc_format, discover, discover_documents, pair_prefixes
from babelfeed.preprocess.stats import Stats
from babelfeed.preprocess.textio import strip_compression
from babelfeed.storage.remote import client as remote
from babelfeed.storage.dtypes import dtype_for_vocab
from babelfeed.storage.remote.objects import is_remote


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
        shutil.rmtree(stage, ignore_errors=True)  # (uploaded whole: nothing left to resume)
        log(f"uploaded {written / 1e6:,.1f} MB to {url}; removed the staging folder")
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


def _finish(job, fp, stats, out, totals) -> None:
    record = {"fingerprint": fp, "stats": asdict(stats)}
    atomic_write(_record_path(out, job), json.dumps(record).encode())
    fsync_dir(os.path.join(out, STATE_DIR))
    totals.setdefault((job.split, job.key), Stats()).add(stats)
