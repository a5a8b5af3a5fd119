"""The planner's strategies: a sampler and a batch cutter, each chosen once as an object from the config. A new
sampler is a class and one registration: the config accepts its name, and the planner, the state and resume
work with it unchanged."""

import json

import numpy as np
import pytest

import babelfeed
from babelfeed.plan import cutters, samplers
from golden import digest
from synthetic import config_for, make_data_bin


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("strategies")
    make_data_bin(r)
    return r


@pytest.mark.parametrize("overrides, sampler, cutter", [
    ({}, "stratified", "dynamic"),
    ({"mixing__sampler": "stream", "data__shards": "all"}, "stream", "dynamic"),
    ({"mixing__sampler": "concat"}, "concat", "dynamic"),
    ({"compat": "fairseq", "mixing__sampler": "fairseq"}, "fairseq", "fairseq"),
    ({"batching__shapes": "64x64,128x128"}, "stratified", "static"),
    ({"batching__pack": "128x128"}, "stratified", "packed"),
])
def test_each_config_chooses_its_sampler_and_cutter_once(root, overrides, sampler, cutter):
    it = babelfeed.build_train_iterator(config_for(root, **overrides))
    assert it.planner.sampler.name == sampler and it.planner.cutter.name == cutter
    assert it.planner.sampler is samplers.choose(sampler) and isinstance(it.planner.cutter, type(cutters.choose(it.planner.opts)))
    assert next(it)["nsentences"] > 0


class EqualShares(samplers.Sampler):
    """Every corpus the same share of an epoch, whatever its size or the temperature (a sampler of a user's)."""

    name = "equal-shares"

    def ratios(self, opts, sizes, keys, task_of, task_weights=None):
        return np.full(len(sizes), 1.0 / len(sizes))


def test_a_new_sampler_is_a_class_and_one_registration(root):
    samplers.register(EqualShares())
    try:
        cfg = config_for(root, mixing__sampler="equal-shares", mixing__temperature=1.0)
        it = babelfeed.build_train_iterator(cfg)
        setup = it.planner.setup(1)
        assert np.ptp(setup.counts) <= 1 and len(set(setup.counts.tolist())) <= 2  # equal shares, not by size
        plain = babelfeed.build_train_iterator(config_for(root, mixing__temperature=1.0))
        assert np.ptp(plain.planner.setup(1).counts) > 1
        head = [digest(next(it)) for _ in range(4)]
        state = json.loads(json.dumps(it.get_state()))
        fresh = babelfeed.build_train_iterator(cfg)
        fresh.set_state(state)
        assert [digest(next(fresh)) for _ in range(5)] == [digest(next(it)) for _ in range(5)] and head
    finally:
        samplers._REGISTRY.pop("equal-shares")
    with pytest.raises(babelfeed.ConfigError, match="mixing.sampler must be one of 'auto', 'stratified'"):
        babelfeed.build_train_iterator(config_for(root, mixing__sampler="equal-shares"))
