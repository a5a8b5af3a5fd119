"""Golden batches: every batch kind, hashed, recorded before the gather engine was rewritten.

The data is a pure function of integer hashes (no numpy distributions, whose streams may change between
numpy versions), and the raw-text task uses a SentencePiece model committed beside this file
(``data/golden_spm.model``), so the recorded hashes depend on babelfeed's behaviour alone.

    python tests/golden.py --record     # rewrite tests/data/golden_batches.json (only for an intended change)
    python tests/golden.py              # compare, printing the configs that differ

``tests/iterators/test_golden_batches.py`` runs the comparison in the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
GOLDEN = os.path.join(HERE, "data", "golden_batches.json")
SPM = os.path.join(HERE, "data", "golden_spm.model")

LANGS = ["aaa", "bbb", "ccc", "ddd", "eee"]
# direction -> (sentences per shard, format, dtype)
DIRECTIONS = {"aaa-bbb": ([300, 250], "fairseq", np.uint16), "aaa-ccc": ([90, 60], "fairseq", np.uint16),
              "aaa-ddd": ([15, 10], "megatron", np.int32)}
MONO = {"eee": 80}  # fairseq's legacy TNTIDX layout (values stored + 1)
SYMBOLS = 300
_WORDS = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "tu", "va", "zo", "ba", "de", "fi", "go"]


def _hash(*keys) -> np.ndarray:
    """splitmix64 of integer keys (broadcast), as uint64."""
    with np.errstate(over="ignore"):
        x = np.uint64(0x9E3779B97F4A7C15)
        for k in keys:
            x = (np.asarray(k, dtype=np.uint64) + x) * np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(31)
            x = x * np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(29)
        return x


def _lengths(n: int, salt: int) -> np.ndarray:
    r = np.arange(n)
    h1, h2, h3 = _hash(salt, r, 1), _hash(salt, r, 2), _hash(salt, r, 3)
    base = 2 + (h1 % np.uint64(18)).astype(np.int64)
    tail = np.where(h2 % np.uint64(6) == 0, (h3 % np.uint64(45)).astype(np.int64), 0)
    long = np.where(h3 % np.uint64(97) == 5, 140, 0)  # a few over the test's 128-token limit
    return base + tail + long


def _tokens(lengths: np.ndarray, salt: int, low: int, high: int) -> np.ndarray:
    total = int(lengths.sum())
    toks = low + (_hash(salt, np.arange(total), 7) % np.uint64(high - low)).astype(np.int64)
    ends = np.cumsum(lengths) - 1
    toks[ends] = 2  # </s>
    return toks


def raw_lines(lang: str, n: int, salt: int) -> list[str]:
    out = []
    for r in range(n):
        k = 1 + int(_hash(salt, r, 11) % np.uint64(9))
        words = [_WORDS[int(_hash(salt, r, 12, j) % np.uint64(len(_WORDS)))] +
                 _WORDS[int(_hash(salt, r, 13, j) % np.uint64(len(_WORDS)))] for j in range(k)]
        out.append(" ".join(words))
    return out


def make_golden_data(root) -> None:
    import babelfeed
    import sentencepiece as spm
    from helpers import write_tntidx

    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    sp = spm.SentencePieceProcessor(model_file=SPM)
    d = babelfeed.Dictionary()
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            d.add_symbol(sp.id_to_piece(i))
    for i in range(SYMBOLS):
        d.add_symbol(f"w{i}")
    d.add_language_tokens(LANGS + ["bt"])
    d.save(os.path.join(root, "dict.txt"))
    with open(SPM, "rb") as f, open(os.path.join(root, "spm.model"), "wb") as g:
        g.write(f.read())
    low, high = 4, len(d) - len(LANGS) - 1
    for split, scale in (("train", 1), ("valid", 0)):
        for di, (key, (shards, fmt, dtype)) in enumerate(DIRECTIONS.items()):
            for shard, n in enumerate(shards if scale else [max(4, shards[0] // 10)]):
                folder = os.path.join(root, f"shard{shard:03d}")
                os.makedirs(folder, exist_ok=True)
                for side, lang in enumerate(key.split("-")):
                    salt = 1000 * di + 100 * shard + 10 * side + (5 if split == "valid" else 0)
                    lens = _lengths(n, salt)
                    with babelfeed.IndexedDatasetBuilder(os.path.join(folder, f"{split}.{key}.{lang}"), dtype,
                                                      format=fmt) as b:
                        b.add_items(_tokens(lens, salt, low, high).astype(dtype), lens)
                        b.finalize()
        for lang, n in MONO.items():
            lens = _lengths(n if scale else 8, 77 + scale)
            toks = _tokens(lens, 77 + scale, low, high)
            seqs = np.split(toks, np.cumsum(lens)[:-1])
            write_tntidx(os.path.join(root, "shard000", f"{split}.{lang}"), seqs, dtype=np.int32, code=4)
    for split, n in (("train", 200), ("valid", 20)):
        folder = os.path.join(root, "text", split)
        os.makedirs(folder, exist_ok=True)
        for side, lang in enumerate(("aaa", "bbb")):
            with open(os.path.join(folder, f"aaa-bbb.{lang}"), "w", encoding="utf-8") as f:
                f.write("\n".join(raw_lines(lang, n, side + (10 if split == "valid" else 0))) + "\n")


# ----------------------------------------------------------------------------------------------- digests
def digest(batch) -> str:
    """sha256 of every leaf: key path, dtype, shape and bytes (arrays), or the value (scalars)."""
    h = hashlib.sha256()

    def walk(prefix, value):
        if isinstance(value, dict):
            for k in sorted(value):
                walk(f"{prefix}/{k}", value[k])
        elif isinstance(value, np.ndarray):
            h.update(f"{prefix}:{value.dtype.str}:{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(f"{prefix}={value!r}".encode())
    walk("", batch)
    return h.hexdigest()[:20]


def _cfg(root, **overrides):
    from synthetic import config_for

    # the recording predates batching.spread_copies (copies of one sample in different batches): its cases keep
    # the length order's batches, which spread_copies=False must still give bit for bit; the spread_* cases, recorded
    # later, run the default
    settings = dict(batching__window=200, mixing__temperature=5.0, batching__spread_copies=False)
    return config_for(root, **{**settings, **overrides})


def _epochs(it, n: int) -> list:
    out = []
    for _ in range(n):
        out.extend(it)
    return out


def _train(root, epochs=1, rank=0, world=1, split="batches", tasks=None, **overrides):
    import babelfeed

    cfg = _cfg(root, **overrides)
    if tasks:
        with cfg.unlocked():
            for name, t in tasks.items():
                cfg.tasks[name] = t
    it = babelfeed.build_train_iterator(cfg, rank=rank, world_size=world, split=split)
    return _epochs(it, epochs), it.get_state()


def _lm(root, mode, rank=0, world=1, **kw):
    from babelfeed.lm.iterator import LMIterator

    # the shuffles are keyed by the dataset paths as given: relative ones keep the digests independent of root
    here = os.getcwd()
    os.chdir(root)
    try:
        it = LMIterator.build("0.4 lm/web 0.6 lm/books", seq_len=kw.pop("seq_len", 24), global_batch=6,
                              num_samples=90, split="90,10,0", mode=mode, seed=3, cache_dir="lm/cache", rank=rank,
                              world_size=world)
        return list(it), it.get_state()
    finally:
        os.chdir(here)


def make_lm_data(root) -> None:
    import babelfeed

    os.makedirs(os.path.join(root, "lm"), exist_ok=True)
    for di, (name, n_docs) in enumerate((("web", 40), ("books", 25))):
        with babelfeed.IndexedDatasetBuilder(os.path.join(root, "lm", name), np.int32, format="megatron") as b:
            for doc in range(n_docs):
                for s in range(1 + int(_hash(di, doc, 21) % np.uint64(4))):
                    n = int(_lengths(1, 500 + 50 * di + doc * 7 + s)[0])
                    b.add_item(_tokens(np.array([n]), 900 + di * 1000 + doc * 10 + s, 10, 5000))
                b.end_document()
            b.finalize()


def cases(root) -> dict:
    """name -> a function returning (batches, final state)."""
    from babelfeed.config import task

    noise = "token_drop:rate=0.1;local_reorder:k=3;insert_tokens:rate=0.05,low=10,high=50;" \
            "token_replace:rate=0.05,low=10,high=50;span_mask:ratio=0.3,mask_id=<unk>"
    raw = dict(data__shards="all", mixing__sampler="stream", mixing__virtual_size="300", batching__window=120)
    sched = dict(data__shards="all", mixing__schedule__boundaries="3", mixing__schedule__weights=
                 "mt:1,dae:0.5 | mt:1,dae:0", batching__accumulation=2, batching__window=150)
    pack = dict(batching__pack="64x64", filter__max_source_positions=64, filter__max_target_positions=64)
    return {
        "plain_2epochs": lambda: _train(root, epochs=2),
        "plain_rank1_of_2": lambda: _train(root, rank=1, world=2),
        "rows_rank1_of_3_int32_padmult": lambda: _train(root, rank=1, world=3, split="rows",
                                                        collate__pad_to_multiple=8, collate__left_pad_target=True,
                                                        collate__dtype="int32"),
        "rows_rank0_of_2_right_pad_source": lambda: _train(root, world=2, split="rows",
                                                           collate__left_pad_source=False),
        "static_shapes_rows_rank0_of_2": lambda: _train(root, world=2, split="rows", batching__num_shapes=3),
        "static_shapes_explicit": lambda: _train(root, batching__shapes="24x24,48x48,128x128"),
        "packed": lambda: _train(root, **pack),
        "packed_rows_rank1_of_2": lambda: _train(root, rank=1, world=2, split="rows", **pack),
        "noised_with_monolingual": lambda: _train(root, epochs=2, data__monolingual="eee", data__noise=noise),
        "fairseq_mode_rank1_of_2": lambda: _train(root, rank=1, world=2, compat="fairseq",
                                                  mixing__sampler="fairseq", batching__window=0),
        "fairseq_mode_concat": lambda: _train(root, compat="fairseq", mixing__sampler="concat"),
        "stream_schedule_tasks": lambda: _train(
            root, epochs=2, world=2, tasks={"mt": task("aaa-bbb,aaa-ccc", weight=1.0),
                                           "dae": task("eee", kind="denoise", transforms="token_drop:rate=0.2",
                                                       source_prefix="__bt__")}, **sched),
        "raw_text_task": lambda: _train(
            root, tasks={"raw": task("aaa-bbb", weight=1.0, text="text/{split}/{key}.{lang}", alpha=0.2, nbest=8),
                         "mt": task("aaa-ccc", weight=1.0)}, **raw),
        "spread_copies_2epochs": lambda: _train(root, epochs=2, batching__spread_copies=True),
        "spread_copies_static_rows_rank1_of_2": lambda: _train(root, rank=1, world=2, split="rows",
                                                               batching__num_shapes=3, batching__spread_copies=True),
        "valid": lambda: _valid(root),
        "lm_concat": lambda: _lm(root, "concat"),
        "lm_concat_rank1_of_3": lambda: _lm(root, "concat", rank=1, world=3),
        "lm_pack": lambda: _lm(root, "pack"),
        "lm_pack_rank1_of_2": lambda: _lm(root, "pack", rank=1, world=2),
        "lm_sentences": lambda: _lm(root, "sentences", seq_len=40),
    }


def _valid(root):
    import babelfeed

    it = babelfeed.build_valid_iterator(_cfg(root, data__monolingual="eee", filter__on_too_long_valid="skip"))
    return list(it), it.get_state()


def compute(root) -> dict:
    out = {}
    for name, fn in cases(root).items():
        batches, state = fn()
        out[name] = {"batches": [digest(b) for b in batches], "state": json.loads(json.dumps(state))}
    return out


def build(root) -> None:
    make_golden_data(root)
    make_lm_data(root)


def main(argv=None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser()
    p.add_argument("--record", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        got = compute(tmp)
    if a.record:
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
        print(f"recorded {sum(len(v['batches']) for v in got.values())} batches of {len(got)} cases in {GOLDEN}")
        return 0
    with open(GOLDEN) as f:
        want = json.load(f)
    def same(g, w):  # every recorded batch, and the recorded fields of the state (later versions may add fields)
        return g is not None and g["batches"] == w["batches"] and {k: g["state"].get(k) for k in w["state"]} == w["state"]
    bad = [k for k in want if not same(got.get(k), want[k])]
    for k in bad:
        g = got.get(k) or {"batches": [], "state": {}}
        fields = sorted(f for f in want[k]["state"] if g["state"].get(f) != want[k]["state"][f])
        print(f"differs: {k}: " + ("batches, " if g["batches"] != want[k]["batches"] else "") + f"state fields {fields}")
    print("all equal" if not bad else f"{len(bad)} of {len(want)} cases differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(main())
