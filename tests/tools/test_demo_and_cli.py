import hashlib
import json
import os
import shlex
import subprocess
import sys
import warnings

import numpy as np

import pytest

import babelfeed
from babelfeed.tools.demo import DIRECTIONS, build_corpus, run_demo
from babelfeed.tools.stats import _percentile, corpus_stats
from babelfeed.errors import ConfigError, StateMismatch


def digest(folder):
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        h.update(name.encode() + open(os.path.join(folder, name), "rb").read())
    return h.hexdigest()


def test_demo_corpus_is_deterministic_and_skewed(tmp_path):
    a = build_corpus(str(tmp_path / "a"), scale=0.2)
    build_corpus(str(tmp_path / "b"), scale=0.2)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    sizes = [a[f"{d}.{d.split('-')[0]}"] for d in DIRECTIONS]
    assert len(sizes) >= 4 and max(sizes) / min(sizes) >= 100
    assert build_corpus(str(tmp_path / "a"), scale=0.2) == {}  # up to date: nothing rewritten
    # Real CLDR text is in there, identical in meaning on both sides (a formatted date).
    en = (tmp_path / "a" / "eng_Latn-deu_Latn.eng_Latn").read_text(errors="replace").splitlines()
    de = (tmp_path / "a" / "eng_Latn-deu_Latn.deu_Latn").read_text(errors="replace").splitlines()
    dates = [(e, g) for e, g in zip(en, de) if e.split(",")[0] in ("Monday", "Tuesday", "Wednesday")]
    assert dates and all(g.split(",")[0] in ("Montag", "Dienstag", "Mittwoch") for _, g in dates)


def test_run_demo_small(tmp_path, capsys):
    assert run_demo("configs/demo.py" if os.path.exists("configs/demo.py") else None,
                    workdir=str(tmp_path / "demo"), scale=0.05, workers=1, train_steps=0) == 0
    out = capsys.readouterr().out
    assert "== 3/5 babelfeed inspect" in out and "eng_Latn-swh_Latn" in out
    assert "padding efficiency" in out and "served share" in out
    # the planted bad lines of the three directions with >= 100 pairs, each reported
    assert "dropped 6 empty, 3 over 256 tokens, 3 undecodable" in out
    corpus = babelfeed.ShardedCorpus(tmp_path / "demo" / "data_bin")
    assert len(corpus.directions("train")) == 4 and corpus.monolingual("train") == ["swh_Latn"]
    # it ends on what it made and where, and commands to try next that run as printed
    summary = out[out.index("== done in"):]
    data_bin = str(tmp_path / "demo" / "data_bin")
    assert f"{data_bin}: dict.txt, spm.model" in summary and "try next:" in summary
    assert "pip install 'babelfeed[torch]'" not in summary, "torch is installed here: no install hint"
    from babelfeed.tools.demo import _command

    bf, py = _command("babelfeed"), _command("python")  # the venv's own, by path where it is not on PATH
    lines = [line.strip().split("  #")[0].strip() for line in summary.splitlines()]
    commands = [line for line in lines if line.startswith(bf + " ")]
    assert len(commands) == 3 and all(f"data.path={data_bin}" in c for c in commands[1:])
    for command in commands:
        r = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (command, r.stderr)
    trains = [line for line in lines if line.startswith(py + " ")]
    assert len(trains) == 1 and trains[0].endswith(f"--steps=100 --config.train.data.path={data_bin}"), trains
    r = subprocess.run(shlex.split(trains[0].replace("--steps=100", "--steps=2")), capture_output=True, text=True,
                       timeout=300)  # as printed, 2 steps instead of 100
    assert r.returncode == 0 and "trained 2 steps" in r.stdout, (trains[0], r.stdout[-1000:], r.stderr[-2000:])


