"""Static batch shapes in the pipeline: every batch takes one of K shapes; masked rows fill, never drop."""

import json
from collections import Counter

import numpy as np
import pytest

import babelfeed
from synthetic import config_for, make_data_bin
from helpers import decode_ids, digest
from babelfeed.errors import DataError


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("static")
    make_data_bin(r)
    return r


def batch_shape(b):
    return b["net_input"]["src_tokens"].shape + b["target"].shape[1:]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_every_batch_has_a_planned_shape_and_nothing_is_lost(root, k):
    cfg = config_for(root, batching__num_shapes=k, mixing__sampler="concat", data__shards="all")
    it = babelfeed.build_train_iterator(cfg)
    shapes = it.planner.opts.shapes
    assert 1 <= len(shapes) <= k and all(b * max(ls, lt) <= 512 for b, ls, lt in shapes)
    who = decode_ids(it)
    seen, masked = Counter(), 0
    for batch in it:
        assert batch_shape(batch) in set(shapes)
        real = batch["weight"] > 0
        masked += int((~real).sum())
        assert batch["nsentences"] == int(real.sum())
        assert batch["ntokens"] == int((batch["target"][real] != 1).sum())
        seen.update(who(i) for i in batch["id"][real])
    assert max(seen.values()) == 1 and sum(seen.values()) == 600 + 500 + 120 + 80 + 12 + 9
    assert masked == it.planner.masked_rows(1) and masked < len(shapes) * max(s[0] for s in shapes)


def test_explicit_shapes_and_resume(root):
    cfg = config_for(root, batching__shapes="20x20,64x64")
    it = babelfeed.build_train_iterator(cfg)
    assert it.planner.opts.shapes == ((24, 20, 20), (8, 64, 64))
    full = [digest(b) for b in it]
    it2 = babelfeed.build_train_iterator(cfg)
    head = [digest(next(it2)) for _ in range(5)]
    it3 = babelfeed.build_train_iterator(cfg)
    it3.set_state(json.loads(json.dumps(it2.get_state())))
    assert head + [digest(b) for b in it3] == full


def test_explicit_shapes_holding_the_limits_read_no_lengths_at_build(root, monkeypatch):
    """Explicit shapes of which one holds the filter limits are taken as given (the mixture's length histogram,
    ~1 s for 20M samples, only priced the plan): the same shapes and the same batches as the priced plan."""
    from babelfeed import build
    from babelfeed.plan.planner import EpochPlanner

    cfg = config_for(root, batching__shapes="20x20,64x64", filter__max_source_positions=64,
                     filter__max_target_positions=64)
    priced = build.shape_plan(cfg, EpochPlanner(*build.train_sources(cfg)[::2]))
    full = [digest(b) for b in babelfeed.build_train_iterator(cfg)]
    monkeypatch.setattr(build, "mixture_lengths", lambda planner: pytest.fail("lengths read at build"))
    it = babelfeed.build_train_iterator(cfg)
    assert it.planner.opts.shapes == tuple(priced.shapes) == ((24, 20, 20), (8, 64, 64))
    assert [digest(b) for b in it] == full


def test_shapes_too_small_are_reported(root):
    with pytest.raises(DataError, match="fit none of the shapes") as got:
        babelfeed.build_train_iterator(config_for(root, batching__shapes="8x8"))
    assert "batching.shapes" in str(got.value) and "max_source_positions" in str(got.value)  # what to change


def test_jit_compiles_once_per_shape(root):
    """A jitted step over a whole epoch traces exactly once per distinct batch shape (<= K)."""
    import jax  # in the test extras: a missing jax fails here rather than skipping
    jnp = jax.numpy
    traces = []

    @jax.jit
    def step(src, tgt, weight):
        traces.append(src.shape + tgt.shape)  # runs only while tracing a new shape
        return jnp.sum(jnp.where(tgt != 1, 1.0, 0.0) * weight[:, None]) + jnp.sum(src * 0)

    k = 4
    it = babelfeed.build_train_iterator(config_for(root, batching__num_shapes=k))
    used = set()
    for _ in range(2):  # two epochs: shard cycling changes the data, never the shapes
        for batch in it:
            step(batch["net_input"]["src_tokens"], batch["target"], batch["weight"]).block_until_ready()
            used.add(batch_shape(batch))
    assert len(traces) == len(used) <= k


def test_plan_command(root):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "plan", "configs/nllb_like.py", "--shapes", "3",
                          "--set", f"data.path={root}", "--set", "batching.max_tokens=512",
                          "--set", "filter.max_source_positions=128", "--set", "filter.max_target_positions=128"],
                         capture_output=True, text=True, check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    text = out.stdout
    assert "expected padding efficiency" in text and "percentile edges" in text and "equal token mass" in text
    assert "distinct shapes" in text and "of batches" in text
    opt = float(text.split("optimal edges (dynamic programme)")[1].split("%")[0])
    pct = float(text.split("percentile edges (fairseq get_buckets)")[1].split("%")[0])
    mass = float(text.split("equal token mass (Lhotse)")[1].split("%")[0])
    assert opt >= pct and opt >= mass


