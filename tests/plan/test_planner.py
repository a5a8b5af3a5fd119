"""The planner's mixture through the way users build a run (``build_train_iterator`` and the defaults): UniMax
and the cap on up-sampling give the epoch counts of the paper's algorithm, on the stratified and the stream
sampler, resume exactly at a random cut, and an edit to them takes effect at the next step."""

import json
import warnings

import numpy as np
import pytest

import babelfeed
from babelfeed.errors import ConfigError, Notice
from helpers import digest, unimax_as_written
from synthetic import config_for, make_data_bin


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("mixture")
    make_data_bin(r)
    return r


def cfg(root, sampler, **kw):
    """The defaults but ``sampler`` (the stream sampler reads every shard as one stream)."""
    return config_for(root, mixing__sampler=sampler, **({"data__shards": "all"} if sampler == "stream" else {}), **kw)


def served(it) -> np.ndarray:
    """Samples served per direction (the iterator's stream order) over the rest of the current epoch."""
    out = np.zeros(len(it.planner.keys), np.int64)
    epoch = it.epoch
    for batch in it:
        np.add.at(out, np.asarray(batch["direction"]), 1)
        if it.epoch != epoch:
            break
    return out


@pytest.mark.parametrize("sampler", ["stratified", "stream"])
def test_unimax_serves_the_papers_counts_in_an_epoch(root, sampler):
    it = babelfeed.build_train_iterator(cfg(root, sampler, mixing__method="unimax", mixing__max_upsample=3.0))
    sizes = [d.size for d in it.planner.sources.directions(1)]
    setup = it.planner.setup(1)
    total = int(setup.samples if sampler == "stream" else setup.counts.sum())
    want = np.array(unimax_as_written(sizes, total, 3.0))
    got = served(it)
    assert np.abs(got - want).max() <= 1, (got, want)
    assert (got <= np.array(sizes) * 3 + 1).all() and got[np.argmin(sizes)] >= 3 * min(sizes) - 1  # the small one: N epochs


def test_unimax_without_a_cap_is_refused_naming_the_key(root):
    with pytest.raises(ConfigError, match="mixing.max_upsample"):
        babelfeed.build_train_iterator(config_for(root, mixing__method="unimax"))
    with pytest.raises(ConfigError, match="leave mixing.max_upsample at 0"):
        babelfeed.build_train_iterator(config_for(root, mixing__max_upsample=2.0, mixing__sampler="fairseq",
                                                  compat="fairseq"))


@pytest.mark.parametrize("sampler", ["stratified", "stream"])
def test_max_upsample_caps_the_temperature_mixture_and_shares_the_excess(root, sampler):
    plain = babelfeed.build_train_iterator(cfg(root, sampler))
    capped = babelfeed.build_train_iterator(cfg(root, sampler, mixing__max_upsample=4.0))
    sizes = np.array([d.size for d in plain.planner.sources.directions(1)])
    a, b = served(plain), served(capped)
    small = int(np.argmin(sizes))
    assert a[small] > 4 * sizes[small] + 1 and b[small] <= 4 * sizes[small] + 1  # capped where it was over
    rest = np.arange(len(sizes)) != small
    np.testing.assert_allclose(b[rest] / b[rest].sum(), a[rest] / a[rest].sum(), atol=0.02)  # shared in proportion
    assert b.sum() == pytest.approx(a.sum(), abs=2)  # the epoch keeps its size while the others can take it


TINY = {"aaa-bbb": [400], "aaa-ccc": [50], "aaa-ddd": [3], "bbb-ccc": [1]}


@pytest.mark.parametrize("cap", [0.5, 1.5, 2.7, 7.77])
@pytest.mark.parametrize("method", ["temperature", "unimax"])
def test_a_fractional_cap_is_never_exceeded_by_the_rounding(tmp_path_factory, cap, method):
    """A 1-sentence direction under max_upsample=1.5 was served twice, 7.77 eight times (found by a review): the
    largest-remainder rounding gave the capped direction the epoch's leftover sample. Counts are now at most
    floor(cap x size); the leftover goes to directions under their cap."""
    r = tmp_path_factory.mktemp(f"tiny{cap}{method}")
    make_data_bin(r, directions=TINY, valid=False)
    it = babelfeed.build_train_iterator(config_for(r, data__shards="all", mixing__method=method,
                                                   mixing__max_upsample=cap))
    setup = it.planner.setup(1)
    sizes = np.array([d.size for d in setup.directions])
    assert (setup.counts <= np.floor(sizes * cap)).all(), (setup.counts, sizes, cap)
    assert (served(it) == setup.counts).all()


