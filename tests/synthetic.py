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
