"""Data in an object store (issue 24): a data folder at s3://bucket/prefix gives the batches of the same data on
local disk, bit for bit, through the host's fetcher; indexes are fetched once and checked as local ones."""

import numpy as np
import pytest

import babelfeed
import golden
from s3server import s3, s3_env  # noqa: F401  (fixtures)
from synthetic import config_for, make_data_bin


def leaves(batch, prefix=""):
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = np.asarray(v)
    return out


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        lx, ly = leaves(x), leaves(y)
        assert lx.keys() == ly.keys()
        for k in lx:
            assert lx[k].dtype == ly[k].dtype and np.array_equal(lx[k], ly[k]), k


def test_translation_batches_from_s3_equal_the_local_copy(tmp_path, s3_env):
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "runs/data_bin")
    mine = list(babelfeed.build_train_iterator(config_for(local, data__shards="all")))
    theirs = list(babelfeed.build_train_iterator(config_for(url, data__shards="all")))
    same_batches(mine, theirs)
    from babelfeed.storage import remote

    got = remote.stats()
    assert got["bytes"] > 0 and got["requests"] > 0
    # a second epoch, and a new iterator, read what is held: nothing fetched again
    again = list(babelfeed.build_train_iterator(config_for(url, data__shards="all")))
    same_batches(mine, again)
    assert remote.stats()["bytes"] == got["bytes"]


def test_lm_batches_from_s3_equal_the_local_copy(tmp_path, s3_env):
    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = s3_env.upload(str(root / "lm"), "bkt", "lm")

    def config(where):
        cfg = babelfeed.load_config("lm_packing")
        cfg.data_path = f"0.4 {where}/web 0.6 {where}/books"
        cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * 20
        cfg.split, cfg.cache_dir = "90,10,0", str(tmp_path / "lmcache")
        return cfg

    same_batches(list(babelfeed.build_iterator(config(root / "lm"))), list(babelfeed.build_iterator(config(url))))
