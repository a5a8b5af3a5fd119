"""Raw text inputs for ``babelfeed binarize``: discovery, line counting, byte ranges, decoding.

Input folder naming (one sentence per line, UTF-8, ``\\n`` line ends; a trailing ``\\r`` is dropped):

* ``{src}-{tgt}.{src}`` and ``{src}-{tgt}.{tgt}``: a parallel direction of the ``train`` split;
* ``{split}.{src}-{tgt}.{lang}``: the same for another split (``valid``, ``test``, ``train2`` ...);
* ``{split}.{lang}``: monolingual text (the split is required here, so that ``README.md`` is never data);
* with ``langs=(src, tgt)`` (``--source-lang``/``--target-lang``), fairseq-preprocess's naming: ``{split}.{src}``
  and ``{split}.{tgt}`` are the direction ``src-tgt`` of that split, and ``prefixes`` (``--trainpref`` ...) name
  files ``PREFIX.{src}``/``PREFIX.{tgt}`` anywhere.

Any file may be compressed (``.gz``, ``.zst``, ``.xz``, ``.bz2`` after its name: ``en-de.en.gz``). A direction
held in many files is a folder named like the direction (``en-de/`` or ``valid.en-de/``) of files
``NAME.{src}`` and ``NAME.{tgt}`` paired by ``NAME`` (``part-00001.en.gz`` with ``part-00001.de.gz``), read
in the order of their names; a monolingual folder (``train.fr/``) is read file by file in name order. A
direction can also be given by a glob (:func:`parse_input_spec`, ``--input train.en-de=/data/en-de/*.{lang}.gz``).

Split names start with ``train``, ``valid`` or ``test``. Lines are split on ``\\n`` only: Unicode line
separators inside a sentence (U+2028, U+0085 ...) stay in the sentence, so both sides keep their alignment.

Documents (``binarize --documents``, Megatron-style LM data): ``NAME.jsonl`` / ``NAME.json`` (one JSON object
per line) and ``NAME.txt`` (documents separated by blank lines), compressed or not, or a folder ``NAME/`` of
such files, or ``--input NAME=GLOB``; each NAME is one corpus.
"""

from __future__ import annotations

import glob as globlib
import os
import re
import stat
from dataclasses import dataclass, field

import numpy as np

from babelfeed.errors import BinarizeError

from babelfeed.preprocess.textio import strip_compression

_SPLIT = r"(?:train|valid|test)[\w]*"
_LANG = r"[A-Za-z0-9_]+"
_PARALLEL = re.compile(rf"^(?:(?P<split>{_SPLIT})\.)?(?P<src>{_LANG})-(?P<tgt>{_LANG})\.(?P<lang>{_LANG})$")
_PARALLEL_DIR = re.compile(rf"^(?:(?P<split>{_SPLIT})\.)?(?P<src>{_LANG})-(?P<tgt>{_LANG})$")
_MONO = re.compile(rf"^(?P<split>{_SPLIT})\.(?P<lang>{_LANG})$")
_CORPUS = re.compile(r"^[A-Za-z0-9_][\w.-]*$")
DOC_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".txt": "text"}
_BLOCK = 1 << 22


@dataclass
class Part:
    """One file per side, aligned line by line (or one file of documents)."""

    paths: list[str]
    format: str = "lines"  # "lines" (a sentence a line), "jsonl" or "text" (documents between blank lines)
    records: int = 0
    marks: list = field(default_factory=list)  # per side: [[byte, line], ...] every chunk_lines records, or None

    @property
    def kind(self) -> str:
        return "block" if self.format == "text" else "line"


@dataclass
class RawInput:
    """One unit of input: a direction (two aligned sides), a monolingual text or a corpus of documents, within
    one split; held in one or many files (``parts``, read in order)."""

    split: str
    key: str  # "src-tgt", "lang", or a corpus name (documents)
    langs: list[str]  # [src, tgt] or [lang]; for documents, the JSON keys written
    parts: list[Part]
    num_lines: int = 0  # records (lines, or documents) in all parts
    documents: bool = False
    origin: str = ""  # where it was found: a file, a folder or a glob

    @property
    def parallel(self) -> bool:
        return len(self.langs) == 2 and not self.documents

    @property
    def paths(self) -> list[str]:
        """Every file, side by side and part after part."""
        return [p for part in self.parts for p in part.paths]


