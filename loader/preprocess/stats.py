"""What binarize and documents share: the counts of a run (``Stats``) and where a chunk's work file goes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Stats:
    lines: int = 0  # records read: lines, or documents
    kept: int = 0  # pairs, sentences or documents written
    empty: int = 0
    overlong: int = 0
    bad_utf8: int = 0
    truncated: int = 0
    replaced_utf8: int = 0
    unk_tokens: int = 0
    bad_record: int = 0  # documents: a line that is not a JSON object with the keys asked for
    sequences: int = 0  # sequences written per output (= kept, or sentences with --split-sentences)
    tokens: dict = field(default_factory=dict)  # lang (or JSON key) -> tokens kept (</s> included)
    # what became <unk> in the kept tokens: a character SentencePiece has no piece for -> its occurrences (a run of
    # them is one <unk> token); a piece the --dict lacks -> its <unk> tokens
    unk_chars: dict = field(default_factory=dict)

    _COUNTS = ("lines", "kept", "empty", "overlong", "bad_utf8", "truncated", "replaced_utf8", "unk_tokens",
               "bad_record", "sequences")

    def add(self, other: "Stats") -> None:
        for k in self._COUNTS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for lang, n in other.tokens.items():
            self.tokens[lang] = self.tokens.get(lang, 0) + n
        for ch, n in other.unk_chars.items():
            self.unk_chars[ch] = self.unk_chars.get(ch, 0) + n

    def top_unk(self, k: int) -> dict:
        """The ``k`` most frequent of ``unk_chars``, most frequent first (ties in character order)."""
        return dict(sorted(self.unk_chars.items(), key=lambda kv: (-kv[1], kv[0]))[:k])

    @property
    def dropped(self) -> int:
        return self.empty + self.overlong + self.bad_utf8 + self.bad_record


def _work_prefix(work_dir: str, chunk, lang: str) -> str:
    split, key, shard = chunk.shard_key
    return os.path.join(work_dir, f"{split}.{key}.{shard}.{chunk.index}.{lang}")

