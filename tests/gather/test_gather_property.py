"""Property test of the gather engine: for any number of corpora (1 to 2,000), mixed dtypes and index formats,
any lengths, every row of every batch holds exactly its prefix and the tokens in the files."""

import os
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, example, given, settings, strategies as st

import babelfeed
import babelfeed.gather
import babelfeed.storage.spaces
from helpers import write_tntidx
from synthetic import config_for

LAYOUTS = (("fairseq", np.uint16), ("megatron", np.int32), ("fairseq", np.uint32), ("legacy", np.int32))


def write_index(prefix, seqs, fmt, dtype):
    """The layouts the engine must read, written directly (test data; no fsync)."""
    if fmt == "legacy":
        return write_tntidx(prefix, seqs, dtype=np.int32, code=4)
    lens = np.array([len(s) for s in seqs], dtype=np.int32)
    tokens = np.concatenate(seqs).astype(dtype) if seqs else np.zeros(0, dtype)
    code = {"fairseq": {np.uint16: 8, np.uint32: 9}, "megatron": {np.int32: 4}}[fmt][dtype]
    with open(f"{prefix}.bin", "wb") as f:
        f.write(tokens.tobytes())
    ptr = (np.cumsum(lens, dtype=np.int64) - lens) * np.dtype(dtype).itemsize
    head = b"MMIDIDX\x00\x00" + np.uint64(1).tobytes() + bytes([code]) + np.uint64(len(seqs)).tobytes()
    with open(f"{prefix}.idx", "wb") as f:
        if fmt == "megatron":
            f.write(head + np.uint64(len(seqs) + 1).tobytes() + lens.tobytes() + ptr.tobytes()
                    + np.arange(len(seqs) + 1, dtype=np.int64).tobytes())
        else:
            f.write(head + lens.tobytes() + ptr.tobytes())


def make(root, k: int, shards: int, seed: int):
    rng = np.random.default_rng(seed)
    langs = [f"l{i}" for i in range(int(np.ceil(np.sqrt(k))) + 2)]
    pairs = [(a, b) for a in langs for b in langs if a != b][:k]
    d = babelfeed.Dictionary()
    for i in range(200):
        d.add_symbol(f"w{i}")
    d.add_language_tokens(langs)
    d.save(os.path.join(root, "dict.txt"))
    truth = {}
    for i, (a, b) in enumerate(pairs):
        fmt, dtype = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
        for shard in range(shards):
            folder = os.path.join(root, f"shard{shard:03d}")
            os.makedirs(folder, exist_ok=True)
            n = int(rng.integers(1, 6))
            for lang in (a, b):
                seqs = [np.append(rng.integers(4, 204, int(rng.integers(0, 40))), 2) for _ in range(n)]
                write_index(os.path.join(folder, f"train.{a}-{b}.{lang}"), seqs, fmt, dtype)
                for r, s in enumerate(seqs):
                    truth[(f"{a}-{b}", shard, lang, r)] = s
    return d, truth


def check_batch(batch, it, d, truth):
    comps = it.planner.sources.components
    base = it.collater.id_base
    pad, eos = d.pad(), d.eos()
    src, tgt = batch["net_input"]["src_tokens"], batch["target"]
    prev = batch["net_input"]["prev_output_tokens"]
    assert len(batch["id"]) == len(src) == len(tgt) == len(prev) == len(batch["weight"])
    n_real = 0
    for i, (ident, w) in enumerate(zip(batch["id"].tolist(), batch["weight"].tolist())):
        if w == 0:
            continue
        n_real += 1
        c = int(np.searchsorted(base, ident, side="right") - 1)
        comp, row = comps[c], ident - int(base[c])
        s_lang, t_lang = comp.key.split("-")
        want_src = np.concatenate([comp.src_prefix, truth[(comp.key, comp.shard, s_lang, row)]])
        want_tgt = np.concatenate([comp.tgt_prefix, truth[(comp.key, comp.shard, t_lang, row)]])
        ls, lt = len(want_src), len(want_tgt)
        assert batch["net_input"]["src_lengths"][i] == ls
        assert src[i, src.shape[1] - ls:].tolist() == want_src.tolist() and (src[i, :src.shape[1] - ls] == pad).all()
        assert tgt[i, :lt].tolist() == want_tgt.tolist() and (tgt[i, lt:] == pad).all()
        assert prev[i, :lt].tolist() == [eos] + want_tgt[:-1].tolist() and (prev[i, lt:] == pad).all()
    assert batch["nsentences"] == n_real
    return n_real


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.one_of(st.integers(1, 30), st.integers(300, 1000)), shards=st.integers(1, 2),
       seed=st.integers(0, 2**16), flat=st.booleans(), max_tokens=st.sampled_from([256, 700, 2048]),
       temperature=st.sampled_from([1.0, 5.0]), window=st.sampled_from([0, 97, 1000]),
       shapes=st.sampled_from(["", "24x24,48x48,64x64"]), world=st.integers(1, 3))
@example(k=2000, shards=2, seed=3, flat=True, max_tokens=700, temperature=5.0, window=1000, shapes="", world=2)
@example(k=400, shards=1, seed=4, flat=False, max_tokens=2048, temperature=1.0, window=97, shapes="24x24,48x48,64x64",
         world=3)
def test_every_row_holds_its_files_tokens(tmp_path_factory, k, shards, seed, flat, max_tokens, temperature, window,
                                          shapes, world):
    root = tmp_path_factory.mktemp("prop")
    d, truth = make(str(root), k, shards, seed)
    cfg = config_for(root, batching__max_tokens=max_tokens, mixing__temperature=temperature,
                     batching__window=window, data__shards="all" if shards > 1 and seed % 2 else "cycle",
                     batching__shapes=shapes, filter__max_source_positions=64, filter__max_target_positions=64)
    with mock.patch.object(babelfeed.storage.spaces, "native_available", lambda: flat):
        served = 0
        for rank in range(world):
            it = babelfeed.build_train_iterator(cfg, rank=rank, world_size=world)
            spaces = it.planner.sources.spaces
            assert spaces.flat == flat
            if flat and k > 20:  # several dtypes and index formats: several spaces, each holding many files
                assert 1 < len(spaces) <= len(LAYOUTS)
            for batch in it:
                served += check_batch(batch, it, d, truth)
        planned = sum(int(c) for c in it.planner.setup(1).counts) - int(it.planner.filtered(1).sum())
        assert served == planned  # every planned sample served once over the ranks, none lost
