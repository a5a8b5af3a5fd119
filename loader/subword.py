"""Subword regularisation on the fly: raw text segmented anew each time it is used (seed 003, Kudo 2018).

``RawText`` gives random access to the lines of a raw text shard (a line-offset index, built once and cached).
``SubwordSampler`` segments lines with SentencePiece sampling (``alpha``, ``nbest``), so "unreasonable" can
come out as "un + reasonable" once and "unreason + able" the next time. Each segmentation is a pure function
of (seed, epoch, sample id): SentencePiece's sampler is reseeded per sample, so a resumed run sees the same
segmentations and every epoch sees new ones. It costs about 13 us per sentence on one core: heavy enough to
run in worker processes (``loader.adapters.grain`` or a torch DataLoader) rather than in the training loop.
"""

from __future__ import annotations

import os

import numpy as np

from .blending import IndexCache
from .permute import derive_key
from .transforms import Ragged

_BLOCK = 1 << 22


def _line_starts(path: str) -> np.ndarray:
    """Byte offset of every line start, plus the file size at the end (int64[N + 1])."""
    size = os.path.getsize(path)
    starts = [np.zeros(1, np.int64)]
    pos = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10).astype(np.int64) + pos + 1
            starts.append(nl)
            pos += len(block)
            last = block[-1:]
    out = np.concatenate(starts)
    if last == b"\n" and len(out) > 1:
        out = out[:-1]  # no empty line after the final newline
    return np.concatenate([out, [size]]) if size else np.zeros(1, np.int64)


class RawText:
    """Lines of a UTF-8 text file by index; ``\\n`` ends a line, a trailing ``\\r`` is dropped."""

    def __init__(self, path, cache: IndexCache | None = None):
        self.path = os.fspath(path)
        st = os.stat(self.path)
        describe = {"kind": "raw-lines", "path": os.path.abspath(self.path), "size": st.st_size,
                    "mtime": st.st_mtime_ns}
        build = lambda: {"starts": _line_starts(self.path)}  # noqa: E731
        self.starts = np.asarray((cache.get("lines", describe, build) if cache else build())["starts"])

    def __len__(self) -> int:
        return max(len(self.starts) - 1, 0)

    def lines(self, rows) -> list[str]:
        out = []
        with open(self.path, "rb") as f:
            for r in np.asarray(rows, dtype=np.int64).tolist():
                if not 0 <= r < len(self):
                    raise IndexError(f"{self.path}: line {r} out of range for {len(self)} lines")
                a, b = int(self.starts[r]), int(self.starts[r + 1])
                f.seek(a)
                raw = f.read(b - a).rstrip(b"\n")
                out.append(raw[:-1].decode("utf-8", "replace") if raw.endswith(b"\r") else raw.decode("utf-8", "replace"))
        return out


class SubwordSampler:
    """Texts -> dictionary ids (a Ragged batch), sampled segmentations seeded by (seed, epoch, sample id)."""

    def __init__(self, model_path, dictionary, alpha: float = 0.1, nbest: int = -1, seed: int = 0,
                 append_eos: bool = True):
        import sentencepiece as spm

        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.model_path = os.fspath(model_path)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_path)
        self.dictionary, self.alpha, self.nbest, self.seed, self.append_eos = dictionary, alpha, nbest, seed, append_eos
        self.table = np.array([dictionary.index(self.sp.id_to_piece(i)) for i in range(self.sp.get_piece_size())],
                              dtype=np.int64)

    def _segment(self, text: str, sample_seed: int | None) -> np.ndarray:
        import sentencepiece as spm

        if sample_seed is None:
            ids = self.sp.encode(text, out_type=int)
        else:
            spm.set_random_generator_seed(sample_seed)
            ids = self.sp.encode(text, out_type=int, enable_sampling=True, alpha=self.alpha, nbest_size=self.nbest)
        out = self.table[np.asarray(ids, dtype=np.int64)]
        return np.append(out, self.dictionary.eos()) if self.append_eos else out

    def __call__(self, texts, ids, epoch: int) -> Ragged:
        seeds = [int(derive_key(self.seed, "subword", epoch, int(i))[0] % (2**31 - 1)) for i in np.asarray(ids)]
        return Ragged.from_lists([self._segment(t, s) for t, s in zip(texts, seeds)])

    def deterministic(self, texts) -> Ragged:
        """The best (unsampled) segmentation: lengths for planning, text for evaluation."""
        return Ragged.from_lists([self._segment(t, None) for t in texts])

    def __getstate__(self):  # picklable for worker processes: reopen the model there
        return {"model_path": self.model_path, "dictionary": self.dictionary, "alpha": self.alpha, "nbest": self.nbest,
                "seed": self.seed, "append_eos": self.append_eos}

    def __setstate__(self, state):
        self.__init__(**state)