@pytest.mark.parametrize("max_tokens,k", [(4096, 8), (16384, 3)])
def test_the_plan_report_optimal_edges_bound_the_other_bucketings_and_say_what_they_measure(tmp_path, max_tokens, k):
    """"optimal edges" is the optimum of the 1-D measure it is printed with (it once priced masked rows in, and
    read 83.9% beside Lhotse's 87.1%), and the report says the 1-D and 2-D lines measure different things."""
    from babelfeed.tools.plan_report import plan_report

    make_data_bin(tmp_path)
    config = config_for(tmp_path)
    config.batching.max_tokens = max_tokens
    config.filter.max_source_positions = config.filter.max_target_positions = 256
    text = plan_report(config, k)
    value = lambda name: float(text.split(name)[1].split("%")[0])  # noqa: E731
    opt = value("optimal edges (dynamic programme)")
    for other in ("percentile edges (fairseq get_buckets)", "equal token mass (Lhotse)", "pad to the longest"):
        assert opt >= value(other), (other, text)
    assert "1-D" in text and "2-D" in text and "not with the 2-D lines" in text and "<- the shapes above" in text
    # a config of dynamic batches (num_shapes 0) is told first that the shapes are not what it runs
    config.batching.num_shapes, config.batching.shapes = 0, ""
    dynamic = plan_report(config)
    assert dynamic.startswith("this config batches dynamically") and "dynamically" not in text
    assert json.loads(plan_report(config, as_json=True))["batches"] == "dynamic"


def test_the_plan_report_shows_epoch_1s_mixture_as_its_json_gives_it(tmp_path):
    """plan's help promises epoch 1's mixture; the text had only the shapes (the mixture was in --json and
    --plot). Each direction's size, probability and served samples, and the tiers' shares, as plan_data gives them;
    above 12 directions, the largest and smallest named."""
    from babelfeed.tools import plots
    from babelfeed.tools.plan_report import mixture_lines, plan_data, plan_report

    make_data_bin(tmp_path)
    config = config_for(tmp_path)
    text = plan_report(config).split("epoch 1's mixture")[1].splitlines()
    mixes = [(plan_data(config)["mixing"], text)]
    sizes = np.arange(1, 31) * 1000  # 30 directions: the text names the 5 largest and 5 smallest
    many = plots.mixing_data([f"d{i:02d}" for i in range(30)], sizes, sizes / sizes.sum(), sizes // 2, 1.0)
    lines = mixture_lines(many)
    mixes.append((many, [lines[0].split("epoch 1's mixture")[1]] + lines[1:]))
    for mix, lines in mixes:
        assert lines[0].endswith(f"{len(mix['directions'])} directions, {mix['served']:,} samples served")
        rows = {ln.split()[0]: ln.split()[1:] for ln in lines[1:] if ln.strip() and ln.startswith("  ")
                and not ln.strip().startswith("(")}
        named = [d for d in mix["directions"] if d["key"] in mix["named"]]
        assert len(named) == min(len(mix["directions"]), 10 if len(mix["directions"]) > 12 else 12)
        assert set(rows) - {"tier", "direction", "high", "mid", "low"} == {d["key"] for d in named}
        for d in named:
            assert rows[d["key"]][:3] == [f"{d['size']:,}", f"{d['probability']:.3f}", f"{d['served']:,}"], d
            assert rows[d["key"]][4] == f"{d['served'] / d['size']:.1f}x", d  # its epochs: served over its data
        for t in mix["tiers"]:
            assert rows[t["tier"]][0] == f"{t['directions']:,}" and rows[t["tier"]][3] == f"{t['probability']:.1%}"


def test_the_plan_report_prices_what_the_filter_lets_through(tmp_path):
    """A data_bin holding sentences longer than max_tokens (fairseq-preprocess does not filter by length) that the
    length filter leaves out: the report plans as training does (it once priced every sample and stopped with 'a
    sample of N tokens does not fit max_tokens'), and says how much the filter leaves out."""
    from babelfeed.tools.plan_report import plan_report

    make_data_bin(tmp_path, long_every=40)  # every 40th sentence 201 tokens
    config = config_for(tmp_path)
    config.batching.max_tokens = 160  # under the long ones; max_source/target_positions 128 filter them
    text = plan_report(config, 3)
    assert "leave out" in text and "training skips them" in text, text
    epoch = int(text.split("epoch 1 with these shapes: ")[1].split(" batches")[0].replace(",", ""))
    assert epoch > 0
    config.batching.max_tokens = 512  # now the long ones fit a batch, the filter still leaves them out
    assert "leave out" in plan_report(config, 3)
    config.filter.max_source_positions = config.filter.max_target_positions = 256  # let through: no such line
    assert "leave out" not in plan_report(config, 3)
