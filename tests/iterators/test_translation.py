"""The multilingual training pipeline end to end on a synthetic data_bin."""

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import babelfeed
from helpers import decode_ids, digest
from synthetic import DIRECTIONS, config_for, make_data_bin
from babelfeed.errors import BabelfeedError, DataError, StateMismatch


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("databin")
    truth = make_data_bin(root)
    return root, truth


def epoch_batches(it):
    return [b for b in it]


# ------------------------------------------------------------------------------------------- batches
def test_rows_hold_the_right_tokens(data):
    root, truth = data
    cfg = config_for(root)
    it = babelfeed.build_train_iterator(cfg)
    d = babelfeed.ShardedCorpus(root).dictionary()
    who = decode_ids(it)
    pad, eos = d.pad(), d.eos()
    n = 0
    for batch in it:
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        prev = batch["net_input"]["prev_output_tokens"]
        assert src.dtype == np.int64 and batch["nsentences"] == len(src)
        assert (np.diff(batch["net_input"]["src_lengths"]) <= 0).all()  # sorted by source length, descending
        for i, gid in enumerate(batch["id"]):
            key, shard, row = who(gid)
            s_lang, t_lang = key.split("-")
            want_src = [d.lang_token_index(s_lang)] + truth[("train", key, s_lang, shard, row)].tolist()
            want_tgt = [d.lang_token_index(t_lang)] + truth[("train", key, t_lang, shard, row)].tolist()
            ls, lt = len(want_src), len(want_tgt)
            assert batch["net_input"]["src_lengths"][i] == ls
            assert src[i, src.shape[1] - ls:].tolist() == want_src and (src[i, :src.shape[1] - ls] == pad).all()
            assert tgt[i, :lt].tolist() == want_tgt and (tgt[i, lt:] == pad).all()
            assert prev[i, :lt].tolist() == [eos] + want_tgt[:-1] and (prev[i, lt:] == pad).all()
            n += 1
        assert batch["ntokens"] == int((tgt != pad).sum())
    assert it.epoch == 2 and n == sum(v["served"] for v in it.stats(epoch=1).values())


def test_budget_and_multiple(data):
    root, _ = data
    cfg = config_for(root, batching__max_tokens=300, batching__max_sentences=24)
    it = babelfeed.build_train_iterator(cfg)
    odd = 0
    for batch in it:
        b = batch["nsentences"]
        assert b * batch["net_input"]["src_tokens"].shape[1] <= 300 and b * batch["target"].shape[1] <= 300
        assert b <= 24
        odd += b >= 8 and b % 8 != 0
    assert odd <= 1  # only the last batch of the (single) window may miss the multiple


def test_concat_every_sample_exactly_once_on_any_world_size(data):
    root, truth = data
    cfg = config_for(root, mixing__sampler="concat", data__shards="all")
    expected = Counter((k[1], k[3], k[4]) for k in truth if k[0] == "train" and k[2] == k[1].split("-")[0])
    for world in (1, 3):
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
        per_rank = [epoch_batches(it) for it in its]
        assert len({len(b) for b in per_rank}) == 1  # same number of steps on every rank
        assert all(len(b) == len(it) for b, it in zip(per_rank, its))
        who = decode_ids(its[0])
        seen = Counter(who(i) for batches in per_rank for b in batches for i, w in zip(b["id"], b["weight"]) if w > 0)
        assert seen == expected
        dummies = [b for batches in per_rank for b in batches if b["weight"].sum() == 0]
        assert all(b["ntokens"] == 0 and b["nsentences"] == 0 for b in dummies)
        assert len(dummies) == (-len(its[0].planner.num_batches(1) * [0]) % world)


