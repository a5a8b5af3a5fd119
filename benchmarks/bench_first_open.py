"""What opening a data folder costs the first time a host sees it, and after, as the number of corpora grows.

The first ``build_train_iterator`` on a host runs the full check of every index and its ``</s>`` endings, then
remembers both in a verification stamp per index (``storage/stamps.py``); every later open reads the stamps.
For 200k sentence pairs over 100, 1,000 and 4,000 directions (``many_data.py``, 2 files a direction), each case
in a fresh process with an empty stamps folder:

* first open, each index's stamp written once when the folder is open (what babelfeed does);
* the baseline, measured in the same run: each fact written as it is found (the check's stamp, then the endings'),
  as babelfeed did before;
* a later open in a fresh process, reading the stamps.

The best of ``--repeat`` runs is reported (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_child, table  # noqa: E402

CHILD = r"""
import contextlib, json, os, shutil, sys, tempfile, time
cache = tempfile.mkdtemp(prefix="babelfeed-bench-stamps-")
os.environ["BABELFEED_CACHE_DIR"] = cache
import babelfeed
from babelfeed.storage import stamps

root, mode, repo = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "each fact":
    stamps.deferred = contextlib.nullcontext   # every record_ids call writes its stamp file at once
cfg = babelfeed.load_config(os.path.join(repo, "configs", "nllb_like.py"))
cfg.data.path = root
cfg.filter.max_source_positions = cfg.filter.max_target_positions = 256
t0 = time.perf_counter()
it = babelfeed.build_train_iterator(cfg)
first = time.perf_counter() - t0
files = sum(len(os.listdir(os.path.join(root, d))) for d in os.listdir(root) if d.startswith("shard")) // 2
stamps.forget()   # as a fresh process: nothing in memory, the stamp files on disk
t0 = time.perf_counter()
babelfeed.build_train_iterator(cfg)
again = time.perf_counter() - t0
shutil.rmtree(cache)
print(json.dumps({"first_s": first, "again_s": again, "indexes": files}))
"""


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--directions", default="100,1000,4000")
    p.add_argument("--sentences", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    import many_data

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for k in [int(x) for x in a.directions.split(",")]:
        root = many_data.build(os.path.join(a.workdir, f"first_open_{k}"), k, total=a.sentences)
        # (no stamp is written for a file younger than 2 s: data just built waits that long)
        time.sleep(max(0.0, 2.1 - (time.time() - os.path.getmtime(os.path.join(root, "dict.txt")))))
        best: dict = {}
        for _ in range(a.repeat):
            for mode in ("each fact", "once"):
                r = run_child(CHILD, root, mode, repo)
                old = best.get(mode)
                best[mode] = r if old is None or r["first_s"] < old["first_s"] else old
        base, now = best["each fact"], best["once"]
        rows.append([f"{k:,}", f"{now['indexes']:,}", f"{now['first_s']:.2f} s", f"{base['first_s']:.2f} s",
                     f"{base['first_s'] / now['first_s']:.2f}x", f"{min(base['again_s'], now['again_s']):.2f} s"])
        print(rows[-1], flush=True)
    out = table(f"first open of a data folder on a host, {a.sentences:,} pairs, best of {a.repeat}",
                rows, ["directions", "indexes", "first open", "baseline: a write per fact", "speed-up",
                       "later opens (stamped)"])
    print(out)
    return out


if __name__ == "__main__":
    main()
