"""grain end to end on [64, 128] padded batches: plain grain against the babelfeed grain adapter (issue 12).

The same sentence pairs (one direction, ``n`` pairs, lognormal(3.2, 0.7) lengths clipped to [2, 127] tokens,
</s> included, so a pair with its language token fits 128) feed both:

* plain grain, as a grain user writes it: ``grain.MapDataset.source(PairSource)`` whose records are one pair
  each (two ``np.memmap`` slices of the fairseq .bin/.idx files), ``.shuffle(seed)``, ``.map(PadPair())``
  (language token + sentence, padded to 128: source left-padded, target right-padded, prev_output_tokens with
  </s> moved to the front, as fairseq collates), ``.batch(64, drop_remainder=True)``, read through
  ``to_iter_dataset`` with ``num_threads=0`` (its best setting on 2 cores) or grain's default 16 threads;
* babelfeed: ``babelfeed.adapters.grain.batch_dataset(config, num_workers=0)`` with one static shape 128 x 128
  (``batching.shapes``) and ``max_tokens`` 8192, so every batch is [64, 128] (the last batch of a window is
  completed with masked rows, ``weight`` 0).

Each measurement runs in a fresh process: the first batch is timed from building the dataset (sources opened,
nothing planned yet) to the first batch in hand; the steady rate over the next batches.
"""

from __future__ import annotations

import os
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, ROWS, VOCAB = 128, 64, 32_000
HEADER = 26  # fairseq MMIDIDX: magic (9), version <Q, dtype <B, count <Q; then int32 sizes, int64 pointers


def build(root: str, n: int, log=print) -> str:
    """A data_bin of n (xx, yy) pairs, written chunk by chunk in fairseq's layout (cached)."""
    if os.path.exists(os.path.join(root, "dict.txt")):
        return root
    import babelfeed

    log(f"writing {n:,} sentence pairs to {root} ...")
    shard = os.path.join(root, "shard000")
    os.makedirs(shard, exist_ok=True)
    rng = np.random.default_rng(0)
    src_len = np.clip(rng.lognormal(3.2, 0.7, n), 2, WIDTH - 1).astype(np.int32)
    tgt_len = np.clip(src_len * rng.lognormal(0.0, 0.15, n), 2, WIDTH - 1).astype(np.int32)
    for lang, lens in (("xx", src_len), ("yy", tgt_len)):
        prefix = os.path.join(shard, f"train.xx-yy.{lang}")
        with open(prefix + ".bin", "wb") as f:
            for s in range(0, n, 1 << 21):
                part = lens[s:s + (1 << 21)]
                tok = rng.integers(4, VOCAB, int(part.sum()), dtype=np.uint16)
                tok[np.cumsum(part) - 1] = 2  # </s> ends every sentence
                f.write(tok.tobytes())
        ptr = (np.cumsum(lens, dtype=np.int64) - lens) * 2
        with open(prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", n))
            f.write(lens.tobytes() + ptr.tobytes())
    d = babelfeed.Dictionary()
    for i in range(VOCAB - 4):
        d.add_symbol(f"p{i}")
    d.add_language_tokens(["xx", "yy"])
    d.save(os.path.join(root, "dict.txt"))
    it = babelfeed.build_train_iterator(config(root))  # the first open checks every pointer and stamps the files
    next(it)
    return root


def config(root: str):
    import babelfeed

    cfg = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "nllb_like.py"))
    cfg.data.path = root
    cfg.batching.shapes = f"{WIDTH}x{WIDTH}"
    cfg.batching.max_tokens = ROWS * WIDTH  # 64 rows of 128
    cfg.filter.max_source_positions = cfg.filter.max_target_positions = WIDTH
    return cfg