def test_inspect_on_fairseq_fixture(fixtures_dir, expected):
    rows = corpus_stats(fixtures_dir / "data_bin")
    by_lang = {r["lang"]: r for r in rows}
    for lang in ("eng_Latn", "tur_Latn"):
        sizes = []
        for shard in ("shard000", "shard001"):
            sizes += expected["datasets"][f"data_bin/{shard}/train.eng_Latn-tur_Latn.{lang}"]["sequence_lengths"]
        r = by_lang[lang]
        assert (r["sentences"], r["tokens"], r["shards"], r["dtype"]) == (len(sizes), sum(sizes), 2, "uint32")
        srt = sorted(sizes)
        for q in (50, 90, 99):  # nearest-rank percentiles
            assert r[f"p{q}"] == srt[int(np.ceil(q / 100 * len(srt))) - 1]
        assert r["max"] == max(sizes)
    cli = subprocess.run([sys.executable, "-m", "babelfeed.cli", "inspect", str(fixtures_dir / "data_bin"), "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(cli.stdout) == rows
    table = subprocess.run([sys.executable, "-m", "babelfeed.cli", "inspect", str(fixtures_dir / "data_bin")],
                           capture_output=True, text=True, check=True).stdout
    assert "eng_Latn-tur_Latn" in table and "p99" in table and "uint32" in table


def test_percentile_nearest_rank():
    hist = np.bincount([1, 2, 3, 4, 100])
    assert [_percentile(hist, q) for q in (20, 40, 50, 80, 81, 100)] == [1, 2, 3, 4, 100, 100]
    assert _percentile(np.zeros(3, np.int64), 50) == 0


def test_cli_reports_format_errors_without_traceback(tmp_path):
    (tmp_path / "shard000").mkdir()
    (tmp_path / "shard000" / "train.en-de.en.idx").write_bytes(b"garbage!!" * 4)
    (tmp_path / "shard000" / "train.en-de.en.bin").write_bytes(b"")
    (tmp_path / "shard000" / "train.en-de.de.idx").write_bytes(b"garbage!!" * 4)
    (tmp_path / "shard000" / "train.en-de.de.bin").write_bytes(b"")
    r = subprocess.run([sys.executable, "-m", "babelfeed.cli", "inspect", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "train.en-de.en.idx" in r.stderr


def test_cli_warnings_are_one_line_each(tmp_path):
    """A warning (a .bin longer than its index says) printed Python's form: file, line, class and the source line
    of the warning call, under the command's output."""
    from synthetic import make_data_bin

    make_data_bin(tmp_path / "bin")
    with open(tmp_path / "bin" / "shard000" / "train.aaa-bbb.aaa.bin", "ab") as f:
        f.write(b"\0" * 6)
    r = subprocess.run([sys.executable, "-m", "babelfeed.cli", "inspect", str(tmp_path / "bin")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("babelfeed inspect: warning: ") for ln in lines), r.stderr
    assert "train.aaa-bbb.aaa.bin" in r.stderr and "UserWarning" not in r.stderr


def test_read_data_bin_example_decodes_the_demo(tmp_path, capsys):
    run_demo(None, workdir=str(tmp_path / "demo"), scale=0.05, workers=1, train_steps=0)
    capsys.readouterr()
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "read_data_bin.py")
    r = subprocess.run([sys.executable, example, str(tmp_path / "demo" / "data_bin"), "-n", "50"],
                       capture_output=True, text=True, check=True)
    raw_en = (tmp_path / "demo" / "raw" / "eng_Latn-tur_Latn.eng_Latn").read_text(errors="replace").splitlines()
    sections = r.stdout.split("\neng_Latn-")
    tur = next(sec for sec in sections if sec.startswith("tur_Latn:"))
    shown = [ln.split("] ", 1)[1] for ln in tur.splitlines() if ln.startswith("  [")]
    # shard 0 holds the first half of the 100 pairs, less the 4 planted bad ones; each decodes to its input line
    want = [ln for i, ln in enumerate(raw_en[:50]) if i not in (7, 11, 13, 17)]
    assert len(shown) == len(want) == 46
    # equal, except where a character the tiny SentencePiece model never saw decodes as <unk> (" ⁇ ")
    assert all(a == b or "\u2047" in a for a, b in zip(shown, want))
    assert sum(a == b for a, b in zip(shown, want)) >= 40


def test_config_is_locked(tmp_path):
    from babelfeed.config import load_config

    c = load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "demo.py"))
    assert c.binarize.train_spm == 4000
    import pytest

    with pytest.raises(AttributeError):
        c.binarize.shard = 3  # misspelt key
    (tmp_path / "bad.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        load_config(tmp_path / "bad.py")



def test_demo_trains_flax_and_loss_falls(tmp_path, capsys):
    """The main job end to end, shortened: corpus, binarize, epoch, then the Flax example learns. (A smaller
    model on 2 static shapes: each shape's compilation of the train step costs seconds on the CPU, and the demo's
    own model on its 4 shapes made this the suite's longest test; `make demo` trains that one.)"""
    config = babelfeed.load_config("demo")
    m = config.model
    m.d_model, m.ff, m.layers, m.heads, m.num_shapes = 64, 128, 1, 2, 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_demo(config, workdir=str(tmp_path / "demo"), scale=0.1, workers=1, train_steps=60) == 0
    out = capsys.readouterr().out
    said = [w for w in caught if issubclass(w.category, babelfeed.errors.UpsamplingNotice)]
    assert len(said) == 1, said  # steps 4 and 5 read one mixture: said once (it was twice)
    assert "== 5/5 flax training, 60 steps" in out and "model: 1+1 layers, d_model 64" in out
    summary = [ln for ln in out.splitlines() if "trained 60 steps" in ln][0]
    first, last = (float(x) for x in summary.split("loss ")[1].split(" (means")[0].split(" -> "))
    assert last < first - 1.0  # the loss visibly falls
    used = int(summary.split("(")[-1].split(" used")[0])
    compiled = int(summary.split("; ")[-1].split(" compilations")[0])
    assert compiled == used <= 2  # one compilation per static shape


def test_torch_example_learns(tmp_path, capsys):
    run_demo(None, workdir=str(tmp_path / "demo"), scale=0.1, workers=1, train_steps=0)
    from babelfeed.tools.demo import _example

    import babelfeed

    cfg = babelfeed.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
                                          "demo.py"))
    cfg.train.data.path = str(tmp_path / "demo" / "data_bin")
    cfg.model.d_model, cfg.model.ff, cfg.model.layers, cfg.model.heads = 64, 128, 1, 2  # (a shorter test)
    result = _example("torch").train(cfg, 50, log=lambda m: None)
    assert result["last"] < result["first"] - 1.0


def test_flax_example_killed_and_rerun_continues_exactly_from_its_orbax_checkpoint(tmp_path):
    """The train state and the data position saved together with orbax: a run stopped at step 4 and run again
    trains steps 5-8 on the same batches, to the same losses, as a run that was never stopped."""
    run_demo(None, workdir=str(tmp_path / "demo"), scale=0.05, workers=1, train_steps=0)
    from babelfeed.tools.demo import _example

    import babelfeed

    def config():
        cfg = babelfeed.load_config("demo")
        cfg.train.data.path = str(tmp_path / "demo" / "data_bin")
        cfg.model.d_model, cfg.model.ff, cfg.model.layers, cfg.model.max_tokens = 32, 64, 1, 1024
        cfg.model.num_shapes = 1  # one compilation of the train step per run (four runs below)
        return cfg

    flax = _example("flax")
    whole = flax.train(config(), 8, log=lambda m: None)
    ckpt = str(tmp_path / "ckpt")
    first = flax.train(config(), 8, log=lambda m: None, checkpoint_dir=ckpt, save_every=2, stop_after=4)
    logs = []
    rest = flax.train(config(), 8, log=logs.append, checkpoint_dir=ckpt, save_every=2)
    assert first["steps"] == 4 and f"resumed from {ckpt} at step 4" in logs
    assert first["batch_ids"] + rest["batch_ids"] == whole["batch_ids"] and len(whole["batch_ids"]) == 8
    np.testing.assert_allclose(first["losses"] + rest["losses"], whole["losses"], rtol=1e-5)
    # started again once finished: says so and trains nothing; another model in the same folder: a clear error
    logs = []
    again = flax.train(config(), 8, log=logs.append, checkpoint_dir=ckpt)
    assert again["losses"] == [] and any("already holds step 8 of 8: nothing to train" in m for m in logs), logs
    wider = config()
    wider.model.d_model = 48
    with pytest.raises(StateMismatch, match="holds another model's arrays"):
        flax.train(wider, 10, log=lambda m: None, checkpoint_dir=ckpt)


def test_demo_says_what_to_install_and_which_config_it_takes(tmp_path):
    """Without babel (pip install babelfeed without the demo extra) the demo stops at once with the extra to
    install, exit 2; a pipeline config is refused by name, not with an internal error."""
    code = ("import sys; sys.modules['babel'] = None; from babelfeed.cli import main; "
            f"sys.exit(main(['demo', '--workdir', {str(tmp_path / 'd')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "pip install 'babelfeed[demo]'" in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()  # nothing written before the refusal
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "demo", "--config", "nllb_like"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "takes a demo config" in out.stderr, out.stderr
