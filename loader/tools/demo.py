"""The embedded demo corpus and ``babelfeed demo``.

Four directions out of English whose sizes differ by more than 100x (NLLB's problem in miniature), a small
monolingual corpus, and valid splits. Each pair is either

* real text: CLDR names and formats shipped inside the ``babel`` package (territory, language and currency
  names joined by the locale's own list pattern, full dates, unit and money amounts), identical in meaning
  on both sides; or
* synthetic text: Zipf-distributed pseudo-words with a fixed per-language lexicon and word-order rule, so that
  the pairs are learnable (a later training demo must see its loss fall), with log-normal lengths.

A handful of deliberately bad lines (empty, undecodable, over-long) show the binarizer's drop policy at work.
Everything is a pure function of the seed: the same command writes the same bytes.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import os
import shutil
import sys
import time
import warnings

import numpy as np

from babelfeed.build import build_train_iterator
from babelfeed.config.files import load_config
from babelfeed.errors import ConfigError, MissingExtraError, UpsamplingNotice
from babelfeed.preprocess.binarize import BinarizeOptions, binarize, format_report
from babelfeed.tools.stats import corpus_stats, format_stats


# NLLB code -> babel locale
LANGS = {"eng_Latn": "en", "deu_Latn": "de", "fra_Latn": "fr", "tur_Latn": "tr", "swh_Latn": "sw"}
# Train pairs per direction at scale 1: 30000 / 250 = 120x between the largest and the smallest.
DIRECTIONS = {"eng_Latn-deu_Latn": 30000, "eng_Latn-fra_Latn": 8000, "eng_Latn-tur_Latn": 2000, "eng_Latn-swh_Latn": 250}
VALID = {"eng_Latn-deu_Latn": 200, "eng_Latn-fra_Latn": 200, "eng_Latn-tur_Latn": 100, "eng_Latn-swh_Latn": 50}
MONOLINGUAL = {"swh_Latn": 3000}
REAL_SHARE = 0.35
VOCAB_WORDS = 3000
VERSION = "demo-corpus-v1"

_SYLLABLES = {
    "eng_Latn": (["b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "w", "th", "sh", "st", "br"],
                 ["a", "e", "i", "o", "u", "ea", "oo", "ai"], ["", "n", "r", "t", "s", "ck", "ng", "ll"]),
    "deu_Latn": (["b", "d", "f", "g", "h", "k", "l", "m", "n", "r", "s", "t", "w", "z", "sch", "st", "pf", "kr"],
                 ["a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "au", "ie"], ["", "n", "r", "t", "ch", "ng", "tz", "ss"]),
    "fra_Latn": (["b", "c", "d", "f", "g", "j", "l", "m", "n", "p", "r", "s", "t", "v", "ch", "qu", "gr"],
                 ["a", "e", "i", "o", "u", "é", "è", "ou", "eau", "ai", "oi"], ["", "", "n", "r", "s", "t", "x"]),
    "tur_Latn": (["b", "c", "ç", "d", "g", "h", "k", "l", "m", "n", "p", "r", "s", "ş", "t", "y", "z"],
                 ["a", "e", "ı", "i", "o", "ö", "u", "ü"], ["", "k", "l", "m", "n", "r", "z", "ş"]),
    "swh_Latn": (["b", "ch", "d", "f", "h", "j", "k", "l", "m", "n", "ng", "ny", "p", "s", "t", "w", "y", "z"],
                 ["a", "e", "i", "o", "u"], [""]),
}


def _lexicon(lang: str, n: int, rng: np.random.Generator) -> list[str]:
    onsets, nuclei, codas = _SYLLABLES[lang]
    words, seen = [], set()
    while len(words) < n:
        k = int(rng.integers(1, 4))
        w = "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(k))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _reorder(lang: str, words: list[str]) -> list[str]:
    """A fixed word-order rule per language, so the demo's translation is not a word-for-word copy."""
    if lang == "tur_Latn" and len(words) > 2:  # verb-final: the second word moves to the end
        return [words[0]] + words[2:] + [words[1]]
    if lang == "fra_Latn":  # noun-adjective: swap each pair
        out = list(words)
        for i in range(0, len(out) - 1, 2):
            out[i], out[i + 1] = out[i + 1], out[i]
        return out
    if lang == "deu_Latn" and len(words) > 3:  # the third word goes last
        return words[:2] + words[3:] + [words[2]]
    return list(words)


