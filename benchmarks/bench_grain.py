"""grain adapter throughput: batches/s with 0, 1 and 2 worker processes, against the plain iterator.

Uses the collate benchmark's data_bin (400k sentence pairs, max_tokens 16384). Also shows the read-thread trap:
grain's default of 16 read threads against babelfeed's default of 0 for these in-memory, already-batched reads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import collate_bin_config, table  # noqa: E402


def main(argv=None) -> str:
    import loader
    from loader.adapters import grain as grain_adapter

    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
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

    it = loader.build_train_iterator(cfg)  # plans window 0 at its first batch, as batch_dataset does
    base, first = timed(it)
    rows = [["plain iterator, this process (baseline)", f"{base:,.1f}", "1.00x", f"{first * 1e3:,.0f} ms"]]
    for workers, threads in ((0, 0), (0, 16), (1, 0), (2, 0)):
        ds = grain_adapter.batch_dataset(cfg, num_workers=workers, read_threads=threads)
        rate, first = timed(ds)
        label = f"grain, {workers} worker process(es), {threads} read threads"
        rows.append([label + (" (grain's default)" if threads == 16 else ""), f"{rate:,.1f}", f"{rate / base:.2f}x",
                     f"{first * 1e3:,.0f} ms"])
    text = "# grain adapter" + table(f"{a.batches} batches of max_tokens 16384 after the first ({os.cpu_count()} cores)",
                                     rows, ["reader", "batches/s (steady)", "vs plain", "first batch"])
    print(text)
    return text


if __name__ == "__main__":
    main()
