"""The first index a fresh process opens, after ``import babelfeed``, against a raw ``np.memmap`` of the same
kind of file, measured in the same process.

Three indexes of one small fairseq dataset (200 records: what is measured is what a first open loads, not the
checks, which grow with the index), copies so that no open reuses another's, verified once beforehand so that
every open reads its verification stamp, as a job's opens do after the first on a host. In a fresh
interpreter: ``import babelfeed``; a raw ``np.memmap`` of the first ``.idx`` (the baseline); then
``IndexedDataset`` of the second (the first open: whatever babelfeed loads on first use shows here) and of the
third (a later open). The goal is a first open <= 2x the raw memmap. Best of ``--repeat`` fresh processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import age_for_stamps, run_child, table  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import babelfeed
imported = time.perf_counter() - t0
a, b, c = sys.argv[1:4]
t0 = time.perf_counter(); m = np.memmap(a + ".idx", dtype=np.uint8, mode="r"); raw = time.perf_counter() - t0
t0 = time.perf_counter(); first = babelfeed.IndexedDataset(b); first_s = time.perf_counter() - t0
t0 = time.perf_counter(); later = babelfeed.IndexedDataset(c); later_s = time.perf_counter() - t0
assert len(first) == len(later) > 0
print(json.dumps({"import_s": imported, "raw_s": raw, "first_s": first_s, "later_s": later_s}))
"""


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args(argv)
    import babelfeed

    work = tempfile.mkdtemp(prefix="babelfeed-bench-open-")
    cache = os.path.join(work, "cache")
    os.environ["BABELFEED_CACHE_DIR"] = cache
    try:
        rng = np.random.default_rng(0)
        prefixes = [os.path.join(work, f"train.{k}") for k in "abc"]
        with babelfeed.IndexedDatasetBuilder(prefixes[0], np.uint16, format="fairseq") as builder:
            for n in rng.integers(1, 60, 200):
                builder.add_item(rng.integers(4, 8000, n))
            builder.finalize()
        for q in prefixes[1:]:
            for ext in (".idx", ".bin"):
                shutil.copyfile(prefixes[0] + ext, q + ext)
        age_for_stamps()
        for q in prefixes:
            babelfeed.IndexedDataset(q)  # verified once: the stamps the fresh processes read
        runs = [run_child(CHILD, *prefixes) for _ in range(a.repeat)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    rows = [["import babelfeed", f"{best['import_s'] * 1e3:.1f} ms", ""],
            ["raw np.memmap of an .idx (baseline)", f"{best['raw_s'] * 1e3:.3f} ms", "1.00x"],
            ["first IndexedDataset(prefix)", f"{best['first_s'] * 1e3:.3f} ms", f"{best['first_s'] / best['raw_s']:.2f}x"],
            ["a later IndexedDataset(prefix)", f"{best['later_s'] * 1e3:.3f} ms", f"{best['later_s'] / best['raw_s']:.2f}x"]]
    out = table("First index open in a fresh process, after import babelfeed (goal: first <= 2x raw), best of "
                f"{a.repeat}", rows, ["what", "time", "vs raw memmap"])
    print(out)
    return out


if __name__ == "__main__":
    main()
