"""A small synthetic multilingual data_bin written with our builder (fast; for pipeline tests)."""

import os

import numpy as np

import babelfeed

LANGS = ["aaa", "bbb", "ccc", "ddd"]
# direction -> sentences per shard
DIRECTIONS = {"aaa-bbb": [600, 500], "aaa-ccc": [120, 80], "aaa-ddd": [12, 9]}
VOCAB = 300


def make_data_bin(root, seed=0, valid=True, long_every=0, directions=None, fmt="fairseq"):
    """Tokens of sentence r of direction d in shard s encode (d, s, r) so tests can check what they got."""
    rng = np.random.default_rng(seed)
    d = babelfeed.Dictionary()
    for i in range(VOCAB):
        d.add_symbol(f"w{i}")
    d.add_language_tokens(LANGS + ["bt"])
    os.makedirs(root, exist_ok=True)
    d.save(os.path.join(root, "dict.txt"))
    directions = directions or DIRECTIONS
    splits = [("train", directions)]
    if valid:
        splits.append(("valid", {k: [max(3, v[0] // 10)] for k, v in directions.items()}))
    truth = {}
    for split, dirs in splits:
        for di, (key, shard_sizes) in enumerate(dirs.items()):
            src, tgt = key.split("-")
            for shard, n in enumerate(shard_sizes):
                folder = os.path.join(root, f"shard{shard:03d}")
                os.makedirs(folder, exist_ok=True)
                for side, lang in enumerate((src, tgt)):
                    with babelfeed.IndexedDatasetBuilder(os.path.join(folder, f"{split}.{key}.{lang}"), np.uint16,
                                                      format=fmt) as b:
                        for r in range(n):
                            length = int(np.clip(rng.lognormal(2.3, 0.6), 1, 60))
                            if long_every and r % long_every == long_every - 1:
                                length = 200
                            body = rng.integers(4, 4 + VOCAB, length)
                            body[0] = 4 + di * 3 + side  # marks direction and side
                            toks = np.concatenate([body, [2]])
                            truth[(split, key, lang, shard, r)] = toks
                            b.add_item(toks)
                        b.finalize()
    return truth


def config_for(root, **overrides):
    cfg = babelfeed.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                          "nllb_like.py"))
    cfg.data.path = str(root)
    cfg.batching.max_tokens = 512
    cfg.filter.max_source_positions = 128
    cfg.filter.max_target_positions = 128
    cfg.batching.window = 0
    for dotted, value in overrides.items():
        node = cfg
        *path, last = dotted.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    return cfg


def stats_rows(directions: int, seed: int = 0, valid: bool = True) -> list[dict]:
    """``corpus_stats(..., histograms=True)`` rows of a synthetic data_bin of ``directions`` translation
    directions, built in memory (no files): log-normally uneven sizes (5 to 100,000 pairs), per direction its own
    length distribution, a few directions with a long tail or sides of unequal lengths, a valid split for most."""
    rng = np.random.default_rng(seed)
    names = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    n_langs = int(np.ceil(np.sqrt(directions))) + 1
    keys = [f"{names[i]}_Latn-{names[j]}_Latn" for i in range(n_langs) for j in range(n_langs) if i != j][:directions]
    sizes = np.clip(np.round(rng.lognormal(7, 2.0, directions)), 5, 100_000).astype(np.int64)
    lengths = np.arange(1024)
    rows = []
    for d, key in enumerate(keys):
        mu, ratio = rng.normal(3.0, 0.25), (rng.lognormal(0, 0.6) if d % 97 == 3 else rng.lognormal(0, 0.05))
        for split, n in (("train", int(sizes[d])), ("valid", max(3, int(sizes[d]) // 50))):
            if split == "valid" and (not valid or d % 13 == 5):
                continue
            for side, lang in enumerate(key.split("-")):
                m = mu + (np.log(ratio) if side else 0.0)
                pdf = np.exp(-((np.log(np.maximum(lengths, 1)) - m) ** 2) / (2 * 0.6 ** 2)) / np.maximum(lengths, 1)
                pdf[:2] = 0
                if d % 211 == 7:  # a corpus of long documents among the sentences
                    pdf[300:1000] += pdf.sum() * 0.1 / 700
                hist = rng.multinomial(n, pdf / pdf.sum())
                nz = np.flatnonzero(hist)
                cum = np.cumsum(hist)
                row = {"split": split, "key": key, "lang": lang, "sentences": n, "tokens": int(hist @ lengths),
                       "shards": 1, "dtype": "uint16"}
                for q in (50, 90, 99):
                    row[f"p{q}"] = int(np.searchsorted(cum, max(1, int(np.ceil(q / 100 * n)))))
                row["max"] = int(nz[-1])
                row["histogram"] = hist[:nz[-1] + 1].tolist()
                rows.append(row)
    return rows


def plan_dict(directions: int, seed: int = 0, shapes: int = 8) -> dict:
    """What ``plan_report.plan_data`` returns, for a synthetic mixture of ``directions`` directions built in
    memory: the mixture's lengths histogram and the mixing through the plots module's own helpers, shapes and
    alternatives as a plan of ``shapes`` static shapes would give them."""
    from babelfeed.tools import plots

    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(7, 2.0, directions)), 5, 100_000)
    probs = sizes ** 0.2 / (sizes ** 0.2).sum()
    served = np.round(probs * 200_000)
    src = np.clip(rng.lognormal(3.0, 0.6, 200_000), 2, 1000).astype(np.int64)
    tgt = np.clip(src * rng.lognormal(0, 0.15, len(src)), 2, 1024).astype(np.int64)
    edges = np.unique(np.quantile(np.maximum(src, tgt), np.linspace(0, 1, shapes + 1)[1:]).astype(np.int64))
    if len(edges) < shapes:  # more shapes than distinct quantiles
        edges = np.linspace(8, 1000, shapes).astype(np.int64)
    rows = []
    for k, e in enumerate(edges.tolist()):
        batches = int(rng.integers(0 if k == 1 else 1, 3000))
        padded = batches * 4096
        rows.append({"batch": max(4096 // e, 1), "source": e, "target": e + k % 3, "planned_share": 1 / len(edges),
                     "batches": batches, "share_of_batches": 1 / len(edges), "real_tokens": int(padded * 0.8),
                     "padded_tokens": padded, "efficiency": 0.8 if batches else 0.0})
    names = ["optimal edges (dynamic programme), 1-D", "percentile edges (fairseq get_buckets), 1-D",
             "equal token mass (Lhotse), 1-D", "pad to the longest, 1-D", "buckets of max(src, tgt), 2-D widths",
             f"this plan: {len(edges)} (source, target) boxes", "this plan, epoch 1 (20,233 batches)",
             "dynamic batches (1,742 shapes)"]
    keys = [f"d{i:04d}_Latn-x{i:04d}_Latn" for i in range(directions)]
    return {"data_path": "synthetic", "max_tokens": 4096, "required_batch_size_multiple": 8, "shapes": rows,
            "alternatives": [{"name": n, "efficiency": float(e), "this_plan": n.startswith("this plan"),
                              "measure": "1-D" if n.endswith("1-D") else "2-D"}
                             for n, e in zip(names, (0.8, 0.2, 0.46, 0.03, 0.745, 0.746, 0.746, 0.953))],
            "epoch1": {"static": {"batches": 20233, "efficiency": 0.746, "masked_rows": 312},
                       "dynamic": {"batches": 15758, "shapes": 1742, "efficiency": 0.953}},
            "lengths": plots.length_cells(np.stack([src, tgt], axis=1), rng.random(len(src)) + 0.5, (1024, 1024)),
            "mixing": plots.mixing_data(keys, sizes, probs, served, 5.0, "every shard")}
