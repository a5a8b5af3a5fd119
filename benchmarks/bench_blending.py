"""Megatron's greedy blend over 100M samples: babelfeed's kernel and numpy fallback against Megatron's C++ loop.

The anchor is build_blending_indices' loop (megatron/core/datasets/helpers.cpp, reference §6.1) written here in
C from its semantics: for every sample a scalar scan over the datasets, ``w_i * max(s, 1) - count_i`` with a
strict ``>`` (lowest index on ties), counts as int64. It is compiled at run time with the system ``cc -O3``
(and ``-ffp-contract=off``, as babelfeed's kernel: on x86-64 without ``-march`` there is no fused
multiply-add either way) into a temporary shared library called through ctypes. The first timing includes the
allocation of the two output arrays ('fresh'), then the loop alone is timed again into the same, already
touched arrays ('written again': first-touch page faults of 1 GB cost from 0.3 s to 3 s on this VM). Each
array is checked identical to the anchor's; the fallback runs a prefix (the greedy's first m choices do not
depend on the size) and its time is scaled to the full size.
``megatron=False`` (target ``w * (s + 1)``) is checked against the anchor with the same change.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402

ANCHOR_C = r"""
#include <stdint.h>
#include <stdlib.h>
/* target: x = max(s, 1) as Megatron, or s + 1 (babelfeed's megatron=False) */
int anchor_blend(int16_t *dataset, int64_t *sample, const double *weights, int64_t k, int64_t size, int megatron) {
    int64_t *count = calloc((size_t)k, sizeof(int64_t));
    if (!count) return -1;
    for (int64_t s = 0; s < size; ++s) {
        double x = megatron ? (s > 1 ? (double)s : 1.0) : (double)s + 1.0;
        int64_t best = 0;
        double best_error = weights[0] * x - (double)count[0];
        for (int64_t i = 1; i < k; ++i) {
            double error = weights[i] * x - (double)count[i];
            if (error > best_error) {
                best_error = error;
                best = i;
            }
        }
        dataset[s] = (int16_t)best;
        sample[s] = count[best];
        count[best] += 1;
    }
    free(count);
    return 0;
}
"""


def compile_anchor(workdir: str):
    src, lib = os.path.join(workdir, "anchor.c"), os.path.join(workdir, "anchor.so")
    with open(src, "w") as f:
        f.write(ANCHOR_C)
    subprocess.run(["cc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", src, "-o", lib], check=True)
    fn = ctypes.CDLL(lib).anchor_blend
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    return fn


def weights_for(k: int) -> np.ndarray:
    """Fixed, uneven weights (seeded), with one zero weight from 4 datasets on."""
    w = np.random.default_rng(k).random(k) + 0.05
    if k >= 4:
        w[k // 2] = 0.0
    return w


def run_anchor(fn, weights, size: int, megatron: bool):
    """(seconds allocating and writing fresh outputs, seconds writing them again, dataset, sample)."""
    w = np.ascontiguousarray(np.asarray(weights, np.float64) / np.sum(weights))  # as blending_indices
    t = time.perf_counter()
    dataset, sample = np.empty(size, np.int16), np.empty(size, np.int64)
    if fn(dataset.ctypes.data, sample.ctypes.data, w.ctypes.data, len(w), size, int(megatron)):
        raise MemoryError
    fresh = time.perf_counter() - t
    t = time.perf_counter()
    fn(dataset.ctypes.data, sample.ctypes.data, w.ctypes.data, len(w), size, int(megatron))
    return fresh, time.perf_counter() - t, dataset, sample


def run_ours(weights, size: int, megatron: bool, kernel: bool):
    """The same for blending_indices (its second time: the kernel alone into the first call's arrays)."""
    import babelfeed.lm.blending as blending

    saved = blending.KERNEL
    blending.KERNEL = saved if kernel else None
    try:
        t = time.perf_counter()
        dataset, sample = blending.blending_indices(weights, size, megatron=megatron)
        fresh = time.perf_counter() - t
        again = None
        if kernel:
            w = np.asarray(weights, np.float64)
            t = time.perf_counter()
            blending.KERNEL.blend(w / w.sum(), megatron, dataset, sample)
            again = time.perf_counter() - t
        return fresh, again, dataset, sample
    finally:
        blending.KERNEL = saved


def main(argv=None) -> str:
    import babelfeed.lm.blending as blending

    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=100_000_000)
    p.add_argument("--fallback-samples", type=int, default=10_000_000, help="prefix the numpy fallback runs")
    p.add_argument("--datasets", default="2,50")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs of anchor and kernel; medians")
    a = p.parse_args(argv)
    n, m = a.samples, min(a.fallback_samples, a.samples)
    if blending.KERNEL is None:
        print("note: the compiled kernel is not built (or BABELFEED_KERNEL=0): only the fallback is timed")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        anchor = compile_anchor(tmp)
        for k in (int(x) for x in a.datasets.split(",")):
            w = weights_for(k)
            for megatron in (True, False):
                times: dict = {"anchor": ([], []), "kernel": ([], [])}
                for _ in range(a.repeat):
                    fresh, again, ad, asmp = run_anchor(anchor, w, n, megatron)
                    times["anchor"][0].append(fresh)
                    times["anchor"][1].append(again)
                    if blending.KERNEL is not None:
                        fresh, again, kd, ks = run_ours(w, n, megatron, kernel=True)
                        times["kernel"][0].append(fresh)
                        times["kernel"][1].append(again)
                        assert np.array_equal(kd, ad) and np.array_equal(ks, asmp), f"kernel differs, k={k}"
                        del kd, ks
                base = [statistics.median(x) for x in times["anchor"]]
                target = "max(s, 1)" if megatron else "(s + 1)"
                rows.append([f"{k} datasets, w*{target}: Megatron's loop in C (anchor)", f"{base[0]:.2f} s",
                             "1.00x", f"{base[1]:.2f} s", "1.00x", "-"])
                if times["kernel"][0]:
                    t = [statistics.median(x) for x in times["kernel"]]
                    rows.append([f"{k} datasets, w*{target}: babelfeed kernel", f"{t[0]:.2f} s",
                                 f"{base[0] / t[0]:.2f}x", f"{t[1]:.2f} s", f"{base[1] / t[1]:.2f}x", "yes"])
                if megatron:
                    t, _, fd, fs = run_ours(w, m, megatron, kernel=False)
                    same = np.array_equal(fd, ad[:m]) and np.array_equal(fs, asmp[:m])
                    assert same, f"fallback differs, k={k}"
                    scaled = t * n / m
                    label = f"{k} datasets, w*{target}: babelfeed numpy fallback"
                    if m < n:
                        label += f" ({m / 1e6:g}M run, scaled)"
                    rows.append([label, f"{scaled:.1f} s", f"{base[0] / scaled:.3f}x", "", "", "yes"])
                    del fd, fs
                del ad, asmp
    text = "# blending" + table(
        f"Megatron's greedy blend, {n / 1e6:g}M samples, one core, median of {a.repeat} interleaved runs; "
        "'fresh': allocating the outputs too (first-touch page faults, which vary a lot on this VM), "
        "'written again': the loop alone into the same arrays", rows,
        ["", "fresh", "vs anchor", "written again", "vs anchor", "identical"])
    print(text)
    return text


if __name__ == "__main__":
    main()
