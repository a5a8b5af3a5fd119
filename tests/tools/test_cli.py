"""Every error of the ``babelfeed`` command is one line on stderr that names what is wrong, with a non-zero exit
status and no traceback; ``--debug`` shows the traceback. Nonsense values are refused naming key and value."""

import os
import subprocess
import sys

import pytest

import babelfeed
from babelfeed.cli import main
from synthetic import make_data_bin
from test_binarize import make_raw
from babelfeed.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NLLB = os.path.join(REPO, "configs", "nllb_like.py")
DEMO = os.path.join(REPO, "configs", "demo.py")
LM = os.path.join(REPO, "configs", "lm_packing.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "data_bin"
    make_data_bin(root)
    return str(root)


def fails(capsys, argv, *names, status=2):
    """Run ``babelfeed ARGV``; it must exit with ``status`` and print one stderr line naming each of ``names``."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == status, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith(f"babelfeed {argv[0]}: ") and "error: " in lines[0], err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------------ configs of every kind
def test_plan_and_preview_take_the_demo_config(data, capsys):
    """configs/demo.py keeps its pipeline under ``train``: plan and preview read it there (was AttributeError)."""
    assert main(["plan", DEMO, f"--config.train.data.path={data}", "--shapes", "2"]) == 0
    assert "static shapes for" in capsys.readouterr().out
    assert main(["preview", "--config", DEMO, f"--config.train.data.path={data}", "--task", "aaa-bbb", "-n", "2",
                 "--transforms", "token_drop:rate=0.2"]) == 0
    assert "token_drop" in capsys.readouterr().out


def test_plan_at_a_low_temperature_warns_nothing_and_weighs_the_mixture(data, capsys):
    """At T=0.5 a corpus can get no sample: its weight 0 made numpy warn three times and the alternatives table
    use NaN weights (the T=1 figures). Now no warning, and the table follows the mixture's weights."""
    import warnings

    tables = {}
    for t in ("0.5", "1.0"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(["plan", NLLB, f"--config.data.path={data}", f"--config.mixing.temperature={t}"]) == 0
        out = capsys.readouterr().out
        tables[t] = out[out.index("length edges"):out.index("pad to the longest")]
    assert tables["0.5"] != tables["1.0"] and "nan" not in tables["0.5"]


def test_plan_of_a_language_model_config_names_its_missing_data(capsys):
    # plan takes LM configs (tests/lm/test_lm_parity.py); the shipped one points at data/web, not here
    fails(capsys, ["plan", LM], "data/web.idx", "No such file")


def test_missing_files_are_named(capsys, tmp_path):
    fails(capsys, ["plan", str(tmp_path / "nope.py")], "nope.py", "not found")
    fails(capsys, ["plan", NLLB, f"--config.data.path={tmp_path / 'nothing'}"], "nothing", "not found")
    fails(capsys, ["inspect", str(tmp_path / "nothing")], "nothing")


def test_a_file_that_is_no_config_is_named(capsys, tmp_path):
    fails(capsys, ["plan", "/etc/hostname"], "/etc/hostname", "not a Python config file")
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    fails(capsys, ["plan", str(tmp_path / "broken.py")], "broken.py", "line 1", "SyntaxError")
    # a get_config() that raises is the user's config to fix, not "an internal error, please report it"
    (tmp_path / "raises.py").write_text("def get_config():\n    raise KeyError('model')\n")
    line = fails(capsys, ["plan", str(tmp_path / "raises.py")], "raises.py", "its get_config() raised KeyError")
    assert "internal error" not in line


def test_usage_errors_are_one_line(capsys):
    fails(capsys, ["plan", NLLB, "--shapes", "x"], "--shapes", "'x'")
    fails(capsys, ["plan", NLLB, "--config.mixing.temprature=2"], "mixing.temprature", "did you mean temperature")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "required: command" in err
    assert main(["plan", "--help"]) == 0 and "--shapes" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ nonsense values
@pytest.mark.parametrize("override, key, value", [
    ("filter.max_source_positions=0", "filter.max_source_positions", "0"),
    ("filter.max_target_positions=-3", "filter.max_target_positions", "-3"),
    ("batching.max_tokens=0", "batching.max_tokens", "0"),
    ("batching.max_tokens=-5", "batching.max_tokens", "-5"),
    ("batching.max_tokens=True", "batching.max_tokens", "True"),
    ("mixing.temperature=0", "mixing.temperature", "0"),
    ("mixing.temperature=-1.5", "mixing.temperature", "-1.5"),
    ("batching.required_batch_size_multiple=0", "batching.required_batch_size_multiple", "0"),
    ("batching.accumulation=0", "batching.accumulation", "0"),
    ("batching.num_shapes=-1", "batching.num_shapes", "-1"),
    ("batching.max_sentences=-1", "batching.max_sentences", "-1"),
    ("collate.pad_to_multiple=0", "collate.pad_to_multiple", "0"),
    ("data.shards=some", "data.shards", "'some'"),
    ("batching.max_tokens=99999999999999999999", "batching.max_tokens", "99999999999999999999"),
    ("batching.shapes=-8x8", "batching.shapes", "'-8x8'"),
    ("batching.shapes=abc", "batching.shapes", "'abc'"),
    ("mixing.schedule.boundaries=5.5", "mixing.schedule.boundaries", "'5.5'"),
    ("seed=-1", "seed", "-1"),
    ("filter.max_source_positions=65536", "filter.max_source_positions", "65536"),
])
def test_plan_refuses_nonsense_config_values(data, capsys, override, key, value):
    line = fails(capsys, ["plan", NLLB, f"--config.data.path={data}", f"--config.{override}"], key, value)
    assert "must" in line


@pytest.mark.parametrize("shapes", ["0", "-2"])
def test_plan_refuses_shapes_below_one(data, capsys, shapes):
    """--shapes 0 used to plan 8 shapes silently."""
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}", "--shapes", shapes], "--shapes", shapes)


def test_demo_config_values_are_named_with_their_section(data, capsys, tmp_path):
    fails(capsys, ["plan", DEMO, f"--config.train.data.path={data}", "--config.train.mixing.temperature=0"],
          "train.mixing.temperature", "0")
    fails(capsys, ["plan", DEMO, f"--config.train.data.path={tmp_path / 'none'}"], "train.data.path", "not found")
    fails(capsys, ["demo", "--workdir", str(tmp_path / "demo"), "--config.train.batching.max_tokens=0"],
          "train.batching.max_tokens", "0")
    assert not os.path.exists(tmp_path / "demo")  # refused before writing the corpus
    fails(capsys, ["demo", "--workdir", str(tmp_path / "demo"), "--scale", "0"], "--scale", "0")


def test_preview_refuses_nonsense_counts(data, capsys):
    base = ["preview", "--config", NLLB, f"--config.data.path={data}", "--task", "aaa-bbb",
            "--transforms", "token_drop:rate=0.2"]
    fails(capsys, base + ["-n", "0"], "-n", "0")
    fails(capsys, base + ["--epoch", "0"], "--epoch", "0")


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "raw"
    make_raw(root, n=40, bad=False)
    return root


@pytest.mark.parametrize("flags, name, value", [
    (["--train-spm", "0"], "--train-spm", "0"),
    (["--train-spm", "60", "--workers", "-1"], "--workers", "-1"),
    (["--train-spm", "60", "--shards", "0"], "--shards", "0"),
    (["--train-spm", "60", "--max-len", "1"], "--max-len", "1"),
    (["--train-spm", "60", "--chunk-lines", "0"], "--chunk-lines", "0"),
    (["--train-spm", "60", "--spm-sample", "0"], "--spm-sample", "0"),
    (["--train-spm", "60", "--character-coverage", "0"], "--character-coverage", "got 0.0"),
    (["--train-spm", "60", "--character-coverage", "0.5"], "--character-coverage", "[0.98, 1]"),
    (["--spm", "any.model", "--character-coverage", "1.0"], "--character-coverage 1 is a setting", "--train-spm"),
    (["--train-spm", "60", "--source-lang", "en"], "--source-lang and --target-lang go together", "train.en"),
])
def test_binarize_refuses_nonsense_before_any_work(raw, tmp_path, capsys, flags, name, value):
    fails(capsys, ["binarize", str(raw), "-o", str(tmp_path / "out"), "--no-progress"] + flags, name, value)
    assert not os.path.exists(tmp_path / "out" / "spm.model")  # refused before training SentencePiece


def test_binarize_refuses_more_shards_than_lines(raw, tmp_path, capsys):
    """50 shards of 40 pairs would leave empty shards: epochs of no batch under shard cycling."""
    line = fails(capsys, ["binarize", str(raw), "-o", str(tmp_path / "out"), "--train-spm", "60", "--shards", "50",
                          "--no-progress"], "--shards 50", "40", "en-de")
    assert "train.fr" in line or "en-de" in line
    assert not os.path.exists(tmp_path / "out" / "shard000")


def test_pair_looking_monolingual_files_are_warned_about_with_the_command_that_pairs_them(raw, tmp_path, capsys):
    """train.en and train.de binarized as two monolingual corpora with exit 0, and plan said only "no directions
    selected for split 'train'" (issue 25). binarize now says on stderr which files look paired and the exact
    command that reads them as a direction; plan's error says the same; the command works."""
    import shlex

    fs = tmp_path / "fs"
    fs.mkdir()
    for lang in ("en", "de"):
        (fs / f"train.{lang}").write_bytes((raw / f"en-de.{lang}").read_bytes())
    out = tmp_path / "out"
    assert main(["binarize", str(fs), "-o", str(out), "--train-spm", "60", "--no-progress"]) == 0
    err = capsys.readouterr().err
    warning = next(ln for ln in err.splitlines() if ln.startswith("WARNING: "))
    assert f"{fs / 'train.de'}, {fs / 'train.en'} were read as monolingual text" in warning
    assert "40 lines each" in warning
    command = warning.split("rerun as: ", 1)[1].split(" (--overwrite", 1)[0]
    assert command == shlex.join(["babelfeed", "binarize", str(fs), "-o", str(out), "--train-spm", "60",
                                  "--no-progress", "--source-lang", "de", "--target-lang", "en", "--overwrite"])
    fails(capsys, ["plan", NLLB, f"--config.data.path={out}"], "no directions selected for split 'train'",
          "--source-lang de --target-lang en")
    assert main(shlex.split(command)[1:]) == 0
    assert "WARNING" not in capsys.readouterr().err
    assert babelfeed.ShardedCorpus(out).directions() == ["de-en"] and not babelfeed.ShardedCorpus(out).monolingual()


# ------------------------------------------------------------------------------------ rank and world size
@pytest.mark.parametrize("rank, world_size, match", [
    (0, 2.5, "world_size must be an integer in \\[1, 1,048,576\\], got 2.5"),
    (0, 0, "world_size must be an integer in \\[1, 1,048,576\\], got 0"),
    (0, True, "world_size must be an integer in \\[1, 1,048,576\\], got True"),
    (0, 2**20 + 1, "world_size must be an integer in \\[1, 1,048,576\\], got 1048577"),
    (1.0, 2, "rank must be an integer"),
    (2, 2, r"rank must be an integer in \[0, 2\), got 2"),
    (-1, 2, "rank must be an integer"),
])
def test_rank_and_world_size_are_checked_first(data, rank, world_size, match):
    """world_size=2.5 used to end in a numpy IndexError, 0 in 'batches per optimizer update must be >= 1'."""
    from synthetic import config_for

    cfg = config_for(data)
    with pytest.raises(ConfigError, match=match):
        babelfeed.build_train_iterator(cfg, rank=rank, world_size=world_size)
    with pytest.raises(ConfigError, match=match):
        babelfeed.build_valid_iterator(cfg, rank=rank, world_size=world_size)
    with pytest.raises(ConfigError, match=match):
        babelfeed.build_iterator(babelfeed.load_config(LM), rank=rank, world_size=world_size)


def test_library_builds_refuse_nonsense_config_values(data):
    from synthetic import config_for

    for key, value in [("filter.max_source_positions", 0), ("batching.max_tokens", -1), ("mixing.temperature", 0.0)]:
        cfg = config_for(data, **{key.replace(".", "__"): value})
        with pytest.raises(ConfigError, match=rf"{key} must .*got {value}"):
            babelfeed.build_train_iterator(cfg)


# ------------------------------------------------------------------------------------ one handler, --debug
def test_an_unexpected_error_is_one_line_too(data, monkeypatch, capsys):
    import babelfeed.tools.plan_report

    def broken(*_a, **_k):
        raise AttributeError("'NoneType' object has no attribute 'shapes'")

    monkeypatch.setattr(babelfeed.tools.plan_report, "plan_report", broken)
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}"], "internal error", "AttributeError", "--debug",
          status=1)


