"""Source noise applied in the training loop: deterministic per sample, fresh each epoch, never silent."""

import json

import numpy as np
import pytest

import babelfeed
from synthetic import config_for, make_data_bin
from helpers import decode_ids, digest
from babelfeed.errors import ConfigError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise")
    truth = make_data_bin(root)
    return root, truth


def is_subsequence(small, big):
    it = iter(big)
    return all(t in it for t in small)


def test_noised_sources_clean_targets_per_task(data):
    root, truth = data
    cfg = config_for(root, mixing__sampler="concat", data__shards="all",
                     data__noise_by_task="aaa-bbb=token_drop:rate=0.5")
    it = babelfeed.build_train_iterator(cfg)
    d = babelfeed.ShardedCorpus(root).dictionary()
    who = decode_ids(it)
    changed = untouched = 0
    for batch in it:
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        for i, gid in enumerate(batch["id"]):
            key, shard, r = who(gid)
            s_lang, t_lang = key.split("-")
            clean = [d.lang_token_index(s_lang)] + truth[("train", key, s_lang, shard, r)].tolist()
            want_tgt = [d.lang_token_index(t_lang)] + truth[("train", key, t_lang, shard, r)].tolist()
            got = src[i][src[i] != d.pad()].tolist()
            assert tgt[i][: len(want_tgt)].tolist() == want_tgt  # targets are never noised
            assert got[0] == clean[0] and got[-1] == 2 and is_subsequence(got, clean)
            assert batch["net_input"]["src_lengths"][i] == len(got)
            if key == "aaa-bbb":
                changed += len(got) < len(clean)
            else:
                untouched += got == clean
    assert changed > 500 and untouched == 200 + 21  # aaa-ccc and aaa-ddd rows, all intact


def test_noise_is_deterministic_resumable_and_fresh_each_epoch(data):
    root, _ = data
    cfg = config_for(root, mixing__sampler="concat", data__shards="all", data__noise="local_reorder:k=3")
    a = babelfeed.build_train_iterator(cfg)
    epoch1 = [digest(b) for b in a]
    epoch2 = [digest(b) for b in a]
    assert [digest(b) for b in babelfeed.build_train_iterator(cfg)] == epoch1
    b = babelfeed.build_train_iterator(cfg)
    head = [digest(next(b)) for _ in range(5)]
    c = babelfeed.build_train_iterator(cfg)
    c.set_state(json.loads(json.dumps(b.get_state())))
    assert head + [digest(x) for x in c] == epoch1
    # the same samples in epoch 2 (concat, every shard) get other noise
    same_order = babelfeed.build_train_iterator(cfg)
    assert epoch1 != epoch2 and len(epoch1) == len(epoch2) == len(list(same_order))


def test_sources_that_outgrow_the_limit_are_masked_and_counted(data):
    root, _ = data
    cfg = config_for(root, mixing__sampler="concat", data__shards="all", filter__max_source_positions=64,
                     filter__max_target_positions=64, data__noise="insert_tokens:rate=0.9,low=10,high=20")
    it = babelfeed.build_train_iterator(cfg)
    masked = 0
    for batch in it:
        assert batch["net_input"]["src_tokens"].shape[1] <= 64
        masked += int((batch["weight"] == 0).sum())
    assert masked > 0 and it.collater.noise_dropped == masked


def test_bad_noise_settings(data):
    root, _ = data
    with pytest.raises(ConfigError, match="unknown transform"):
        babelfeed.build_train_iterator(config_for(root, data__noise="scramble:x=1"))
    with pytest.raises(ConfigError, match="not used"):
        babelfeed.build_train_iterator(config_for(root, data__noise_by_task="zzz-yyy=token_drop:rate=0.1"))
