"""Every config file loads; entry points take --config=FILE and --config.key=value, and reject bad keys/types."""

import os
import subprocess
import sys

import pytest

import babelfeed
from babelfeed.config import apply_overrides
from synthetic import make_data_bin
from babelfeed.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = ["demo.py", "nllb_like.py", "tpu_static.py", "lm_packing.py"]


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_load_and_lock(name):
    c = babelfeed.load_config(os.path.join(REPO, "configs", name))
    with pytest.raises(AttributeError):
        c.no_such_key = 1


def test_overrides_are_type_checked_and_named():
    c = babelfeed.load_config(os.path.join(REPO, "configs", "nllb_like.py"))
    apply_overrides(c, ["--config.mixing.temperature=2", "batching.max_tokens=2048", "data.path=some/where",
                        "batching.window=0"])
    assert (c.mixing.temperature, c.batching.max_tokens, c.data.path) == (2.0, 2048, "some/where")
    with pytest.raises(ConfigError, match="did you mean temperature"):
        apply_overrides(c, ["mixing.temprature=2"])
    # in plain words, not ml_collections' ("is a int ... (reference) ... cannot be casted to type <class 'int'>")
    for value, said in (("lots", "'lots' is text$"), ("1e4", "'1e4' is a number: write 10000$")):
        with pytest.raises(ConfigError, match=f"'batching.max_tokens' takes an integer \\(now 2048\\); {said}") as e:
            apply_overrides(c, [f"batching.max_tokens={value}"])
        assert "casted" not in str(e.value) and "class" not in str(e.value)
    with pytest.raises(ConfigError, match="mixing.weights is set but mixing.method is 'temperature', which ignores"):
        babelfeed.build_train_iterator(apply_overrides(babelfeed.load_config("nllb_like"), ["mixing.weights=en-de:1"]))
    with pytest.raises(ConfigError, match="must be a finite number > 0, got inf; for a uniform mixture .*method='uniform'"):
        babelfeed.build_train_iterator(apply_overrides(c, ["mixing.temperature=inf"]))
    with pytest.raises(ConfigError, match="must look like"):
        apply_overrides(c, ["mixing.temperature"])


def test_tpu_static_config_builds_static_batches(tmp_path):
    make_data_bin(tmp_path)
    c = babelfeed.load_config(os.path.join(REPO, "configs", "tpu_static.py"))
    apply_overrides(c, [f"data.path={tmp_path}", "batching.max_tokens=512", "filter.max_source_positions=128",
                        "filter.max_target_positions=128"])
    it = babelfeed.build_train_iterator(c, split="rows")
    shapes = {b["net_input"]["src_tokens"].shape + b["target"].shape[1:] for b in it}
    assert len(shapes) <= 8 and shapes <= set(it.planner.opts.shapes)
    assert next(iter(babelfeed.build_train_iterator(c)))["target"].dtype.name == "int32"


def test_lm_packing_config(tmp_path):
    import numpy as np

    with babelfeed.IndexedDatasetBuilder(tmp_path / "web", np.int32, format="megatron") as b:
        for d in range(40):
            b.add_item(np.arange(5 + d % 30))
            b.end_document()
        b.finalize()
    c = babelfeed.load_config(os.path.join(REPO, "configs", "lm_packing.py"))
    apply_overrides(c, [f"data_path={tmp_path / 'web'}", "seq_len=32", "global_batch=4", "num_samples=16",
                        f"cache_dir={tmp_path / 'cache'}", "split=100,0,0"])
    batches = list(babelfeed.build_iterator(c))
    assert len(batches) == 4 and batches[0]["tokens"].shape == (4, 32) and "segment_ids" in batches[0]


@pytest.mark.parametrize("example", ["flax_train.py", "torch_train.py"])
def test_examples_reject_a_misspelt_key(example):
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", example), "--config=configs/demo.py",
                          "--config.model.stepz=3"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode != 0 and "stepz" in out.stderr


def test_cli_overrides(tmp_path):
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "plan", "--config=configs/nllb_like.py",
                          "--config.mixing.temprature=2"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "did you mean temperature" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("spelling", ["{name}", "{name}.py", "configs/{name}.py"])
@pytest.mark.parametrize("name", [c[:-3] for c in CONFIGS])
def test_shipped_configs_are_found_by_name_from_any_directory(tmp_path, monkeypatch, name, spelling):
    monkeypatch.chdir(tmp_path)  # outside the checkout: no configs/ here
    c = babelfeed.load_config(spelling.format(name=name))
    assert c == babelfeed.load_config(os.path.join(REPO, "configs", f"{name}.py"))


def test_a_file_of_ones_own_wins_over_a_shipped_name_and_unknown_names_list_the_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nllb_like.py").write_text(
        "import ml_collections\ndef get_config():\n    return ml_collections.ConfigDict({'mine': 1})\n")
    assert babelfeed.load_config("nllb_like.py").mine == 1  # a path that exists is that file
    assert "data" in babelfeed.load_config("nllb_like")  # a bare name is the shipped config
    with pytest.raises(FileNotFoundError, match=r"demo, lm_packing, nllb_like, tpu_static"):
        babelfeed.load_config("nllb_lik")
    with pytest.raises(FileNotFoundError, match="not the name of a shipped config"):
        babelfeed.load_config("elsewhere/nllb_like.py")  # another folder is a path, never a name


def test_the_import_name_is_babelfeed_and_a_users_loader_py_does_not_shadow_it(tmp_path):
    """A ``loader.py`` beside a training script (a common file name) used to win over the package."""
    (tmp_path / "loader.py").write_text("raise RuntimeError('the user script module, not the library')\n")
    code = ("import babelfeed, babelfeed.adapters, babelfeed.configs; print(babelfeed.load_config('nllb_like').seed); "
            "import importlib.util; print(importlib.util.find_spec('babelfeed.storage') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(babelfeed.load_config("nllb_like").seed), "True"]


def test_the_cli_takes_a_shipped_config_by_name_outside_the_checkout(tmp_path):
    make_data_bin(tmp_path / "bin")
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "plan", "nllb_like", f"--config.data.path={tmp_path / 'bin'}",
                          "--shapes", "2"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "shape" in out.stdout.lower()
