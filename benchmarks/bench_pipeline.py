"""The pipeline's planners and gather against fairseq's procedures, measured in the same run.

1. Plan a 20M-sentence epoch (lognormal lengths, max_tokens 16384, multiple 8): fairseq's ordering
   (np.random.permutation + two stable argsorts, exactly as LanguagePairDataset.ordered_indices) and our
   Python port of its batch_by_size, against babelfeed's window planner (order + batches) over the same lengths.
2. First batch of a 1-billion-sample mixture (200 directions, simulated lengths), RSS in a fresh process.
3. Collate: babelfeed's vectorised gather against a fairseq-style per-sample collate (index each sample,
   prepend the language token, build a list, pad in a loop) on the same batches, and against a plain numpy
   fancy-index gather of random whole sentences (this machine's gather bandwidth).
4. Rank balance: per-rank token load over an epoch for babelfeed's block shuffle (global batch g on rank
   g % W) against fairseq's shuffle-then-shard, on the same batches.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RSS_SNIPPET, age_for_stamps, run_child, table  # noqa: E402


def lengths(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.2, 0.7, n), 2, 256).astype(np.int32)
    tgt = np.clip(src * rng.lognormal(0.0, 0.15, n), 2, 256).astype(np.int32)
    return src, tgt


# ------------------------------------------------------------------------------------------------- 1. plan
def bench_plan(n: int, max_tokens: int = 16384, mult: int = 8, window: int = 1_000_000, workdir: str | None = None,
               rounds: int | None = None) -> str:
    """Every planner once per round, rounds interleaved (this machine's speed drifts), medians printed. Rounds: 7
    up to 2M sentences (a round takes well under a second, and a tenth-of-a-second planner's median needs more
    than three draws of this VM's noise to settle), 3 above."""
    rounds = rounds or (7 if n <= 2_000_000 else 3)
    from babelfeed.plan.batching import batch_sorted, fairseq_batch_by_size, fairseq_ordered_indices, length_order

    src, tgt = lengths(n)
    cost = np.maximum(src, tgt)

    def ours(win: int) -> int:
        nb = 0
        step = win or n
        for s in range(0, n, step):
            rng = np.random.default_rng([1, 1, s])
            ws, wt = src[s:s + step], tgt[s:s + step]
            o = length_order(ws, wt, rng)
            ends = batch_sorted(np.maximum(ws, wt)[o], max_tokens, None, mult)
            served = rng.permutation(len(ends))  # batch order (block shuffle is a permutation of the same size)
            nb += len(served)
        return nb

    runs = {"order": lambda: fairseq_ordered_indices(src, tgt, seed=1), "ours-win": lambda: ours(window),
            "ours-global": lambda: ours(0)}
    if workdir:
        runs["planner-win"] = lambda: full_planner(workdir, n, max_tokens, mult, window)
        runs["planner-global"] = lambda: full_planner(workdir, n, max_tokens, mult, 0)
        full_planner(workdir, n, max_tokens, mult, window)  # builds the data_bin and stamps it, untimed
    times: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, int] = {}
    for _ in range(rounds):
        for name, fn in runs.items():
            t = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t)
            counts[name] = out if isinstance(out, int) else len(out)
            del out
    med = {k: float(np.median(v)) for k, v in times.items()}
    span = lambda k: f"{med[k]:.2f} s ({min(times[k]):.2f}-{max(times[k]):.2f})"  # noqa: E731
    t_order = med["order"]
    rows = [["fairseq ordering (permutation + 2 stable sorts)", span("order"), "1.00x"]]
    t = time.perf_counter()
    fs_batches = fairseq_batch_by_size(fairseq_ordered_indices(src, tgt, seed=1), cost, max_tokens, None, mult)
    rows.append([f"fairseq batch_by_size, our pure-Python port ({len(fs_batches):,} batches, once)",
                 f"{time.perf_counter() - t:.2f} s", "(fairseq's Cython: ~0.19 s, not run here)"])
    for key, label in (("ours-win", f"windows of {window:,}"), ("ours-global", "one global window")):
        rows.append([f"babelfeed, {label} (order + batches, {counts[key]:,} batches)", span(key),
                     f"{t_order / med[key]:.1f}x faster"])
    for key, label in (("planner-win", f"windows of {window:,}"), ("planner-global", "one global window")):
        if key in med:
            rows.append([f"babelfeed EpochPlanner, whole epoch from a data_bin, {label} (open + draws + length "
                         f"lookups + order + batches, {counts[key]:,} batches)", span(key),
                         f"{med[key] / t_order:.2f}x of its time"])
    return table(f"plan one epoch of {n:,} sentences (max_tokens {max_tokens}, multiple {mult}); median (min-max) "
                 f"of {rounds} interleaved rounds, {os.cpu_count()} cores", rows,
                 ["planner", "time", "vs fairseq ordering"])