class _Real:
    """Aligned real phrases built from CLDR data for one target language."""

    def __init__(self, tgt: str):
        from babel import Locale  # optional: babelfeed[demo]

        self.locales = {lang: Locale.parse(LANGS[lang]) for lang in ("eng_Latn", tgt)}
        self.tgt = tgt
        en, tl = self.locales["eng_Latn"], self.locales[tgt]
        self.names = {
            "territory": sorted(set(en.territories) & set(tl.territories)),
            "language": sorted(set(en.languages) & set(tl.languages)),
            "currency": sorted(set(en.currencies) & set(tl.currencies)),
        }
        self.units = ["length-kilometer", "mass-kilogram", "duration-hour", "volume-liter", "temperature-celsius"]

    def pair(self, rng: np.random.Generator) -> tuple[str, str]:
        from babel.dates import format_date  # optional: babelfeed[demo]
        from babel.lists import format_list  # optional: babelfeed[demo]
        from babel.numbers import format_currency  # optional: babelfeed[demo]
        from babel.units import format_unit  # optional: babelfeed[demo]

        kind = int(rng.integers(0, 5))
        out = []
        if kind <= 1:
            table = ("territory", "language", "currency")[int(rng.integers(0, 3))]
            keys = [self.names[table][i] for i in rng.choice(len(self.names[table]), int(rng.integers(1, 5)), replace=False)]
            attr = {"territory": "territories", "language": "languages", "currency": "currencies"}[table]
            for lang in ("eng_Latn", self.tgt):
                loc = self.locales[lang]
                out.append(format_list([getattr(loc, attr)[k] for k in keys], locale=loc))
        elif kind == 2:
            day = dt.date(1950, 1, 1) + dt.timedelta(days=int(rng.integers(0, 40000)))
            out = [format_date(day, format="full", locale=self.locales[lang]) for lang in ("eng_Latn", self.tgt)]
        elif kind == 3:
            unit = self.units[int(rng.integers(0, len(self.units)))]
            value = int(rng.integers(1, 5000))
            out = [format_unit(value, unit, length="long", locale=self.locales[lang]) for lang in ("eng_Latn", self.tgt)]
        else:
            cur = self.names["currency"][int(rng.integers(0, len(self.names["currency"])))]
            amount = round(float(rng.lognormal(5, 2)), 2)
            out = [format_currency(amount, cur, locale=self.locales[lang]) for lang in ("eng_Latn", self.tgt)]
        return out[0], out[1]


def _synthetic(src_lex, tgt_lex, tgt: str, rng: np.random.Generator, zipf: np.ndarray) -> tuple[str, str]:
    n = int(np.clip(np.round(rng.lognormal(2.3, 0.6)), 1, 120))
    ids = rng.choice(len(zipf), size=n, p=zipf)
    src = [src_lex[i] for i in ids]
    words = _reorder(tgt, [tgt_lex[i] for i in ids])
    s, t = " ".join(src), " ".join(words)
    return s[0].upper() + s[1:] + ".", t[0].upper() + t[1:] + "."


def build_corpus(raw_dir: str, scale: float = 1.0, seed: int = 1234) -> dict:
    """Write the demo's raw text files into ``raw_dir``; returns {file name: lines}. Skips if up to date."""
    stamp = os.path.join(raw_dir, ".demo-version")
    key = f"{VERSION} scale={scale} seed={seed}"
    if os.path.exists(stamp) and open(stamp).read() == key:
        return {}
    os.makedirs(raw_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB_WORDS + 1)
    zipf = (1.0 / ranks**1.05) / (1.0 / ranks**1.05).sum()
    lex = {lang: _lexicon(lang, VOCAB_WORDS, np.random.default_rng([seed, i])) for i, lang in enumerate(LANGS)}
    written = {}

    def write(name: str, lines: list[bytes]) -> None:
        path = os.path.join(raw_dir, name)
        with open(path + ".partial", "wb") as f:
            f.write(b"".join(ln + b"\n" for ln in lines))
        os.replace(path + ".partial", path)
        written[name] = len(lines)

    for direction, n_train in DIRECTIONS.items():
        src, tgt = direction.split("-")
        real = _Real(tgt)
        for split, n in (("train", max(1, int(n_train * scale))), ("valid", VALID[direction])):
            pairs = []
            for _ in range(n):
                if rng.random() < REAL_SHARE:
                    pairs.append(real.pair(rng))
                else:
                    pairs.append(_synthetic(lex[src], lex[tgt], tgt, rng, zipf))
            s_lines = [p[0].encode() for p in pairs]
            t_lines = [p[1].encode() for p in pairs]
            if split == "train" and n >= 100:
                # Bad lines a real crawl has: the binarizer drops each pair and reports it.
                s_lines[7], t_lines[11] = b"", b"   "
                t_lines[13] = b"Caf\xe9 au lait"  # Latin-1, not UTF-8
                s_lines[17] = b" ".join([b"word"] * 3000)  # longer than any max_len
            prefix = "" if split == "train" else f"{split}."
            write(f"{prefix}{direction}.{src}", s_lines)
            write(f"{prefix}{direction}.{tgt}", t_lines)
    for lang, n in MONOLINGUAL.items():
        lines = []
        for _ in range(max(1, int(n * scale))):
            ids = rng.choice(VOCAB_WORDS, size=int(np.clip(rng.lognormal(2.3, 0.6), 1, 120)), p=zipf)
            s = " ".join(lex[lang][i] for i in ids)
            lines.append((s[0].upper() + s[1:] + ".").encode())
        write(f"train.{lang}", lines)
    with open(stamp, "w") as f:
        f.write(key)
    return written


