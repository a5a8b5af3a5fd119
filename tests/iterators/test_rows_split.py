"""split="rows": every rank holds its rows of every global batch (the JAX multi-host layout)."""

import numpy as np
import pytest

import babelfeed
from synthetic import config_for, make_data_bin
from helpers import digest


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("rows")
    make_data_bin(r)
    return r


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("static", [False, True])
def test_ranks_hold_the_rows_of_the_same_global_batch(root, world, static):
    cfg = config_for(root, batching__num_shapes=3 if static else 0)
    single = list(babelfeed.build_train_iterator(cfg))
    single_rows = list(babelfeed.build_train_iterator(cfg, split="rows"))
    ranks = [list(babelfeed.build_train_iterator(cfg, rank=r, world_size=world, split="rows")) for r in range(world)]
    assert all(len(x) == len(single) for x in ranks)
    for g, whole in enumerate(single):
        pieces = [ranks[r][g] for r in range(world)]
        shapes = {(p["net_input"]["src_tokens"].shape, p["target"].shape) for p in pieces}
        assert len(shapes) == 1  # the pieces assemble into one global array
        rows = pieces[0]["net_input"]["src_tokens"].shape[0]
        assert rows * world >= whole["net_input"]["src_tokens"].shape[0]
        got = sorted(int(i) for p in pieces for i, w in zip(p["id"], p["weight"]) if w > 0)
        want = sorted(int(i) for i, w in zip(whole["id"], whole["weight"]) if w > 0)
        assert got == want
        if static:  # same row count: the pieces stacked are the single-process global batch, row for row
            stacked = np.concatenate([p["net_input"]["src_tokens"] for p in pieces])
            assert np.array_equal(stacked, single_rows[g]["net_input"]["src_tokens"])
        if static:
            assert rows * world == whole["net_input"]["src_tokens"].shape[0]


def test_rows_state_resumes_in_batches_mode(root):
    cfg = config_for(root)
    full = [digest(b) for b in babelfeed.build_train_iterator(cfg)]
    it = babelfeed.build_train_iterator(cfg, rank=0, world_size=2, split="rows")
    for _ in range(4):
        next(it)
    resumed = babelfeed.build_train_iterator(cfg)
    resumed.set_state(it.get_state())
    assert [digest(b) for b in resumed] == full[4:]