def test_global_order_does_not_depend_on_world_size(data):
    root, _ = data
    cfg = config_for(root)
    single = [digest(b) for b in epoch_batches(babelfeed.build_train_iterator(cfg))]
    for world in (2, 4):
        ranks = [epoch_batches(babelfeed.build_train_iterator(cfg, rank=r, world_size=world)) for r in range(world)]
        interleaved = [digest(ranks[g % world][g // world]) for g in range(len(single))]
        assert interleaved == single


def test_deterministic_and_seeded(data):
    root, _ = data
    a = [digest(b) for b in epoch_batches(babelfeed.build_train_iterator(config_for(root)))]
    b = [digest(b) for b in epoch_batches(babelfeed.build_train_iterator(config_for(root)))]
    c = [digest(b) for b in epoch_batches(babelfeed.build_train_iterator(config_for(root, seed=2)))]
    assert a == b and a != c


def test_windows_plan_the_same_samples(data):
    root, truth = data
    cfg = config_for(root, mixing__sampler="concat", data__shards="all", batching__window=97)
    it = babelfeed.build_train_iterator(cfg)
    assert it.planner.setup(1).num_windows > 5
    who = decode_ids(it)
    seen = Counter(who(i) for b in it for i in b["id"])
    assert sum(seen.values()) == sum(1 for k in truth if k[0] == "train" and k[2] == k[1].split("-")[0])
    assert max(seen.values()) == 1


# ------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("window", [0, 150])
def test_resume_at_random_points_is_bit_identical(data, window):
    root, _ = data
    cfg = config_for(root, batching__window=window)
    full_it = babelfeed.build_train_iterator(cfg)
    full = [digest(b) for _ in range(3) for b in epoch_batches(full_it)]  # three epochs
    rng = np.random.default_rng(0)
    for cut in sorted(set(rng.integers(0, len(full), 12).tolist()) | {0, len(full) - 1}):
        it = babelfeed.build_train_iterator(cfg)
        got = []
        while len(got) < cut:
            try:
                got.append(digest(next(it)))
            except StopIteration:
                pass
        state = json.loads(json.dumps(it.get_state()))
        resumed = babelfeed.build_train_iterator(cfg)
        resumed.set_state(state)
        while len(got) < len(full):
            try:
                got.append(digest(next(resumed)))
            except StopIteration:
                pass
        assert got == full, f"resume after {cut} batches diverged"


def test_resume_in_a_fresh_process(data, tmp_path):
    root, _ = data
    cfg = config_for(root)
    it = babelfeed.build_train_iterator(cfg)
    for _ in range(7):
        next(it)
    state = it.get_state()
    expected = [digest(next(it)) for _ in range(10)]
    script = f"""
import json, sys
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent.parent)!r})
import babelfeed
from synthetic import config_for
from helpers import digest
it = babelfeed.build_train_iterator(config_for({str(root)!r}))
it.set_state(json.loads(sys.argv[1]))
print(json.dumps([digest(next(it)) for _ in range(10)]))
"""
    out = subprocess.run([sys.executable, "-c", script, json.dumps(state)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.parametrize("before,after", [(2, 3), (4, 1), (1, 2)])
def test_resume_on_another_world_size(data, before, after):
    """No sample skipped or repeated across the change; the global order continues."""
    root, _ = data
    cfg = config_for(root)
    single = [digest(b) for b in epoch_batches(babelfeed.build_train_iterator(cfg))]
    steps = 5
    ranks = [babelfeed.build_train_iterator(cfg, rank=r, world_size=before) for r in range(before)]
    got = {}
    for s in range(steps):
        for r, it in enumerate(ranks):
            got[s * before + r] = digest(next(it))
    states = [it.get_state() for it in ranks]
    assert all(s == states[0] for s in states)  # rank-independent
    new = [babelfeed.build_train_iterator(cfg, rank=r, world_size=after) for r in range(after)]
    for it in new:
        it.set_state(states[0])
    base = steps * before
    for s, batches in enumerate(zip(*[epoch_batches(it) for it in new])):
        for r, b in enumerate(batches):
            if base + s * after + r < len(single):
                got[base + s * after + r] = digest(b)
    assert [got[g] for g in range(len(single))] == single


def test_state_refuses_other_settings(data):
    root, _ = data
    it = babelfeed.build_train_iterator(config_for(root))
    next(it)
    state = it.get_state()
    other = babelfeed.build_train_iterator(config_for(root, batching__max_tokens=640))
    with pytest.raises(StateMismatch, match="different data or settings"):
        other.set_state(state)
    with pytest.warns(babelfeed.errors.Notice, match="batching.max_tokens 512 -> 640.*may be skipped"):
        other.set_state(state, mixture_change="keep_position")  # said out loud: samples may repeat or be skipped
    # small: position, fingerprint and what it stands for, the step count's world sizes, the ledger (3 streams) and
    # the config it was saved with (what an edit compares; about 1.3 kB)
    assert set(state) >= {"epoch", "consumed", "fingerprint", "history", "identity"} and len(json.dumps(state)) < 3000


# ------------------------------------------------------------------------------------------- epochs
def test_shard_cycling(data):
    root, _ = data
    it = babelfeed.build_train_iterator(config_for(root))
    who = decode_ids(it)
    shards_per_epoch = []
    for _ in range(3):
        shards_per_epoch.append({who(i)[1] for b in it for i in b["id"]})
    assert shards_per_epoch == [{0}, {1}, {0}]


def test_counts_follow_temperature(data):
    root, _ = data
    it = babelfeed.build_train_iterator(config_for(root))
    st = it.stats()
    sizes = [sum(v) for v in DIRECTIONS.values()]
    p = babelfeed.sampling_probabilities(sizes, 5.0)
    assert [round(st[k]["probability"], 6) for k in DIRECTIONS] == [round(x, 6) for x in p]
    setup = it.planner.setup(1)
    assert np.abs(setup.counts / setup.counts.sum() - p).max() < 1e-3


def test_too_long_samples_are_counted_or_raise(tmp_path):
    make_data_bin(tmp_path, long_every=10)
    it = babelfeed.build_train_iterator(config_for(tmp_path, mixing__sampler="concat", batching__max_tokens=1024,
                                                filter__max_source_positions=150, filter__max_target_positions=150))
    total = sum(b["nsentences"] for b in it)
    filtered = it.planner.filtered(1)
    assert filtered.tolist() == [600 // 10, 120 // 10, 12 // 10] and total == 600 + 120 + 12 - filtered.sum()
    assert [v["filtered"] for v in it.stats(epoch=1).values()] == filtered.tolist()  # still known in epoch 2
    with pytest.raises(DataError, match="over max_source_positions=150"):
        list(babelfeed.build_train_iterator(config_for(tmp_path, filter__on_too_long="raise", batching__max_tokens=1024,
                                                    filter__max_source_positions=150,
                                                    filter__max_target_positions=150)))
    # every shard joined: the error names the shard, the record in its own file and the file, not a joined row
    with pytest.raises(DataError) as got:
        list(babelfeed.build_train_iterator(config_for(tmp_path, filter__on_too_long="raise", data__shards="all",
                                                    batching__max_tokens=1024, filter__max_source_positions=150,
                                                    filter__max_target_positions=150)))
    key, shard, record, index = re.match(r"(\S+) shard (\d+) record (\d+) \((\S+\.idx)\)", str(got.value)).groups()
    assert f"shard{int(shard):03d}" in index and f".{key}." in index
    assert int(record) % 10 == 9 and int(record) < DIRECTIONS[key][int(shard)]  # every tenth record of its file


def test_prefix_overrides(data):
    root, truth = data
    cfg = config_for(root, data__prefix_overrides="aaa-ddd:source=__bt__ __{src}__")
    it = babelfeed.build_train_iterator(cfg)
    d = babelfeed.ShardedCorpus(root).dictionary()
    comps = {c.key: c for c in it.planner.sources.components}
    assert comps["aaa-ddd"].src_prefix.tolist() == [d.index("__bt__"), d.index("__aaa__")]
    assert comps["aaa-bbb"].src_prefix.tolist() == [d.index("__aaa__")]
    assert comps["aaa-bbb"].tgt_prefix.tolist() == [d.index("__bbb__")]


@pytest.mark.parametrize("override,match", [
    (dict(mixing__temperature=0.0), "temperature"),
    (dict(batching__max_tokens=-1), "max_tokens"),
    (dict(batching__max_tokens=64), "smaller than the longest allowed sample"),
    (dict(data__directions="aaa-zzz"), "no train data for 'aaa-zzz'"),
    (dict(mixing__method="weights", mixing__weights="aaa-bbb:1"), "missing"),
    (dict(data__prefix_overrides="aaa-bbb:source=__nope__"), "not in the dictionary"),
    (dict(mixing__virtual_size="lots"), "virtual_size"),
])
def test_invalid_config_is_rejected_at_build_time(data, override, match):
    root, _ = data
    with pytest.raises(BabelfeedError, match=match):
        babelfeed.build_train_iterator(config_for(root, **override))


# ------------------------------------------------------------------------------------------- validation
def test_valid_iterator_every_sample_once_in_fixed_order(data):
    root, truth = data
    cfg = config_for(root)
    expected = Counter((k[1], k[3], k[4]) for k in truth if k[0] == "valid" and k[2] == k[1].split("-")[0])
    a = babelfeed.build_valid_iterator(cfg)
    who = decode_ids(a)
    batches = epoch_batches(a)
    assert Counter(who(i) for b in batches for i in b["id"]) == expected
    assert [digest(b) for b in batches] == [digest(b) for b in epoch_batches(babelfeed.build_valid_iterator(cfg))]
    assert list(a) == []  # one pass only
    ranks = [epoch_batches(babelfeed.build_valid_iterator(cfg, rank=r, world_size=2)) for r in range(2)]
    assert Counter(who(i) for bs in ranks for b in bs for i, w in zip(b["id"], b["weight"]) if w) == expected


def test_length_cache_budget_changes_nothing_but_speed(data):
    root, _ = data
    plans = []
    for mb in (0, 512):
        it = babelfeed.build_train_iterator(config_for(root, data__length_cache_mb=mb))
        plans.append([digest(b) for _ in range(3) for b in it])  # a corpus's first lookup reads in place
        cached = [c._lengths.get("src") for c in it.planner.sources.components if "src" in c._lengths]
        assert cached and all((isinstance(x, np.ndarray) and x.dtype == np.uint16) == (mb > 0) for x in cached)
    assert plans[0] == plans[1]
    cache = babelfeed.sources.rows.LengthCache(budget_bytes=100)
    assert cache.copy(np.arange(40, dtype=np.int32)).dtype == np.uint16 and cache.used == 80
    assert cache.copy(np.arange(40, dtype=np.int32)) is None  # over budget: the caller reads the memmap
    assert babelfeed.sources.rows.LengthCache(10**6).copy(np.array([70000], np.int32)).dtype == np.int32


@pytest.mark.parametrize("sampler", ["fairseq", "concat"])
def test_fairseq_compat_epoch(data, sampler):
    """compat='fairseq' composes fairseq's stages exactly as its multilingual task does; each stage is checked
    against fairseq's own outputs in test_mixing / test_batching, here the composition is rebuilt by hand."""
    from babelfeed.plan.batching import fairseq_batch_by_size
    from babelfeed.plan.mixing import fairseq_draw

    root, _ = data
    seed, epoch, world = 3, 2, 2
    cfg = config_for(root, compat="fairseq", mixing__sampler=sampler, seed=seed, mixing__temperature=2.0)
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world, epoch=epoch) for r in range(world)]
    setup = its[0].planner.setup(epoch)
    comps = [d.components[0] for d in setup.directions]
    sizes = [len(c) for c in comps]
    if sampler == "fairseq":
        p = babelfeed.sampling_probabilities([d.total_size for d in setup.directions], 2.0)
        v = babelfeed.plan.mixing.virtual_size(sizes, p)
        draws = fairseq_draw(sizes, p, v, epoch)  # RandomState([sha1 % 2**32, 2, epoch])
    else:
        draws = [np.arange(n) for n in sizes]
    virt = [(d, int(r)) for d, idx in enumerate(draws) for r in idx]
    src = np.array([int(comps[d].src_lengths(np.array([r]))[0]) for d, r in virt])
    tgt = np.array([int(comps[d].tgt_lengths(np.array([r]))[0]) for d, r in virt])
    np.random.seed(seed)  # TranslationMultiSimpleEpochTask: numpy_seed(seed) around ordered_indices
    perm = np.random.permutation(len(virt))
    perm = perm[np.argsort(tgt[perm], kind="mergesort")]
    perm = perm[np.argsort(src[perm], kind="mergesort")]
    perm = perm[(src[perm] <= 128) & (tgt[perm] <= 128)]
    batches = fairseq_batch_by_size(perm, np.maximum(src, tgt), 512, None, 8)
    np.random.seed(seed + epoch)  # EpochBatchIterator: numpy_seed(seed + epoch), shuffle, then r::W
    np.random.shuffle(batches)
    want = [sorted(virt[i] for i in b) for b in batches]
    got_by_rank = [list(it) for it in its]
    comp_index = {id(c): d for d, c in enumerate(comps)}
    who = decode_ids(its[0])
    got = []
    for g in range(len(want)):
        b = got_by_rank[g % world][g // world]
        got.append(sorted((comp_index[id(next(c for c in comps if c.key == who(i)[0]))], who(i)[2]) for i in b["id"]))
    assert got == want