def _glob_regex(pattern: str, lang: str | None) -> re.Pattern:
    """A regex matching what ``pattern`` (a glob, ``{lang}`` replaced by ``lang``) matches, each wildcard a group."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("{lang}", i):
            out.append(re.escape(lang or ""))
            i += 6
        elif pattern.startswith("**", i):
            out.append("(.*)")
            i += 2
        elif pattern[i] == "*":
            out.append("([^/]*)")
            i += 1
        elif pattern[i] == "?":
            out.append("([^/])")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            j = pattern.index("]", i + 1)
            body = pattern[i + 1:j]
            out.append("([" + ("^" + body[1:] if body.startswith("!") else body) + "])")
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("^" + "".join(out) + "$")


def refuse_special(path: str) -> None:
    """Refuse an input that is not a regular file (a named pipe such as ``<(zcat ...)`` gives, a socket, a
    device): binarize reads each input more than once (it counts lines, then encodes ranges of them in
    parallel), and a second read of a pipe waits forever."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return
    kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
    raise BinarizeError(f"{path}: {kind}, not a regular file: binarize reads each input more than once (it counts "
                        f"the lines, then encodes ranges of them in parallel), and a pipe can be read once. Write "
                        f"it to a file first, or give the compressed file itself (.gz, .bz2, .xz, .zst are read "
                        f"directly)")


def _expand(pattern: str, lang: str | None) -> dict[tuple, str]:
    """Files matched by ``pattern`` for one language, keyed by what the wildcards matched."""
    concrete = pattern.replace("{lang}", lang or "")
    rx = _glob_regex(os.path.normpath(pattern), lang)
    found = {}
    for path in sorted(globlib.glob(concrete, recursive=True)):
        if not os.path.basename(path).startswith("."):
            refuse_special(path)
        if os.path.isfile(path) and not os.path.basename(path).startswith("."):
            m = rx.match(os.path.normpath(path))
            found[m.groups() if m else (path,)] = path
    return found


def _pair(side_files: list[dict], langs: list[str], where: str) -> list[Part]:
    """Aligned parts from per-side ``{key: path}``; a file without its counterpart is an error naming it."""
    keys = [set(f) for f in side_files]
    for side, (k, files) in enumerate(zip(keys, side_files)):
        other = langs[1 - side]
        for stem in sorted(k - keys[1 - side]):
            raise BinarizeError(f"{files[stem]}: no {other} file beside it in {where} (each {langs[side]} file "
                                f"needs its {other} counterpart of the same name)")
    return [Part([side_files[0][k], side_files[1][k]]) for k in sorted(keys[0])]


def _folder_parts(folder: str, langs: list[str], ignored: list[str]) -> list[Part]:
    """The parts of a folder input: NAME.{lang}[.gz] files paired by NAME, or every file (monolingual)."""
    for n in os.listdir(folder):
        if not n.startswith("."):
            refuse_special(os.path.join(folder, n))
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".") and os.path.isfile(os.path.join(folder, n)))
    if len(langs) == 1:
        return [Part([os.path.join(folder, n)]) for n in names]
    sides: list[dict] = [{}, {}]
    for n in names:
        stem, _ = strip_compression(n)
        base, dot, lang = stem.rpartition(".")
        if dot and lang in langs:
            sides[langs.index(lang)][base] = os.path.join(folder, n)
        else:
            ignored.append(os.path.join(os.path.basename(folder), n))
    return _pair(sides, langs, folder)


def parse_input_spec(spec: str) -> tuple[str, str, list[str], str]:
    """``"[split.]src-tgt=GLOB"`` or ``"split.lang=GLOB"`` -> (split, key, langs, glob)."""
    key, eq, pattern = spec.partition("=")
    if not eq or not pattern:
        raise BinarizeError(f"--input {spec!r}: give KEY=GLOB, e.g. train.en-de=/data/en-de/*.{{lang}}.gz")
    m = _PARALLEL_DIR.match(key)
    if m and m["src"] != m["tgt"]:
        if "{lang}" not in pattern:
            raise BinarizeError(f"--input {spec!r}: a direction's glob must hold {{lang}}, where each side's "
                                f"language goes ({m['src']} and {m['tgt']})")
        return m["split"] or "train", f"{m['src']}-{m['tgt']}", [m["src"], m["tgt"]], pattern
    m = _MONO.match(key)
    if m:
        return m["split"], m["lang"], [m["lang"]], pattern
    raise BinarizeError(f"--input {spec!r}: {key!r} is neither a direction ([split.]src-tgt) nor a monolingual "
                        f"split.lang")


