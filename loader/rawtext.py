"""Raw text inputs for ``babelfeed binarize``: discovery, line counting, byte ranges, decoding.

Input folder naming (one sentence per line, UTF-8, ``\\n`` line ends; a trailing ``\\r`` is dropped):

* ``{src}-{tgt}.{src}`` and ``{src}-{tgt}.{tgt}``: a parallel direction of the ``train`` split;
* ``{split}.{src}-{tgt}.{lang}``: the same for another split (``valid``, ``test``, ``train2`` ...);
* ``{split}.{lang}``: monolingual text (the split is required here, so that ``README.md`` is never data).

Split names start with ``train``, ``valid`` or ``test``. Lines are split on ``\\n`` only: Unicode line
separators inside a sentence (U+2028, U+0085 ...) stay in the sentence, so both sides keep their alignment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

_SPLIT = r"(?:train|valid|test)[\w]*"
_LANG = r"[A-Za-z0-9_]+"
_PARALLEL = re.compile(rf"^(?:(?P<split>{_SPLIT})\.)?(?P<src>{_LANG})-(?P<tgt>{_LANG})\.(?P<lang>{_LANG})$")
_MONO = re.compile(rf"^(?P<split>{_SPLIT})\.(?P<lang>{_LANG})$")
_BLOCK = 1 << 22


class BinarizeError(ValueError):
    """Input that binarize refuses: mismatched line counts, missing sides, a policy set to 'error'."""


@dataclass
class RawInput:
    """One unit of input: a direction (two aligned files) or a monolingual file, within one split."""

    split: str
    key: str  # "src-tgt" or "lang"
    langs: list[str]  # [src, tgt] or [lang]
    paths: list[str]
    num_lines: int = 0
    sizes: list[int] = field(default_factory=list)

    @property
    def parallel(self) -> bool:
        return len(self.langs) == 2


def discover(input_dir) -> tuple[list[RawInput], list[str]]:
    """Inputs found in ``input_dir`` and the names that were not recognised (never silently dropped)."""
    input_dir = os.fspath(input_dir)
    if not os.path.isdir(input_dir):
        raise FileNotFoundError(2, "input directory not found", input_dir)
    sides: dict[tuple[str, str], dict[str, str]] = {}
    mono: list[RawInput] = []
    ignored = []
    for name in sorted(os.listdir(input_dir)):
        path = os.path.join(input_dir, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        m = _PARALLEL.match(name)
        if m and m["lang"] in (m["src"], m["tgt"]) and m["src"] != m["tgt"]:
            split = m["split"] or "train"
            sides.setdefault((split, f"{m['src']}-{m['tgt']}"), {})[m["lang"]] = path
            continue
        m = _MONO.match(name)
        if m:
            mono.append(RawInput(m["split"], m["lang"], [m["lang"]], [path]))
            continue
        ignored.append(name)
    inputs = []
    for (split, key), found in sorted(sides.items()):
        src, tgt = key.split("-")
        missing = [lang for lang in (src, tgt) if lang not in found]
        if missing:
            have = next(iter(found.values()))
            raise BinarizeError(f"{have}: direction {key} ({split}) has no {missing[0]} side beside it")
        inputs.append(RawInput(split, key, [src, tgt], [found[src], found[tgt]]))
    return inputs + mono, ignored


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
    """UTF-8 decode; returns the texts and a mask of lines that were not valid UTF-8 (decoded with U+FFFD)."""
    bad = np.zeros(len(lines), dtype=bool)
    try:
        return b"\n".join(lines).decode("utf-8").split("\n"), bad
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
