"""Every batch kind is bit-identical to the batches recorded before the gather engine was rewritten.

The recording (tests/data/golden_batches.json) was made with the collate and LM code of commit ef27d1e on data
that depends on integer hashes and a committed SentencePiece model only (tests/golden.py). Each case compares
the digest of every leaf of every batch, the batch count and the recorded fields of the final iterator state.
"""

import json

import pytest

import golden
from helpers import hist

from babelfeed.run.history import upgrade


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    golden.build(root)
    return root


with open(golden.GOLDEN) as f:
    WANT = json.load(f)


@pytest.mark.parametrize("name", sorted(WANT))
def test_batches_match_the_recording(root, name):
    batches, state = golden.cases(root)[name]()
    got = [golden.digest(b) for b in batches]
    want = WANT[name]["batches"]
    assert len(got) == len(want), f"{name}: {len(got)} batches, recorded {len(want)}"
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None, f"{name}: batch {first} of {len(want)} differs from the recording"
    state = json.loads(json.dumps(state))
    # the recorded fields (more may exist), of a state written before the history list (version 1): upgraded, the
    # recording must equal what this babelfeed writes, the history's update counts included
    want_state = upgrade(WANT[name]["state"])
    assert WANT[name]["state"]["version"] in (1, 2) and want_state["version"] == state["version"] == 3
    assert {k: state.get(k) for k in want_state if k != "history"} == {k: v for k, v in want_state.items()
                                                                       if k != "history"}
    if "history" in want_state:
        assert hist(want_state).updates == hist(state).updates


def test_every_case_is_recorded(root):
    assert sorted(golden.cases(root)) == sorted(WANT)


@pytest.mark.parametrize("table, flat, kernel", [(True, False, True), (False, True, False), (True, True, False),
                                                (False, False, False)])
def test_batches_match_on_every_gather_path(root, monkeypatch, table, flat, kernel):
    """The other planner and gather paths give the same batches: lengths and addresses from the flat row table
    (used with many components), gathering file by file (where flat spaces are unavailable), and the numpy
    gather (where the compiled kernel is not built)."""
    import babelfeed.gather
    import babelfeed.storage.spaces
    import babelfeed.sources.rows

    monkeypatch.setattr(babelfeed.sources.rows.RowTable, "MIN_COMPONENTS", 0 if table else 10**9)
    monkeypatch.setattr(babelfeed.storage.spaces, "native_available", lambda: flat)
    if not kernel:
        monkeypatch.setattr(babelfeed.gather.engine, "KERNEL", None)
    built = []
    original = babelfeed.sources.rows.RowTable.__init__

    def spy(self, *args):
        built.append(self)
        original(self, *args)

    monkeypatch.setattr(babelfeed.sources.rows.RowTable, "__init__", spy)
    flats = []  # the gather path each token space took: the patch must reach where TokenSpaces reads it
    spaces_init = babelfeed.storage.spaces.TokenSpaces.__init__

    def spy_spaces(self, *args, **kwargs):
        spaces_init(self, *args, **kwargs)
        flats.append(self.flat)

    monkeypatch.setattr(babelfeed.storage.spaces.TokenSpaces, "__init__", spy_spaces)
    for name, fn in golden.cases(root).items():
        batches, _ = fn()
        assert [golden.digest(b) for b in batches] == WANT[name]["batches"], name
    assert bool(built) == table
    assert flats and all(f == flat for f in flats)


def test_batches_match_without_the_planning_kernel(root, monkeypatch):
    """The numpy planner (where loader/_native/_plan.c is not built) plans the same batches as the compiled one."""
    import babelfeed._native.plan_kernel

    monkeypatch.setattr(babelfeed._native.plan_kernel, "KERNEL", None)
    for name, fn in golden.cases(root).items():
        batches, _ = fn()
        assert [golden.digest(b) for b in batches] == WANT[name]["batches"], name


def test_batches_match_where_the_kernel_declines_the_window_order(root, monkeypatch):
    """Where plan_kernel.sorted_rows declines a window (lengths or keys it does not take), the planner builds the
    rows and orders them its other way, with the same random key: the same batches."""
    import babelfeed._native.plan_kernel

    declined = []
    monkeypatch.setattr(babelfeed._native.plan_kernel, "sorted_rows", lambda *a: declined.append(1))
    for name, fn in golden.cases(root).items():
        batches, _ = fn()
        assert [golden.digest(b) for b in batches] == WANT[name]["batches"], name
    assert declined


def test_the_compiled_kernel_is_built():
    """make test builds loader/_native/_gather.c and loader/_native/_plan.c (setup.py); without them every path above still runs,
    on numpy, slower. Set BABELFEED_KERNEL=0 to run without them on purpose."""
    import os

    import babelfeed.gather
    import babelfeed.storage.spaces
    import babelfeed._native.plan_kernel

    if os.environ.get("BABELFEED_KERNEL", "1") == "0":
        pytest.skip("BABELFEED_KERNEL=0: the numpy gather was asked for")
    assert babelfeed.gather.engine.KERNEL is not None, "loader/_native/_gather.c was not compiled: is a C compiler installed?"
    assert babelfeed._native.plan_kernel.KERNEL is not None, "loader/_native/_plan.c was not compiled: is a C compiler installed?"


def test_a_scheduled_state_recorded_before_updates_were_counted_in_it_still_matches(root):
    """The recording's stream_schedule_tasks state carried fingerprint 1cf2d3df4adfd1de before states recorded
    how updates were counted (the fingerprint then held the batches per update): that value is still accepted."""
    import re

    import babelfeed
    from babelfeed.config import task

    src = open(golden.__file__).read()
    sched = eval("dict(" + re.search(r"sched = dict\((.*?)\)\n", src, re.S).group(1) + ")")
    cfg = golden._cfg(root, **sched)
    with cfg.unlocked():
        cfg.tasks["mt"] = task("aaa-bbb,aaa-ccc", weight=1.0)
        cfg.tasks["dae"] = task("eee", kind="denoise", transforms="token_drop:rate=0.2", source_prefix="__bt__")
    it = babelfeed.build_train_iterator(cfg, rank=0, world_size=2)
    assert "1cf2d3df4adfd1de" in it.fingerprints() and it.fingerprint() == WANT["stream_schedule_tasks"]["state"][
        "fingerprint"]
