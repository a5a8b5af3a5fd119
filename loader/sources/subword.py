"""Subword regularisation on the fly: raw text segmented anew each time it is used (Kudo 2018).

``RawText`` gives random access to the lines of a raw text shard (a line-offset index, built once and cached).
``SubwordSampler`` segments lines by sampling among SentencePiece's ``nbest`` best segmentations with
probabilities ~ ``P^alpha``, so "unreasonable" can come out as "un + reasonable" once and "unreason + able" the
next time. Each choice is a pure function of (seed, epoch, sample id) through babelfeed's own counter-based
randomness, so a resumed run, and any worker process, sees the same segmentations and every epoch sees new
ones. It costs tens of microseconds per sentence: heavy enough to run in worker processes
(``babelfeed.adapters.grain`` or a torch DataLoader) rather than in the training loop. ``SampledText`` serves a raw
text file to the planner (length bounds) and the collate (segmentations within those bounds).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from babelfeed.errors import ConfigError, OutOfRange
from babelfeed.permute import derive_key
from babelfeed.sources.cache import IndexCache
from babelfeed.sources.ragged import Ragged


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
                    raise OutOfRange(f"{self.path}: line {r} out of range for {len(self)} lines")
                a, b = int(self.starts[r]), int(self.starts[r + 1])
                f.seek(a)
                raw = f.read(b - a).rstrip(b"\n")
                out.append(raw[:-1].decode("utf-8", "replace") if raw.endswith(b"\r") else raw.decode("utf-8", "replace"))
        return out


class SubwordSampler:
    """Texts -> dictionary ids (a Ragged batch), sampled segmentations seeded by (seed, epoch, sample id).

    A segmentation is drawn from SentencePiece's ``nbest`` best ones with probability proportional to
    ``P(segmentation)^alpha`` (Kudo 2018's l-best sampling; a unigram model's segmentation score is the sum of
    its pieces' log probabilities), using babelfeed's own counter-based randomness. SentencePiece's built-in
    sampler is not used: its thread-local generator makes the same seed give different segmentations in
    different processes (measured with sentencepiece 0.2), which would break resumption and worker
    independence.
    """

    def __init__(self, model_path, dictionary, alpha: float = 0.1, nbest: int = 16, seed: int = 0,
                 append_eos: bool = True):
        import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)

        if not 0 < alpha <= 1:
            raise ConfigError(f"alpha must be in (0, 1], got {alpha}")
        if not 2 <= nbest <= 1024:
            raise ConfigError(f"nbest must be in [2, 1024] (segmentations are drawn from the n best; SentencePiece's "
                              f"full-lattice sampler, nbest=-1, is not reproducible across processes), got {nbest}")
        self.model_path = os.fspath(model_path)
        # n-best search on a very long line gives up and returns the best path (one candidate: no sampling for
        # that line); SentencePiece logs a warning per such line, which would flood worker stderr
        spm.set_min_log_level(2)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_path)
        self.dictionary, self.alpha, self.nbest, self.seed, self.append_eos = dictionary, alpha, nbest, seed, append_eos
        self.table = np.array([dictionary.index(self.sp.id_to_piece(i)) for i in range(self.sp.get_piece_size())],
                              dtype=np.int64)
        self.scores = np.array([self.sp.get_score(i) for i in range(self.sp.get_piece_size())], dtype=np.float64)

    def _ids(self, pieces) -> np.ndarray:
        out = self.table[np.asarray(pieces, dtype=np.int64)]
        return np.append(out, self.dictionary.eos()) if self.append_eos else out

    def best(self, texts) -> list[np.ndarray]:
        return [self._ids(p) for p in self.sp.encode(list(texts), out_type=int)]

    def draw(self, texts, uniforms) -> list[np.ndarray]:
        """One segmentation per text, chosen among its n best by the matching uniform in [0, 1)."""
        out = []
        for cands, u in zip(self.sp.nbest_encode(list(texts), nbest_size=self.nbest), uniforms):
            if len(cands) <= 1:
                out.append(self._ids(cands[0] if cands else []))
                continue
            logits = self.alpha * np.array([self.scores[c].sum() for c in cands])
            p = np.exp(logits - logits.max())
            k = min(int(np.searchsorted(np.cumsum(p), u * p.sum(), side="right")), len(cands) - 1)
            out.append(self._ids(cands[k]))
        return out

    def uniforms(self, ids, *salt) -> np.ndarray:
        return np.array([derive_key(self.seed, "subword", *salt, int(i))[0] for i in np.asarray(ids)],
                        dtype=np.uint64).astype(np.float64) / 2.0**64

    def __call__(self, texts, ids, epoch: int) -> Ragged:
        return Ragged.from_lists(self.draw(texts, self.uniforms(ids, epoch)))

    def deterministic(self, texts) -> Ragged:
        """The best (unsampled) segmentation: lengths for planning, text for evaluation."""
        return Ragged.from_lists(self.best(texts))

    def __getstate__(self):  # picklable for worker processes: reopen the model there
        return {"model_path": self.model_path, "dictionary": self.dictionary, "alpha": self.alpha, "nbest": self.nbest,
                "seed": self.seed, "append_eos": self.append_eos}

    def __setstate__(self, state):
        self.__init__(**state)


class SampledText:
    """One side of a raw-text corpus read like a dataset: planning lengths up front, sampled segmentations at
    gather time (in whichever process collates: grain or DataLoader workers).

    ``sizes`` (what the planner budgets) are upper bounds: the best segmentation's length, scaled by the
    ``quantile`` of sampled/best length ratios measured on the first ``probe`` lines. A sample that comes out
    longer than its bound is drawn again (another seed, up to ``tries`` times) and otherwise falls back to the
    best segmentation, which always fits: no row ever outgrows its planned width, nothing is cut or dropped,
    and the distribution is truncated only in its long tail (counted in ``resampled``/``fallbacks``). With
    ``sampling=False`` (validation), segmentations are the best ones and ``sizes`` their lengths.
    """

    def __init__(self, path, sampler: SubwordSampler, cache: IndexCache | None = None, sampling: bool = True,
                 quantile: float = 0.9, probe: int = 2000, tries: int = 3, salt: str = ""):
        self.text = RawText(path, cache)
        self.sampler, self.sampling, self.tries, self.salt = sampler, sampling, tries, salt
        st = os.stat(self.text.path)
        with open(sampler.model_path, "rb") as f:
            model_hash = hashlib.sha256(f.read()).hexdigest()[:16]
        describe = {"kind": "spm-lengths", "path": os.path.abspath(self.text.path), "size": st.st_size,
                    "mtime": st.st_mtime_ns, "model": model_hash, "eos": sampler.append_eos,
                    "symbols": len(sampler.dictionary)}
        build = lambda: {"lengths": self._best_lengths()}  # noqa: E731
        self.best = np.asarray((cache.get("spm-lengths", describe, build) if cache else build())["lengths"])
        self.factor = 1.0
        eos = int(sampler.append_eos)
        if sampling and len(self.best):
            def measure():
                rows = np.arange(min(probe, len(self.best)))
                got = self._draw(self.text.lines(rows), rows, epoch=0, attempt=-1).lengths
                ratio = (got - eos) / np.maximum(self.best[rows] - eos, 1)
                return {"factor": np.array([max(1.0, float(np.quantile(ratio, quantile)))])}
            probe_key = {**describe, "alpha": sampler.alpha, "nbest": sampler.nbest, "seed": sampler.seed,
                         "salt": salt, "quantile": quantile, "probe": probe}
            self.factor = float((cache.get("spm-factor", probe_key, measure) if cache else measure())["factor"][0])
        self.sizes = (np.ceil((self.best - eos) * self.factor) + eos).astype(np.int32)
        self.resampled = self.fallbacks = 0

    def __len__(self) -> int:
        return len(self.best)

    def _best_lengths(self) -> np.ndarray:
        from tqdm import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

        out = np.zeros(len(self.text), np.int32)
        step = 50_000
        eos = int(self.sampler.append_eos)
        with tqdm(total=len(self.text), desc=f"segment {os.path.basename(self.text.path)}", unit="line",
                  disable=len(self.text) < 200_000, leave=False) as bar:
            for a in range(0, len(self.text), step):
                rows = np.arange(a, min(a + step, len(self.text)))
                pieces = self.sampler.sp.encode(self.text.lines(rows), out_type=int)
                out[rows] = [len(p) + eos for p in pieces]
                bar.update(len(rows))
        return out

    def _draw(self, texts, ids, epoch: int, attempt: int) -> Ragged:
        return Ragged.from_lists(self.sampler.draw(texts, self.sampler.uniforms(ids, self.salt, epoch, attempt)))

    def sample(self, rows, ids, epoch: int) -> Ragged:
        """Segmentations of ``rows`` for samples ``ids`` in ``epoch``, each within its planned length."""
        rows = np.asarray(rows, dtype=np.int64)
        texts = self.text.lines(rows)
        if not self.sampling:
            return self.sampler.deterministic(texts)
        bound = self.sizes[rows]
        segs = [None] * len(rows)
        todo = np.arange(len(rows))
        for attempt in range(self.tries):
            got = self._draw([texts[i] for i in todo], np.asarray(ids)[todo], epoch, attempt)
            fits = got.lengths <= bound[todo]
            for k, seg in zip(todo[fits].tolist(), [s for s, f in zip(got.to_lists(), fits) if f]):
                segs[k] = seg
            todo = todo[~fits]
            if not len(todo):
                break
            if attempt + 1 < self.tries:
                self.resampled += len(todo)
        for k, seg in zip(todo.tolist(), self.sampler.best([texts[k] for k in todo.tolist()])):
            segs[k] = seg
        self.fallbacks += len(todo)
        return Ragged.from_lists(segs)


class RaggedRecords:
    """A Ragged batch with the reading interface of an IndexedDataset (records 0..n-1), for the collate."""

    def __init__(self, ragged: Ragged):
        self.sizes = ragged.lengths
        self.tokens = ragged.tokens
        self.dtype = np.dtype(np.int64)
        self.pointers = (np.cumsum(ragged.lengths) - ragged.lengths) * self.dtype.itemsize
        self.token_shift = 0
