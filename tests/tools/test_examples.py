"""The examples take any translation config: the demo's layout (train, model) or a plain pipeline config such as
configs/nllb_like.py, by path or by a shipped config's name; a language-model config is refused in one line."""

import os
import subprocess
import sys

import numpy as np
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


def test_the_varlen_example_trains_packed_rows_with_attention_inside_each_document(tmp_path):
    """examples/torch_varlen.py: the loader's cu_seqlens drive the attention (on the CPU, a mask built from them
    alone), which equals causal attention over each document by itself; a few steps lower the loss."""
    import torch

    import babelfeed
    from babelfeed.examples import torch_varlen

    torch.manual_seed(1)
    cu = torch.tensor([0, 3, 8, 9, 15], dtype=torch.int32)
    q, k, v = (torch.randn(15, 2, 8) for _ in range(3))
    got = torch_varlen.attention(q, k, v, cu, 6)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):  # each document alone, causal
        want = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True).transpose(0, 1)
        torch.testing.assert_close(got[a:b], want)
    rng = np.random.default_rng(0)  # documents that count up from a random start: learnable next tokens
    with babelfeed.IndexedDatasetBuilder(str(tmp_path / "count"), np.int32, format="megatron") as b:
        for _ in range(200):
            start, n = int(rng.integers(0, 40)), int(rng.integers(3, 20))
            b.add_item(10 + (start + np.arange(n)) % 40)
            b.end_document()
        b.finalize()
    config = babelfeed.load_config("lm_packing")
    config.data_path, config.mode, config.split = f"1 {tmp_path}/count", "pack", "100,0,0"
    config.seq_len, config.global_batch, config.num_samples, config.vocab_size = 32, 8, 8 * 30, 64
    config.cache_dir = str(tmp_path / "cache")
    result = torch_varlen.train(config, 30, d_model=32, heads=2, layers=1, log=lambda m: None, device="cpu")
    assert len(result["losses"]) == 30 and result["tokens"] > 0
    assert np.mean(result["losses"][-5:]) < result["losses"][0] - 0.5
