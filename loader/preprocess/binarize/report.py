"""What a binarize run reports: the counts per split and direction, its warnings, and the text table."""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict

from babelfeed.preprocess.binarize.jobs import ShardJob
from babelfeed.preprocess.rawtext import RawInput, looks_paired
from babelfeed.preprocess.stats import Stats
from babelfeed.storage.indexed import IndexedDataset, dataset_exists


REPORT = "binarize_report.json"


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


UNK_SHARE = 0.01  # an input more <unk> than this: the SentencePiece model does not cover its text


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
            chars = e.get("unk_chars") or {}
            most = ", ".join(f"{_shown(c)} {n:,}" for c, n in list(chars.items())[:8])
            out_warnings.append(f"{e['split']}.{e['key']}: {unk:,} of its {tokens:,} tokens ({unk / tokens:.1%}) are "
                                f"<unk>{f' ({most})' if most else ''}: the SentencePiece model does not cover this "
                                f"text (another script or language?); {fix}")
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
