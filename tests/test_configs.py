"""Every config file loads; entry points take --config=FILE and --config.key=value, and reject bad keys/types."""

import os
import subprocess
import sys

import pytest

import loader
from loader.config import apply_overrides
from synthetic import make_data_bin

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ["demo.py", "nllb_like.py", "tpu_static.py", "lm_packing.py"]


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_load_and_lock(name):
    c = loader.load_config(os.path.join(REPO, "configs", name))
    with pytest.raises(AttributeError):
        c.no_such_key = 1


def test_overrides_are_type_checked_and_named():
    c = loader.load_config(os.path.join(REPO, "configs", "nllb_like.py"))
    apply_overrides(c, ["--config.mixing.temperature=2", "batching.max_tokens=2048", "data.path=some/where",
                        "batching.window=0"])
    assert (c.mixing.temperature, c.batching.max_tokens, c.data.path) == (2.0, 2048, "some/where")
    with pytest.raises(ValueError, match="did you mean temperature"):
        apply_overrides(c, ["mixing.temprature=2"])
    with pytest.raises(ValueError, match="'batching.max_tokens' is a int"):
        apply_overrides(c, ["batching.max_tokens=lots"])
    with pytest.raises(ValueError, match="must look like"):
        apply_overrides(c, ["mixing.temperature"])


def test_tpu_static_config_builds_static_batches(tmp_path):
    make_data_bin(tmp_path)
    c = loader.load_config(os.path.join(REPO, "configs", "tpu_static.py"))
    apply_overrides(c, [f"data.path={tmp_path}", "batching.max_tokens=512", "filter.max_source_positions=128",
                        "filter.max_target_positions=128"])
    it = loader.build_train_iterator(c, split="rows")
    shapes = {b["net_input"]["src_tokens"].shape + b["target"].shape[1:] for b in it}
    assert len(shapes) <= 8 and shapes <= set(it.planner.opts.shapes)
    assert next(iter(loader.build_train_iterator(c)))["target"].dtype.name == "int32"


def test_lm_packing_config(tmp_path):
    import numpy as np

    with loader.IndexedDatasetBuilder(tmp_path / "web", np.int32, format="megatron") as b:
        for d in range(40):
            b.add_item(np.arange(5 + d % 30))
            b.end_document()
        b.finalize()
    c = loader.load_config(os.path.join(REPO, "configs", "lm_packing.py"))
    apply_overrides(c, [f"data_path={tmp_path / 'web'}", "seq_len=32", "global_batch=4", "num_samples=16",
                        f"cache_dir={tmp_path / 'cache'}", "split=100,0,0"])
    batches = list(loader.LMIterator.from_config(c))
    assert len(batches) == 4 and batches[0]["tokens"].shape == (4, 32) and "segment_ids" in batches[0]


@pytest.mark.parametrize("example", ["flax_train.py", "torch_train.py"])
def test_examples_reject_a_misspelt_key(example):
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", example), "--config=configs/demo.py",
                          "--config.model.stepz=3"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode != 0 and "stepz" in out.stderr


def test_cli_overrides(tmp_path):
    out = subprocess.run([sys.executable, "-m", "loader.cli", "plan", "--config=configs/nllb_like.py",
                          "--config.mixing.temprature=2"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "did you mean temperature" in out.stderr and "Traceback" not in out.stderr