DEFAULT_CONFIG = "demo"  # the shipped configs/demo.py


def check_demo_config(config) -> None:
    if not all(k in config for k in ("corpus", "binarize", "train", "model", "workdir")):
        raise ConfigError("babelfeed demo takes a demo config (configs/demo.py: workdir, corpus, binarize, train and "
                          "model sections); for a pipeline config such as nllb_like use babelfeed plan or preview")


def run_demo(config=None, workdir: str | None = None, scale: float | None = None, workers: int | None = None,
             train_steps: int | None = None, trainer: str = "flax") -> int:
    """Corpus, SentencePiece, binarize, inspect, one streamed epoch, then a model trained on the batches;
    settings from ``configs/demo.py`` (or ``config``). ``train_steps=0`` stops before training."""
    if config is None or isinstance(config, (str, os.PathLike)):
        config = load_config(config or DEFAULT_CONFIG)
    check_demo_config(config)
    try:
        import babel  # noqa: F401  (the demo corpus is real text from babel's CLDR data)
    except ImportError:
        raise MissingExtraError("babelfeed demo writes its corpus from the babel package's CLDR data: pip install "
                                "'babelfeed[demo]'") from None
    steps = config.model.steps if train_steps is None else train_steps
    example = _example(trainer) if steps > 0 else None  # a missing framework is said now, not after the corpus
    workdir = workdir or config.workdir
    scale = config.corpus.scale if scale is None else scale
    b = config.binarize
    workers = b.workers if workers is None else workers
    raw = os.path.join(workdir, "raw")
    data_bin = os.path.join(workdir, "data_bin")
    print(f"== 1/5 demo corpus -> {raw}")
    t0 = time.perf_counter()
    written = build_corpus(raw, scale=scale, seed=config.seed)
    if written:
        sizes = {d: written[f"{d}.{d.split('-')[0]}"] for d in DIRECTIONS}
        print(f"   wrote {len(written)} files in {time.perf_counter() - t0:.1f} s; train pairs per direction: "
              + ", ".join(f"{d} {n:,}" for d, n in sizes.items())
              + f" (largest/smallest = {max(sizes.values()) / min(sizes.values()):.0f}x)")
    else:
        print("   up to date")
    print(f"== 2/5 babelfeed binarize {raw} -o {data_bin} --train-spm {b.train_spm} --shards {b.shards} "
          f"--max-len {b.max_len} --format {b.format}")
    report = binarize(
        BinarizeOptions(input_dir=raw, output_dir=data_bin, train_spm=b.train_spm, shards=b.shards,
                        max_len=b.max_len, format=b.format, workers=workers),
        log=lambda m: print("   " + m),
    )
    print(format_report(report))
    print(f"== 3/5 babelfeed inspect {data_bin}")
    print(format_stats(corpus_stats(data_bin)))
    print(f"== 4/5 one training epoch: temperature {config.train.mixing.temperature}, "
          f"max_tokens {config.train.batching.max_tokens}, {config.train.mixing.sampler} sampling")
    config.train.data.path = data_bin
    print(stream_epoch(config.train))
    sys.stdout.flush()
    if steps <= 0:
        _summary(raw, data_bin, t0, data_bin != os.path.join(config.workdir, "data_bin"))
        return 0
    shapes = f", {config.model.num_shapes} static shapes (one compilation each)" if trainer == "flax" else ""
    print(f"== 5/5 {trainer} training, {steps} steps ({os.path.relpath(example.__file__)}): batches of "
          f"max_tokens {config.model.max_tokens}{shapes}, so padding differs from step 4")
    sys.stdout.flush()
    with warnings.catch_warnings():  # (step 4 said which directions are up-sampled: the same mixture)
        warnings.simplefilter("ignore", UpsamplingNotice)
        example.train(config, steps, log=lambda m: (print("   " + m), sys.stdout.flush()))
    _summary(raw, data_bin, t0, data_bin != os.path.join(config.workdir, "data_bin"))
    return 0


