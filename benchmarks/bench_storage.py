"""Index open time and RSS for a 20M-sentence index; random single-record reads against np.memmap.

Baselines measured in the same run:
* open: a Megatron-style reader (map the .idx, frombuffer the arrays, no checks) and a fairseq-style one
  (first read the whole .idx and the whole .bin sequentially in 100 MB chunks, as fairseq's
  MMapIndexedDataset does with _warmup_mmap_file on both files, then map);
* reads: slicing a plain np.memmap of the .bin with precomputed element offsets (no checks at all).
Each open runs in a fresh process so that RSS is that of the open alone. Page cache is warm for all.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RSS_SNIPPET, run_child, table  # noqa: E402

OPEN_CHILD = RSS_SNIPPET + """
import json, mmap, sys, time, numpy as np
prefix, how = sys.argv[1], sys.argv[2]
import loader
base, base_anon, base_file = rss_mb(), rss_mb("RssAnon"), rss_mb("RssFile")
t = time.perf_counter()
if how in ("full", "quick"):
    ds = loader.IndexedDataset(prefix, verify=how)
    n = len(ds); first = int(ds.sizes[0])
elif how == "megatron-style":
    f = open(prefix + ".idx", "rb"); buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int(np.frombuffer(buf, np.uint64, 1, 18)[0])
    sizes = np.frombuffer(buf, np.int32, n, 26); pointers = np.frombuffer(buf, np.int64, n, 26 + 4 * n)
    b = open(prefix + ".bin", "rb"); data = mmap.mmap(b.fileno(), 0, access=mmap.ACCESS_READ)
    first = int(sizes[0])
elif how == "fairseq-style":
    for ext in (".idx", ".bin"):
        with open(prefix + ext, "rb") as f:
            while f.read(100 * 1024 * 1024):
                pass
    f = open(prefix + ".idx", "rb"); buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int(np.frombuffer(buf, np.uint64, 1, 18)[0])
    sizes = np.frombuffer(buf, np.int32, n, 26); pointers = np.frombuffer(buf, np.int64, n, 26 + 4 * n)
    b = open(prefix + ".bin", "rb"); data = mmap.mmap(b.fileno(), 0, access=mmap.ACCESS_READ)
    first = int(sizes[0])
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "anon_mb": rss_mb("RssAnon") - base_anon, "file_mb": rss_mb("RssFile") - base_file,
                  "n": n}))
"""


def build_index(prefix: str, n: int, seed: int = 0) -> float:
    import loader

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.2, 0.7, n), 2, 256).astype(np.int64)
    t = time.perf_counter()
    b = loader.IndexedDatasetBuilder(prefix, np.uint16, format="fairseq")
    step = 1 << 22
    for s in range(0, n, step):
        part = lengths[s : s + step]
        b.add_items(np.zeros(int(part.sum()), np.uint16), part)
    b.finalize()
    return time.perf_counter() - t


def reads(prefix: str, count: int, seed: int = 1) -> list[list]:
    import loader

    ds = loader.IndexedDataset(prefix, verify="quick")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ds), count).tolist()
    mm = np.memmap(prefix + ".bin", dtype=ds.dtype, mode="r")
    offsets = (np.asarray(ds.pointers) // ds.dtype.itemsize).tolist()
    sizes = np.asarray(ds.sizes).tolist()
    for i in idx[:1000]:  # touch pages once for both
        ds[i]

    def ours():
        for i in idx:
            ds[i]

    def memmap():
        for i in idx:
            o = offsets[i]
            mm[o : o + sizes[i]]

    def ours_get_slice():
        for i in idx:
            ds.get(i, 1, 1)

    rows = []
    t_mm = min(_timed(memmap) for _ in range(3))
    for name, fn in (("np.memmap slice (baseline)", memmap), ("IndexedDataset[i]", ours),
                     ("IndexedDataset.get(i, 1, 1)", ours_get_slice)):
        t = t_mm if fn is memmap else min(_timed(fn) for _ in range(3))
        rows.append([name, f"{count / t:,.0f}", f"{t_mm / t:.2f}x"])
    return rows


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=20_000_000)
    p.add_argument("--reads", type=int, default=300_000)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    prefix = os.path.join(a.workdir, f"idx{a.sentences}")
    build_s = None
    if not os.path.exists(prefix + ".idx"):
        build_s = build_index(prefix, a.sentences)
    idx_mb = os.path.getsize(prefix + ".idx") / 2**20
    bin_mb = os.path.getsize(prefix + ".bin") / 2**20
    rows = []
    results = {}
    for how in ("megatron-style", "fairseq-style", "quick", "full"):
        runs = [run_child(OPEN_CHILD, prefix, how) for _ in range(3)]
        best = min(runs, key=lambda r: r["seconds"])
        results[how] = best
    base = results["megatron-style"]["seconds"]
    labels = {"megatron-style": "Megatron-style map, no checks (baseline)",
              "fairseq-style": "fairseq-style: read .idx and .bin, then map",
              "quick": "IndexedDataset(verify='quick')", "full": "IndexedDataset(verify='full') (default)"}
    for how, r in results.items():
        rows.append([labels[how], f"{r['seconds'] * 1e3:,.2f} ms", f"{r['anon_mb']:,.1f} MB", f"{r['file_mb']:,.1f} MB",
                     f"{r['seconds'] / base:,.0f}x"])
    out = [f"# storage: {a.sentences:,} sentences (.idx {idx_mb:,.0f} MB, .bin {bin_mb:,.0f} MB)"
           + (f"; built with IndexedDatasetBuilder.add_items in {build_s:.1f} s" if build_s else "")]
    out.append(table("index open (best of 3, each in a fresh process)", rows, ["reader", "open", "RssAnon (allocated)", "RssFile (mapped cache)", "vs baseline"]))
    out.append(table(f"random single-record reads ({a.reads:,} records)", reads(prefix, a.reads),
                     ["reader", "records/s", "vs np.memmap"]))
    text = "\n".join(out)
    print(text)
    return text


if __name__ == "__main__":
    main()
