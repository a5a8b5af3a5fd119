"""Language-model pretraining samples over blended indexed datasets (Megatron-style data paths).

    it = LMIterator.build("0.3 data/web 0.7 data/books", seq_len=2048, global_batch=64, num_samples=64_000,
                          split="969,30,1", mode="concat", cache_dir="cache")
    for batch in it: batch["tokens"], batch["labels"], batch["loss_mask"], (pack mode) batch["segment_ids"], ...

* Each dataset is split by documents (``"969,30,1"``, contiguous, Megatron's rounding) and read as its
  sequences, which are shuffled **per epoch** (Megatron shuffles once across all epochs, so a document can
  repeat back to back, issue #697).
* ``mode="concat"``: the epoch's sequences are concatenated and cut every ``seq_len`` tokens, each sample
  carrying one extra label token (Megatron's GPT sample index). ``mode="pack"``: whole sequences packed into
  rows of ``seq_len + 1`` tokens by best-fit decreasing, with ``segment_ids``/``positions`` so attention stays
  inside each document; padding is masked out of the loss. ``mode="sentences"``: BERT-style, consecutive
  sentences of one document up to ``seq_len + 1`` tokens per sample (seed 002).
* Datasets are blended by Megatron's greedy ``blending_indices`` over ``num_samples``; a dataset that runs out
  starts its next epoch (reshuffled) rather than repeating samples in the same order.
* Index arrays (blend, per-epoch sample indexes) are cached by :class:`~loader.blending.IndexCache` under names
  derived from everything they depend on.
* Global batch g holds samples ``[g B, (g + 1) B)``; rank r of W takes its ``B / W`` rows of it, so the batch
  content never depends on W, and the state is one integer (samples consumed), as Megatron's sampler keeps.
"""

from __future__ import annotations

import os

import numpy as np

from .blending import IndexCache, blending_indices, document_splits, parse_data_path
from .packing import gpt_sample_index, pack, pack_sentences
from .permute import derive_key, permute
from .storage.indexed import IndexedDataset

MODES = ("concat", "pack", "sentences")


