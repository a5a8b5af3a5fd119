"""What skipping costs: the iterator's speed with skips in force, a skipped batch's shape, replay, the ledger.

The same synthetic sentence pairs (``many_data.py``, log-normal lengths) over 1,000 directions, at two sizes
(200k and 1.2M pairs), configs/nllb_like.py with 16k-token batches, dynamic and with 8 static shapes. For each, in
a fresh process pinned to one core, 300 batches after a first step:

* **serving**: real tokens per second through ``next(it)`` with no skip (the baseline, measured in the same
  process), then with each skip in force: a corpus skipped for good (``where``, the 100 smallest directions'
  shards), 10,000 sample ids, and every step of the range skipped (``steps``);
* **ledger**: ``it.ledger_totals()`` after every batch, as the read-ahead threads take it, with the corpus and
  ids skips;
* **the shape of a skipped batch** (static shapes): skipped rows keep their slots as weight-0 copies, so the
  batch keeps its compiled shape. What re-cutting would save instead: the slots of the smallest shape of the set
  that holds the rows left, against the batch's own, over the batches a skip touched and over the run;
* **replay**: ``batch_for_step`` of a step a few epochs in (5,000), against serving every step to reach it;
* **ledger recount** (``babelfeed ledger``'s per-shard report) over the run up to that step.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, run_child, table  # noqa: E402

CHILD = r"""
import json, os, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})   # one core
import numpy as np
import babelfeed

root, shapes, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = babelfeed.load_config(os.path.join(sys.argv[4], "configs", "nllb_like.py"))
cfg.data.path = root
cfg.batching.max_tokens = 16384
cfg.filter.max_source_positions = cfg.filter.max_target_positions = 256
if shapes:
    cfg.batching.num_shapes = shapes

def tokens(b):
    return int(b["net_input"]["src_lengths"][b["weight"] > 0].sum()) + int(b["ntokens"])

probe = babelfeed.build_train_iterator(cfg)
sizes = {}
for c in probe.planner.sources.components:
    sizes[c.key] = sizes.get(c.key, 0) + len(c)
small = sorted(sizes, key=sizes.get)[:100]
ids = np.random.default_rng(0).choice(int(probe.collater.id_base[-1]), 10_000, replace=False)
SKIPS = {"none": [], "where 100 corpora": [dict(where={"stream": small})], "10k ids": [dict(ids=ids)],
         "steps": [dict(steps=range(2, steps + 2))]}
SKIPS["where + ids"] = SKIPS["where 100 corpora"] + SKIPS["10k ids"]

out = {}
warm = babelfeed.build_train_iterator(cfg)  # the data's pages touched once, before any case is timed
for _ in range(steps + 1):
    next(warm, None)
for name, skips in SKIPS.items():
    it = babelfeed.build_train_iterator(cfg)
    next(it)
    for s in skips:
        it.skip(**s)
    n_tok, t0 = 0, time.perf_counter()
    for _ in range(steps):
        b = next(it, None) or next(it)
        n_tok += tokens(b)
    dt = time.perf_counter() - t0
    out[name] = {"tokens_s": n_tok / dt, "tokens": n_tok, "batch_ms": dt / steps * 1e3}
    if name == "where + ids":
        it2 = babelfeed.build_train_iterator(cfg); next(it2)
        for s in skips:
            it2.skip(**s)
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it2, None)
            it2.ledger_totals()
        out["ledger per batch"] = {"s": (time.perf_counter() - t0) / steps}
