"""The examples take any translation config: the demo's layout (train, model) or a plain pipeline config such as
configs/nllb_like.py, by path or by a shipped config's name; a language-model config is refused in one line."""

import os
import subprocess
import sys

import pytest

import babelfeed
from babelfeed.examples import flax_train, torch_train
from babelfeed.examples.common import example_config, resolve_config_flag
from babelfeed.errors import ConfigError
from synthetic import config_for, make_data_bin


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("examples")
    make_data_bin(r)
    return r


def test_a_pipeline_config_becomes_the_train_section_with_the_demo_model(root):
    cfg = config_for(root)
    wrapped = example_config(cfg)
    assert wrapped.train.data.path == str(root) and wrapped.seed == cfg.seed
    assert wrapped.model.max_tokens == cfg.batching.max_tokens  # the pipeline's own budget rules
    assert wrapped.model.d_model == babelfeed.load_config("demo").model.d_model
    demo = babelfeed.load_config("demo")
    assert example_config(demo) is demo  # the demo's layout is taken as it is
    # the pipelines the two models train on
    assert torch_train.model_pipeline(cfg).batching.max_tokens == cfg.batching.max_tokens
    flax_pipe = flax_train.model_pipeline(config_for(root))
    assert flax_pipe.batching.num_shapes == demo.model.num_shapes and flax_pipe.collate.dtype == "int32"


def test_other_configs_are_refused_by_what_they_are():
    with pytest.raises(ConfigError, match="language-model config"):
        example_config(babelfeed.load_config("lm_packing"))
    import ml_collections

    with pytest.raises(ConfigError, match="neither a translation pipeline config.*it has foo"):
        example_config(ml_collections.ConfigDict({"foo": 1}))


def test_config_flag_takes_a_shipped_name():
    argv = resolve_config_flag(["prog", "--config=nllb_like", "--steps=3", "--config", "demo", "--config.seed=2"])
    assert argv[1].startswith("--config=") and argv[1].endswith("nllb_like.py") and os.path.exists(argv[1][9:])
    assert argv[4].endswith("demo.py") and argv[5] == "--config.seed=2" and argv[2] == "--steps=3"
    assert resolve_config_flag(["p", "--config=no/such.py"]) == ["p", "--config=no/such.py"]


def test_torch_example_trains_on_nllb_like_by_name(root):
    cmd = [sys.executable, "-m", "babelfeed.examples.torch_train", "--config=nllb_like", f"--data={root}",
           "--steps=2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "trained 2 steps" in run.stdout
    lm = subprocess.run(cmd[:3] + ["--config=lm_packing", "--steps=1"], capture_output=True, text=True, timeout=300)
    assert lm.returncode == 2 and "language-model config" in lm.stderr and "Traceback" not in lm.stderr


def test_examples_keep_absl_info_logs_off_unless_asked(tmp_path):
    """absl's app.run logs INFO to stderr (orbax: ~20 lines a checkpoint); the examples keep warnings only unless
    --verbosity is given."""
    import inspect

    from babelfeed.examples import flax_train, lm_train, torch_train

    for module in (flax_train, lm_train, torch_train):
        assert "quiet_logging()" in inspect.getsource(module.main), module.__name__
    script = tmp_path / "app.py"
    script.write_text("from absl import app, logging\n"
                      "from babelfeed.examples.common import quiet_logging\n"
                      "def main(argv):\n"
                      "    quiet_logging()\n"
                      "    logging.info('an info line')\n"
                      "    logging.warning('a warning line')\n"
                      "app.run(main)\n")
    quiet = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "a warning line" in quiet.stderr and "an info line" not in quiet.stderr
    loud = subprocess.run([sys.executable, str(script), "--verbosity", "0"], capture_output=True, text=True,
                          timeout=120)
    assert "an info line" in loud.stderr
