"""Index open time and RSS for a 20M-sentence index; random single-record reads against np.memmap.

Baselines measured in the same run:
* open: ``np.memmap`` of the .idx plus reading its header (the floor any mapped reader pays), a Megatron-style
  reader (map the .idx, frombuffer the arrays, no checks) and a fairseq-style one
  (first read the whole .idx and the whole .bin sequentially in 100 MB chunks, as fairseq's
  MMapIndexedDataset does with _warmup_mmap_file on both files, then map);
* reads: slicing a plain np.memmap of the .bin with precomputed element offsets (no checks at all).
Each open runs in a fresh process so that RSS is that of the open alone (medians over interleaved runs: the
machine is shared); the cheap opens are then repeated 200 times in that warm process, with no stamp held in
memory, which is what opening one more corpus costs a running loader. Page cache is warm for all. The default
open (``verify="full"``) is measured twice: with its stamp present (every open after the first), and as the first
open, which runs the full check and writes the stamp.
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
import json, mmap, os, sys, tempfile, time, numpy as np
prefix, how, cache = sys.argv[1], sys.argv[2], sys.argv[3]
# "first": the full check with no stamp (a cache folder of its own); the others find the stamp left in `cache`
os.environ["BABELFEED_CACHE_DIR"] = tempfile.mkdtemp() if how == "first" else cache
import babelfeed
from babelfeed.storage import stamps

def open_once():
    if how in ("first", "stamped", "quick"):
        ds = babelfeed.IndexedDataset(prefix, verify="quick" if how == "quick" else "full")
        return len(ds), int(ds.sizes[0])
    if how == "raw-memmap":  # np.memmap of the .idx and its header read, nothing else
        m = np.memmap(prefix + ".idx", dtype=np.uint8, mode="r")
        return int(m[18:26].view(np.uint64)[0]), None
    if how == "fairseq-style":
        for ext in (".idx", ".bin"):
            with open(prefix + ext, "rb") as f:
                while f.read(100 * 1024 * 1024):
                    pass
    f = open(prefix + ".idx", "rb"); buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int(np.frombuffer(buf, np.uint64, 1, 18)[0])
    sizes = np.frombuffer(buf, np.int32, n, 26); pointers = np.frombuffer(buf, np.int64, n, 26 + 4 * n)
    b = open(prefix + ".bin", "rb"); data = mmap.mmap(b.fileno(), 0, access=mmap.ACCESS_READ)
    return n, int(sizes[0])

base_anon, base_file = rss_mb("RssAnon"), rss_mb("RssFile")
t = time.perf_counter()
n, _ = open_once()
dt = time.perf_counter() - t
out = {"seconds": dt, "anon_mb": rss_mb("RssAnon") - base_anon, "file_mb": rss_mb("RssFile") - base_file, "n": n}
if how in ("stamped", "quick", "raw-memmap", "megatron-style"):
    # the same open again in this (now warm) process, as a loader opens one more file: no stamp held in memory
    times = []
    for _ in range(200):
        stamps.forget()
        t = time.perf_counter()
        open_once()
        times.append(time.perf_counter() - t)
    out["again"] = float(np.median(times))
print(json.dumps(out))
"""


def build_index(prefix: str, n: int, seed: int = 0) -> float:
    import babelfeed

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.2, 0.7, n), 2, 256).astype(np.int64)
    t = time.perf_counter()
    b = babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="fairseq")
    step = 1 << 22
    for s in range(0, n, step):
        part = lengths[s : s + step]
        tokens = np.full(int(part.sum()), 4, np.uint16)
        tokens[np.cumsum(part) - 1] = 2  # (each record a sentence ending with </s>, as a data_bin's are)
        b.add_items(tokens, part)
    b.finalize()
    return time.perf_counter() - t


def reads(prefix: str, count: int, seed: int = 1) -> list[list]:
    import babelfeed

    ds = babelfeed.IndexedDataset(prefix, verify="quick")
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


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms" if seconds < 0.01 else f"{seconds * 1e3:,.0f} ms"


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> str:
    import babelfeed

    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=20_000_000)
    p.add_argument("--reads", type=int, default=300_000)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--skip-reads", action="store_true")
    a = p.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    prefix = os.path.join(a.workdir, f"idx{a.sentences}")
    build_s = None
    if not os.path.exists(prefix + ".idx"):
        build_s = build_index(prefix, a.sentences)
    idx_mb = os.path.getsize(prefix + ".idx") / 2**20
    bin_mb = os.path.getsize(prefix + ".bin") / 2**20
    cache = os.path.join(a.workdir, "stamps")
    saved_env = os.environ.get("BABELFEED_CACHE_DIR")
    os.environ["BABELFEED_CACHE_DIR"] = cache
    babelfeed.IndexedDataset(prefix)  # the stamp every "stamped" open finds (the files are older than 2 s)
    if saved_env is None:
        del os.environ["BABELFEED_CACHE_DIR"]
    else:
        os.environ["BABELFEED_CACHE_DIR"] = saved_env
    modes = ("raw-memmap", "megatron-style", "stamped", "quick", "first", "fairseq-style")
    runs: dict = {how: [] for how in modes}
    for _ in range(a.repeat):  # interleaved, medians: this machine is shared
        for how in modes:
            runs[how].append(run_child(OPEN_CHILD, prefix, how, cache))
    med = lambda how, key: float(np.median([r[key] for r in runs[how]]))
    labels = {"raw-memmap": "np.memmap of the .idx + header read (baseline)",
              "megatron-style": "Megatron-style map + header parse, no checks",
              "stamped": "IndexedDataset(prefix), stamp present (default, verify='full')",
              "quick": "IndexedDataset(verify='quick'), stamp present",
              "first": "IndexedDataset(prefix), first open: full check, writes the stamp",
              "fairseq-style": "fairseq-style: read .idx and .bin, then map"}
    base_fresh, base_again = med("raw-memmap", "seconds"), med("raw-memmap", "again")
    rows = []
    for how in modes:
        fresh = med(how, "seconds")
        again = med(how, "again") if "again" in runs[how][0] else None
        rows.append([labels[how], _ms(fresh), f"{fresh / base_fresh:,.2f}x",
                     _ms(again) if again is not None else "-",
                     f"{again / base_again:,.2f}x" if again is not None else "-",
                     f"{med(how, 'anon_mb'):,.1f} MB"])
    out = [f"# storage: {a.sentences:,} sentences (.idx {idx_mb:,.0f} MB, .bin {bin_mb:,.0f} MB)"
           + (f"; built with IndexedDatasetBuilder.add_items in {build_s:.1f} s" if build_s else "")]
    out.append(table(f"index open (median of {a.repeat} fresh processes; 'again': median of 200 more opens in the "
                     f"warm process, no stamp held in memory)", rows,
                     ["reader", "first open in a process", "vs np.memmap", "open again", "vs np.memmap",
                      "RssAnon (allocated)"]))
    if not a.skip_reads:
        out.append(table(f"random single-record reads ({a.reads:,} records)", reads(prefix, a.reads),
                         ["reader", "records/s", "vs np.memmap"]))
    text = "\n".join(out)
    print(text)
    return text


if __name__ == "__main__":
    main()