class LMSource:
    """One dataset's split, with per-epoch shuffled sequence orders and sample indexes (cached)."""

    def __init__(self, prefix, split: str, split_name: str, seq_len: int, mode: str, seed: int,
                 cache: IndexCache | None):
        self.prefix = os.fspath(prefix)
        self.ds = IndexedDataset(prefix, verify="quick")
        parts = document_splits(self.ds, split)
        if parts.get(split_name) is None:
            raise ValueError(f"{self.prefix}: split {split!r} leaves no documents for {split_name!r}")
        self.sequences = np.arange(parts[split_name][1].start, parts[split_name][1].stop, dtype=np.int64)
        self.documents = parts[split_name][0]
        if not len(self.sequences):
            raise ValueError(f"{self.prefix}: the {split_name} split is empty")
        self.seq_len, self.mode, self.seed, self.cache = seq_len, mode, seed, cache
        self.split, self.split_name = split, split_name
        self._epochs: dict[int, dict] = {}
        self._counts: dict[int, int] = {}

    def _describe(self, epoch: int) -> dict:
        st = os.stat(self.prefix + ".idx")
        return {"kind": "lm-epoch", "prefix": os.path.abspath(self.prefix), "idx_size": st.st_size,
                "idx_mtime": st.st_mtime_ns, "split": self.split, "split_name": self.split_name,
                "seq_len": self.seq_len, "mode": self.mode, "seed": self.seed, "epoch": epoch}

    def _build(self, epoch: int) -> dict:
        order = self.sequences[permute(np.arange(len(self.sequences)), len(self.sequences),
                                       derive_key(self.seed, "lm-order", self.prefix, epoch))]
        sizes = np.asarray(self.ds.sizes, dtype=np.int64)
        if self.mode == "sentences":
            doc_idx = np.asarray(self.ds.doc_idx)[self.documents.start:self.documents.stop + 1]
            return {"order": order, "sentence_ranges": pack_sentences(sizes, doc_idx, self.seq_len + 1)}
        if self.mode == "concat":
            idx = gpt_sample_index(sizes, order, self.seq_len, add_extra_token=True)
            return {"order": order, "sample_index": idx}
        plan = pack(sizes[order], self.seq_len + 1)
        return {"order": order, "piece_sequence": plan.sequence, "piece_start": plan.start,
                "piece_length": plan.length, "piece_row": plan.row, "piece_offset": plan.offset,
                "num_rows": np.asarray([plan.num_rows], dtype=np.int64)}

    def epoch(self, e: int) -> dict:
        if e not in self._epochs:
            arrays = self.cache.get("lm", self._describe(e), lambda: self._build(e)) if self.cache else self._build(e)
            if self.mode == "pack":
                arrays = dict(arrays)
                row = np.asarray(arrays["piece_row"])
                arrays["row_order"] = np.argsort(row, kind="stable")
                arrays["row_start"] = np.searchsorted(row[arrays["row_order"]], np.arange(int(arrays["num_rows"][0]) + 1))
            self._epochs = {e: arrays}  # one epoch at a time in memory
        return self._epochs[e]

    def samples_per_epoch(self, e: int) -> int:
        if self.mode in ("concat", "sentences"):  # the same samples every epoch, only reordered
            e = 1
        if e not in self._counts:
            arrays = self.epoch(e)
            if self.mode == "sentences":
                self._counts[e] = len(arrays["sentence_ranges"])
            else:
                self._counts[e] = len(arrays["sample_index"]) - 1 if self.mode == "concat" else int(arrays["num_rows"][0])
        return self._counts[e]

    def sample(self, e: int, j: int) -> dict:
        """Tokens (seq_len + 1), loss mask, and for pack mode segment ids and positions, of sample j of epoch e."""
        arrays = self.epoch(e)
        width = self.seq_len + 1
        tokens = np.zeros(width, dtype=np.int64)
        if self.mode == "concat":
            idx, order = arrays["sample_index"], arrays["order"]
            (p0, o0), (p1, o1) = idx[j], idx[j + 1]
            at = 0
            for p in range(int(p0), int(p1) + 1):
                seq = int(order[p])
                start = int(o0) if p == p0 else 0
                stop = int(o1) + 1 if p == p1 else int(self.ds.sizes[seq])
                piece = self.ds.get(seq, start, max(0, min(stop, int(self.ds.sizes[seq])) - start))
                take = min(len(piece), width - at)
                tokens[at:at + take] = piece[:take]
                at += take
                if at >= width:
                    break
            return {"tokens": tokens, "mask": np.ones(width, np.float32), "segment_ids": np.ones(width, np.int32),
                    "positions": np.arange(width, dtype=np.int32)}
        if self.mode == "sentences":
            a, b = (int(x) for x in arrays["sentence_ranges"][j])
            text = np.concatenate([self.ds[i] for i in range(a, b)])[:width]
            tokens[: len(text)] = text
            real = np.arange(width) < len(text)
            return {"tokens": tokens, "mask": real.astype(np.float32), "segment_ids": real.astype(np.int32),
                    "positions": np.where(real, np.arange(width), 0).astype(np.int32)}
        seg = np.zeros(width, np.int32)
        pos = np.zeros(width, np.int32)
        members = arrays["row_order"][arrays["row_start"][j]:arrays["row_start"][j + 1]]
        members = members[np.argsort(np.asarray(arrays["piece_offset"])[members])]
        for k, m in enumerate(members.tolist(), start=1):
            seq = int(arrays["order"][int(arrays["piece_sequence"][m])])
            start, n, off = int(arrays["piece_start"][m]), int(arrays["piece_length"][m]), int(arrays["piece_offset"][m])
            tokens[off:off + n] = self.ds.get(seq, start, n)
            seg[off:off + n] = k
            pos[off:off + n] = np.arange(n)
        return {"tokens": tokens, "mask": (seg > 0).astype(np.float32), "segment_ids": seg, "positions": pos}


