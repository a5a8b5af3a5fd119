"""The LM blend's weights from the config: UniMax over the datasets (uniform, each capped at max_upsample epochs of
its tokens) and a cap on data_path's weights, as the paper's algorithm gives them, through build_iterator; a resumed
run serves the same batches, and a cap that cannot fill num_samples is refused naming both keys."""

import json
import os

import numpy as np
import pytest

import babelfeed
import golden
from helpers import unimax_as_written
from babelfeed.lm.options import blend_weights

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("lmblend")
    golden.make_lm_data(r)
    return r


def config(root, **kw):
    c = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "lm_packing.py"))
    c.data_path = f"0.1 {root}/lm/web 0.9 {root}/lm/books"
    c.seq_len, c.global_batch, c.num_samples = 16, 8, 8 * 30
    c.split, c.mode, c.cache_dir = "100,0,0", "concat", str(root / "cache")
    for k, v in kw.items():
        c[k] = v
    return c


def test_unimax_weights_are_the_papers():
    sizes = [30.0, 500.0, 2000.0]
    w = blend_weights([0.2, 0.3, 0.5], sizes, 1500, "unimax", 2.0)
    want = np.array(unimax_as_written(sizes, 1500, 2.0))
    np.testing.assert_allclose(np.array(w) * 1500, want, rtol=1e-9)
    assert blend_weights([0.2, 0.8], [10, 10], 5) == [0.2, 0.8]  # no cap: data_path's weights as they are


def test_a_unimax_blend_serves_each_dataset_at_most_n_epochs_and_resumes_exactly(root):
    cfg = config(root, blend="unimax", max_upsample=1.8)
    it = babelfeed.build_iterator(cfg)
    sizes = [s.epoch_tokens() / 16 for s in it.sources]
    want = np.array(unimax_as_written(sizes, 8 * 30, 1.8)) / (8 * 30)
    np.testing.assert_allclose(it.weights / np.sum(it.weights), want, rtol=1e-9)
    assert abs(want[1] - 0.5) > 0.02  # (the smaller dataset is held at its cap: not simply uniform)
    served = np.zeros(len(sizes))
    digests = []
    for batch in it:
        np.add.at(served, np.asarray(batch["dataset"]), 1)
        digests.append(hash(np.asarray(batch["tokens"]).tobytes()))
    assert (served <= np.array(sizes) * 1.8 + 8).all()  # (within a batch of the cap: the blend rounds per sample)
    again = babelfeed.build_iterator(cfg)
    for _ in range(7):
        next(again)
    state = json.loads(json.dumps(again.get_state()))
    fresh = babelfeed.build_iterator(cfg)
    fresh.set_state(state)
    assert [hash(np.asarray(b["tokens"]).tobytes()) for b in fresh] == digests[7:]


def test_a_cap_that_cannot_fill_the_run_and_unimax_without_one_are_refused(root):
    with pytest.raises(babelfeed.ConfigError, match="blend='unimax' .* set max_upsample"):
        babelfeed.build_iterator(config(root, blend="unimax"))
    with pytest.raises(babelfeed.ConfigError, match="fewer than num_samples=.*raise max_upsample or lower num_samples"):
        babelfeed.build_iterator(config(root, max_upsample=0.01))


@pytest.mark.parametrize("mode", ["pack", "sentences"])
def test_a_row_longer_than_the_whole_split_is_refused(tmp_path, mode):
    """Issue 39 item 5: seq_len 10**8 on a 3,000-token corpus was accepted in pack mode (the corpus repeated
    ~130,000 times a row, 6.1 GB at its peak); concat refused it. Every mode refuses it, naming the prefix."""
    prefix = str(tmp_path / "tiny")
    with babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="megatron") as b:
        for _ in range(100):
            b.add_item(np.arange(1, 31, dtype=np.uint16))
            b.end_document()
        b.finalize()
    with pytest.raises(babelfeed.DataError, match=r"tiny: an epoch of its train split holds 3,000 tokens, fewer than "
                                                  r"one row of seq_len=1,000,000"):
        babelfeed.LMIterator.build(prefix, seq_len=10**6, global_batch=2, num_samples=4, split="100,0,0", mode=mode)
    it = babelfeed.LMIterator.build(prefix, seq_len=64, global_batch=2, num_samples=4, split="100,0,0", mode=mode)
    assert next(it)["tokens"].shape[-1] >= 64
