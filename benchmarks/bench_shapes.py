"""Static shapes and packing: padding efficiency of each way to cut waste, measured in the same run.

On an NLLB-like lognormal(3.2, 0.7) length mixture clipped to [2, 256]:
* K static lengths: optimal edges (babelfeed.plan_shapes) against fairseq's percentile edges (get_buckets),
  Lhotse's equal-token-mass edges and pad-to-max; and fairseq's unconstrained dynamic batching (every batch its
  own shape) for contrast.
* Encoder-decoder pairs: free (source, target) boxes (babelfeed.plan_shapes) against the previous planner's buckets
  of max(src, tgt) (method="max"), measured in the same run, on correlated lognormal pairs and on a mix of
  directions with different target/source length ratios; planning and assignment time for 20M lengths, 1-D
  and 2-D (``--only timing``: just those rows, median of 3 interleaved runs).
* Encoder-decoder pairs: the unpacked static buckets against pairs packed side by side into one or two shapes.
* LM documents (lognormal(5, 1), 8 to 8192 tokens) into rows of 2048: document-aware best-fit packing against
  pad-to-max and Megatron's concatenate-and-slice (no padding, but attention crosses documents).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402


def main(argv=None) -> str:
    from babelfeed.plan.batching import batch_sorted
    from babelfeed.plan.packing import pack, pack_pairs
    from babelfeed.plan.shapes import edges_efficiency, equal_mass_edges, percentile_edges, plan_shapes

    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--timing-samples", type=int, default=20_000_000, help="lengths for the planning-time rows")
    p.add_argument("--only", choices=["timing"], help="only the planning-time rows")
    a = p.parse_args(argv)
    if a.only == "timing":
        text = planning_time(np.random.default_rng(1), a.timing_samples)
        print(text)
        return text
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3.2, 0.7, a.samples), 2, 256).astype(np.int64)
    parts = [f"# static shapes and packing ({a.samples:,} lognormal(3.2, 0.7) lengths clipped to [2, 256])"]

    rows = []
    for k in (4, 8, 16):
        t = time.perf_counter()
        plan = plan_shapes(lengths, k, 16384)
        dt = time.perf_counter() - t
        rows.append([f"K={k}", f"{plan.efficiency:.1%}", f"{edges_efficiency(lengths, percentile_edges(lengths, k)):.1%}",
                     f"{edges_efficiency(lengths, equal_mass_edges(lengths, k)):.1%}", f"{dt * 1e3:.0f} ms"])
    rows.append(["K=1 (pad to max)", f"{edges_efficiency(lengths, [lengths.max()]):.1%}", "", "", ""])
    srt = np.sort(lengths)
    ends = batch_sorted(srt, 16384, None, 8)
    starts = np.concatenate([[0], ends[:-1]])
    padded = ((ends - starts) * srt[ends - 1]).sum()
    shapes = len(set(zip((ends - starts).tolist(), srt[ends - 1].tolist())))
    rows.append([f"dynamic batches ({shapes} distinct shapes)", f"{srt.sum() / padded:.1%}", "", "", ""])
    parts.append(table("padding efficiency (real / padded tokens) of K static lengths", rows,
                       ["shapes", "optimal (plan_shapes)", "percentile (fairseq)", "equal mass (Lhotse)",
                        "planning time"]))

    parts.append(pair_boxes(a.samples, a.timing_samples))
    tgt = np.clip(lengths * rng.lognormal(0, 0.15, len(lengths)), 2, 256).astype(np.int64)
    pairs = np.stack([lengths, tgt], axis=1)
    n_pack = min(len(lengths), 200_000)
    rows = []
    for k in (1, 2, 8):
        plan = plan_shapes(pairs, k, 16384)
        rows.append([f"unpacked, {k} static shape(s)", " ".join(f"{s[1]}x{s[2]}" for s in plan.shapes[:3]) +
                     (" ..." if k > 3 else ""), f"{plan.efficiency:.1%}"])
    # packed: one row shape for every pair; two shapes: short pairs in (128, 128) rows, the rest in (256, 256)
    t = time.perf_counter()
    one = pack_pairs(lengths[:n_pack], tgt[:n_pack], 256, 256)
    dt = time.perf_counter() - t
    rows.append(["packed side by side, 1 shape", "256x256", f"{one.efficiency:.1%}"])
    short = (lengths[:n_pack] <= 128) & (tgt[:n_pack] <= 128)
    a_plan = pack_pairs(lengths[:n_pack][short], tgt[:n_pack][short], 128, 128)
    b_plan = pack_pairs(lengths[:n_pack][~short], tgt[:n_pack][~short], 256, 256)
    real = lengths[:n_pack].sum() + tgt[:n_pack].sum()
    two = real / (a_plan.num_rows * 256 + b_plan.num_rows * 512)
    rows.append(["packed side by side, 2 shapes", "128x128 256x256", f"{two:.1%}"])
    parts.append(table(f"encoder-decoder pairs ({n_pack:,} pairs packed in {dt:.1f} s; real / padded tokens, "
                       "both sides)", rows, ["layout", "row shapes (src x tgt)", "efficiency"]))

    docs = np.clip(rng.lognormal(5, 1, 200_000), 8, 8192).astype(np.int64)
    t = time.perf_counter()
    packed = pack(docs, 2048)
    dt = time.perf_counter() - t
    rows = [["pad every document to 2048 (longer ones split)",
             f"{docs.sum() / (np.ceil(docs / 2048).sum() * 2048):.1%}", "no"],
            [f"document-aware best-fit packing ({dt:.2f} s, {len(docs) / dt / 1e6:.1f}M documents/s)",
             f"{packed.efficiency:.2%}", "no (segment_ids mask it)"],
            ["concatenate and slice (Megatron GPT)", "100.0%", "yes"]]
    parts.append(table(f"LM documents into rows of 2048 ({len(docs):,} documents, lognormal(5, 1))", rows,
                       ["method", "real / row tokens", "attention across documents"]))
    text = "\n".join(parts)
    print(text)
    return text


def _pairs(rng, n: int, ratios) -> np.ndarray:
    """Lognormal(3.2, 0.7) sources in [2, 256]; each pair's direction draws a target/source length ratio."""
    src = np.clip(rng.lognormal(3.2, 0.7, n), 2, 256)
    ratio = np.asarray(ratios)[rng.integers(0, len(ratios), n)]
    tgt = np.clip(src * ratio * rng.lognormal(0, 0.15, n), 2, 256)
    return np.stack([src, tgt], axis=1).astype(np.int64)


