"""Encoder-decoder pairs packed side by side into one static row shape, through the pipeline."""

import json
from collections import Counter

import numpy as np
import pytest

import babelfeed
from synthetic import config_for, make_data_bin
from helpers import decode_ids
from babelfeed.errors import ConfigError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    truth = make_data_bin(root)
    return root, truth


def packed_config(root, **kw):
    return config_for(root, batching__pack="64x64", filter__max_source_positions=64, filter__max_target_positions=64,
                      **kw)


def test_packed_rows_hold_each_pair_intact(data):
    root, truth = data
    it = babelfeed.build_train_iterator(packed_config(root, mixing__sampler="concat", data__shards="all"))
    d = babelfeed.ShardedCorpus(root).dictionary()
    who = decode_ids(it)
    seen = Counter()
    for batch in it:
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        sseg, tseg = batch["net_input"]["src_segment_ids"], batch["net_input"]["tgt_segment_ids"]
        spos, prev = batch["net_input"]["src_positions"], batch["net_input"]["prev_output_tokens"]
        assert src.shape == (8, 64) and tgt.shape == (8, 64)
        real_rows = batch["weight"] > 0
        for gid, row, seg in zip(batch["id"], batch["row"], batch["segment"]):
            key, shard, r = who(gid)
            s_lang, t_lang = key.split("-")
            want_s = [d.lang_token_index(s_lang)] + truth[("train", key, s_lang, shard, r)].tolist()
            want_t = [d.lang_token_index(t_lang)] + truth[("train", key, t_lang, shard, r)].tolist()
            assert src[row][sseg[row] == seg].tolist() == want_s  # same segment id on both sides: one pair
            assert tgt[row][tseg[row] == seg].tolist() == want_t
            assert prev[row][tseg[row] == seg].tolist() == [d.eos()] + want_t[:-1]
            assert spos[row][sseg[row] == seg].tolist() == list(range(len(want_s)))
            if real_rows[row]:
                seen[(key, shard, r)] += 1
        assert batch["ntokens"] == int((tseg[real_rows] > 0).sum())
        assert (prev[tseg == 0] == d.pad()).all() and (src[sseg == 0] == d.pad()).all()
    assert sum(seen.values()) == 1321 and max(seen.values()) == 1  # every sample once; masked rows repeat only
    assert it.planner.masked_rows(1) < 8


def test_packed_mode_resumes_exactly(data):
    root, _ = data
    cfg = packed_config(root)
    full = [json.dumps(b["id"].tolist()) + str(b["net_input"]["src_tokens"].sum()) for b in
            babelfeed.build_train_iterator(cfg)]
    a = babelfeed.build_train_iterator(cfg)
    head = [json.dumps(next(a)["id"].tolist()) for _ in range(3)]
    b = babelfeed.build_train_iterator(cfg)
    b.set_state(a.get_state())
    rest = [json.dumps(x["id"].tolist()) + str(x["net_input"]["src_tokens"].sum()) for x in b]
    assert [h for h in head] == [f.split("]")[0] + "]" for f in full[:3]] and rest == full[3:]


def test_pack_shape_must_hold_the_longest_allowed_pair(data):
    root, _ = data
    with pytest.raises(ConfigError, match="must fit the packed row"):
        babelfeed.build_train_iterator(config_for(root, batching__pack="32x32"))