def in_babelfeed(body: str):
    """A function whose code reads as babelfeed's own (its file is babelfeed.tools.plan_report's)."""
    import babelfeed.tools.plan_report

    namespace: dict = {}
    exec(compile(f"def f(*_a, **_k):\n    import numpy\n    {body}\n", babelfeed.tools.plan_report.__file__, "exec"),
         namespace)
    return namespace["f"]


@pytest.mark.parametrize("body,name", [('return {}["shapes"]', "KeyError"), ("return [][3]", "IndexError"),
                                       ("return len(5)", "TypeError"),
                                       ("return numpy.zeros(3).reshape(2)", "ValueError"),
                                       ('raise ValueError("a planted bug")', "ValueError"),
                                       ('raise KeyError("a planted bug")', "KeyError")])
def test_a_bug_inside_babelfeed_is_an_internal_error_not_a_user_error(data, monkeypatch, capsys, body, name):
    """A KeyError, TypeError or ValueError in babelfeed's code (a lookup or a numpy call going wrong, even a raise
    statement of a builtin type) is a bug to report, not the user's mistake: the CLI decides by the error's type,
    and every error a user can cause is a BabelfeedError."""
    import babelfeed.tools.plan_report

    monkeypatch.setattr(babelfeed.tools.plan_report, "plan_report", in_babelfeed(body))
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}"], "internal error", name, "please report it",
          status=1)