def check_lang(flag: str, lang: str) -> None:
    """A language code names files (``train.{src}-{tgt}.{lang}.idx``): letters, digits and ``_`` only."""
    if not isinstance(lang, str) or not re.fullmatch(_LANG, lang):
        raise BinarizeError(f"{flag} {lang!r}: a language code is letters, digits and _ only (it names the output "
                            f"files, train.{{src}}-{{tgt}}.{{lang}}.bin; write en_US, not en-US)")


def _prefix_files(split: str, prefix: str, langs: list[str], flag: str) -> list[str]:
    """The files ``PREFIX.{lang}`` (compressed or not) of both sides of a fairseq-style prefix."""
    prefix = os.fspath(prefix)
    out = []
    for lang in langs:
        names = [f"{prefix}.{lang}"] + [f"{prefix}.{lang}{ext}" for ext in (".gz", ".zst", ".xz", ".bz2")]
        there = [n for n in names if os.path.exists(n)]
        if len(there) > 1:
            raise BinarizeError(f"{flag} {prefix}: two files for its {lang} side, {there[0]} and {there[1]}; keep one")
        if not there:
            raise BinarizeError(f"{flag} {prefix}: no {lang} side ({prefix}.{lang}, compressed or not, not found); "
                                f"the {split} split of --source-lang {langs[0]} --target-lang {langs[1]} is read "
                                f"from {prefix}.{langs[0]} and {prefix}.{langs[1]}")
        refuse_special(there[0])
        out.append(there[0])
    return out


def discover(input_dir=None, specs=(), langs=None, prefixes=()) -> tuple[list[RawInput], list[str]]:
    """Inputs found in ``input_dir`` and given by ``specs`` (``KEY=GLOB``), and the names that were not
    recognised (never silently dropped).

    ``langs`` (``[src, tgt]``, from ``--source-lang``/``--target-lang``) reads fairseq-preprocess's naming:
    ``{split}.{src}`` with ``{split}.{tgt}`` in ``input_dir`` is the direction ``src-tgt`` of that split, and each
    ``(split, PREFIX)`` of ``prefixes`` (``--trainpref``, ``--validpref``, ``--testpref``) names the files
    ``PREFIX.{src}`` and ``PREFIX.{tgt}`` of that split."""
    pair = list(langs) if langs is not None else None  # (the --input loop below has langs of its own)
    if pair is not None:
        src_lang, tgt_lang = pair
        check_lang("--source-lang", src_lang)
        check_lang("--target-lang", tgt_lang)
        if src_lang == tgt_lang:
            raise BinarizeError(f"--source-lang and --target-lang are both {src_lang!r}: a direction joins two "
                                f"languages")
    elif prefixes:
        raise BinarizeError("--trainpref, --validpref and --testpref name the files PREFIX.{src} and PREFIX.{tgt}: "
                            "give --source-lang and --target-lang with them")
    found: dict[tuple[str, str], RawInput] = {}
    ignored: list[str] = []

    def add(inp: RawInput) -> None:
        old = found.get((inp.split, inp.key))
        if old is not None:
            raise BinarizeError(f"two inputs for {inp.split} {inp.key}: {old.origin} and {inp.origin}; keep one")
        found[(inp.split, inp.key)] = inp

    if input_dir is not None:
        input_dir = os.fspath(input_dir)
        if not os.path.isdir(input_dir):
            raise FileNotFoundError(2, "input directory not found", input_dir)
        sides: dict[tuple[str, str], dict[str, str]] = {}
        for name in sorted(os.listdir(input_dir)):
            path = os.path.join(input_dir, name)
            if name.startswith("."):
                continue
            refuse_special(path)
            if os.path.isdir(path):
                m = _PARALLEL_DIR.match(name)
                if m and m["src"] != m["tgt"]:
                    langs = [m["src"], m["tgt"]]
                    add(RawInput(m["split"] or "train", f"{m['src']}-{m['tgt']}", langs,
                                 _folder_parts(path, langs, ignored), origin=path + os.sep))
                    continue
                m = _MONO.match(name)
                if m:
                    add(RawInput(m["split"], m["lang"], [m["lang"]], _folder_parts(path, [m["lang"]], ignored),
                                 origin=path + os.sep))
                    continue
                ignored.append(name + os.sep)
                continue
            stem, _ = strip_compression(name)
            m = _PARALLEL.match(stem)
            if m and m["lang"] in (m["src"], m["tgt"]) and m["src"] != m["tgt"]:
                split = m["split"] or "train"
                side = sides.setdefault((split, f"{m['src']}-{m['tgt']}"), {})
                if m["lang"] in side:
                    raise BinarizeError(f"two files for the {m['lang']} side of {split} {m['src']}-{m['tgt']}: "
                                        f"{side[m['lang']]} and {path}; keep one")
                side[m["lang"]] = path
                continue
            m = _MONO.match(stem)
            if m and pair is not None and m["lang"] in pair:  # fairseq's naming: {split}.{src}, {split}.{tgt}
                side = sides.setdefault((m["split"], "-".join(pair)), {})
                if m["lang"] in side:
                    raise BinarizeError(f"two files for the {m['lang']} side of {m['split']} {'-'.join(pair)}: "
                                        f"{side[m['lang']]} and {path}; keep one")
                side[m["lang"]] = path
                continue
            if m:
                add(RawInput(m["split"], m["lang"], [m["lang"]], [Part([path])], origin=path))
                continue
            ignored.append(name)
        for (split, key), have in sorted(sides.items()):
            src, tgt = key.split("-")
            missing = [lang for lang in (src, tgt) if lang not in have]
            if missing:
                named = (f" (--source-lang {src} --target-lang {tgt} pairs {split}.{src} with {split}.{tgt})"
                         if pair is not None and key == "-".join(pair) else "")
                raise BinarizeError(f"{next(iter(have.values()))}: direction {key} ({split}) has no {missing[0]} "
                                    f"side beside it{named}")
            add(RawInput(split, key, [src, tgt], [Part([have[src], have[tgt]])], origin=have[src]))
    for split, prefix in prefixes:
        flag = "--" + re.match(r"[a-z]+", split)[0] + "pref"
        add(RawInput(split, "-".join(pair), pair, [Part(_prefix_files(split, prefix, pair, flag))],
                     origin=f"{flag} {prefix}"))
    for spec in specs:
        split, key, langs, pattern = parse_input_spec(spec)
        if len(langs) == 2:
            parts = _pair([_expand(pattern, lg) for lg in langs], langs, f"--input {spec}")
        else:
            parts = [Part([p]) for p in _expand(pattern, langs[0]).values()]
        if not parts:
            raise BinarizeError(f"--input {spec}: the glob matches no file")
        add(RawInput(split, key, langs, parts, origin=f"--input {spec}"))
    if pair is not None and not any(key == "-".join(pair) for _, key in found):
        where = f"{input_dir}" if input_dir is not None else "the inputs"
        raise BinarizeError(f"--source-lang {pair[0]} --target-lang {pair[1]}: {where} holds no pair of files "
                            f"{{split}}.{pair[0]} and {{split}}.{pair[1]} (train.{pair[0]} and train.{pair[1]}, "
                            f"valid.{pair[0]} ...); name other prefixes with --trainpref, --validpref or "
                            f"--testpref PREFIX")
    inputs = sorted(found.values(), key=lambda i: (i.parallel is False, i.split, i.key))
    return inputs, ignored


