"""SentencePiece for binarize: the training sample (a temperature over languages), the model, the dictionary."""

from __future__ import annotations

import io
import re
import time
import unicodedata

import numpy as np

from babelfeed.errors import BinarizeError
from babelfeed.fileio import atomic_write
from babelfeed.preprocess import engines
from babelfeed.preprocess.documents import _fields, document_texts
from babelfeed.preprocess.options import BinarizeOptions
from babelfeed.preprocess.rawtext import Part, RawInput
from babelfeed.preprocess.textio import RecordReader
from babelfeed.sources.dictionary import Dictionary


# SentencePiece's trainer splits its work by thread, and the model it learns depends on the split: a fixed
# count (not --workers, not the machine's cores) keeps the model, and so every token, the same everywhere.
SPM_THREADS = 16


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


def _sample_for_spm(inputs: list[RawInput], opts: BinarizeOptions, engine) -> dict[str, list[str]]:
    """A temperature-balanced sample of train records per language (per corpus for documents), so small
    languages get pieces too: language -> its sampled texts (languages in sorted order)."""
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
    tasks, lang_of = [], []
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
            lang_of.append(lang)
    results: dict[int, list[str]] = {}

    def done(tag, texts):
        results[tag] = texts

    engines.run_tasks(engine, tasks, done)
    out: dict[str, list[str]] = {}
    for i, lang in enumerate(lang_of):
        out.setdefault(lang, []).extend(results[i])
    return out


def covered(counts: dict, coverage: float) -> set:
    """The characters SentencePiece keeps of text with these character counts at ``character_coverage``: the
    most frequent ones, until they make ``coverage`` of all characters (the last one counted in full)."""
    total = sum(counts.values())
    out, seen = set(), 0
    for ch, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if seen >= coverage * total:
            break
        out.add(ch)
        seen += n
    return out


def required_chars(sample: dict[str, list[str]], coverage: float) -> str:
    """The characters each language's own sample needs at ``coverage``, for SentencePiece to keep whatever their
    share of the pool: a small language's letters (Icelandic þ, ð) are rare in the pool, common in its own text.
    Counted after NFKC, as SentencePiece normalises; whitespace is its own to handle. Sorted (the same model every
    run); empty for one language (the pool is its sample)."""
    if len(sample) < 2:
        return ""
    need: set = set()
    for texts in sample.values():
        counts: dict[str, int] = {}
        for text in texts:
            for ch in unicodedata.normalize("NFKC", text):
                counts[ch] = counts.get(ch, 0) + 1
        need |= covered(counts, coverage)
    return "".join(sorted(ch for ch in need if not ch.isspace()))


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

    by_lang = _sample_for_spm(inputs, opts, engine or engines.InlineEngine())
    sample = [t for lang in sorted(by_lang) for t in by_lang[lang]]
    if not sample:
        raise BinarizeError(f"no text to train SentencePiece on: the sampled train records hold none"
                            f"{_why_no_text(inputs, opts)}")
    log(f"training SentencePiece ({opts.spm_model_type}, vocab {opts.train_spm}, character coverage "
        f"{opts.character_coverage:g}) on {len(sample):,} sampled "
        f"{'lines of documents' if opts.documents else 'sentences'} (no progress is shown until it ends)")
    # every language keeps the characters its own text needs at that coverage, however small its share of the pool
    required = required_chars(by_lang, opts.character_coverage) if opts.character_coverage < 1 else ""
    if required:
        log(f"every language keeps the characters its own sample needs at coverage {opts.character_coverage:g} "
            f"({len(required):,} in all), however small its share of the pooled sample")
    t0 = time.perf_counter()
    model = io.BytesIO()
    spm.set_random_generator_seed(opts.seed)
    extra = {"required_chars": required} if required else {}
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
            **extra,
        )
    except RuntimeError as e:
        short = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if short:  # its own words name its own flag; say what --train-spm needs
            raise BinarizeError(f"--train-spm {opts.train_spm:,} is smaller than the {int(short.group(2)):,} characters "
                                f"(and control pieces) the languages' text needs at --character-coverage "
                                f"{opts.character_coverage:g}: give --train-spm {int(short.group(2)):,} or more (a "
                                f"script with thousands of characters, such as Chinese, needs a few thousand), or a "
                                f"lower --character-coverage") from None
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
