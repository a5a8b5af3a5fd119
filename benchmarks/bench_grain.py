"""grain: the issue-12 workload end to end, and the adapter's worker processes.

1. ``padded`` (``grain_padded.py``): [64, 128] padded translation batches of a 20M-pair epoch through plain grain
   (``MapDataset.source(pairs).shuffle(seed).map(pad).batch(64)``) and through the babelfeed grain adapter with
   0 workers, on the same data: steady batches/s, the ratio, and the first batch's latency, each run in a fresh
   process, runs interleaved, medians printed.
2. ``workers``: batches/s with 0, 1 and 2 worker processes against the plain iterator, on the collate
   benchmark's data_bin (400k sentence pairs, max_tokens 16384); also grain's default of 16 read threads against
   babelfeed's default of 0 for these in-memory, already-batched reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HERE, REPO, collate_bin_config, table  # noqa: E402

PADDED = {  # kind -> (label, steady batches measured after the first)
    "grain": ("plain grain: MapDataset.source.shuffle.map.batch, num_threads=0", 3_000),
    "grain16": ("plain grain, grain's default ReadOptions (16 threads)", 1_500),
    "plain": ("babelfeed plain iterator (no grain)", 40_000),
    "adapter": ("babelfeed grain adapter, 0 workers", 40_000),
}


def padded(samples: int, repeats: int, workdir: str, kinds: list[str]) -> str:
    import grain_padded

    root = grain_padded.build(os.path.join(workdir, f"grain_padded_{samples}"), samples)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    loads = [os.getloadavg()[0]]
    for _ in range(repeats):  # interleaved: every kind once per round
        for kind in kinds:
            out = subprocess.run([sys.executable, os.path.join(HERE, "grain_padded.py"), kind, root,
                                  str(PADDED[kind][1])], capture_output=True, text=True, env=env)
            if out.returncode:
                raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    med = {k: (statistics.median(r["rate"] for r in v), statistics.median(r["first_s"] for r in v),
               min(r["rate"] for r in v), max(r["rate"] for r in v), statistics.median(r["cpu_us"] for r in v))
           for k, v in runs.items()}
    base, base_cpu = med["grain"][0], med["grain"][4]
    rows = [[PADDED[k][0], f"{m[0]:,.0f}", f"{m[2]:,.0f}-{m[3]:,.0f}", f"{m[0] / base:.1f}x", f"{m[4]:,.0f}",
             f"{base_cpu / m[4]:.1f}x", f"{m[1]:.3f} s"] for k, m in med.items()]
    text = table(f"[{grain_padded.ROWS}, {grain_padded.WIDTH}] padded batches, {samples:,}-pair epoch, median of "
                 f"{repeats} fresh processes (load {min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores)", rows,
                 ["reader", "batches/s", "range", "vs grain", "CPU us/batch", "vs grain", "first batch"])
    for k in kinds:
        text += f"\n{k} leaves: " + ", ".join(runs[k][0]["leaves"])
    return text


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--only", choices=("padded", "workers"), help="run one section only")
    p.add_argument("--samples", type=int, default=20_000_000, help="pairs in the padded section's epoch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kinds", default="grain,grain16,plain,adapter")
    a = p.parse_args(argv)
    parts = ["# grain"]
    if a.only in (None, "padded"):
        parts.append(padded(a.samples, a.repeats, a.workdir, a.kinds.split(",")))
    if a.only in (None, "workers"):
        parts.append(workers(a))
    text = "\n".join(parts)
    print(text)
    return text


def workers(a) -> str:
    import babelfeed
    from babelfeed.adapters import grain as grain_adapter

    cfg = collate_bin_config(a.workdir)

    def timed(iterable) -> tuple[float, float]:
        """(steady batches/s after the first batch, seconds to the first batch)."""
        it = iter(iterable)
        t0 = time.perf_counter()
        next(it)
        first = time.perf_counter() - t0
        t, n = time.perf_counter(), 0
        for _ in it:
            n += 1
            if n >= a.batches:
                break
        rate = n / (time.perf_counter() - t)
        if hasattr(it, "close"):
            it.close()  # stops grain's workers and frees their shared memory
        return rate, first

    it = babelfeed.build_train_iterator(cfg)  # plans window 0 at its first batch, as batch_dataset does
    base, first = timed(it)
    rows = [["plain iterator, this process (baseline)", f"{base:,.1f}", "1.00x", f"{first * 1e3:,.0f} ms"]]
    for workers, threads in ((0, 0), (0, 16), (1, 0), (2, 0)):
        ds = grain_adapter.batch_dataset(cfg, num_workers=workers, read_threads=threads)
        rate, first = timed(ds)
        label = f"grain, {workers} worker process(es), {threads} read threads"
        rows.append([label + (" (grain's default)" if threads == 16 else ""), f"{rate:,.1f}", f"{rate / base:.2f}x",
                     f"{first * 1e3:,.0f} ms"])
    return table(f"{a.batches} batches of max_tokens 16384 after the first ({os.cpu_count()} cores)",
                 rows, ["reader", "batches/s (steady)", "vs plain", "first batch"])


if __name__ == "__main__":
    main()