def _command(name: str) -> str:
    """How to run ``name`` (``babelfeed``, ``python``) from here: the bare name where it is this environment's on
    PATH, else its path (a venv not activated: ``.venv/bin/babelfeed``)."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(here):
        return name if name != "python" else "python3"
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(here):
        return name
    rel = os.path.relpath(here)
    return rel if not rel.startswith("..") else here


def _summary(raw: str, data_bin: str, t0: float, moved: bool) -> None:
    """What the demo made and where, and what to try next (``moved``: not where the config says), as commands
    that run from here as printed."""
    checkout = os.path.exists("configs/demo.py") and os.path.exists("examples/torch_train.py")
    cfg = "configs/demo.py" if checkout else "demo"
    data = f" --config.train.data.path={data_bin}" if moved else ""
    bf, py = _command("babelfeed"), _command("python")
    torch_line = (f"{py} examples/torch_train.py --config=configs/demo.py --steps=100{data}" if checkout else
                  f"{py} -m babelfeed.examples.torch_train --steps=100{data}")

    # the install hint only where torch is missing (make demo installs the demo's extra, which has no torch)
    torch_hint = "" if importlib.util.find_spec("torch") else (
        " (first: make venv EXTRAS=demo,torch)" if checkout else
        " (first: pip install torch==2.13.0, then pip install 'babelfeed[torch]')")
    print(f"== done in {time.perf_counter() - t0:.0f} s\n"
          f"   {raw}: the demo corpus (raw text, 4 directions and swh_Latn monolingual)\n"
          f"   {data_bin}: dict.txt, spm.model, binarize_report.json and shard*/ of fairseq .idx/.bin files\n"
          f"   try next:\n"
          f"     {bf} inspect {data_bin} --verify        # every token checked against dict.txt\n"
          f"     {bf} plan {cfg}{data} --shapes 8              # static shapes, padding, the alternatives\n"
          f"     {bf} preview --config {cfg}{data} --task eng_Latn-tur_Latn -n 3 --transforms \"token_drop:rate=0.15\"\n"
          f"     {torch_line}   # the same data in PyTorch{torch_hint}\n"
          f"   README.md and docs/ explain each step (make docs builds the site); every command takes --help.")


def _example(trainer: str):
    """babelfeed.examples.{trainer}_train: the examples/ folder, shipped with the package."""
    if trainer not in ("flax", "torch"):
        raise ConfigError(f"trainer must be 'flax' or 'torch', got {trainer!r}")
    try:
        return importlib.import_module(f"babelfeed.examples.{trainer}_train")
    except ImportError as e:
        extra = "demo" if trainer == "flax" else "torch"
        raise MissingExtraError(f"the demo's {trainer} training needs {e.name or e}: pip install 'babelfeed[{extra}]' "
                                f"(or run the demo with --train-steps 0)") from e


def stream_epoch(train_config, epoch_limit: int = 1) -> str:
    """Stream one epoch and report what came out: shares against the configured probabilities, padding, speed."""
    t0 = time.perf_counter()
    it = build_train_iterator(train_config)
    first = None
    batches = sentences = real = padded = 0
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        batches += 1
        sentences += batch["nsentences"]
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        real += int(batch["net_input"]["src_lengths"].sum()) + batch["ntokens"]
        padded += src.size + tgt.size
    elapsed = time.perf_counter() - t0
    stats = it.stats(epoch=1)
    served = sum(v["served"] for v in stats.values())
    lines = [f"{'direction':<20} {'probability':>11} {'served share':>12} {'served':>8} {'filtered':>8}"]
    for key, v in stats.items():
        lines.append(f"{key:<20} {v['probability']:>11.3f} {v['served'] / max(served, 1):>12.3f} "
                     f"{v['served']:>8,} {v['filtered']:>8,}")
    lines.append(
        f"{batches:,} batches, {sentences:,} sentence pairs, padding efficiency {real / max(padded, 1):.1%} "
        f"(real / padded tokens, both sides); {batches / elapsed:,.0f} batches/s, {real / elapsed / 1e6:,.2f} M real "
        f"tokens/s; first batch after {first * 1e3:.0f} ms")
    return "\n".join(lines)
