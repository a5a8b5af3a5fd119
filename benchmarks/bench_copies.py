"""Copies of one sample in one batch: rows repeating another row of their batch, against padding, with
``batching.spread_copies`` on and off, measured in the same run.

A demo-like mixture (four directions of 30,000 / 8,000 / 2,000 / 250 pairs, lognormal lengths, temperature 5,
shards "all": the smallest drawn ~34 times an epoch), at two sizes (x1 and x10 the pairs) and several window
sizes, one epoch planned: per setting, the share of rows that repeat a row of their own batch, the padding
efficiency (real / padded tokens, both sides, each batch padded to its longest source and target; static shapes
to their shape) and the planning time of the epoch (spread / plain, same run). The curve it prints is what
``batching.spread_copies`` costs: nothing with static shapes, some padding with dynamic batches (a copy moves k
batches on, among longer samples).

    python benchmarks/bench_copies.py [--scales 1,10] [--windows 4000,20000,0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from common import table  # noqa: E402

PAIRS = {"aaa-bbb": 30_000, "aaa-ccc": 8_000, "aaa-ddd": 2_000, "bbb-ccc": 250}


def epoch_figures(cfg) -> tuple[float, float, float, int]:
    """(repeat share, padding efficiency, planning seconds, batches) of epoch 1."""
    import babelfeed
    from babelfeed.plan.copies import identities, repeats

    t0 = time.perf_counter()
    it = babelfeed.build_train_iterator(cfg)
    planner = it.planner
    setup = planner.setup(1)
    wins = []
    w = 0
    while w < setup.num_windows:
        wins.append(planner.window(1, w))
        w += 1
    seconds = time.perf_counter() - t0
    rows = reps = real = padded = batches = 0
    shapes = planner.opts.shapes
    for win in wins:
        s = win.samples
        rep = repeats(identities(s.comp, s.local), win.ends)
        rows += len(rep)
        reps += int(rep.sum())
        src, tgt = s.src_len.astype(np.int64), s.tgt_len.astype(np.int64)
        starts = np.concatenate([[0], win.ends[:-1]]).astype(np.int64)
        real += int(src.sum() + tgt.sum())
        if shapes:
            padded += int(sum(shapes[k][0] * sum(shapes[k][1:]) for k in win.shape))
        else:
            ms, mt = np.maximum.reduceat(src, starts), np.maximum.reduceat(tgt, starts)
            padded += int(((win.ends - starts) * (ms + mt)).sum())
        batches += len(win.ends)
    return reps / max(rows, 1), real / max(padded, 1), seconds, batches


def main(argv=None) -> str:
    import babelfeed  # noqa: F401,F811  (import cost out of the timings)
    from synthetic import config_for, make_data_bin

    p = argparse.ArgumentParser()
    p.add_argument("--scales", default="1,10")
    p.add_argument("--windows", default="4000,20000,0", help="batching.window values (0: the whole epoch)")
    a = p.parse_args(argv)
    rows = []
    for scale in [int(x) for x in a.scales.split(",")]:
        with tempfile.TemporaryDirectory() as root:
            make_data_bin(root, directions={k: [n * scale] for k, n in PAIRS.items()}, valid=False)
            for window in [int(x) for x in a.windows.split(",")]:
                for shapes in ("", "24x24,40x40,64x64,128x128"):
                    got = {}
                    for spread in (False, True):
                        cfg = config_for(root, data__shards="all", mixing__temperature=5.0, batching__max_tokens=4096,
                                         batching__window=window, batching__shapes=shapes,
                                         batching__spread_copies=spread)
                        got[spread] = epoch_figures(cfg)
                    (r0, e0, t0, b0), (r1, e1, t1, b1) = got[False], got[True]
                    rows.append([f"x{scale} ({sum(PAIRS.values()) * scale:,} pairs)", window or "epoch",
                                 "static (4)" if shapes else "dynamic", f"{r0:.1%} -> {r1:.1%}",
                                 f"{e0:.3f} -> {e1:.3f} ({e1 / e0:.3f}x)", f"{b0} -> {b1}",
                                 f"{t1 / max(t0, 1e-9):.2f}x"])
    return table("Copies of one sample in one batch, batching.spread_copies off -> on (demo-like mixture, "
                 "temperature 5, one epoch)", rows,
                 ["pairs", "window", "batches", "rows repeating a row of their batch", "padding efficiency",
                  "batches", "planning time, on / off"])


if __name__ == "__main__":
    print(main())