# ------------------------------------------------------------------------------------------- plain grain
class PairSource:
    """A grain RandomAccessDataSource: record i is pair i, {"src": uint16[len], "tgt": uint16[len]} (memmap
    slices; files opened lazily, picklable)."""

    def __init__(self, root: str):
        self.prefixes = [os.path.join(root, "shard000", f"train.xx-yy.{lang}") for lang in ("xx", "yy")]
        with open(self.prefixes[0] + ".idx", "rb") as f:
            self.n = struct.unpack("<Q", f.read(HEADER)[18:26])[0]
        self._sides = None

    def _open(self):
        sides = []
        for p in self.prefixes:
            idx = np.memmap(p + ".idx", np.uint8, "r")
            sizes = idx[HEADER:HEADER + 4 * self.n].view(np.int32)
            starts = np.asarray(idx[HEADER + 4 * self.n:HEADER + 12 * self.n].view(np.int64) // 2)
            tokens = np.memmap(p + ".bin", np.uint16, "r").view(np.ndarray)  # slices without memmap's overhead
            sides.append((tokens, sizes.view(np.ndarray), starts))
        self._sides = sides
        return sides

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        (sb, ss, sp), (tb, ts, tp) = self._sides or self._open()
        a, b = int(sp[i]), int(tp[i])
        return {"src": sb[a:a + int(ss[i])], "tgt": tb[b:b + int(ts[i])]}

    def __repr__(self) -> str:
        return f"PairSource({self.prefixes[0]})"


def pad_pair_transform(src_lang: int, tgt_lang: int, pad: int = 1, eos: int = 2):
    import grain

    class PadPair(grain.transforms.Map):
        """One pair as fairseq collates it, padded to 128: src = [lang] + tokens left-padded, target =
        [lang] + tokens right-padded, prev_output_tokens = [</s>] + target[:-1]."""

        def map(self, rec: dict) -> dict:
            s, t = rec["src"], rec["tgt"]
            src = np.full(WIDTH, pad, np.int64)
            src[WIDTH - len(s) - 1] = src_lang
            src[WIDTH - len(s):] = s
            tgt = np.full(WIDTH, pad, np.int64)
            tgt[0] = tgt_lang
            tgt[1:len(t) + 1] = t
            prev = np.full(WIDTH, pad, np.int64)
            prev[0] = eos
            prev[1:len(t) + 1] = tgt[:len(t)]
            return {"net_input": {"src_tokens": src, "src_lengths": np.int64(len(s) + 1),
                                  "prev_output_tokens": prev}, "target": tgt}

    return PadPair()


def grain_dataset(root: str, threads: int):
    import grain

    import babelfeed

    d = babelfeed.Dictionary.load(os.path.join(root, "dict.txt"))
    ds = (grain.MapDataset.source(PairSource(root)).shuffle(seed=1)
          .map(pad_pair_transform(d.index("__xx__"), d.index("__yy__"), d.pad(), d.eos()))
          .batch(ROWS, drop_remainder=True))
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=threads) if threads >= 0 else None)


# ------------------------------------------------------------------------------------------- one run
def child(kind: str, root: str, batches: int) -> dict:
    """One measurement, in a fresh process: seconds from building the dataset to its first batch, then steady
    batches/s over the next ``batches`` batches, and the first batch's leaves (key, dtype, shape)."""
    import json

    import babelfeed
    from babelfeed.adapters import grain as grain_adapter

    import grain  # noqa: F401  (imported before the clock starts, as the adapter is)

    cfg = config(root)
    t0 = time.perf_counter()
    if kind == "adapter":
        ds = grain_adapter.batch_dataset(cfg, num_workers=0)
    elif kind == "plain":
        ds = babelfeed.build_train_iterator(cfg)
    else:
        ds = grain_dataset(root, threads={"grain": 0, "grain16": -1}[kind])
    it = iter(ds)
    first_batch = next(it)
    first = time.perf_counter() - t0
    t, cpu, n = time.perf_counter(), time.process_time(), 0
    for _ in it:
        n += 1
        if n >= batches:
            break
    rate = n / (time.perf_counter() - t)
    cpu_us = (time.process_time() - cpu) / max(n, 1) * 1e6  # this process's CPU per batch: less load-bound
    leaves = []

    def walk(prefix, x):
        if isinstance(x, dict):
            for k in sorted(x):
                walk(f"{prefix}{k}.", x[k])
        else:
            a = np.asarray(x)
            leaves.append(f"{prefix[:-1]} {a.dtype}{list(a.shape)}")

    walk("", first_batch)
    print(json.dumps({"first_s": first, "rate": rate, "cpu_us": cpu_us, "batches": n, "leaves": leaves}))
    return {}


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