def test_what_babelfeed_refuses_on_purpose_stays_a_user_error(data, monkeypatch, capsys):
    """An error babelfeed raises for bad input (a language the dictionary lacks) is the user's to fix."""
    import babelfeed.tools.plan_report

    def missing(*_a, **_k):
        babelfeed.ShardedCorpus(data).dictionary().lang_token_index("zzz")

    monkeypatch.setattr(babelfeed.tools.plan_report, "plan_report", missing)
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}"], "language token", "not in the dictionary", status=2)


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "babelfeed.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "BABELFEED_DEBUG": ""})


def test_debug_shows_the_traceback(data):
    plain = run_cli("plan", NLLB, f"--config.data.path={data}", "--config.mixing.temperature=0")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip() == "babelfeed plan: error: mixing.temperature must be a finite number > 0, got 0.0"
    for argv in (["--debug", "plan"], ["plan", "--debug"]):
        debug = run_cli(*argv, NLLB, f"--config.data.path={data}", "--config.mixing.temperature=0")
        assert debug.returncode != 0
        assert "Traceback" in debug.stderr and "mixing.temperature must be a finite number > 0" in debug.stderr


def test_a_closed_pipe_is_not_an_error(data):
    """`babelfeed plan ... | head` printed 'error: [Errno 32] Broken pipe'."""
    p = subprocess.Popen([sys.executable, "-m", "babelfeed.cli", "plan", NLLB, f"--config.data.path={data}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    p.stdout.close()  # the reader is gone before the report is printed
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == ""


def test_binarize_refuses_a_file_that_is_no_model_before_it_replaces_the_data_bins_own(raw, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["binarize", str(raw), "-o", str(out), "--train-spm", "60", "--no-progress"]) == 0
    capsys.readouterr()
    model = (out / "spm.model").read_bytes()
    (tmp_path / "junk").write_text("abc")
    fails(capsys, ["binarize", str(raw), "-o", str(out), "--spm", str(tmp_path / "junk"), "--no-progress"],
          "--spm", "junk", "not a SentencePiece model")
    assert (out / "spm.model").read_bytes() == model
    (tmp_path / "empty.model").write_bytes(b"")  # was "internal error: RuntimeError: unk is not defined"
    fails(capsys, ["binarize", str(raw), "-o", str(out), "--spm", str(tmp_path / "empty.model"), "--no-progress"],
          "--spm", "empty.model", "not a SentencePiece model (the file is empty)")
    assert (out / "spm.model").read_bytes() == model


def test_plan_refuses_what_training_refuses(data, capsys):
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}", "--config.filter.max_source_positions=2"],
          "filter.max_source_positions=2", "filters out every sample")
    fails(capsys, ["plan", NLLB, f"--config.data.path={data}", "--config.mixing.schedule.boundaries=5",
                   "--config.mixing.schedule.weights=aaa-bbb:1,aaa-ccc:1,aaa-ddd:1|aaa-bbb:0,aaa-ccc:1,aaa-ddd:1"],
          "shards")