def plan_data(workdir: str, n: int) -> str:
    """A data_bin whose one direction is the storage benchmark's n-sentence index (built once, untimed)."""
    import babelfeed
    from bench_storage import build_index

    prefix = os.path.abspath(os.path.join(workdir, f"sentences{n}"))  # (records end with </s>: the planner checks)
    if not os.path.exists(prefix + ".idx"):
        build_index(prefix, n)
        age_for_stamps()
    root = os.path.join(workdir, f"plan_data{n}")
    shard = os.path.join(root, "shard000")
    os.makedirs(shard, exist_ok=True)
    for lang in ("xx", "yy"):
        for ext in (".bin", ".idx"):
            link = os.path.join(shard, f"train.xx-yy.{lang}{ext}")
            if not os.path.exists(link):
                os.symlink(prefix + ext, link)
    if not os.path.exists(os.path.join(root, "dict.txt")):
        d = babelfeed.Dictionary()
        d.add_language_tokens(["xx", "yy"])
        d.save(os.path.join(root, "dict.txt"))
    return root


def full_planner(workdir: str, n: int, max_tokens: int, mult: int, window: int) -> int:
    """The real planner over ``plan_data``'s data_bin: its dictionary and corpus opened, one epoch planned."""
    import babelfeed
    from babelfeed.plan.planner import EpochPlanner, PlanOptions
    from babelfeed.sources.sources import SourceSet

    root = plan_data(workdir, n)
    d = babelfeed.Dictionary.load(os.path.join(root, "dict.txt"))
    corpus = babelfeed.ShardedCorpus(root)
    sources = SourceSet(corpus, d, "train", ["xx-yy"])
    planner = EpochPlanner(sources, PlanOptions(max_tokens=max_tokens, multiple=mult, window=window,
                                                max_source_positions=300, max_target_positions=300))
    return planner.num_batches(1)


# ------------------------------------------------------------------------------------------------- 2. 1B
BILLION_CHILD = RSS_SNIPPET + """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from babelfeed.plan.planner import EpochPlanner, PlanOptions
from babelfeed.sources.sources import Direction

class SimulatedComponent:
    # Lengths are a hash of the row: a billion-row corpus that takes no memory and no disk.
    def __init__(self, key, n, salt):
        self.key, self.n, self.salt, self.tgt = key, n, salt, True
        self.src_prefix = self.tgt_prefix = np.zeros(1, np.int64)
    def __len__(self):
        return self.n
    def _len(self, rows, salt):
        h = (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)) >> np.uint64(40)
        u = (h.astype(np.float64) + 0.5) / 2.0**24
        return np.clip(np.exp(3.2 + 0.7 * np.sqrt(2) * _erfinv(2 * u - 1)), 2, 256).astype(np.int64) + 1
    def src_lengths(self, rows):
        return self._len(rows, self.salt)
    def tgt_lengths(self, rows):
        return self._len(rows, self.salt + 1)
    def lengths(self, rows, pairs):
        pairs[:, 2] = self.src_lengths(rows)
        pairs[:, 3] = self.tgt_lengths(rows)

def _erfinv(y):  # Giles' approximation, plenty for simulated lengths
    w = -np.log((1.0 - y) * (1.0 + y))
    w1 = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        p1 = c + p1 * w1
    w2 = np.sqrt(np.maximum(w, 5)) - 3
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        p2 = c + p2 * w2
    return np.where(w < 5, p1, p2) * y

class SimulatedSources:
    def __init__(self, sizes):
        self.keys = [f"d{i:03d}" for i in range(len(sizes))]
        self.components = [SimulatedComponent(k, int(n), 17 * i) for i, (k, n) in enumerate(zip(self.keys, sizes))]
        self.split, self.shards, self.with_target = "train", "all", True
    def row_table(self):
        return None
    def directions(self, epoch):
        return [Direction(c.key, i, [c], [i], len(c)) for i, c in enumerate(self.components)]

sizes = np.random.default_rng(0).lognormal(0, 1.5, 200)
sizes = np.maximum((sizes / sizes.sum() * 1_000_000_000).astype(np.int64), 1000)
base = rss_mb()
t = time.perf_counter()
planner = EpochPlanner(SimulatedSources(sizes), PlanOptions(temperature=5.0, max_tokens=16384, window=1_000_000,
                                                             max_source_positions=512, max_target_positions=512))
setup = planner.setup(1)
t_setup = time.perf_counter() - t
win = planner.window(1, 0)
first = win.batch(0)
dt = time.perf_counter() - t
print(json.dumps({"sentences": int(sizes.sum()), "epoch": int(setup.total), "windows": setup.num_windows,
                  "setup_s": t_setup, "first_batch_s": dt, "batches_in_window": len(win),
                  "first_batch_size": first.stop - first.start, "rss_mb": rss_mb() - base, "peak_mb": rss_mb("VmHWM")}))
"""


