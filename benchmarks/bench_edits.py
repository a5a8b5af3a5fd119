"""What a mixture edit costs, against planning one window (the issue's bound), at 1,000 directions.

The same synthetic sentence pairs as ``bench_many_directions`` (``many_data.py``) over 1,000 directions,
configs/nllb_like.py with 16k-token batches and the default 1M-sample window, for the default (stratified) and the
stream sampler. In a fresh process pinned to one core, the run is taken to the middle of its first window, then:

* **one window planned** (the baseline, in the same process): a fresh iterator of the edited config planning its
  epoch's first window, its data already open;
* **edit in place** ``it.edit(...)`` (temperature 5 -> 2 and 100 directions removed): the edited config's iterator
  built (its data opened again), every stream's handoff taken from the window in progress (its rows matched to the
  served batches), and the edited plan begun; then the first batch after it (which plans the edited part's window);
* **edited resume** in a fresh process: ``set_state(state, mixture_change="allow")`` on an iterator of the edited
  config (the saved run rebuilt from the config the state carries, its window planned, the handoff) to the first
  batch, against a plain resume of the same state under its own config to its first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_child, table  # noqa: E402

CHILD = r"""
import json, os, sys, time, warnings
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})   # one core
warnings.simplefilter("ignore")
import babelfeed

root, sampler, mode, repo = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def config(edited):
    c = babelfeed.load_config(os.path.join(repo, "configs", "nllb_like.py"))
    c.data.path = root
    c.batching.max_tokens = 16384
    c.filter.max_source_positions = c.filter.max_target_positions = 256
    c.mixing.sampler = sampler
    c.data.shards = "all"
    if edited:
        keys = babelfeed.ShardedCorpus(root).directions("train")
        c.data.directions = ",".join(keys[100:])
        c.mixing.temperature = 2.0
    return c

out = {}
if mode == "in_place":
    it = babelfeed.build_train_iterator(config(False))
    half = len(it.planner.window(1, 0)) // 2
    for _ in range(half):
        next(it)
    t = time.perf_counter()
    fresh = babelfeed.build_train_iterator(config(True))
    out["open_s"] = time.perf_counter() - t
    t = time.perf_counter()
    fresh.planner.window(1, 0)
    out["window_s"] = time.perf_counter() - t
    t = time.perf_counter()
    it.edit(config(True))
    out["edit_s"] = time.perf_counter() - t
    t = time.perf_counter()
    next(it)
    out["first_after_s"] = time.perf_counter() - t
    out["returned"] = it.last_edit.returned
    state_it = babelfeed.build_train_iterator(config(False))
    for _ in range(half):
        next(state_it)
    with open(sys.argv[5], "w") as f:
        json.dump(state_it.get_state(), f)
else:
    with open(sys.argv[5]) as f:
        state = json.load(f)
    t = time.perf_counter()
    it = babelfeed.build_train_iterator(config(mode == "edited"))
    it.set_state(state, mixture_change="allow" if mode == "edited" else "refuse")
    next(it)
    out["resume_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--sentences", type=int, default=1_200_000)
    p.add_argument("--repeat", type=int, default=2, help="runs per case; the best is kept")
    a = p.parse_args(argv)
    import many_data

    root = os.path.join(a.workdir, "many", "1000" if a.sentences == many_data.TOTAL else f"1000-{a.sentences}")
    many_data.build(root, 1000, total=a.sentences)
    rows = []
    for sampler in ("stratified", "stream"):
        state = os.path.join(a.workdir, f"edit_state_{sampler}.json")
        best: dict = {}
        for _ in range(a.repeat):
            for mode in ("in_place", "plain", "edited"):
                r = run_child(CHILD, root, sampler, mode, REPO, state)
                if mode != "in_place":
                    r = {f"resume_s_{mode}": r["resume_s"]}
                for k, v in r.items():
                    if isinstance(v, float):
                        best[k] = min(best.get(k, v), v)
                    elif v is not None:
                        best[k] = v
        w = best["window_s"]
        plain, edited = best["resume_s_plain"], best["resume_s_edited"]
        rows.append([sampler, f"{w:.2f} s", f"{best['edit_s']:.2f} s", f"{best['edit_s'] / w:.2f}x",
                     f"{best['open_s']:.2f} s", f"{best['first_after_s']:.2f} s", f"{best['returned']:,}",
                     f"{plain:.2f} s", f"{edited:.2f} s", f"{edited / plain:.2f}x"])
    text = table(f"a mixture edit at 1,000 directions ({a.sentences:,} pairs, 1M-sample windows, one core, best of "
                 f"{a.repeat} fresh processes)", rows,
                 ["sampler", "one window planned", "it.edit()", "edit / window", "(a fresh open of the data)",
                  "first batch after", "rows given back", "resume to 1st batch", "edited resume", "vs plain"])
    print(text)
    return text


if __name__ == "__main__":
    main()
