"""fairseq ``dict.txt``: read, write, and language tokens.

Ids: ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3 (not in the file), then one id per file line in order,
language tokens such as ``__eng_Latn__`` last. Each line is ``<token> <count>[ #fairseq:overwrite]``, split
on the last space, exactly as fairseq's ``Dictionary.add_from_file`` reads it.
"""

from __future__ import annotations

import os
import re

import numpy as np

from babelfeed.errors import ConfigError, DataError, FormatError
from babelfeed.fileio import atomic_write

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
_OVERWRITE = "#fairseq:overwrite"
_LANG_TOKEN = re.compile(r"^__(.+)__$")


def lang_token(lang: str, style: str = "multilingual") -> str:
    """fairseq's ``get_lang_tok``: ``__eng_Latn__`` (multilingual style) or ``[eng_Latn]`` (mbart style)."""
    if style == "multilingual":
        return f"__{lang}__"
    if style == "mbart":
        return f"[{lang}]"
    raise ConfigError(f"lang token style must be 'multilingual' or 'mbart', got {style!r}")


class Dictionary:
    """A fairseq-compatible symbol table."""

    def __init__(self, extra_special_symbols=()):
        self.symbols: list[str] = []
        self.count: list[int] = []
        self.indices: dict[str, int] = {}
        self.bos_index = self.add_symbol(BOS)
        self.pad_index = self.add_symbol(PAD)
        self.eos_index = self.add_symbol(EOS)
        self.unk_index = self.add_symbol(UNK)
        for sym in extra_special_symbols:
            self.add_symbol(sym)
        self.nspecial = len(self.symbols)
        self.source: tuple | None = None  # (path, file identity) of a loaded dictionary (load)

    # fairseq spells these as methods; models written for it call them.
    def bos(self) -> int:
        return self.bos_index

    def pad(self) -> int:
        return self.pad_index

    def eos(self) -> int:
        return self.eos_index

    def unk(self) -> int:
        return self.unk_index

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, sym: str) -> bool:
        return sym in self.indices

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx] if 0 <= idx < len(self.symbols) else UNK

    def __eq__(self, other) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols

    def index(self, sym: str) -> int:
        return self.indices.get(sym, self.unk_index)

    def add_symbol(self, word: str, n: int = 1, overwrite: bool = False) -> int:
        if word in self.indices and not overwrite:
            idx = self.indices[word]
            self.count[idx] += n
            return idx
        if word in self.indices:
            idx = self.indices[word]
            self.count[idx] = n
            return idx
        idx = len(self.symbols)
        self.indices[word] = idx
        self.symbols.append(word)
        self.count.append(n)
        return idx

    # ------------------------------------------------------------------------------ language tokens
    def add_language_tokens(self, langs, style: str = "multilingual") -> list[int]:
        """Append ``__lang__`` for each language (an existing token keeps its id, as in fairseq)."""
        return [self.add_symbol(lang_token(lang, style)) for lang in langs]

    def lang_token_index(self, lang: str, style: str = "multilingual") -> int:
        tok = lang_token(lang, style)
        if tok not in self.indices:
            raise DataError(f"language token {tok} is not in the dictionary ({len(self)} symbols)")
        return self.indices[tok]

    @property
    def language_tokens(self) -> dict[str, int]:
        """``{lang: id}`` for every ``__lang__`` symbol."""
        out = {}
        for sym, idx in self.indices.items():
            m = _LANG_TOKEN.match(sym)
            if m and idx >= self.nspecial:
                out[m.group(1)] = idx
        return out

    # ------------------------------------------------------------------------------ text
    def string(self, ids, skip_special: bool = True) -> str:
        """Symbols of ``ids`` joined by spaces (specials dropped unless ``skip_special=False``)."""
        syms = []
        for i in np.asarray(ids).ravel().tolist():
            if skip_special and i in (self.bos_index, self.pad_index, self.eos_index):
                continue
            syms.append(self[i])
        return " ".join(syms)

    # ------------------------------------------------------------------------------ files
    @classmethod
    def load(cls, path) -> "Dictionary":
        path = os.fspath(path)
        st = os.stat(path)
        d = cls()
        d.add_from_file(path)
        # where it came from, as it was (what an iterator built beside this one may reuse: sources/corpus.reusing)
        d.source = (os.path.abspath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return d

    def add_from_file(self, path) -> None:
        path = os.fspath(path)
        with open(path, "rb") as f:
            for lineno, data in enumerate(f, start=1):
                try:
                    raw = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise FormatError(path, f"line {lineno}: not UTF-8 text (byte {data[e.start]:#04x} at column "
                                            f"{e.start + 1}): a fairseq dict.txt is UTF-8 lines '<token> <count>' "
                                            f"(is this the dictionary, and not another file?)") from None
                line = raw.rstrip()
                if not line:
                    raise FormatError(path, f"line {lineno}: empty line; expected '<token> <count>'")
                try:
                    word, field = line.rsplit(" ", 1)
                    overwrite = field == _OVERWRITE
                    if overwrite:
                        word, field = word.rsplit(" ", 1)
                    count = int(field)
                except ValueError:
                    raise FormatError(
                        path, f"line {lineno}: expected '<token> <count> [#fairseq:overwrite]', got {line!r}"
                    ) from None
                if word in self.indices and not overwrite:
                    raise FormatError(
                        path,
                        f"line {lineno}: duplicate token {word!r} (first at id {self.indices[word]}); "
                        f"mark it '{_OVERWRITE}' to overwrite",
                    )
                self.add_symbol(word, n=count, overwrite=overwrite)

    def save(self, path) -> None:
        """Write ``symbols[nspecial:]`` with their counts, atomically (temp file, fsync, rename)."""
        lines = (f"{sym} {cnt}\n" for sym, cnt in zip(self.symbols[self.nspecial :], self.count[self.nspecial :]))
        atomic_write(path, "".join(lines).encode("utf-8"))