def bench_billion() -> str:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = run_child(BILLION_CHILD, repo)
    rows = [["corpus", f"{r['sentences']:,} sentences in 200 directions (simulated lengths)"],
            ["epoch (temperature 5, fairseq virtual size)", f"{r['epoch']:,} samples in {r['windows']:,} windows"],
            ["epoch setup (probabilities, counts, draws)", f"{r['setup_s'] * 1e3:.0f} ms"],
            ["first batch planned", f"{r['first_batch_s']:.2f} s ({r['batches_in_window']:,} batches in window 0)"],
            ["memory", f"{r['rss_mb']:.0f} MB more RSS after planning, {r['peak_mb']:.0f} MB peak for the process"]]
    return table("first batch of a 1-billion-sample mixture (fresh process)", rows, ["", ""])


# ------------------------------------------------------------------------------------------------- 3. collate
def _per_sample_collate(samples, pad, eos, xp=np):
    """fairseq's LanguagePairDataset.collate, step for step, on per-sample arrays (``xp``: numpy or torch)."""
    def merge(key, left_pad, move_eos=False):
        values = [s[key] for s in samples]
        width = max(len(v) for v in values)
        res = xp.full((len(values), width), pad, dtype=xp.int64)
        for i, v in enumerate(values):  # data_utils.collate_tokens: one copy per row
            dst = res[i][width - len(v):] if left_pad else res[i][: len(v)]
            if move_eos:
                dst[0] = eos
                dst[1:] = v[:-1]
            else:
                dst[:] = v
        return res

    ids = xp.asarray([s["id"] for s in samples])
    src_tokens = merge("source", True)
    src_lengths = xp.asarray([int((s["source"] != pad).sum()) for s in samples])  # per-sample ne(pad).sum()
    order = xp.argsort(-src_lengths, stable=True) if xp is not np else np.argsort(-src_lengths, kind="stable")
    target = merge("target", False)[order]
    prev = merge("target", False, True)[order]
    ntokens = sum(int((s["target"] != pad).sum()) for s in samples)
    return {"id": ids[order], "nsentences": len(samples), "ntokens": ntokens,
            "net_input": {"src_tokens": src_tokens[order], "src_lengths": src_lengths[order],
                          "prev_output_tokens": prev}, "target": target}


def _per_sample_items(comps, dirs, rows, xp=np):
    """fairseq's per-item path: MMapIndexedDataset[i] (cast to int64), PrependTokenDataset, a dict per sample."""
    out = []
    for d, r in zip(dirs, rows):
        c = comps[d]
        src = xp.asarray(c.src[r].astype(np.int64))
        tgt = xp.asarray(c.tgt[r].astype(np.int64))
        src = xp.concatenate([xp.asarray(c.src_prefix), src])
        tgt = xp.concatenate([xp.asarray(c.tgt_prefix), tgt])
        out.append({"id": int(r), "source": src, "target": tgt})
    return out


