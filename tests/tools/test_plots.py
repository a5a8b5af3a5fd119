"""``inspect --plot`` and ``plan --plot``: the pictures are written and hold a drawing, not an empty canvas."""

import os
import subprocess
import sys

import numpy as np
import pytest

from synthetic import make_data_bin

pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is part of the test extra: make test has it")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _drawn(path) -> None:
    from matplotlib.image import imread

    assert os.path.getsize(path) > 10_000, path
    img = imread(path)
    assert img.shape[0] >= 250 and img.shape[1] >= 500, (path, img.shape)
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05, f"{path} is nearly one colour"
    # coloured marks (bars, boxes, points), not only black text and axes on white
    coloured = rgb.max(axis=1) - rgb.min(axis=1) > 0.2
    assert coloured.sum() > 200, f"{path}: {coloured.mean():.2%} of the pixels coloured"


def _cli(*argv, cwd=REPO):
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", *argv], capture_output=True, text=True, cwd=cwd,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_inspect_plot_draws_lengths_and_sentence_counts(tmp_path):
    make_data_bin(tmp_path / "bin")
    out = _cli("inspect", str(tmp_path / "bin"), "--plot", str(tmp_path / "plots"))
    assert f"wrote {tmp_path / 'plots' / 'lengths.png'}, {tmp_path / 'plots' / 'sentences.png'}" in out
    for name in ("lengths.png", "sentences.png"):
        _drawn(tmp_path / "plots" / name)
    assert "histogram" not in _cli("inspect", str(tmp_path / "bin"), "--json", "--plot", str(tmp_path / "p2"))


@pytest.mark.parametrize("config", ["nllb_like", "configs/demo.py"])
def test_plan_plot_draws_the_shapes_and_the_mixture(tmp_path, config):
    make_data_bin(tmp_path / "bin")
    key = "train.data.path" if "demo" in config else "data.path"
    out = _cli("plan", config, f"--config.{key}={tmp_path / 'bin'}", "--shapes", "4", "--plot", str(tmp_path / "p"))
    assert "shapes.png" in out and "mixing.png" in out
    for name in ("shapes.png", "mixing.png"):
        _drawn(tmp_path / "p" / name)


def test_without_matplotlib_the_plot_flag_says_what_to_install(tmp_path):
    make_data_bin(tmp_path / "bin")
    code = ("import sys; sys.modules['matplotlib'] = None; from babelfeed.cli import main; "
            f"sys.exit(main(['inspect', {str(tmp_path / 'bin')!r}, '--plot', {str(tmp_path / 'p')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "pip install 'babelfeed[plot]'" in out.stderr and "Traceback" not in out.stderr