@pytest.mark.parametrize("sampler", ["stratified", "stream"])
def test_a_capped_run_resumes_exactly_at_a_random_cut(root, sampler):
    config = cfg(root, sampler, mixing__method="unimax", mixing__max_upsample=2.5)
    whole = babelfeed.build_train_iterator(config)
    digests = [digest(next(whole)) for _ in range(40)]
    cut = int(np.random.default_rng(7).integers(1, 39))
    first = babelfeed.build_train_iterator(config)
    for _ in range(cut):
        next(first)
    state = json.loads(json.dumps(first.get_state()))
    again = babelfeed.build_train_iterator(config)
    again.set_state(state)
    assert [digest(next(again)) for _ in range(40 - cut)] == digests[cut:]
    plain = babelfeed.build_train_iterator(cfg(root, sampler))
    with pytest.raises(babelfeed.StateMismatch, match="max_upsample"):
        plain.set_state(state)  # a capped run's state is not a plain run's


def test_an_edit_to_unimax_takes_effect_at_the_next_step_and_says_so(root):
    it = babelfeed.build_train_iterator(config_for(root))
    for _ in range(3):
        next(it)
    with pytest.warns(Notice, match="mixing.method"):
        it.edit(mixing__method="unimax", mixing__max_upsample=2.0)
    served(it)  # the rest of epoch 1
    sizes = np.array([d.size for d in it.planner.sources.directions(it.epoch)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        got = served(it)  # epoch 2, wholly under the edit
    assert (got <= 2 * sizes + 1).all()


def test_building_a_run_names_the_directions_served_many_times_their_data_once(root):
    """At the defaults the 12-sentence direction is served ~19 times its data in an epoch: building rank 0's
    iterator says so once, naming it and the settings that lower it; a cap below the threshold, the threshold
    at 0 and other ranks say nothing."""
    from babelfeed.errors import UpsamplingNotice

    with pytest.warns(UpsamplingNotice) as caught:
        babelfeed.build_train_iterator(config_for(root))
    [w] = [w for w in caught if issubclass(w.category, UpsamplingNotice)]
    text = str(w.message)
    assert "aaa-ddd 19." in text and "aaa-ccc" not in text and "(12 sentences)" in text
    assert all(k in text for k in ("mixing.temperature", "mixing.max_upsample", "unimax", "mixing.warn_upsample"))
    assert w.filename == __file__  # pointed at the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", UpsamplingNotice)
        babelfeed.build_train_iterator(config_for(root, mixing__max_upsample=8.0))
        babelfeed.build_train_iterator(config_for(root, mixing__warn_upsample=0.0))
        babelfeed.build_train_iterator(config_for(root), rank=1, world_size=2)


def test_the_plan_report_gives_each_directions_epochs_and_the_warning(root):
    from babelfeed.tools.plan_report import plan_report

    text = plan_report(config_for(root))
    row = next(line for line in text.splitlines() if line.strip().startswith("aaa-ddd"))
    assert row.rstrip().endswith("x") and float(row.split()[-1][:-1]) > 19
    assert "warning: epoch 1 serves 1 of 3 directions more than 10 times their data: aaa-ddd" in text
    assert "warning:" not in plan_report(config_for(root, mixing__method="unimax", mixing__max_upsample=5.0))


def test_a_state_of_the_caps_former_rounding_is_told_apart(root):
    """A capped run's state from before counts were held at floor(cap x size) is refused saying so; options an
    identity leaves out at their default show that default, not null (found by a review)."""
    from babelfeed.run.record import identity_changes
    said = identity_changes({"opts": {"max_upsample": 5.0}},
                            {"opts": {"max_upsample": 5.0, "max_upsample_counts": "floor"}})
    assert said == ["mixing.max_upsample's rounding null -> 'floor' (a state of a cap rounded otherwise: a direction "
                    "could take one sample more)"]
    assert identity_changes({"opts": {}}, {"opts": {"max_upsample": 5.0, "max_upsample_counts": "floor"}}) == \
        ["mixing.max_upsample 0.0 -> 5.0"]
    capped = babelfeed.build_train_iterator(config_for(root, mixing__max_upsample=5.0))
    plain = babelfeed.build_train_iterator(config_for(root))
    next(plain)
    with pytest.raises(babelfeed.StateMismatch, match=r"mixing.max_upsample 0.0 -> 5.0"):
        capped.set_state(plain.get_state())