def pair_boxes(samples: int, timing_samples: int) -> str:
    """(source, target) boxes against buckets of max(src, tgt), and planning time on many lengths."""
    from babelfeed.plan.shapes import plan_shapes

    rng = np.random.default_rng(1)
    data = {"correlated (ratio 1)": _pairs(rng, samples, [1.0]),
            "2 directions (ratios 1, 1.8)": _pairs(rng, samples, [1.0, 1.8]),
            "4 directions (ratios 0.6, 1, 1.4, 2)": _pairs(rng, samples, [0.6, 1.0, 1.4, 2.0])}
    rows = []
    for name, pairs in data.items():
        for k in (2, 4, 8, 16):
            old = plan_shapes(pairs, k, 16384, method="max")
            t = time.perf_counter()
            new = plan_shapes(pairs, k, 16384)
            dt = time.perf_counter() - t
            rows.append([name, f"K={k}", f"{old.fill:.1%}", f"{new.fill:.1%}", f"{old.padded / new.padded:.3f}",
                         f"{dt * 1e3:.0f} ms"])
    mirrored = np.array([(10, 100)] * 50 + [(100, 10)] * 50)
    old, new = (plan_shapes(mirrored, 2, 5000, multiple=2, method=m) for m in ("max", "boxes"))
    rows.append(["50 x (10, 100) + 50 x (100, 10)", "K=2", f"{old.fill:.1%}", f"{new.fill:.1%}",
                 f"{old.padded / new.padded:.3f}", ""])
    text = [table(f"pairs: (source, target) boxes against buckets of max(src, tgt) ({samples:,} pairs, max_tokens "
                  "16384, multiple 8; fill = real / padded tokens of both sides, masked rows included)", rows,
                  ["pairs", "shapes", "max(src, tgt) buckets", "boxes", "padded tokens, max / boxes",
                   "boxes planning time"])]
    text.append(planning_time(rng, timing_samples))
    return "\n".join(text)


def planning_time(rng, timing_samples: int, repeats: int = 3) -> str:
    """plan_shapes and bucket on many lengths (2 directions, ratios 1 and 1.8), K=8: medians of interleaved runs."""
    from babelfeed.plan.shapes import plan_shapes

    big = _pairs(rng, timing_samples, [1.0, 1.8])
    cases = (("1-D lengths", np.ascontiguousarray(big[:, 0])), ("pairs, boxes", big))
    runs = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, x in cases:
            t = time.perf_counter()
            plan = plan_shapes(x, 8, 16384)
            dt = time.perf_counter() - t
            t = time.perf_counter()
            plan.bucket(x)
            runs[name].append((dt, time.perf_counter() - t))
    rows = []
    for name, v in runs.items():
        dt, db = np.median(np.array(v), axis=0)
        rows.append([name, "K=8", f"{dt:.2f} s", f"{db:.2f} s"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return table(f"planning time on {timing_samples:,} lengths (median of {repeats} interleaved runs; load "
                 f"{load:.1f} on {os.cpu_count()} cores)", rows,
                 ["lengths", "shapes", "plan_shapes", "bucket (every sample to its shape)"])


if __name__ == "__main__":
    main()