# the shape of batches with skipped rows (static shapes): slots kept against the smallest shape of the set
if shapes:
    it = babelfeed.build_train_iterator(cfg); next(it)
    ref = babelfeed.build_train_iterator(cfg); next(ref)
    it.skip(**SKIPS["where 100 corpora"][0]); it.skip(ids=ids)
    sset = sorted({tuple(int(v) for v in x) for x in it.planner.opts.shapes}, key=lambda s: s[0] * (s[1] + s[2]))
    touched = slots = saved = all_slots = 0
    for _ in range(steps):
        a, b = next(ref, None) or next(ref), next(it, None) or next(it)
        B, L = b["net_input"]["src_tokens"].shape
        T = b["target"].shape[1]
        area = B * (L + T)
        all_slots += area
        left = b["weight"] > 0
        if left.sum() < (a["weight"] > 0).sum():
            touched += 1
            slots += area
            ls = int(b["net_input"]["src_lengths"][left].max()) if left.any() else 1
            lt = int((b["target"][left] != 1).sum(axis=1).max()) if left.any() else 1
            fit = [s for s in sset if s[0] >= max(int(left.sum()), 1) and s[1] >= ls and s[2] >= lt]
            best = min(((s[0] * (s[1] + s[2])) for s in fit), default=area)
            saved += area - min(best, area)
    out["recut"] = {"touched": touched, "batches": steps, "slots_touched": slots, "saved": saved, "all": all_slots}
# replay a late step (a few epochs in) against serving every step up to it
it = babelfeed.build_train_iterator(cfg)
next(it); it.skip(**SKIPS["where 100 corpora"][0]); it.skip(ids=ids)
far = int(sys.argv[5])
t0 = time.perf_counter()
while it.total_steps < far:
    next(it, None)
serve = time.perf_counter() - t0
state = it.get_state()
probe = babelfeed.build_train_iterator(cfg)
t0 = time.perf_counter()
probe.batch_for_step(it.total_steps, state)
out["replay"] = {"s": time.perf_counter() - t0, "serve_s": serve, "step": it.total_steps, "epoch": it.epoch}
from babelfeed.tools.ledger_report import translation_ledger
t0 = time.perf_counter()
rep = translation_ledger(babelfeed.build_train_iterator(cfg), state, progress=False)
out["ledger report"] = {"s": time.perf_counter() - t0, "rows": len(rep["rows"]), "samples": rep["totals"]["samples"]}
print(json.dumps(out))
"""


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--sentences", default="200000,1200000")
    p.add_argument("--directions", type=int, default=1000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--far", type=int, default=5000, help="the step replayed (served up to, for the comparison)")
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    import many_data

    parts = []
    for total in [int(x) for x in a.sentences.split(",")]:
        root = many_data.build(os.path.join(a.workdir, f"skip_{a.directions}_{total}"), a.directions, total=total)
        for shapes in (0, 8):
            r = run_child(CHILD, root, str(shapes), str(a.steps), REPO, str(a.far))
            ms = r["none"]["batch_ms"]
            rows = [[f"serving, skip: {name}", f"{r[name]['tokens_s'] / 1e6:.1f} M tok/s",
                     f"{r[name]['batch_ms']:.2f} ms/batch", f"{ms / r[name]['batch_ms']:.2f}x"]
                    for name in ("none", "where 100 corpora", "10k ids", "steps", "where + ids")]
            rows.append(["ledger_totals() after each batch, 2 skips", "", f"{r['ledger per batch']['s'] * 1e3:.2f} ms",
                         ""])
            rp = r["replay"]
            rows.append([f"batch_for_step({rp['step']:,}) (epoch {rp['epoch']}) / serving to it",
                         f"{rp['s']:.3f} s", f"{rp['serve_s']:.2f} s", f"{rp['serve_s'] / rp['s']:.1f}x"])
            rows.append([f"ledger report to step {rp['step']:,} ({r['ledger report']['rows']} shards)",
                         f"{r['ledger report']['s']:.2f} s", "", ""])
            if "recut" in r:
                c = r["recut"]
                rows.append(["batches with skipped rows", f"{c['touched']} of {c['batches']}", "", ""])
                rows.append(["slots re-cutting would save: those batches / run",
                             f"{c['saved'] / max(c['slots_touched'], 1):.1%}", f"{c['saved'] / c['all']:.1%}", ""])
            title = (f"skips: {total:,} pairs, {a.directions:,} directions, "
                     f"{'8 static shapes' if shapes else 'dynamic batches'} (one core)")
            parts.append(table(title, rows, ["case", "", "", "speed vs no skip"]))
            print(parts[-1])
    return "\n".join(parts)


if __name__ == "__main__":
    main()
