"""Synthetic data_bins holding the same sentence pairs spread over 4 to 10,000 directions (benchmark data).

Files are written straight in fairseq's MMIDIDX layout without fsync (the library's builder fsyncs every file,
which makes writing 40,000 files slow, and this is throwaway benchmark data); the library reads them back.
"""

from __future__ import annotations

import os
import struct

import numpy as np

TOTAL = 1_200_000
VOCAB = 32_000


def lengths(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.2, 0.7, n), 2, 256).astype(np.int32)
    tgt = np.clip(src * rng.lognormal(0.0, 0.15, n), 2, 256).astype(np.int32)
    return src, tgt


def direction_sizes(total: int, k: int, seed: int = 1) -> np.ndarray:
    """k direction sizes summing to ``total``, log-normally uneven (NLLB directions differ by 100x and more)."""
    if k == 1:
        return np.array([total])
    w = np.random.default_rng(seed).lognormal(0, 1.0, k)
    sizes = np.maximum(1, np.floor(w / w.sum() * total)).astype(np.int64)
    sizes[np.argmax(sizes)] += total - sizes.sum()
    return sizes


def write_fairseq(prefix: str, tokens: np.ndarray, lens: np.ndarray) -> None:
    tokens = np.asarray(tokens, dtype=np.uint16)
    with open(prefix + ".bin", "wb") as f:
        f.write(tokens.tobytes())
    lens = np.asarray(lens, dtype=np.int32)
    ptr = (np.cumsum(lens, dtype=np.int64) - lens) * 2
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", len(lens)))
        f.write(lens.tobytes() + ptr.tobytes())


def langs(k: int) -> list[tuple[str, str]]:
    """k distinct (src, tgt) language codes: two-letter codes, every pair out of a few hundred languages."""
    names = [a + b + c for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz" for c in "xyz"]
    pairs = []
    n = int(np.ceil(np.sqrt(k))) + 1
    for i in range(n):
        for j in range(n):
            if i != j:
                pairs.append((names[i], names[j]))
    return pairs[:k]


def build(root: str, k: int, total: int = TOTAL, shards: int = 1, log=print) -> str:
    """The data_bin of ``total`` sentence pairs over ``k`` directions (cached: rebuilt only when missing)."""
    done = os.path.join(root, "dict.txt")
    if os.path.exists(done):
        return root
    from babelfeed import Dictionary

    log(f"writing {total:,} sentence pairs in {k:,} directions x {shards} shard(s) to {root} ...")
    src_len, tgt_len = lengths(total)
    rng = np.random.default_rng(2)
    src_tok = rng.integers(4, VOCAB, int(src_len.sum()), dtype=np.uint16)
    tgt_tok = rng.integers(4, VOCAB, int(tgt_len.sum()), dtype=np.uint16)
    src_tok[np.cumsum(src_len) - 1] = 2
    tgt_tok[np.cumsum(tgt_len) - 1] = 2
    src_off = np.concatenate([[0], np.cumsum(src_len, dtype=np.int64)])
    tgt_off = np.concatenate([[0], np.cumsum(tgt_len, dtype=np.int64)])
    sizes = direction_sizes(total, k)
    pairs = langs(k)
    d = Dictionary()
    for i in range(VOCAB - 4):
        d.add_symbol(f"p{i}")
    d.add_language_tokens(sorted({x for p in pairs for x in p}))
    at = 0
    for (s, t), n in zip(pairs, sizes.tolist()):
        cuts = np.linspace(at, at + n, shards + 1).astype(np.int64)
        for shard in range(shards):
            a, b = int(cuts[shard]), int(cuts[shard + 1])
            folder = os.path.join(root, f"shard{shard:03d}")
            os.makedirs(folder, exist_ok=True)
            key = f"{s}-{t}"
            write_fairseq(os.path.join(folder, f"train.{key}.{s}"), src_tok[src_off[a]:src_off[b]], src_len[a:b])
            write_fairseq(os.path.join(folder, f"train.{key}.{t}"), tgt_tok[tgt_off[a]:tgt_off[b]], tgt_len[a:b])
        at += n
    d.save(done)
    return root