def pair_prefixes(trainpref=None, validpref=None, testpref=None) -> list[tuple[str, str]]:
    """``(split, prefix)`` of fairseq-preprocess's prefix flags: ``--validpref a,b`` gives the splits ``valid``
    and ``valid1``, as fairseq names them."""
    out = []
    for split, value in (("train", trainpref), ("valid", validpref), ("test", testpref)):
        for k, prefix in enumerate(p for p in (value or "").split(",") if p):
            out.append((f"{split}{k or ''}", prefix))
    return out


def looks_paired(inputs: list[RawInput]) -> list[list[RawInput]]:
    """Monolingual inputs that look like the two sides of one direction read apart: the same split (the prefix
    of fairseq's ``train.en``/``train.de``) and the same number of lines. Groups of two or more, after the line
    counts are known."""
    by: dict[tuple, list[RawInput]] = {}
    for inp in inputs:
        if not inp.documents and len(inp.langs) == 1 and inp.num_lines:
            by.setdefault((inp.split, inp.num_lines), []).append(inp)
    return [sorted(g, key=lambda i: i.key) for _, g in sorted(by.items()) if len(g) > 1]


def _doc_format(name: str) -> str | None:
    stem, _ = strip_compression(name)
    return DOC_FORMATS.get(os.path.splitext(stem)[1].lower())


