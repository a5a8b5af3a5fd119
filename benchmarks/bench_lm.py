"""LM batches ([64, 2048], Megatron-style blended datasets) through LMIterator, against the per-sample path.

The baseline is the per-sample algorithm LMIterator used before the gather engine (kept here, in the same
run): for every row, locate its sample, walk the sample's documents in Python reading each through
``IndexedDataset.get``, write them into a row, then ``np.stack`` the rows. Both read the same samples of the
same datasets; the first batches are checked equal, leaf by leaf, before timing. One core, warm page cache.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402


def build_data(root: str, tokens_per_dataset: int = 20_000_000) -> str:
    """Two Megatron-format datasets (web, books) of documents made of log-normal sentences (uint16)."""
    import babelfeed

    os.makedirs(root, exist_ok=True)
    for i, name in enumerate(("web", "books")):
        prefix = os.path.join(root, name)
        if os.path.exists(prefix + ".idx"):
            continue
        rng = np.random.default_rng(10 + i)
        with babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="megatron") as b:
            written = 0
            while written < tokens_per_dataset:
                k = int(rng.integers(1, 9))
                lens = np.clip(rng.lognormal(4.2, 0.6, k), 3, 1500).astype(np.int64)
                toks = rng.integers(10, 50000, int(lens.sum()), dtype=np.uint16)
                toks[np.cumsum(lens) - 1] = 2
                b.add_items(toks, lens)
                b.end_document()
                written += int(lens.sum())
            b.finalize()
    return root


# ------------------------------------------------------------------------------------ the per-sample path
def _sample(src, e: int, j: int) -> dict:
    """One sample, document by document in Python (the algorithm LMIterator used before the gather engine)."""
    arrays = src.epoch(e)
    width = src.seq_len + 1
    tokens = np.zeros(width, dtype=np.int64)
    ds = src.ds
    if src.mode == "concat":
        idx, order = arrays["sample_index"], arrays["order"]
        (p0, o0), (p1, o1) = idx[j], idx[j + 1]
        at = 0
        for p in range(int(p0), int(p1) + 1):
            seq = int(order[p])
            start = int(o0) if p == p0 else 0
            stop = int(o1) + 1 if p == p1 else int(ds.sizes[seq])
            piece = ds.get(seq, start, max(0, min(stop, int(ds.sizes[seq])) - start))
            take = min(len(piece), width - at)
            tokens[at:at + take] = piece[:take]
            at += take
            if at >= width:
                break
        return {"tokens": tokens, "mask": np.ones(width, np.float32), "segment_ids": np.ones(width, np.int32),
                "positions": np.arange(width, dtype=np.int32)}
    seg = np.zeros(width, np.int32)
    pos = np.zeros(width, np.int32)
    members = arrays["row_order"][arrays["row_start"][j]:arrays["row_start"][j + 1]]
    members = members[np.argsort(np.asarray(arrays["piece_offset"])[members])]
    for k, m in enumerate(members.tolist(), start=1):
        seq = int(arrays["order"][int(arrays["piece_sequence"][m])])
        start, n, off = int(arrays["piece_start"][m]), int(arrays["piece_length"][m]), int(arrays["piece_offset"][m])
        tokens[off:off + n] = ds.get(seq, start, n)
        seg[off:off + n] = k
        pos[off:off + n] = np.arange(n)
    return {"tokens": tokens, "mask": (seg > 0).astype(np.float32), "segment_ids": seg, "positions": pos}


def per_sample_batch(it, g: int) -> dict:
    b = it.global_batch
    rows = []
    for s in range(g * b, (g + 1) * b):
        src = it.sources[int(it.dataset_index[s])]
        e, j = src.locate(np.array([int(it.dataset_sample[s])]))
        rows.append(_sample(src, int(e[0]), int(j[0])))
    text = np.stack([r["tokens"] for r in rows])
    mask = np.stack([r["mask"] for r in rows])
    seg = np.stack([r["segment_ids"] for r in rows])
    loss_mask = mask[:, 1:] * (mask[:, :-1] > 0) * (seg[:, 1:] == seg[:, :-1])
    return {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask.astype(np.float32),
            "segment_ids": seg[:, :-1], "positions": np.stack([r["positions"] for r in rows])[:, :-1],
            "dataset": it.dataset_index[g * b:(g + 1) * b].astype(np.int32)}


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    a = p.parse_args(argv)
    from babelfeed.lm.iterator import LMIterator

    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    except (AttributeError, OSError):
        pass
    root = build_data(os.path.join(a.workdir, "lm"))
    rows = []
    for mode in ("concat", "pack"):
        kw = dict(seq_len=a.seq_len, global_batch=a.global_batch, num_samples=a.global_batch * a.batches * 2,
                  split="100,0,0", mode=mode, cache_dir=os.path.join(root, "cache"))
        path = f"0.6 {root}/web 0.4 {root}/books"
        t = time.perf_counter()
        it = LMIterator.build(path, **kw)
        first = next(it)
        t_first = time.perf_counter() - t
        for key, value in per_sample_batch(it, 0).items():  # the same batch, leaf by leaf
            assert np.array_equal(value, first[key]), (mode, key)
        for g in range(a.batches):  # touch every page both read, so neither pays first reads
            it.batch_at(g)
        tok = a.global_batch * a.seq_len * a.batches
        t = time.perf_counter()
        for g in range(a.batches):
            it.batch_at(g)
        ours = tok / (time.perf_counter() - t)
        n_base = max(5, a.batches // 5)
        t = time.perf_counter()
        for g in range(n_base):
            per_sample_batch(it, g)
        base = a.global_batch * a.seq_len * n_base / (time.perf_counter() - t)
        rows.append([mode, f"{base / 1e6:.1f} M", f"{ours / 1e6:.1f} M", f"{ours / base:.1f}x", f"{t_first:.2f} s"])
    text = "\n".join(["# language model", table(
        f"[{a.global_batch}, {a.seq_len}] batches of two blended Megatron datasets, one core (tokens/s)", rows,
        ["mode", "per-sample path (before)", "LMIterator (gather engine)", "speed-up", "build + first batch"])])
    print(text)
    return text


if __name__ == "__main__":
    main()
