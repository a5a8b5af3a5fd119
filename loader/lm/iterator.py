"""Language-model pretraining batches over blended indexed datasets (Megatron-style data paths).

    it = LMIterator.build("0.3 data/web 0.7 data/books", seq_len=2048, global_batch=64, num_samples=64_000,
                          split="969,30,1", mode="concat", cache_dir="cache")
    for batch in it: batch["tokens"], batch["labels"], batch["loss_mask"], batch["segment_ids"], ...

* Each dataset is split by documents (``"969,30,1"``, contiguous, Megatron's rounding) and read as its
  sequences, which are shuffled **per epoch** (Megatron shuffles once across all epochs, so a document can
  repeat back to back, issue #697). Modes ``concat``, ``pack`` and ``sentences``: see ``lm_plan.py``.
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
  one vectorised gather of its pieces from the token space (``gather.py``). No per-sample Python.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from babelfeed.checks import at_least
from babelfeed.gather import engine as gather
from babelfeed.errors import FormatError
from babelfeed.lm.blending import IndexCache, blending_indices, parse_data_path
from babelfeed.iterators.protocol import STATE_VERSION, LoaderIterator, StateMismatch
from babelfeed.lm.plan import MODES, LMSource
from babelfeed.plan.packing import ragged_arange, segments

WINDOW_SAMPLES = 1 << 14  # samples (of this rank) planned at once


class LMIterator(LoaderIterator):
    """Static (B / world_size, seq_len) batches of a blended LM dataset for one rank."""

    kind = "lm"

    def __init__(self, sources: list[LMSource], weights, num_samples: int, global_batch: int, rank: int = 0,
                 world_size: int = 1, cache: IndexCache | None = None, split: str = "rows", name: str = "train",
                 vocab_size: int = 0):
        if split != "rows":
            raise ValueError("an LM iterator splits every global batch into rows per rank (split='rows'): "
                             "global_batch counts the samples of one step over all ranks")
        super().__init__(rank, world_size, split)
        if global_batch < 1 or global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} must be a positive multiple of world_size {world_size}")
        if num_samples < global_batch:
            raise ValueError(f"num_samples={num_samples} is less than one global batch ({global_batch} samples)")
        self.sources, self.weights, self.global_batch = sources, [float(w) for w in weights], global_batch
        self.name = name
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
        # the run's blend over time (babelfeed.lm.mixture): [] while it blends the config's weights throughout
        self.blend_events: list = []
        self.skip_events: list = []  # it.skip's events, in the order made (babelfeed.iterators.skips)
        self.consumed = 0  # global samples
        # the planned windows, at most three, least recently used first (the one read, and those the lookahead
        # plans for remote data):
        # first global batch -> (batches, counts, piece pointers, pieces, row blocks)
        self._plans: dict = {}

    # the config spec's checks (check_known_keys, validate); set by babelfeed.build, as the spec lives a layer above
    check_config = None

    @classmethod
    def build(cls, data_path, seq_len: int, global_batch: int, num_samples: int, split: str = "969,30,1",
              split_name: str = "train", mode: str = "concat", seed: int = 1, cache_dir=None, rank: int = 0,
              world_size: int = 1, verify: str = "full", vocab_size: int = 0) -> "LMIterator":
        """An LM iterator from Megatron's ``--data-path`` string (``"0.3 PREFIX 0.7 PREFIX"``) and the run's shape:
        rows of ``seq_len`` tokens, ``global_batch`` rows a step over all ranks, ``num_samples`` rows in all,
        documents split by ``split`` (train/valid/test shares) and served from ``split_name``, ``mode``
        ``"concat"``, ``"pack"`` or ``"sentences"``. ``from_config`` takes the same from a config."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        for key, value, low in (("seq_len", seq_len, 1), ("global_batch", global_batch, 1),
                                ("num_samples", num_samples, 1), ("vocab_size", vocab_size, 0)):
            at_least(key, value, low)  # (seq_len 0 served (8, 0) batches, or divided by zero)
        cache = IndexCache(cache_dir) if cache_dir else None
        from babelfeed.storage.remote import resolve_prefix

        entries = [(w, resolve_prefix(p)) for w, p in parse_data_path(data_path)]  # (s3://...: local shadows)
        sources = [LMSource(prefix, split, split_name, seq_len, mode, seed, cache, verify) for _, prefix in entries]
        return cls(sources, [w for w, _ in entries], num_samples, global_batch, rank, world_size, cache,
                   name=split_name, vocab_size=vocab_size)

    @classmethod
    def from_config(cls, config, rank: int = 0, world_size: int = 1) -> "LMIterator":
        """From a config like configs/lm_packing.py, checked as ``babelfeed.build_iterator`` checks it: every key
        known (a typo is refused with a suggestion), every value of its type and range."""
        from babelfeed.iterators.edits import snapshot

        cls.check_config(config)
        it = cls.build(config.data_path, seq_len=config.seq_len, global_batch=config.global_batch,
                       num_samples=config.num_samples, split=config.split, split_name=config.split_name,
                       mode=config.mode, seed=config.seed, cache_dir=config.cache_dir or None, rank=rank,
                       world_size=world_size, verify=config.get("verify", "full"),
                       vocab_size=config.get("vocab_size", 0))
        it.config_snapshot, it.source_config = snapshot(config), config
        return it

    # ----------------------------------------------------------------------------------------- iteration
    def __len__(self) -> int:
        return self.num_samples // self.global_batch

    batches_per_step = 1  # every step takes one global batch, split into rows per rank

    def steps_after(self, base: int) -> int:
        """The global batches from ``base`` to the end of the run."""
        return max(len(self) - int(base), 0)

    def has_batch(self, k: int, base: int | None = None) -> bool:
        return k >= 0 and 0 <= (base or 0) + k < len(self)

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
            raise IndexError(f"batch {k} out of range: the run has {len(self)} global batches")
        if self.spaces.remote:
            from babelfeed.storage.remote import set_clock

            set_clock(float(k))
            self._fetch_ahead().before(at[0], at[1], 1, at[2] if len(at) > 2 else None)
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
                               self.dataset_index[k * self.global_batch + mine])
        if self.skip_events:
            self._drop_skipped(batch, k * self.global_batch + mine)
        return batch

    def _drop_skipped(self, batch: dict, g: np.ndarray) -> None:
        """Rows of global samples ``g`` that the run's skips drop become rows that teach nothing: tokens and
        labels 0, ``loss_mask`` 0, one segment, positions 0, 1, ..., ``dataset`` -1 (the skipped sample's tokens
        never reach the model)."""
        drop = self.skipped_samples(g)
        if not drop.any():
            return
        width = batch["tokens"].shape[1]
        for key in ("tokens", "labels", "loss_mask"):
            batch[key][drop] = 0
        batch["segment_ids"][drop] = 1
        batch["positions"][drop] = np.arange(width, dtype=batch["positions"].dtype)
        batch["dataset"][drop] = -1

    def skipped_samples(self, g, events: list | None = None) -> np.ndarray:
        """Which of global samples ``g`` the run's skips (or ``events``) drop (each skip from the sample it took
        effect at)."""
        from babelfeed.iterators.skips import in_ranges, merged

        g = np.asarray(g, np.int64)
        out = np.zeros(len(g), bool)
        for e in self.skip_events if events is None else events:
            if "samples" in e or "ids" in e:  # (global samples: positions the run had not reached)
                out |= in_ranges(g, *merged(e.get("samples", e.get("ids"))))
                continue
            live = g >= e["sample"]
            if not live.any():
                continue
            out |= live & self._where(e["where"], g)
        return out

    def skip_which(self, g) -> np.ndarray:
        """Per global sample of ``g``: the index in ``skip_events`` of the first skip that drops it, -1 where
        none does (what the ledger's report attributes to each skip)."""
        g = np.asarray(g, np.int64)
        out = np.full(len(g), -1, np.int64)
        for i, e in enumerate(self.skip_events):
            out[(out < 0) & self.skipped_samples(g, [e])] = i
        return out

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
        """``{path: (share, rows)}``: the share of each remote ``.bin``'s documents the run reads on this rank
        (its samples' tokens over the file's, capped at one) and the documents it holds; the ranks, and this one."""
        if getattr(self, "_shares", None) is None:
            drawn = np.bincount(self.dataset_index[self.dataset_index >= 0], minlength=len(self.sources))
            out = {}
            for d, src in enumerate(self.sources):
                tokens = max(int(np.asarray(src.ds.sizes).sum()), 1)
                out[src.ds.data_file] = (min(1.0, float(drawn[d]) * (self.seq_len + 1) / tokens) / self.world_size,
                                         len(src.ds))
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

    def _assemble(self, rows: np.ndarray, p: dict, dataset: np.ndarray) -> dict:
        """One rank's batch from its pieces: one gather of every piece, written at (row, column)."""
        n, width = len(dataset), self.seq_len + 1
        text = np.zeros((n, width), dtype=np.int64)
        space = p["space"] if len(self.spaces) > 1 else (int(self.space_of[0]) if len(self.space_of) else 0)
        gather.scatter(self.spaces, space, p["start"], p["length"], text, rows * width + p["column"])
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
    def dataset_names(self) -> list[str]:
        """A name per blended dataset: its prefix's file name, or the whole prefix where two share a name."""
        base = [os.path.basename(s.prefix) for s in self.sources]
        return [b if base.count(b) == 1 else s.prefix for b, s in zip(base, self.sources)]

    def describe_samples(self, g) -> list[dict]:
        """Where global samples ``g`` of the run (``batch k`` holds ``k * global_batch ...``) came from: per
        sample ``{"sample", "dataset", "prefix", "epoch" (the dataset's), "index" (its sample in that epoch),
        "records" (the .idx records its tokens come from, in order), "documents", "tokens" (its real input
        tokens: the ``tokens`` positions of its row that hold data)}``."""
        g = np.asarray(g, dtype=np.int64).reshape(-1)
        if len(g) and (g.min() < 0 or g.max() >= self.num_samples):
            raise ValueError(f"sample {int(g.max() if g.max() >= self.num_samples else g.min())} is not a sample of "
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

    def trace(self, step: int, state: dict | None = None) -> list[dict]:
        """The samples of training step ``step`` (1-based; a step is one global batch) on every rank: where each
        row came from (:meth:`describe_samples`) and the rank that holds it. ``state``: a state of the run, checked
        against this data, whose history gives the blend of every step (weight changes, edits: its steps are its
        global batches)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an integer >= 1 (steps count from 1), got {step!r}")
        if state is not None:
            return self.run_of(state).trace(step)
        if step > len(self):
            raise ValueError(f"step {step} is past the run's end: it is {len(self)} global batches (num_samples)")
        first = (step - 1) * self.global_batch
        per_rank = self.global_batch // self.world_size
        g = np.arange(first, first + self.global_batch)
        rows = self.describe_samples(g)
        dropped = self.skipped_samples(g).tolist() if self.skip_events else [False] * len(g)
        return [{"step": step, "batch": step - 1, "rank": i // per_rank, "row": i % per_rank, **r,
                 "skipped": bool(x)} for i, (r, x) in enumerate(zip(rows, dropped))]

    # ----------------------------------------------------------------------------------------- ledger
    def ledger_totals(self, consumed: int | None = None) -> np.ndarray:
        """``int64[3, datasets]``: samples, tokens (their rows' real input tokens) and completed passes (epochs of
        the dataset's split) taken by every rank together up to global batch ``consumed`` (default: here). Samples
        and tokens are those served; samples the run's skips dropped are counted apart (:meth:`skipped_totals`),
        passes count them (the dataset moved past them)."""
        return self._count(consumed)[0]

    def skipped_totals(self, consumed: int | None = None) -> np.ndarray | None:
        """``int64[2, datasets]``: samples and tokens the run's skips dropped (never served) up to global batch
        ``consumed`` (default: here); None when the run made no skip."""
        return self._count(consumed)[1] if self.skip_events else None

    def _count(self, consumed: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(served totals as :meth:`ledger_totals` gives them, skipped samples and tokens) up to ``consumed``."""
        n = (self.consumed if consumed is None else int(consumed) * self.global_batch)
        cache = getattr(self, "_ledger_cache", None)
        if cache is None or cache[0] > n:
            cache = (0, np.zeros((3, len(self.sources)), np.int64), np.zeros((2, len(self.sources)), np.int64))
        done, totals, skipped = cache[0], cache[1].copy(), cache[2].copy()
        step = 1 << 16
        for lo in range(done, n, step):  # tokens count sample by sample: in blocks, remembered
            g = np.arange(lo, min(lo + step, n))
            which, k_in = self.dataset_index[g].astype(np.int64), self.dataset_sample[g]
            drop = self.skipped_samples(g) if self.skip_events else np.zeros(len(g), bool)
            keep = which >= 0  # (a dataset an edit removed: not among this config's, not counted here)
            which, k_in, drop = which[keep], k_in[keep], drop[keep]
            totals[0] += np.bincount(which, minlength=len(self.sources))  # (drawn: the passes count them)
            skipped[0] += np.bincount(which[drop], minlength=len(self.sources))
            for d in np.unique(which).tolist():
                src = self.sources[d]
                mine = which == d
                epochs, samples = src.locate(k_in[mine])
                gone = drop[mine]
                for e in np.unique(epochs).tolist():
                    real = self._real_tokens(*src.pieces(e, samples[epochs == e], self.seq_len + 1))
                    totals[1, d] += int(real.sum())
                    skipped[1, d] += int(real[gone[epochs == e]].sum())
        self._ledger_cache = (n, totals.copy(), skipped.copy())
        out = totals.copy()
        out[2] = self.passes(totals[0])
        out[:2] -= skipped
        return out, skipped

    def _real_tokens(self, count: np.ndarray, pieces: dict) -> np.ndarray:
        """Per sample of ``LMSource.pieces``' answer: its real input tokens (the ``tokens`` positions of its row
        that hold data)."""
        per = np.bincount(np.repeat(np.arange(len(count)), count), weights=pieces["length"], minlength=len(count))
        return np.minimum(per, self.seq_len).astype(np.int64)

    def passes(self, samples) -> np.ndarray:
        """Per blended dataset: the passes over its split that its first ``samples[d]`` samples complete (the
        epochs its next sample lies beyond)."""
        return np.array([int(src.locate(np.array([int(n)]))[0][0]) - 1 if n else 0
                         for src, n in zip(self.sources, samples)], np.int64)

    def ledger(self, prefix: str = "ledger", consumed: int | None = None) -> dict:
        """What every rank together has consumed, per blended dataset, at this position: a flat dict of numbers to
        log (``{prefix}/{dataset}/samples``, ``tokens``, ``passes``; ``{prefix}/samples``, ``tokens``,
        ``step``), counted from the plan, the same on every rank."""
        totals = self.ledger_totals(consumed)
        out: dict = {}
        for d, name in enumerate(self.dataset_names()):
            out[f"{prefix}/{name}/samples"] = int(totals[0, d])
            out[f"{prefix}/{name}/tokens"] = int(totals[1, d])
            out[f"{prefix}/{name}/passes"] = int(totals[2, d])
        removed = 0
        if self.blend_events:  # datasets an edit removed: their samples (their tokens need their data)
            from babelfeed.lm.mixture import offsets_at

            n = self.consumed if consumed is None else int(consumed) * self.global_batch
            keys = set(self.data_keys())
            names = {}
            for e in self.blend_events:
                names.update(e["names"])
            for key, taken in offsets_at(self.blend_events, n).items():
                if key not in keys and taken:
                    out[f"{prefix}/{names.get(key, key)}/samples"] = int(taken)
                    removed += int(taken)
        out[f"{prefix}/samples"] = int(totals[0].sum()) + removed
        out[f"{prefix}/tokens"] = int(totals[1].sum())
        skipped = self.skipped_totals(consumed)
        if skipped is not None:
            for d, name in enumerate(self.dataset_names()):
                out[f"{prefix}/{name}/skipped"] = int(skipped[0, d])
                out[f"{prefix}/{name}/skipped_tokens"] = int(skipped[1, d])
            out[f"{prefix}/skipped"] = int(skipped[0].sum())
        out[f"{prefix}/step"] = (self.consumed if consumed is None else int(consumed) * self.global_batch) \
            // self.global_batch
        return out

    # ----------------------------------------------------------------------------------------- state
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

    def get_state(self) -> dict:
        """``{"version", "kind": "lm", "name", "consumed_samples", "fingerprint", "identity", "history"}``; the
        history lists the blend's segments (``babelfeed.lm.mixture``), from the config's weights at sample 0, then
        the skips (``babelfeed.iterators.skips``)."""
        return {"version": STATE_VERSION, "kind": "lm", "name": self.name, "consumed_samples": self.consumed,
                "fingerprint": self.fingerprint(), "identity": self.identity(),
                "history": [dict(e) for e in (self.blend_events or [self._first_event()])]
                + [dict(e) for e in self.skip_events]}

    # ----------------------------------------------------------------------------------------- blend changes
    def data_keys(self) -> list[str]:
        """Per blended dataset, the key the blend's history names it by: its content digest (the same files under
        another path are the same dataset), with ``#2``, ``#3`` ... where one dataset is listed more than once."""
        out: list = []
        for s in self.sources:
            k = str(s.data_key)
            out.append(k if k not in out else f"{k}#{sum(1 for x in out if x.split('#')[0] == k) + 1}")
        return out

    def _first_event(self) -> dict:
        from babelfeed.lm.mixture import first_event

        return first_event(self.data_keys(), self.weights, self.dataset_names())

    def _set_blend(self, events: list) -> None:
        """Blend by ``events`` (the history's blend segments; [] or the config's own: the config's weights)."""
        from babelfeed.lm.mixture import arrays

        if not events or events == [self._first_event()]:
            self.blend_events = []
            self.dataset_index, self.dataset_sample = self._config_blend
        else:
            index_of = {k: i for i, k in enumerate(self.data_keys())}
            self.blend_events = [dict(e) for e in events]
            self.dataset_index, self.dataset_sample = arrays(events, self.num_samples, index_of)
        self._plans = {}
        self._ahead = self._shares = None  # (the batches ahead are another blend's now)
        self._ledger_cache = None

    def _missing(self, lo: int, hi: int) -> str | None:
        """The name of a dataset that gives a sample in ``[lo, hi)`` but is not among this iterator's, if any."""
        gone = np.flatnonzero(self.dataset_index[lo:hi] < 0)
        if not len(gone):
            return None
        sample = lo + int(gone[0])
        event = max((e for e in self.blend_events if e["sample"] <= sample), key=lambda e: e["sample"])
        keys = set(self.data_keys())
        names = [event["names"][k] for k in event["weights"] if k not in keys]
        name = names[0] if names else "?"
        if name in self.dataset_names():  # listed, but its files hold other data now
            return f"{name} (sample {sample}), whose data changed since (its content digest differs)"
        return f"{name} (sample {sample}), which this config does not list (an edit removed it)"

    def _refuse_missing(self, lo: int, hi: int) -> None:
        raise ValueError(f"global sample {lo} of this run came from dataset {self._missing(lo, hi)}: use the "
                         f"config and data of that part of the run")

    def set_weights(self, weights: dict) -> None:
        """Blend with ``weights`` (``{dataset name: weight}`` for every dataset, names as ``dataset_names()``) from
        the next global batch on. Every dataset goes on from its position: over the whole run, a dataset's samples
        are its own sequence, none repeated or skipped. Recorded in the state's history, so a resumed run blends
        exactly as this one. Call it on every rank at the same step."""
        from babelfeed.iterators.policy import scaled_weights
        from babelfeed.lm.mixture import add, offsets_at

        names = self.dataset_names()
        scaled = scaled_weights(weights, names, "dataset")
        at = self.consumed
        if at >= self.num_samples:
            raise ValueError("set_weights after the run's last batch: nothing is left to blend")
        events = self.blend_events or [self._first_event()]
        keys = self.data_keys()
        offsets = offsets_at(events, at)
        if events[-1]["sample"] == at and "changes" in events[-1]:  # (an edit resumed here: its record stays)
            changes = {"changes": events[-1]["changes"]}
        else:
            changes = {}
        event = {"event": "blend", "sample": int(at), **changes,
                 "weights": {k: scaled[n] for k, n in zip(keys, names)},
                 "offsets": {**offsets, **{k: offsets.get(k, 0) for k in keys}},
                 "names": {**events[-1]["names"], **dict(zip(keys, names))}}
        self._set_blend(add(events, event))

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """Leave data out of the rest of the run, from the next step on: ``steps`` (a ``range`` of training
        steps, 1-based, not yet taken: every row of their global batches), ``ids`` (global samples not yet
        served: ``trace``'s ``sample``) or ``where`` (``{"dataset": names, "documents": range(lo, hi)}``: the
        samples of those datasets, or of those holding any document of the range). Exactly one of them;
        ``reason`` is kept with it. A skipped row stays in its batch as a row that teaches nothing (``loss_mask``
        0, tokens 0, ``dataset`` -1); every other sample keeps its step. Recorded in the state's history, so a
        resumed run makes the same skip; ``trace``, ``batch_for_step`` and the ledger count with it. Call it on
        every rank at the same step. Returns the event recorded. (``world_size`` is accepted for the adapters'
        sake: an LM run's step is one global batch on any world size.)"""
        import copy

        from babelfeed.iterators.skips import (LM_TERMS, SkipError, as_ranges, name_list, range_arg, step_range,
                                               where_terms, which_kind)

        which_kind(steps, ids, where, reason)
        t, B = self.total_steps, self.global_batch
        event = {"event": "skip", "step": int(t), "sample": int(self.consumed), "reason": reason}
        if steps is not None:
            a, b = step_range(steps, t)
            if b - 1 > len(self):
                raise SkipError(f"steps {a}..{b - 1} run past the run's last step, {len(self)} (num_samples)")
            event.update(steps=[a, b], samples=[[(a - 1) * B, (b - 1) * B]])
        elif ids is not None:
            arr = np.asarray(ids) if isinstance(ids, (list, tuple, range, np.ndarray, int, np.integer)) and \
                not isinstance(ids, bool) else None
            if arr is None or arr.dtype.kind not in "iu" or arr.size == 0:
                raise SkipError(f"ids must be a non-empty list of global samples (trace's 'sample'), got "
                                f"{str(ids)[:200]}")
            arr = arr.reshape(-1)
            if arr.dtype.kind == "u" and int(arr.max()) >= self.num_samples:
                raise SkipError(f"sample {int(arr.max())} is not a sample of this run (it has {self.num_samples})")
            arr = arr.astype(np.int64)
            if arr.min() < self.consumed or arr.max() >= self.num_samples:
                bad = int(arr.min()) if arr.min() < self.consumed else int(arr.max())
                raise SkipError(f"sample {bad} is not a sample the run has yet to serve (it stands at sample "
                                f"{self.consumed}; it has {self.num_samples}): roll back to a state before it")
            event["ids"] = as_ranges(arr)
        else:
            where_terms(where, LM_TERMS, "an LM run")
            out: dict = {}
            if "dataset" in where:
                out["dataset"] = name_list(where["dataset"], "dataset", self.dataset_names())
            if "documents" in where:
                if "dataset" not in out and len(self.sources) > 1:
                    raise SkipError("where['documents'] names documents of one dataset: give where['dataset'] too")
                out["documents"] = range_arg(where["documents"], "where['documents']")
            if "documents" not in out and set(out.get("dataset", self.dataset_names())) >= set(self.dataset_names()):
                raise SkipError(f"where={out}: this skips every dataset of the blend, leaving nothing to serve")
            event["where"] = out
        self.skip_events = self.skip_events + [event]
        self._ledger_cache = None
        return copy.deepcopy(event)

    def batch_for_step(self, step: int, state: dict | None = None, rank: int | None = None,
                       world_size: int | None = None) -> dict:
        """The batch rank ``rank`` of ``world_size`` (default: this iterator's) received at training step
        ``step``, rebuilt exactly from the run's latest ``state`` (default: this iterator's own): its blend and
        skips, without serving the steps before it."""
        import copy

        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(self):
            raise ValueError(f"step must be an integer in [1, {len(self)}] (the run's global batches), got {step!r}")
        world = self.world_size if world_size is None else int(world_size)
        rank = self.rank if rank is None else rank
        if world < 1 or self.global_batch % world:
            raise ValueError(f"world_size {world} must divide global_batch {self.global_batch}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ValueError(f"rank must be an integer in [0, {world}), got {rank!r}")
        probe = copy.copy(self) if state is None else self.run_of(state)  # (this iterator left as it was)
        probe._plans, probe._ahead = {}, None
        probe.row_blocks = ((rank,), world)
        return probe._batch(step - 1, (step - 1, 0))

    def _seek(self, epoch: int, consumed: int, total_steps: int) -> None:
        if epoch != 1:
            raise ValueError(f"an LM run is one pass (epoch 1), not epoch {epoch}")
        self.consumed = min(int(consumed) * self.global_batch, self.num_samples)

    def epoch_batches(self, epoch: int) -> int:
        return len(self)

    def position(self) -> tuple[int, int]:
        return 1, self.consumed // self.global_batch

    @property
    def total_steps(self) -> int:
        return self.consumed // self.global_batch

    def set_state(self, state: dict, mixture_change: str = "refuse") -> None:
        """Continue after ``state`` (from ``get_state()``). A state of another config: ``mixture_change``
        (``protocol.MIXTURE_CHANGES``) says what to do. ``"allow"``: this config's blend differs from the saved
        run's (other weights, a dataset added or removed): every dataset goes on from its position, blended with
        this config's weights from the next step; a change to a kept dataset's data, or to ``seq_len``, ``mode``,
        ``seed`` or the split, is refused (they change the samples). ``"keep_position"``: this config's blend from
        the state's sample on, said out loud."""
        from babelfeed.iterators.protocol import check_mixture_change, say_kept_position

        check_mixture_change(mixture_change)
        strict = mixture_change != "keep_position"
        state = self._state_in(state)
        if (mixture_change == "allow" and isinstance(state, dict)
                and state.get("fingerprint") not in self.fingerprints()):
            return self._resume_edited(state)
        self._check_state(state, strict, {"consumed_samples": 0}, optional=("history",))
        consumed = state["consumed_samples"]
        if consumed % self.global_batch or consumed > self.num_samples:
            raise ValueError(f"consumed_samples={consumed} must be a multiple of global_batch={self.global_batch} "
                             f"and at most num_samples={self.num_samples}")
        events = self._events_of(state)
        skips = self._skips_of(state)
        before = (self.blend_events, self.dataset_index, self.dataset_sample)
        self._set_blend(events)
        missing = self._missing(int(consumed), self.num_samples)
        if missing:
            self.blend_events, self.dataset_index, self.dataset_sample = before
            raise ValueError(f"this state's blend takes samples from dataset {missing}: resume with the run's "
                             f"data_path and data")
        self.skip_events = skips
        self.consumed = int(consumed)
        if not strict:
            say_kept_position(self, state)

    def run_of(self, state) -> "LMIterator":
        """A copy of this iterator standing where the run whose ``state`` it is stands (any checkpoint holding
        one), with its blend and skips: what trace, replay and the ledger read a run through. The state is checked
        against this data and these settings; a state of an edited blend names its datasets in its history, so any
        config of the run with the same settings reads it. This iterator is left as it was."""
        import copy

        from babelfeed.iterators.history import upgrade
        from babelfeed.iterators.state import find_state

        state = upgrade(find_state(state, "state"))  # (a checkpoint holding it: {"data": state}, a loader's)
        events = self._events_of(state)
        self._check_state(state, not events, {"consumed_samples": 0}, optional=("history",))
        if events:
            self._check_blend_only(state, "this state is of a run with other settings")
        probe = copy.copy(self)
        if events:
            probe._set_blend(events)
        probe.skip_events = self._skips_of(state)
        probe.consumed = int(state["consumed_samples"])
        probe._ledger_cache = None  # (its counts are of this iterator's skips)
        return probe

    def _skips_of(self, state: dict) -> list:
        """The skip events of a state's history: an LM run's, none past its ``consumed_samples``."""
        from babelfeed.iterators.history import HistoryError, check

        skips = check(state["history"]).skips if "history" in state else []
        at = state.get("consumed_samples")
        for i, e in enumerate(skips):
            if "sample" not in e:
                raise HistoryError(f"iterator state field 'history': skip {i} is a translation run's (it names an "
                                   f"epoch and global batch); an LM run's names the global sample it took effect at")
            if isinstance(at, int) and e["sample"] > at:
                raise HistoryError(f"iterator state field 'history': skip {i} took effect at sample {e['sample']}, "
                                   f"past the state's consumed_samples={at}")
        return skips

    def _check_blend_only(self, state: dict, what: str) -> None:
        """Refuse a state whose settings other than the blend (seq_len, mode, seed, split) differ from this
        iterator's: they change every dataset's samples."""
        was = (state.get("identity") or {}).get("opts") or {}
        now = self.identity()["opts"]
        fixed = [k for k in now if k != "data_path weights" and was.get(k) != now[k]]
        if fixed:
            changes = ", ".join(f"{k} {was.get(k)!r} -> {now[k]!r}" for k in fixed)
            raise StateMismatch(f"{what}; {changes} changes every dataset's samples: use the run's settings")

    def _events_of(self, state: dict) -> list:
        """The blend events of a state's history, checked against its position: the first at sample 0, each at
        a global batch boundary no later than ``consumed_samples``, and each event's offsets exactly the samples
        the events before it took from every dataset (``babelfeed.lm.mixture``)."""
        from babelfeed.iterators.history import HistoryError, check
        from babelfeed.lm.mixture import check_offsets

        events = check(state["history"]).blend if "history" in state else []
        at = state.get("consumed_samples")
        for i, e in enumerate(events):
            if i == 0 and e["sample"] != 0:
                raise HistoryError(f"iterator state field 'history': an LM run's first blend event is at sample 0 "
                                   f"(the config's weights), this one at {e['sample']}")
            if e["sample"] % self.global_batch or (isinstance(at, int) and e["sample"] > at):
                raise HistoryError(f"iterator state field 'history': blend event {i} is at sample {e['sample']}; "
                                   f"a blend changes at a global batch ({self.global_batch} samples) no later than the "
                                   f"state's consumed_samples={at}")
        check_offsets(events)
        return events

    def _resume_edited(self, state: dict) -> None:
        """set_state with mixture_change="allow" for a state of another blend (weights or datasets)."""
        from babelfeed.lm.mixture import add, first_event, offsets_at

        self._check_state(state, False, {"consumed_samples": 0}, optional=("history",))
        self._check_blend_only(state, "an LM mixture edit changes the blend only")
        saved = state.get("identity") or {}
        events = self._events_of(state)
        if not events:  # a state of an older babelfeed: its blend was its config's weights, as its identity says
            weights = (saved.get("opts") or {}).get("data_path weights")
            streams = list((saved.get("streams") or {}))
            if not isinstance(weights, list) or len(weights) != len(streams) or len(set(streams)) != len(streams):
                raise ValueError("this LM state carries no blend history (saved by an older babelfeed) and its "
                                 "identity does not say its weights per dataset: resume with the run's data_path, "
                                 "then edit at a later state")
            events = [first_event(streams, weights, streams)]
        at = int(state["consumed_samples"])
        if at > self.num_samples or at % self.global_batch:
            raise ValueError(f"consumed_samples={at} must be a multiple of global_batch={self.global_batch} and at "
                             f"most num_samples={self.num_samples}")
        keys, names = self.data_keys(), self.dataset_names()
        last_names = {}
        for e in events:
            last_names.update(e["names"])
        by_name = {n: k for k, n in last_names.items()}
        changed = [n for n, k in zip(names, keys) if n in by_name and by_name[n] != k and by_name[n] not in keys]
        if changed:
            raise ValueError(f"dataset(s) {changed} hold other data than when this state was saved (their content "
                             f"digest changed): an edit may add or remove datasets, not change one's data")
        offsets = offsets_at(events, at)
        old = {last_names.get(k, k): w for k, w in events[-1]["weights"].items()}
        event = {"event": "blend", "sample": at, "weights": {k: float(w) for k, w in zip(keys, self.weights)},
                 "offsets": {**offsets, **{k: offsets.get(k, 0) for k in keys}},
                 "names": {**last_names, **dict(zip(keys, names))},
                 "changes": {"data_path": [old, dict(zip(names, self.weights))]}}
        self._set_blend(add(events, event))
        self.skip_events = self._skips_of(state)
        self.consumed = at
        self.last_edit = self._report(old, event)
        self.last_edit.say()

    def _report(self, old: dict, event: dict):
        """The report of a blend edit (``EditReport``): each dataset's share before and after."""
        from babelfeed.iterators.edits import EditReport

        new = dict(zip(self.dataset_names(), self.weights))
        a, b = sum(old.values()) or 1.0, sum(new.values()) or 1.0
        names = sorted(set(old) | set(new), key=lambda n: (-new.get(n, 0.0), n))
        step = self.consumed // self.global_batch
        return EditReport(step=step + 1, epoch=1, batch=step, changes=dict(event.get("changes", {})),
                          shares={n: (old.get(n, 0.0) / a, new.get(n, 0.0) / b) for n in names},
                          added=sorted(set(new) - set(old)), removed=sorted(set(old) - set(new)))