def bench_collate(workdir: str, n_sentences: int = 400_000, n_batches: int = 300) -> str:
    import babelfeed
    from babelfeed.gather import engine as gather
    from babelfeed.gather.collate import CollateOptions, Collater
    from babelfeed.sources.sources import SourceSet

    root = os.path.join(workdir, "collate_data")  # (collate_bin, of an older version, had no </s>)
    if not os.path.exists(os.path.join(root, "dict.txt")):
        os.makedirs(os.path.join(root, "shard000"), exist_ok=True)
        d = babelfeed.Dictionary()
        for i in range(32000):
            d.add_symbol(f"p{i}")
        d.add_language_tokens(["xx", "yy", "zz"])
        d.save(os.path.join(root, "dict.txt"))
        rng = np.random.default_rng(0)
        for key in ("xx-yy", "xx-zz"):
            src_len, tgt_len = lengths(n_sentences // 2, seed=hash(key) % 1000)
            for lang, lens in zip(key.split("-"), (src_len, tgt_len)):
                b = babelfeed.IndexedDatasetBuilder(os.path.join(root, "shard000", f"train.{key}.{lang}"), np.uint16,
                                                 format="fairseq")
                tokens = rng.integers(4, 32000, int(lens.sum()), dtype=np.uint16)
                tokens[np.cumsum(lens) - 1] = d.eos()  # (sentences end with </s>: the loader checks)
                b.add_items(tokens, lens)
                b.finalize()
    corpus = babelfeed.ShardedCorpus(root)
    dictionary = corpus.dictionary()
    sources = SourceSet(corpus, dictionary, "train", ["xx-yy", "xx-zz"])
    from babelfeed.plan.planner import EpochPlanner, PlanOptions

    planner = EpochPlanner(sources, PlanOptions(max_tokens=16384, window=0, max_source_positions=300,
                                                max_target_positions=300))
    win = planner.window(1, 0)
    collater = Collater(sources, CollateOptions(pad=dictionary.pad(), eos=dictionary.eos()))
    picks = list(range(min(n_batches, len(win))))
    batches = [win.batch(j) for j in picks]
    comps = sources.components

    def ours():
        # as the iterator does: token addresses looked up once for the batches' samples, then each batch gathered
        idx = np.concatenate([np.arange(sl.start, sl.stop) for sl in batches])
        addr = collater.addresses(win.samples.comp[idx], win.samples.local[idx])
        tok, at = 0, 0
        for sl in batches:
            s = win.samples[sl]
            s.addr = addr[at:at + len(s)]
            at += len(s)
            b = collater(s)
            tok += int(b["net_input"]["src_lengths"].sum()) + b["ntokens"]
        return tok

    def ours_numpy():  # the same without the compiled kernel
        kernel, gather.KERNEL = gather.KERNEL, None
        try:
            return ours()
        finally:
            gather.KERNEL = kernel

    def per_sample(xp=np):
        tok = 0
        for sl in batches:
            s = win.samples[sl]
            samples = _per_sample_items(comps, s.comp.tolist(), s.local.tolist(), xp)
            b = _per_sample_collate(samples, dictionary.pad(), dictionary.eos(), xp)
            tok += int(b["net_input"]["src_lengths"].sum()) + b["ntokens"]
        return tok

    try:
        import torch  # the real per-sample path runs on torch tensors: measure it where torch is installed

        torch.set_num_threads(1)
        per_sample_torch = lambda: per_sample(torch)  # noqa: E731
    except ImportError:
        per_sample_torch = None

    def raw_gather():
        # random whole sentences of the source side, one fancy index per batch: the machine's gather rate
        ds = comps[0].src
        tokens = ds.tokens
        rng = np.random.default_rng(1)
        tok = 0
        for sl in batches:
            rows = rng.integers(0, len(ds), 2 * (sl.stop - sl.start))
            sizes = np.asarray(ds.sizes[rows], np.int64)
            starts = np.asarray(ds.pointers[rows], np.int64) // 2
            excl = np.cumsum(sizes) - sizes
            idx = np.repeat(starts - excl, sizes) + np.arange(int(sizes.sum()))
            tok += len(tokens[idx])
        return tok

    ours()  # warm the page cache for all of them
    results = {}
    runs = [("per-sample", per_sample), ("ours", ours), ("ours-numpy", ours_numpy), ("raw", raw_gather)]
    if per_sample_torch:
        runs.append(("per-sample-torch", per_sample_torch))
    for name, fn in runs:
        best = None
        for _ in range(3):
            t = time.perf_counter()
            tok = fn()
            dt = time.perf_counter() - t
            best = dt if best is None or dt < best else best
        results[name] = (tok, best)
    rate = {k: tok / dt for k, (tok, dt) in results.items()}
    torch_rate = rate.get("per-sample-torch")

    def row(label, r, gather=""):
        vs_torch = f"{r / torch_rate:.1f}x" if torch_rate else "(torch not installed)"
        return [label, f"{r / 1e6:.2f} M", f"{r / rate['per-sample']:.1f}x", vs_torch, gather]

    rows = [row("fairseq-style per-sample collate, numpy arrays", rate["per-sample"])]
    if torch_rate:
        rows.append(row("fairseq-style per-sample collate, torch CPU tensors (as fairseq runs)", torch_rate))
    kernel = "compiled kernel" if gather.KERNEL is not None else "kernel not built: numpy"
    rows.append(row(f"babelfeed collate, {kernel} (both sides + prev_output_tokens)", rate["ours"],
                    f"{rate['ours'] / rate['raw']:.0%}"))
    rows.append(row("babelfeed collate, numpy gather only (BABELFEED_KERNEL=0)", rate["ours-numpy"],
                    f"{rate['ours-numpy'] / rate['raw']:.0%}"))
    rows.append(row("plain numpy gather of random whole sentences (bandwidth)", rate["raw"], "100%"))
    return table(f"collate {len(batches)} batches of max_tokens 16384 on one core (real tokens/s)", rows,
                 ["collate", "tokens/s", "vs numpy per-sample", "vs torch per-sample", "of gather rate"])


# ------------------------------------------------------------------------------------------------- 4. ranks
def bench_balance(n: int = 2_000_000, max_tokens: int = 16384) -> str:
    """Per-step and per-epoch load across ranks, for three loads of a batch: real tokens, padded tokens
    (B x longest, both sides) and attention cost (B x longest^2, both sides: what makes a step slow)."""
    from babelfeed.plan.batching import batch_sorted, length_order

    src, tgt = lengths(n, seed=3)
    rng = np.random.default_rng(5)
    o = length_order(src, tgt, rng)
    s_o, t_o = src[o].astype(np.float64), tgt[o].astype(np.float64)
    ends = batch_sorted(np.maximum(s_o, t_o).astype(np.int64), max_tokens, None, 8)
    starts = np.concatenate([[0], ends[:-1]])
    size = np.diff(np.concatenate([[0], ends]))
    smax, tmax = np.maximum.reduceat(s_o, starts), np.maximum.reduceat(t_o, starts)
    loads = {"real tokens": np.add.reduceat(s_o + t_o, starts),
             "padded tokens": size * (smax + tmax),
             "attention cost": size * (smax ** 2 + tmax ** 2)}
    rows = []
    for world in (8, 64):
        fs_order = np.random.RandomState(1 + 1).permutation(len(size))  # fairseq: shuffle (seed + epoch), r::W
        q = 16  # babelfeed: blocks of 16 similar-cost batches; blocks and members shuffled; rank g % W
        blocks = [np.arange(s, min(s + q, len(size))) for s in range(0, len(size), q)]
        bf_order = np.concatenate([rng.permutation(blocks[i]) for i in rng.permutation(len(blocks))])
        for name, order in (("fairseq shuffle-then-shard", fs_order), ("babelfeed block shuffle", bf_order)):
            cells = [f"W={world}", name]
            for load in loads.values():
                seq = load[order]
                steps = len(seq) // world
                grid = seq[: steps * world].reshape(steps, world)
                per_rank = np.concatenate([seq, np.zeros((-len(seq)) % world)]).reshape(-1, world).sum(axis=0)
                cells.append(f"{(grid.max(axis=1) / grid.mean(axis=1)).mean():.3f} / "
                             f"{per_rank.max() / per_rank.mean():.4f}")
            rows.append(cells)
    return table(f"rank balance over {len(size):,} batches of {n:,} sentences: per step max/mean (straggling, mean "
                 "over steps) / per rank over the epoch max/mean", rows, ["ranks", "order", *loads])


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=20_000_000)
    p.add_argument("--skip-billion", action="store_true")
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--only", choices=("plan", "billion", "collate", "balance"), help="run one section only")
    a = p.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    run = lambda name: a.only in (None, name)  # noqa: E731
    parts = ["# pipeline"]
    if run("plan"):
        parts.append(bench_plan(a.sentences, workdir=a.workdir))
    if run("billion") and not a.skip_billion:
        parts.append(bench_billion())
    if run("collate"):
        parts.append(bench_collate(a.workdir))
    if run("balance"):
        parts.append(bench_balance(min(a.sentences, 2_000_000)))
    text = "\n".join(parts)
    print(text)
    return text


if __name__ == "__main__":
    main()