def test_trace_names_a_mismatch_without_advice_the_command_line_cannot_take(data, capsys, tmp_path):
    """trace advised "Pass strict=False", for which the command has no flag (issue 23 item 16)."""
    import json

    cfg = babelfeed.load_config(NLLB)
    cfg.data.path = data
    it = babelfeed.build_train_iterator(cfg)
    next(it)
    (tmp_path / "state.json").write_text(json.dumps(it.get_state()))
    line = fails(capsys, ["trace", NLLB, f"--config.data.path={data}", "--config.batching.max_tokens=2048",
                          "--state", str(tmp_path / "state.json"), "--step", "1"],
                 "batching.max_tokens 4096 -> 2048", "with the config and data it was saved with")
    assert "strict=False" not in line


def test_plan_counts_the_batches_of_a_stream_sampler_epoch(data, capsys):
    """plan printed "0 batches, padding efficiency 0.0%" for mixing.sampler='stream' (the review's finding)."""
    import re

    assert main(["plan", NLLB, f"--config.data.path={data}", "--config.mixing.sampler=stream",
                 "--config.data.shards=all"]) == 0
    out = capsys.readouterr().out
    got = re.search(r"epoch 1 with these shapes: (\d+) batches, padding efficiency ([\d.]+)%", out)
    assert got and int(got.group(1)) > 0 and float(got.group(2)) > 0, out[-800:]


