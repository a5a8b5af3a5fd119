"""Language-model pretraining batches over blended indexed datasets (Megatron-style data paths).

    it = LMIterator.build("0.3 data/web 0.7 data/books", seq_len=2048, global_batch=64, num_samples=64_000,
                          split="969,30,1", mode="concat", cache_dir="cache")
    for batch in it: batch["tokens"], batch["labels"], batch["loss_mask"], batch["segment_ids"], ...

* Each dataset is split by documents (``"969,30,1"``, contiguous, Megatron's rounding) and read as its
  sequences, which are shuffled **per epoch** (Megatron shuffles once across all epochs, so a document can
  repeat back to back, issue #697). Modes ``concat``, ``pack`` and ``sentences``: see ``lm/plan.py``.
* ``concat`` serves the samples Megatron's GPTDataset cuts: with T tokens per epoch, its ``num_epochs`` epochs
  are one stream cut into ``(num_epochs T - 1) // seq_len`` samples (``build_sample_idx``), an epoch's leftover
  tokens starting the next epoch's first sample; here too, so epochs 1..e hold ``(e T - 1) // seq_len`` samples
  (4 epochs of 1,766 tokens at 16: 441, not 4 x 110). Not Megatron's: the document order (per epoch, above) and
  the serving order. Megatron shuffles all ``(num_epochs T - 1) // seq_len`` samples together (or, when the last
  epoch contributes under 80% of an epoch's samples, the earlier epochs' and the last's separately) and serves the
  first ``num_samples`` of that shuffle; we serve epoch after epoch, each in a keyed order, so that a run's
  samples never depend on its length.
* Datasets are blended by Megatron's greedy ``blending_indices`` over ``num_samples``; a dataset that runs out
  starts its next epoch (reshuffled) rather than repeating samples in the same order. As in Megatron, a dataset
  of weight 0 can still give the blend's first sample (the greedy rule ties at the start): leave it out of
  ``data_path`` to exclude it.
* The iterator is one pass over ``num_samples`` (``epoch`` stays 1); it does not start over.
* Global batch g holds samples ``[g B, (g + 1) B)``; rank r of W takes its ``B / W`` rows of it, so the batch
  content never depends on W and a run resumes on another world size. The state is the samples consumed (as
  Megatron's sampler keeps it) and a fingerprint of the data and settings.
* Shuffles are keyed by each dataset's ``content_digest`` (a hash of its sizes and document index), never by
  its path: the same files spelled ``data/web``, ``./data/web``, absolutely, through a symlink, or mounted
  elsewhere on another host give the same batches, and a resumed state refuses data that changed.
* Planning is integers, a window of batches at a time (per-dataset work once per window); each batch is then
  one vectorised gather of its pieces from the token space (``gather/engine.py``). No per-sample Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from babelfeed.errors import ConfigError, DataError, FormatError, OutOfRange, UsageError
from babelfeed.gather import engine as gather
from babelfeed.iterators.protocol import LoaderIterator
from babelfeed.lm.blending import IndexCache, blending_indices
from babelfeed.lm.options import BY_PATH as LM_KEYS
from babelfeed.lm.options import blend_weights
from babelfeed.lm.plan import LMSource
from babelfeed.lm.run import LMRun
from babelfeed.plan.options import SEED
from babelfeed.plan.packing import ragged_arange, segments
from babelfeed.run.weights import Weights
from babelfeed.storage.remote.client import opening_folders, resolve_prefix
from babelfeed.stages import STAGES, timed


WINDOW_SAMPLES = 1 << 14  # samples (of this rank) planned at once


class LMIterator(LMRun, LoaderIterator):
    """Static (B / world_size, seq_len) batches of a blended LM dataset for one rank."""

    kind = "lm"

    def __init__(self, sources: list[LMSource], weights, num_samples: int, global_batch: int, rank: int = 0,
                 world_size: int = 1, cache: IndexCache | None = None, split: str = "rows", name: str = "train",
                 vocab_size: int = 0):
        if split != "rows":
            raise ConfigError("an LM iterator splits every global batch into rows per rank (split='rows'): "
                              "global_batch counts the samples of one step over all ranks")
        super().__init__(rank, world_size, split, streams=len(sources))
        if global_batch < 1 or global_batch % world_size:
            raise ConfigError(f"global_batch {global_batch} must be a positive multiple of world_size {world_size}")
        if num_samples < global_batch:
            raise ConfigError(f"num_samples={num_samples} is less than one global batch ({global_batch} samples)")
        self.sources, self.weights, self.global_batch = sources, [float(w) for w in weights], global_batch
        self.name = self.record.name = name
        self.record.ledger.fields = ("samples", "tokens", "passes")
        self.vocab_size = int(vocab_size)  # every token id must be below it (0: unchecked)
        self.epoch = 1
        self.seq_len = sources[0].seq_len
        self.mode = sources[0].mode
        self.num_samples = num_samples - num_samples % global_batch  # whole global batches
        self.spaces = gather.TokenSpaces([s.ds for s in sources])
        for s in sources:
            s.at = self.spaces.address(s.ds)
        self.space_of = np.array([s.at[0] for s in sources], dtype=np.int64)
        description = {"kind": "lm-blend", "weights": self.weights, "size": self.num_samples,
                       "sources": [s._describe(0) for s in sources]}

        def build():
            d, s = blending_indices(weights, self.num_samples)
            return {"dataset": d, "sample": s}

        blend = cache.get("blend", description, build) if cache else build()
        self.dataset_index, self.dataset_sample = blend["dataset"], blend["sample"]
        self._config_blend = (self.dataset_index, self.dataset_sample)
        # the run's blend over time (record.weights.blend, babelfeed.lm.mixture): [] while it blends the config's
        # weights throughout
        self.record.weights = Weights()
        self.consumed = 0  # global samples
        # the planned windows, at most three, least recently used first (the one read, and those the lookahead
        # plans for remote data):
        # first global batch -> (batches, counts, piece pointers, pieces, row blocks)
        self._plans: dict = {}

    @classmethod
    @opening_folders
    def build(cls, data_path, seq_len: int, global_batch: int, num_samples: int, split: str = "969,30,1",
              split_name: str = "train", mode: str = "concat", seed: int = 1, cache_dir=None, rank: int = 0,
              world_size: int = 1, verify: str = "full", vocab_size: int = 0, blend: str = "weights",
              max_upsample: float = 0.0) -> "LMIterator":
        """An LM iterator from Megatron's ``--data-path`` string (``"0.3 PREFIX 0.7 PREFIX"``) and the run's shape:
        rows of ``seq_len`` tokens, ``global_batch`` rows a step over all ranks, ``num_samples`` rows in all,
        documents split by ``split`` (train/valid/test shares) and served from ``split_name``, ``mode``
        ``"concat"``, ``"pack"`` or ``"sentences"``; ``blend`` and ``max_upsample``: the blend's weights
        (:func:`babelfeed.lm.options.blend_weights`). ``babelfeed.build_iterator`` takes the same from a config,
        checked."""
        # each argument by its config key's rule (babelfeed.lm.options): the API refuses what a config would
        given = {"data_path": data_path, "split": split, "split_name": split_name, "mode": mode, "seq_len": seq_len,
                 "global_batch": global_batch, "num_samples": num_samples, "vocab_size": vocab_size, "verify": verify,
                 "blend": blend, "max_upsample": max_upsample}
        parsed = {name: LM_KEYS[name].parsed(value) for name, value in given.items()}
        SEED.value(seed)
        if cache_dir is not None:
            LM_KEYS["cache_dir"].value(os.fspath(cache_dir) if isinstance(cache_dir, os.PathLike) else cache_dir)
        cache = IndexCache(cache_dir) if cache_dir else None

        entries = [(w, resolve_prefix(p)) for w, p in parsed["data_path"]]  # (s3://...: local shadows)
        sources = [LMSource(prefix, split, split_name, seq_len, mode, seed, cache, verify) for _, prefix in entries]
        for (_, prefix), source in zip(entries, sources):
            if mode != "concat" and 0 < source.epoch_tokens() < seq_len:  # (concat says so as it cuts its samples)
                raise DataError(f"{prefix}: an epoch of its {split_name} split holds {source.epoch_tokens():,} tokens, "
                                f"fewer than one row of seq_len={seq_len:,}: a {mode} row would hold every document "
                                f"of it several times over (or be mostly padding); lower seq_len")
        weights = blend_weights([w for w, _ in entries], [s.epoch_tokens() / seq_len for s in sources], num_samples,
                                parsed["blend"], parsed["max_upsample"])
        return cls(sources, weights, num_samples, global_batch, rank, world_size, cache, name=split_name,
                   vocab_size=vocab_size)

    # ----------------------------------------------------------------------------------------- iteration
    def __len__(self) -> int:
        return self.num_samples // self.global_batch

    batches_per_step = 1  # every step takes one global batch, split into rows per rank

    def steps_after(self, base: int) -> int:
        """The global batches from ``base`` to the end of the run."""
        return max(len(self) - int(base), 0)

    def has_batch(self, k: int, base: int | None = None) -> bool:
        return k >= 0 and 0 <= (base or 0) + k < len(self)

    @timed("batch")
    def __next__(self) -> dict:
        if self.consumed >= self.num_samples:
            raise StopIteration
        batch = self._batch(self.consumed // self.global_batch, (self.consumed // self.global_batch, 0, 1))
        self.consumed += self.global_batch
        return batch

    def batch_at(self, k: int, base: int = 0) -> dict:
        """This rank's rows of global batch ``base + k``, without moving the iterator."""
        return self._batch(int(base) + k, (k, int(base)))

    def _batch(self, k: int, at: tuple) -> dict:
        """Global batch ``k``; ``at``: ``(k, base[, stride])`` as the caller counts it (remote data: the batches
        after it are fetched ahead, :class:`~babelfeed.iterators.fetch_ahead.FetchAhead`)."""
        if not 0 <= k < len(self):
            raise OutOfRange(f"batch {k} out of range: the run has {len(self)} global batches")
        spaces = self.spaces
        if spaces.remote:
            self._fetch_ahead().before(at[0], at[1], 1, at[2] if len(at) > 2 else None, float(k))
            spaces = spaces.reading(due=float(k))  # (the fetcher's clock: this global batch)
            # (the gather still checks its ranges against the pinned group, in-process: a blend changed since
            # the lookahead planned it is fetched as it is read, never read from a hole)
        mine = self._my_rows(self.global_batch)
        if (self.dataset_index[k * self.global_batch + mine] < 0).any():
            self._refuse_missing(k * self.global_batch, (k + 1) * self.global_batch)
        first, count, ptr, pieces = self._window(k)
        per_rank = len(mine)
        a = (k - first) * per_rank
        lo, hi = int(ptr[a]), int(ptr[a + per_rank])
        rows = np.repeat(np.arange(per_rank), count[a:a + per_rank])
        batch = self._assemble(rows, {key: v[lo:hi] for key, v in pieces.items()},
                               self.dataset_index[k * self.global_batch + mine], spaces)
        if self.skips:
            self._drop_skipped(batch, k * self.global_batch + mine)
        return batch

    def _drop_skipped(self, batch: dict, g: np.ndarray) -> None:
        """Rows of global samples ``g`` that the run's skips drop become rows that teach nothing: tokens and
        labels 0, ``loss_mask`` 0, one segment, positions 0, 1, ..., ``dataset`` -1 (the skipped sample's tokens
        never reach the model)."""
        drop = self.skips.dropped_samples(g, self._where)
        if not drop.any():
            return
        width = batch["tokens"].shape[1]
        for key in ("tokens", "labels", "loss_mask"):
            batch[key][drop] = 0
        batch["segment_ids"][drop] = 1
        batch["positions"][drop] = np.arange(width, dtype=batch["positions"].dtype)
        batch["dataset"][drop] = -1

    def real_tokens_of(self, g) -> np.ndarray:
        """Per global sample of ``g``: its real input tokens (what the ledger counts)."""
        g = np.asarray(g, np.int64)
        out = np.zeros(len(g), np.int64)
        which, k_in = self.dataset_index[g].astype(np.int64), self.dataset_sample[g]
        for d in np.unique(which[which >= 0]).tolist():
            sel = np.flatnonzero(which == d)
            epochs, samples = self.sources[d].locate(k_in[sel])
            for e in np.unique(epochs).tolist():
                out[sel[epochs == e]] = self._real_tokens(*self.sources[d].pieces(e, samples[epochs == e],
                                                                                  self.seq_len + 1))
        return out

    def _where(self, where: dict, g: np.ndarray) -> np.ndarray:
        """Which of global samples ``g`` match a skip's ``where`` (a dataset, and the samples holding any
        document of a range)."""
        names = self.dataset_names()
        which = self.dataset_index[g].astype(np.int64)
        datasets = [names.index(n) for n in where.get("dataset", names) if n in names]
        out = np.isin(which, datasets)
        if "documents" not in where or not out.any():
            return out
        lo, hi = where["documents"]
        hit = np.zeros(len(g), bool)
        k_in = self.dataset_sample[g]
        for d in np.unique(which[out]).tolist():
            src = self.sources[d]
            sel = np.flatnonzero(out & (which == d))
            doc_starts = np.asarray(src.ds.doc_idx, dtype=np.int64) if len(src.ds.doc_idx) else None
            epochs, samples = src.locate(k_in[sel])
            for e in np.unique(epochs).tolist():
                sub = sel[epochs == e]
                count, p = src.pieces(e, samples[epochs == e], self.seq_len + 1)
                seq = np.asarray(p["sequence"], np.int64)
                docs = np.searchsorted(doc_starts, seq, side="right") - 1 if doc_starts is not None else seq
                inside = (docs >= lo) & (docs < hi)
                owner = np.repeat(np.arange(len(sub)), count)
                hit[sub] = np.bincount(owner, weights=inside, minlength=len(sub)) > 0
        return hit

    @timed("plan")
    def _window(self, k: int, ahead: bool = False):
        """The plan of the window of global batches holding batch k: this rank's samples, their pieces (CSR).
        ``ahead``: planned for the lookahead (its files are checked when a batch of it is read)."""
        mine = self._my_rows(self.global_batch)
        n_batches = max(1, WINDOW_SAMPLES // len(mine))
        first = k - k % n_batches
        got = self._plans.pop(first, None)
        if got is not None and got[-1] == self.row_blocks:
            if got[-2] and not ahead:  # (planned ahead, read now: its files checked as a new window's are)
                self.spaces.check_sizes()
                got = (*got[:-2], False, got[-1])
            self._plans[first] = got  # (the most recently used last)
            return first, *got[1:-2]
        if not ahead:
            self.spaces.check_sizes()  # a new window of batches: its files still whole (a truncated one: SIGBUS)
        n_batches = min(n_batches, len(self) - first)
        g = (np.arange(first, first + n_batches)[:, None] * self.global_batch + mine[None, :]).reshape(-1)
        which, k_in = self.dataset_index[g].astype(np.int64), self.dataset_sample[g]
        count = np.zeros(len(g), np.int64)
        groups = []
        width = self.seq_len + 1
        for d in np.unique(which[which >= 0]).tolist():  # (-1: a dataset an edit removed, before this config's part)
            sel = np.flatnonzero(which == d)
            epochs, samples = self.sources[d].locate(k_in[sel])
            for e in np.unique(epochs).tolist():
                sub = sel[epochs == e]
                c, p = self.sources[d].pieces(e, samples[epochs == e], width)
                count[sub] = c
                p["space"] = np.full(len(p["start"]), self.space_of[d], np.int64)
                groups.append((sub, c, p))
        ptr = np.concatenate([[0], np.cumsum(count)])
        pieces = {key: np.empty(int(ptr[-1]), np.int64) for key in ("start", "length", "column", "space")}
        for sub, c, p in groups:  # into sample order
            dest = ragged_arange(ptr[sub], c)
            for key in pieces:
                pieces[key][dest] = p[key]
        while len(self._plans) >= 3:
            self._plans.pop(next(iter(self._plans)))
        self._plans[first] = (n_batches, count, ptr, pieces, ahead, self.row_blocks)
        return first, count, ptr, pieces

    # ------------------------------------------------------------------------------- remote data, ahead
    def _fetch_rows(self, ks: range, base: int) -> tuple[list, int]:
        """The remote byte ranges of this rank's rows of global batches ``base + k`` for ``k`` in ``ks`` (each
        with its batch's clock), and how many of them the run has."""
        per_rank = len(self._my_rows(self.global_batch))
        parts: dict = {}
        got = 0
        for k in ks:
            g = base + k
            if not 0 <= g < len(self):
                break
            first, _, ptr, pieces = self._window(g, ahead=True)
            a = (g - first) * per_rank
            lo, hi = int(ptr[a]), int(ptr[a + per_rank])
            parts.setdefault(first, (pieces, []))[1].append((lo, hi, g))
            got += 1
        files: list = []
        for pieces, runs in parts.values():
            idx = np.concatenate([np.arange(lo, hi) for lo, hi, _ in runs])
            clocks = np.concatenate([np.full(hi - lo, float(g)) for lo, hi, g in runs])
            files += self.spaces.ranges(pieces["space"][idx], pieces["start"][idx], pieces["length"][idx], clocks)
        return files, got

    def _fetch_shares(self) -> tuple[dict, int, int]:
        """``{path: (share, rows, inode)}``: the share of each remote ``.bin``'s documents the run reads on this rank
        (its samples' tokens over the file's, capped at one), the documents it holds and the file the dataset
        opened; the ranks, and this one."""
        if getattr(self, "_shares", None) is None:
            drawn = np.bincount(self.dataset_index[self.dataset_index >= 0], minlength=len(self.sources))
            out = {}
            for d, src in enumerate(self.sources):
                tokens = max(int(np.asarray(src.ds.sizes).sum()), 1)
                out[src.ds.data_file] = (min(1.0, float(drawn[d]) * (self.seq_len + 1) / tokens) / self.world_size,
                                         len(src.ds), src.ds.bin_inode)
            self._shares = out
        return self._shares, self.world_size, self.rank

    def _refuse_tokens(self, text: np.ndarray, bad: tuple, rows: np.ndarray, p: dict, dataset: np.ndarray) -> None:
        """The token id at ``bad`` (row, column) is outside the vocabulary: name the file and record it came from."""
        width = text.shape[1]
        flat = bad[0] * width + bad[1]
        dest = rows * width + p["column"]
        k = int(np.flatnonzero((dest <= flat) & (flat < dest + p["length"]))[0])
        source = self.sources[int(dataset[flat // width])]
        address = int(p["start"][k]) + flat - int(dest[k]) - source.at[1]
        starts = np.asarray(source.ds.pointers) // source.ds.dtype.itemsize
        record = int(np.searchsorted(starts, address, side="right")) - 1
        raise FormatError(source.ds.data_file, f"record {record} holds token id {int(text.flat[flat])}, outside "
                                               f"the vocabulary of {self.vocab_size} symbols (vocab_size)")

    def _assemble(self, rows: np.ndarray, p: dict, dataset: np.ndarray, spaces=None) -> dict:
        """One rank's batch from its pieces: one gather of every piece, written at (row, column). ``spaces``: the
        token spaces as this batch reads them (``TokenSpaces.reading``), default the iterator's."""
        n, width = len(dataset), self.seq_len + 1
        text = np.zeros((n, width), dtype=np.int64)
        space = p["space"] if len(self.spaces) > 1 else (int(self.space_of[0]) if len(self.space_of) else 0)
        t0 = time.perf_counter()
        gather.scatter(self.spaces if spaces is None else spaces, space, p["start"], p["length"], text,
                       rows * width + p["column"])
        STAGES.add("gather", time.perf_counter() - t0, inside=STAGES.in_batch())
        bad = gather.first_outside(text, self.vocab_size) if self.vocab_size else None
        if bad is not None:
            self._refuse_tokens(text, bad, rows, p, dataset)
        if self.mode == "pack":
            seg, pos, _, _ = segments(n, width, rows, p["column"], p["length"])
            mask = (seg > 0).astype(np.float32)
        elif self.mode == "sentences":
            real = np.arange(width) < np.bincount(rows, weights=p["length"], minlength=n)[:, None]
            mask, seg = real.astype(np.float32), real.astype(np.int32)
            pos = np.where(real, np.arange(width), 0).astype(np.int32)
        else:
            mask = np.ones((n, width), np.float32)
            seg = np.ones((n, width), np.int32)
            pos = np.broadcast_to(np.arange(width, dtype=np.int32), (n, width))
        # a label counts when it is a real token of the same document as its input (pack mode masks the jump
        # from one document's last token to the next document's first)
        loss_mask = mask[:, 1:] * (mask[:, :-1] > 0) * (seg[:, 1:] == seg[:, :-1])
        return {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask.astype(np.float32),
                "segment_ids": seg[:, :-1], "positions": np.ascontiguousarray(pos[:, :-1]),
                "dataset": dataset.astype(np.int32)}

    # ----------------------------------------------------------------------------------------- provenance
    def datasets(self) -> list:
        return [s.ds for s in self.sources]

    def dataset_names(self) -> list[str]:
        """A name per blended dataset: its prefix's file name, or the whole prefix where two share a name."""
        base = [os.path.basename(s.prefix) for s in self.sources]
        return [b if base.count(b) == 1 else s.prefix for b, s in zip(base, self.sources)]

    def describe_ids(self, g) -> list[dict]:
        """Where global samples ``g`` of the run (``batch k`` holds ``k * global_batch ...``) came from: per
        sample ``{"sample", "dataset", "prefix", "epoch" (the dataset's), "index" (its sample in that epoch),
        "records" (the .idx records its tokens come from, in order), "documents", "tokens" (its real input
        tokens: the ``tokens`` positions of its row that hold data)}``."""
        g = np.asarray(g, dtype=np.int64).reshape(-1)
        if len(g) and (g.min() < 0 or g.max() >= self.num_samples):
            raise UsageError(f"sample {int(g.max() if g.max() >= self.num_samples else g.min())} is not a sample of "
                             f"this run (0 to {self.num_samples - 1})")
        which, k_in = self.dataset_index[g].astype(np.int64), self.dataset_sample[g]
        if len(g) and (which < 0).any():
            self._refuse_missing(int(g[which < 0].min()), int(g[which < 0].min()) + 1)
        names = self.dataset_names()
        out: list = [None] * len(g)
        for d in np.unique(which).tolist():
            src = self.sources[d]
            sel = np.flatnonzero(which == d)
            epochs, samples = src.locate(k_in[sel])
            doc_starts = np.asarray(src.ds.doc_idx, dtype=np.int64) if len(src.ds.doc_idx) else None
            for e in np.unique(epochs).tolist():
                sub = sel[epochs == e]
                count, p = src.pieces(e, samples[epochs == e], self.seq_len + 1)
                ptr = np.concatenate([[0], np.cumsum(count)])
                real = self._real_tokens(count, p)
                for i, (at, j) in enumerate(zip(sub.tolist(), samples[epochs == e].tolist())):
                    seq = p["sequence"][ptr[i]:ptr[i + 1]]
                    docs = (np.searchsorted(doc_starts, seq, side="right") - 1).tolist() if doc_starts is not None \
                        else []
                    out[at] = {"sample": int(g[at]), "dataset": names[d], "prefix": src.prefix, "epoch": int(e),
                               "index": int(j), "records": seq.tolist(), "documents": sorted(set(docs)),
                               "tokens": int(real[i])}
        return out

    def fingerprint(self) -> str:
        """The data (each dataset's size hashes, which key its shuffles, whatever its path) and every setting
        that shapes the sample sequence (the batch size and the run length do not)."""
        blob = json.dumps(self._description(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _description(self) -> dict:
        s0 = self.sources[0]
        return {"kind": "lm", "weights": self.weights, "seq_len": self.seq_len, "mode": self.mode,
                "seed": s0.seed, "split": s0.split, "split_name": s0.split_name,
                "sources": [(s.data_key, len(s.ds), s.ds.bin_size) for s in self.sources]}

    def identity(self) -> dict:
        d = json.loads(json.dumps(self._description()))
        # datasets by name, their data by digest: a mismatch says "the data of books changed", not two digests
        return {"opts": {("data_path weights" if k == "weights" else k): d[k]
                         for k in ("weights", "seq_len", "mode", "seed", "split", "split_name")},
                "streams": {name: f"{str(key)[:12]}: {n} samples, {size} bytes"
                            for name, (key, n, size) in zip(self.dataset_names(), d["sources"])}}

    def _seek(self, epoch: int, consumed: int, total_steps: int) -> None:
        if epoch != 1:
            raise UsageError(f"an LM run is one pass (epoch 1), not epoch {epoch}")
        self.consumed = min(int(consumed) * self.global_batch, self.num_samples)

    def epoch_batches(self, epoch: int) -> int:
        return len(self)

    def position(self) -> tuple[int, int]:
        return 1, self.consumed // self.global_batch

    @property
    def total_steps(self) -> int:
        return self.consumed // self.global_batch