def discover_documents(input_dir=None, specs=(), keys=("text",)) -> tuple[list[RawInput], list[str]]:
    """Corpora of documents: ``NAME.jsonl``/``.json``/``.txt`` files (compressed or not), folders ``NAME/`` of
    them, and ``NAME=GLOB`` specs. Returns the inputs (split "train") and the names that were not recognised."""
    keys = list(keys)
    found: dict[str, RawInput] = {}
    ignored: list[str] = []

    def add(name: str, paths: list[str], origin: str) -> None:
        if not _CORPUS.match(name):
            raise BinarizeError(f"{origin}: {name!r} cannot name a corpus (letters, digits, _ . - only)")
        if name in found:
            raise BinarizeError(f"two inputs for corpus {name}: {found[name].origin} and {origin}; keep one")
        parts = []
        for p in paths:
            fmt = _doc_format(os.path.basename(p))
            if fmt is None:
                raise BinarizeError(f"{p}: not a document file (.jsonl, .json or .txt, compressed or not)")
            if fmt == "text" and keys != ["text"]:
                raise BinarizeError(f"{p}: plain text holds no JSON keys, but --json-keys asks for {', '.join(keys)}")
            parts.append(Part([p], format=fmt))
        if not parts:
            raise BinarizeError(f"{origin}: no document file in it (.jsonl, .json or .txt, compressed or not)")
        found[name] = RawInput("train", name, keys, parts, documents=True, origin=origin)

    if input_dir is not None:
        input_dir = os.fspath(input_dir)
        if not os.path.isdir(input_dir):
            raise FileNotFoundError(2, "input directory not found", input_dir)
        for name in sorted(os.listdir(input_dir)):
            path = os.path.join(input_dir, name)
            if name.startswith("."):
                continue
            refuse_special(path)
            if os.path.isdir(path):
                files = []
                for n in sorted(os.listdir(path)):
                    if n.startswith("."):
                        continue
                    refuse_special(os.path.join(path, n))
                    if not os.path.isfile(os.path.join(path, n)):
                        continue
                    if _doc_format(n):
                        files.append(os.path.join(path, n))
                    else:
                        ignored.append(os.path.join(name, n))
                if files:
                    add(name, files, path + os.sep)
                else:
                    ignored.append(name + os.sep)
            elif _doc_format(name):
                stem, _ = strip_compression(name)
                add(os.path.splitext(stem)[0], [path], path)
            else:
                ignored.append(name)
    for spec in specs:
        name, eq, pattern = spec.partition("=")
        if not eq or not pattern:
            raise BinarizeError(f"--input {spec!r}: give NAME=GLOB, e.g. web=/data/web/*.jsonl.zst")
        paths = list(_expand(pattern, None).values())
        if not paths:
            raise BinarizeError(f"--input {spec}: the glob matches no file")
        add(name, paths, f"--input {spec}")
    return [found[k] for k in sorted(found)], ignored


def count_lines(path: str) -> int:
    """Lines in ``path``; a last line without ``\\n`` counts."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def line_offsets(path: str, lines: list[int]) -> list[int]:
    """Byte offset where each line number in ``lines`` (sorted, 0-based; may equal the line count) starts."""
    want = np.asarray(lines, dtype=np.int64)
    out = np.full(len(want), -1, dtype=np.int64)
    out[want == 0] = 0
    seen = 0  # newlines before the current block
    pos = 0
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            # line k (k >= 1) starts one byte after newline number k-1
            sel = (want >= seen + 1) & (want <= seen + len(nl))
            out[sel] = pos + nl[want[sel] - seen - 1] + 1
            seen += len(nl)
            pos += len(block)
    out[(out < 0) & (want >= seen)] = size  # past the last newline: end of file
    return out.tolist()


def read_lines(path: str, start: int, end: int) -> list[bytes]:
    """The lines in bytes ``[start, end)`` of ``path`` without their ``\\n`` (and a trailing ``\\r``)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not data:
        return []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


def decode_lines(lines: list[bytes]) -> tuple[list[str], np.ndarray]:
    """UTF-8 decode; returns the texts and a mask of lines that were not valid UTF-8 text (decoded with U+FFFD),
    or that hold a NUL byte (no text does; SentencePiece would make it <unk>)."""
    bad = np.zeros(len(lines), dtype=bool)
    joined = b"\n".join(lines)
    if b"\0" in joined:
        bad[:] = [b"\0" in ln for ln in lines]
    try:
        return joined.decode("utf-8").split("\n"), bad
    except UnicodeDecodeError:
        pass
    texts = []
    for i, ln in enumerate(lines):
        try:
            texts.append(ln.decode("utf-8"))
        except UnicodeDecodeError:
            bad[i] = True
            texts.append(ln.decode("utf-8", errors="replace"))
    return texts, bad