def test_trace_takes_a_checkpoint_folder(data, capsys, tmp_path):
    """trace --state on an HF checkpoint-N/ folder said only "Is a directory" (the review's finding)."""
    import json

    cfg = babelfeed.load_config(NLLB)
    cfg.data.path = data
    it = babelfeed.build_train_iterator(cfg)
    next(it)
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "babelfeed_state.json").write_text(json.dumps(it.get_state()))
    assert main(["trace", NLLB, f"--config.data.path={data}", "--state", str(folder), "--step", "1"]) == 0
    assert "step 1:" in capsys.readouterr().out
    fails(capsys, ["trace", NLLB, f"--config.data.path={data}", "--state", str(tmp_path), "--step", "1"],
          "a folder holding no babelfeed state")


def test_trace_reads_the_torch_checkpoint_the_pytorch_guide_saves(data, capsys, tmp_path):
    """torch.save({"data": loader.state_dict(), ...}) as the README's PyTorch snippet saves it: trace read it as
    text and said only "'utf-8' codec can't decode byte 0x80"."""
    torch = pytest.importorskip("torch")
    cfg = babelfeed.load_config(NLLB)
    cfg.data.path = data
    it = babelfeed.build_train_iterator(cfg)
    next(it)
    torch.save({"data": it.get_state(), "model": {"w": torch.zeros(3)}}, tmp_path / "ckpt.pt")
    assert main(["trace", NLLB, f"--config.data.path={data}", "--state", str(tmp_path / "ckpt.pt"), "--step",
                 "1"]) == 0
    assert "step 1:" in capsys.readouterr().out
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 cut short")
    fails(capsys, ["trace", NLLB, f"--config.data.path={data}", "--state", str(tmp_path / "bad.pt"), "--step", "1"],
          str(tmp_path / "bad.pt"), "torch")
    (tmp_path / "bad.json").write_bytes(b"{not json \xff")
    fails(capsys, ["trace", NLLB, f"--config.data.path={data}", "--state", str(tmp_path / "bad.json"), "--step",
                   "1"], str(tmp_path / "bad.json"), "not a JSON iterator state")