class LMIterator:
    """Static (B, seq_len) batches of a blended LM dataset for one rank; state is samples consumed."""

    def __init__(self, sources: list[LMSource], weights, num_samples: int, global_batch: int, rank: int = 0,
                 world_size: int = 1, cache: IndexCache | None = None):
        if global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} must be a multiple of world_size {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {rank}, {world_size}")
        self.sources, self.global_batch = sources, global_batch
        self.rank, self.world_size = rank, world_size
        self.num_samples = num_samples - num_samples % global_batch  # whole global batches
        description = {"kind": "lm-blend", "weights": [float(w) for w in weights], "size": self.num_samples,
                       "sources": [s._describe(0) for s in sources]}

        def build():
            d, s = blending_indices(weights, self.num_samples)
            return {"dataset": d, "sample": s}

        blend = cache.get("blend", description, build) if cache else build()
        self.dataset_index, self.dataset_sample = blend["dataset"], blend["sample"]
        self.consumed = 0  # global samples

    @classmethod
    def build(cls, data_path, seq_len: int, global_batch: int, num_samples: int, split: str = "969,30,1",
              split_name: str = "train", mode: str = "concat", seed: int = 1, cache_dir=None, rank: int = 0,
              world_size: int = 1) -> "LMIterator":
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        cache = IndexCache(cache_dir) if cache_dir else None
        entries = parse_data_path(data_path)
        sources = [LMSource(prefix, split, split_name, seq_len, mode, seed, cache) for _, prefix in entries]
        return cls(sources, [w for w, _ in entries], num_samples, global_batch, rank, world_size, cache)

    @classmethod
    def from_config(cls, config, rank: int = 0, world_size: int = 1) -> "LMIterator":
        """From a config like configs/lm_packing.py."""
        return cls.build(config.data_path, seq_len=config.seq_len, global_batch=config.global_batch,
                         num_samples=config.num_samples, split=config.split, split_name=config.split_name,
                         mode=config.mode, seed=config.seed, cache_dir=config.cache_dir or None, rank=rank,
                         world_size=world_size)

    def __len__(self) -> int:
        return self.num_samples // self.global_batch

    def _locate(self, source: LMSource, k: int) -> tuple[int, int]:
        """The k-th sample drawn from a source -> (epoch, sample within epoch); epochs follow one another."""
        e = 1
        while True:
            n = source.samples_per_epoch(e)
            if n <= 0:
                raise ValueError(f"{source.prefix}: an epoch of this split holds no sample of {source.seq_len} tokens")
            if k < n:
                return e, k
            k -= n
            e += 1

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.consumed >= self.num_samples:
            raise StopIteration
        per_rank = self.global_batch // self.world_size
        first = self.consumed + self.rank * per_rank
        rows = [self._sample(g) for g in range(first, first + per_rank)]
        self.consumed += self.global_batch
        text = np.stack([r["tokens"] for r in rows])
        mask = np.stack([r["mask"] for r in rows])
        seg = np.stack([r["segment_ids"] for r in rows])
        # a label counts when it is a real token of the same document as its input (pack mode masks the jump
        # from one document's last token to the next document's first)
        loss_mask = mask[:, 1:] * (mask[:, :-1] > 0) * (seg[:, 1:] == seg[:, :-1])
        return {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask.astype(np.float32),
                "segment_ids": seg[:, :-1], "positions": np.stack([r["positions"] for r in rows])[:, :-1],
                "dataset": self.dataset_index[first:first + per_rank].astype(np.int32)}

    def _sample(self, g: int) -> dict:
        src = self.sources[int(self.dataset_index[g])]
        e, j = self._locate(src, int(self.dataset_sample[g]))
        shuffled = permute(np.asarray([j]), src.samples_per_epoch(e), derive_key(src.seed, "lm-samples", src.prefix, e))
        return src.sample(e, int(shuffled[0]))

    def get_state(self) -> dict:
        return {"version": 1, "consumed_samples": self.consumed}

    def set_state(self, state: dict) -> None:
        self.consumed = int(state["consumed_samples"])