def test_every_command_takes_its_config_one_way_or_the_other_and_refuses_two(data, capsys):
    """plan, trace, preview and demo take the config as their first argument or as --config, alike; both at once
    is refused naming both (plan nllb_like --config my.py once used my.py silently)."""
    preview = ["--task", "aaa-bbb", "-n", "1", "--transforms", "token_drop:rate=0.2"]
    for argv in (["plan", NLLB, f"--config.data.path={data}", "--shapes", "2"],
                 ["plan", "--config", NLLB, f"--config.data.path={data}", "--shapes", "2"],
                 ["plan", f"--config={NLLB}", f"--config.data.path={data}", "--shapes", "2"],
                 ["preview", NLLB, f"--config.data.path={data}", *preview],
                 ["preview", "--config", NLLB, f"--config.data.path={data}", *preview]):
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    capsys.readouterr()
    for command, rest in (("plan", []), ("trace", ["--step", "1"]), ("preview", preview), ("demo", [])):
        fails(capsys, [command, "nllb_like", "--config", NLLB, *rest], "two configs given", "'nllb_like'", NLLB)
    fails(capsys, ["trace", "--step", "1"], "name the config")
    fails(capsys, ["preview", *preview], "name the config")


def test_overrides_take_absl_space_form_too(data, capsys):
    """--config.KEY VALUE, as absl's config_flags take it, is the same as --config.KEY=VALUE."""
    assert main(["plan", NLLB, "--config.data.path", data, "--config.batching.max_tokens", "2048", "--shapes",
                 "2"]) == 0
    assert "max_tokens 2048" in capsys.readouterr().out
    assert main(["plan", NLLB, f"--config.data.path={data}", "--config.batching.max_tokens=1024", "--shapes",
                 "2"]) == 0
    assert "max_tokens 1024" in capsys.readouterr().out
    code = main(["plan", NLLB, f"--config.data.path={data}", "--config.batching.max_tokens"])
    err = capsys.readouterr().err
    assert code == 2 and "--config.batching.max_tokens needs a value" in err and "Traceback" not in err
    code = main(["plan", NLLB, f"--config.data.path={data}", "--config.batching.max_tokens", "--shapes", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "--config.batching.max_tokens needs a value" in err, "the next flag is not its value"
    fails(capsys, ["plan", NLLB, "--config.data.path", data, "--config.batching.max_tokens", "lots"],
          "batching.max_tokens", "takes an integer", "'lots'")
    code = main(["plan", NLLB, "--set", "batching.max_tokens", "2048"])
    err = capsys.readouterr().err
    assert code == 2 and "--set takes KEY=VALUE as one argument: --set batching.max_tokens=..." in err


def test_stdout_keeps_its_order_with_stderr_in_one_file(data, tmp_path):
    """`babelfeed ... > log 2>&1`: what a command printed lands before what is written to stderr after it (a
    block-buffered stdout held it back until exit)."""
    code = ("import sys; from babelfeed.cli import main; "
            f"main(['inspect', {data!r}]); print('AFTER', file=sys.stderr)")
    with open(tmp_path / "log", "w") as log:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (as a user's shell has it)
        subprocess.run([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, timeout=120, check=True,
                       env=env)
    text = (tmp_path / "log").read_text()
    assert "AFTER" in text and "aaa-bbb" in text and text.index("aaa-bbb") < text.index("AFTER"), text[-2000:]


def test_preview_without_task_or_transforms_shows_the_first_directions_samples(data, capsys):
    """The README's `babelfeed preview CONFIG`: --task defaults to the first task or direction, and no transforms
    shows the samples as the data holds them (it refused: "no transforms to preview ... pass --transforms")."""
    assert main(["preview", NLLB, f"--config.data.path={data}", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("aaa-bbb (source)") and "0 transform(s)" in out and out.count("original") == 2


def test_a_dashed_language_code_in_a_file_name_is_named_with_the_fix(tmp_path, capsys):
    """train.pt-BR was ignored as "not named like inputs" with no reason; the dash reads as a direction."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.pt-BR").write_text("um dois\ntres quatro\n")
    code = main(["binarize", str(tmp_path / "raw"), "-o", str(tmp_path / "out"), "--train-spm", "8", "--no-progress"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "error: " in last and "train.pt-BR" in last and "write it with _, e.g. pt_BR" in last


# ------------------------------------------------------------------ user mistakes that were internal errors
def _copy(data, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(data, out)
    return out


def test_user_mistakes_found_by_an_adversarial_review_are_the_users_errors(data, tmp_path, capsys, raw):
    """Each of these was reported as "internal error ... please report it" (exit 1) once the command line decided
    by type: a dict.txt that is not UTF-8, a garbage spm.model, prefix templates with stray braces, a config
    section set to a value, a task entry of the wrong type, a history event named by a list, counts past int64,
    binarize --seed out of range and a world size no run has. Each is now a one-line error naming what to fix."""
    import json

    bad_dict = _copy(data, tmp_path / "d")
    with open(bad_dict / "dict.txt", "ab") as f:
        f.write(b"caf\xe9 1\n")
    fails(capsys, ["plan", NLLB, f"--config.data.path={bad_dict}"], "dict.txt", "not UTF-8")
    bad_spm = _copy(data, tmp_path / "s")
    (bad_spm / "spm.model").write_text("garbage\n")
    fails(capsys, ["preview", "--config", NLLB, f"--config.data.path={bad_spm}", "--task", "aaa-bbb"],
          "spm.model", "not a SentencePiece model")
    for template in ("__{", "{0}"):
        fails(capsys, ["plan", NLLB, f"--config.data.path={data}", f"--config.data.source_prefix={template}"],
              "is not a template")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"import babelfeed, ml_collections\ndef get_config():\n"
                   f"    d = babelfeed.load_config({NLLB!r}).to_dict()\n"
                   f"    d['data']['path'], d['filter'] = {data!r}, 'x'\n    return ml_collections.ConfigDict(d)\n")
    fails(capsys, ["plan", str(cfg)], "filter is a section of keys")
    cfg.write_text(f"import babelfeed, ml_collections\ndef get_config():\n"
                   f"    d = babelfeed.load_config({NLLB!r}).to_dict()\n    d['data']['path'] = {data!r}\n"
                   f"    d['tasks'] = {{'mt': {{'corpora': 'all', 'weight': '1.0x'}}}}\n"
                   f"    return ml_collections.ConfigDict(d)\n")
    fails(capsys, ["plan", str(cfg)], "tasks.mt.weight must be a finite number >= 0")
    with pytest.raises(babelfeed.ConfigTypeError, match="weight must be a finite number"):
        babelfeed.config.task("all", weight="x")
    it = babelfeed.build_train_iterator(_cfg(data))
    next(it)
    state = it.get_state()
    for damage, name in ((lambda s: s["history"].append({"event": []}), "history"),
                         (lambda s: s["ledger"]["samples"].update({k: 10**20 for k in s["ledger"]["samples"]}),
                          "ledger")):
        s = json.loads(json.dumps(state))
        damage(s)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(s))
        fails(capsys, ["edit", NLLB, "--set", f"data.path={data}", "--set", "mixing.temperature=2", "--state",
                       str(path), "--out", str(tmp_path / "edited.json")], name)
    fails(capsys, ["binarize", str(raw), "-o", str(tmp_path / "o"), "--train-spm", "60", "--seed", "-1"],
          "--seed", "-1")
    fails(capsys, ["binarize", str(raw), "-o", str(raw), "--train-spm", "60"], "is the input folder")
    assert not (raw / "dict.txt").exists()
    fails(capsys, ["trace", NLLB, f"--config.data.path={data}", "--step", "1", "--world-size", "1000000000"],
          "--world-size")
    with pytest.raises(babelfeed.UsageTypeError, match=r"babelfeed.load_config\('nllb_like'\)"):
        babelfeed.build_train_iterator("nllb_like")


def _cfg(data):
    c = babelfeed.load_config(NLLB)
    c.data.path = data
    return c


def test_inspect_gives_each_directions_up_sampling_under_a_mixture(tmp_path):
    """inspect follows its table with epoch 1's epochs per direction at nllb_like's mixture (or --config, --set),
    and the warning plan gives (--json: a field of each train row, the warning on stderr); data it cannot plan is
    said in a line, not an error."""
    import json
    import subprocess
    import sys

    from synthetic import make_data_bin

    make_data_bin(tmp_path / "bin")
    run = [sys.executable, "-m", "babelfeed.cli", "inspect", str(tmp_path / "bin")]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith("aaa-ddd") and "sentences" in line)
    assert float(row.split()[-1][:-1]) > 19 and "warning: epoch 1 serves 1 of 3 directions" in out
    capped = subprocess.run(run + ["--set", "mixing.max_upsample=4"], capture_output=True, text=True,
                            check=True).stdout
    row = next(line for line in capped.splitlines() if line.strip().startswith("aaa-ddd") and "sentences" in line)
    assert row.split()[-1] == "4.0x" and "warning:" not in capped
    as_json = subprocess.run(run + ["--json"], capture_output=True, text=True, check=True)
    rows = [r for r in json.loads(as_json.stdout) if r["key"] == "aaa-ddd"]
    assert rows and all(r["epoch1_upsampling"] > 19 for r in rows if r["split"] == "train")
    assert all("epoch1_upsampling" not in r for r in rows if r["split"] != "train")
    assert "warning: epoch 1 serves 1 of 3 directions" in as_json.stderr
    (tmp_path / "bin" / "dict.txt").unlink()
    bare = subprocess.run(run, capture_output=True, text=True)
    assert bare.returncode == 0 and "epoch 1's up-sampling: not shown" in bare.stdout, bare.stderr


def test_a_state_is_read_once_so_a_pipe_can_hold_it(tmp_path):
    """Issue 39 item 7: ``--state <(cat state.json)`` and ``--state /dev/stdin`` are pipes, which cannot be read
    a second time; the state was read twice (its first bytes, then the whole) and refused as not JSON."""
    import json
    import threading

    from babelfeed.tools.cli import _read_state
    state = {"version": 3, "epoch": 2, "consumed": 17}
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, json.dumps(state).encode()), os.close(w)))
    writer.start()
    try:
        assert _read_state(f"/dev/fd/{r}") == state
    finally:
        writer.join()
        os.close(r)
