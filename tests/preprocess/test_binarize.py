"""babelfeed binarize: output layout and content, drop policies, errors, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import sentencepiece as spm

import babelfeed
from babelfeed.preprocess import binarize as bz
from babelfeed.preprocess.binarize import BinarizeOptions, binarize, format_report
from babelfeed.errors import BinarizeError, UsageError

WORDS = "the cat sat on a mat and dog ran far away under blue sky with green hat".split()


def make_raw(root, n=400, seed=0, bad=True):
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    src, tgt = [], []
    for _ in range(n):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(1, 12)))]
        src.append(" ".join(words).encode())
        tgt.append(" ".join(w.upper() for w in reversed(words)).encode())
    if bad:
        src[3] = b""  # empty source
        tgt[5] = b"caf\xe9"  # not UTF-8
        src[9] = b" ".join([b"cat"] * 400)  # overlong at max_len 200
    (root / "en-de.en").write_bytes(b"\n".join(src) + b"\n")
    (root / "en-de.de").write_bytes(b"\n".join(tgt) + b"\n")
    (root / "valid.en-de.en").write_bytes(b"the cat\na dog\n")
    (root / "valid.en-de.de").write_bytes(b"CAT THE\nDOG A\n")
    (root / "train.fr").write_bytes(b"\n".join(b"le chat " + str(i).encode() for i in range(50)) + b"\n")
    return src, tgt


def opts(raw, out, **kw):
    base = dict(input_dir=str(raw), output_dir=str(out), train_spm=60, shards=2, workers=1, max_len=200,
                chunk_lines=64, progress=False)
    base.update(kw)
    return BinarizeOptions(**base)


def quiet(*_):
    pass


@pytest.fixture
def raw(tmp_path):
    make_raw(tmp_path / "raw")
    return tmp_path / "raw"


def read_all(out):
    """Every output file's bytes, keyed by path relative to the data_bin."""
    files = {}
    for d, _, names in os.walk(out):
        if ".binarize" in d:
            continue
        for n in names:
            if n.endswith((".bin", ".idx", ".txt", ".model")):
                files[os.path.relpath(os.path.join(d, n), out)] = open(os.path.join(d, n), "rb").read()
    return files


def test_layout_content_and_report(raw, tmp_path):
    out = tmp_path / "data_bin"
    report = binarize(opts(raw, out), log=quiet)
    corpus = babelfeed.ShardedCorpus(out)
    assert corpus.splits == ["train", "valid"]
    assert corpus.directions() == ["en-de"] and corpus.monolingual() == ["fr"]
    assert corpus.shard_ids("train", "en-de") == [0, 1] and corpus.shard_ids("valid", "en-de") == [0]
    d = babelfeed.Dictionary.load(out / "dict.txt")
    assert list(d.language_tokens) == ["de", "en", "fr"]  # appended last, sorted
    assert max(d.language_tokens.values()) == len(d) - 1
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    # Decoding the kept sentences gives back the input text, in order, pairs aligned.
    src_lines = (raw / "en-de.en").read_bytes().decode("utf-8", "replace").splitlines()
    tgt_lines = (raw / "en-de.de").read_bytes().decode("utf-8", "replace").splitlines()
    dropped = {3, 5, 9}
    kept = [i for i in range(len(src_lines)) if i not in dropped]
    got_src, got_tgt = [], []
    for shard in (0, 1):
        s, t = corpus.open_pair("train", "en-de", shard)
        assert s.dtype == np.uint16 and s.format == "fairseq"
        for side, acc in ((s, got_src), (t, got_tgt)):
            for toks in side:
                assert toks[-1] == d.eos() and (toks[:-1] != d.eos()).all()
                acc.append(sp.decode([sp.piece_to_id(d[int(x)]) for x in toks[:-1]]))
    assert got_src == [src_lines[i] for i in kept]
    assert got_tgt == [tgt_lines[i] for i in kept]
    entry = {e["key"] + "/" + e["split"]: e for e in report["inputs"]}["en-de/train"]
    assert (entry["lines"], entry["kept"], entry["empty"], entry["bad_utf8"], entry["overlong"]) == (400, 397, 1, 1, 1)
    assert json.loads((out / "binarize_report.json").read_text()) == report
    assert "dropped 1 empty, 1 over 200 tokens, 1 undecodable" in bz.format_report(report)
    assert not os.path.exists(out / ".binarize" / "work")


def test_workers_do_not_change_the_bytes(raw, tmp_path):
    binarize(opts(raw, tmp_path / "one", workers=1), log=quiet)
    binarize(opts(raw, tmp_path / "two", workers=2, spm_model=str(tmp_path / "one" / "spm.model"), train_spm=None),
             log=quiet)
    a, b = read_all(tmp_path / "one"), read_all(tmp_path / "two")
    assert a.keys() == b.keys() and a == b


def test_line_count_mismatch_names_both_files(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "en-de.en").write_text("a\nb\nc\n")
    (raw / "en-de.de").write_text("a\nb\n")
    with pytest.raises(BinarizeError) as info:
        binarize(opts(raw, tmp_path / "out"), log=quiet)
    msg = str(info.value)
    assert str(raw / "en-de.en") in msg and "3 lines" in msg and str(raw / "en-de.de") in msg and "has 2" in msg
    r = subprocess.run([sys.executable, "-m", "babelfeed.cli", "binarize", str(raw), "-o", str(tmp_path / "o"),
                        "--train-spm", "50"], capture_output=True, text=True)
    assert r.returncode == 2 and "line counts differ" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "policy,match",
    [({"empty": "error"}, r"en-de\.en: line 4 is empty"),
     ({"bad_utf8": "error"}, r"en-de\.de: line 6 is not valid UTF-8"),
     ({"overlong": "error"}, r"en-de\.en: line 10 has more than 200 tokens")],
)
def test_error_policies_name_file_and_line(raw, tmp_path, policy, match):
    with pytest.raises(BinarizeError, match=match):
        binarize(opts(raw, tmp_path / "out", **policy), log=quiet)


def test_keep_truncate_replace_policies(raw, tmp_path):
    out = tmp_path / "out"
    report = binarize(opts(raw, out, empty="keep", overlong="truncate", bad_utf8="replace", shards=1), log=quiet)
    e = [x for x in report["inputs"] if x["key"] == "en-de" and x["split"] == "train"][0]
    assert (e["kept"], e["dropped"], e["truncated"], e["replaced_utf8"]) == (400, 0, 1, 1)
    src, tgt = babelfeed.ShardedCorpus(out).open_pair("train", "en-de", 0)
    assert src[3].tolist() == [2]  # an empty sentence is just </s>
    assert len(src[9]) == 200 and src[9][-1] == 2  # truncated to max_len, </s> kept
    assert int(src.sizes.max()) == 200


def test_megatron_format_one_document_per_sentence(raw, tmp_path):
    out = tmp_path / "out"
    binarize(opts(raw, out, format="megatron", shards=1), log=quiet)
    ds = babelfeed.ShardedCorpus(out).open("train", "en-de", "en", 0)
    assert ds.format == "megatron" and ds.doc_idx.tolist() == list(range(len(ds) + 1))


def test_existing_spm_and_dict(raw, tmp_path):
    binarize(opts(raw, tmp_path / "a"), log=quiet)
    d = babelfeed.Dictionary.load(tmp_path / "a" / "dict.txt")
    # A user dictionary in another order (as NLLB's is): pieces map through it by string.
    custom = babelfeed.Dictionary()
    syms = [s for s in d.symbols[d.nspecial:] if not s.startswith("__")]
    for s in reversed(syms):
        custom.add_symbol(s)
    custom.save(tmp_path / "custom.txt")
    binarize(opts(raw, tmp_path / "b", train_spm=None, spm_model=str(tmp_path / "a" / "spm.model"),
                  dict_path=str(tmp_path / "custom.txt")), log=quiet)
    db = babelfeed.Dictionary.load(tmp_path / "b" / "dict.txt")
    a_ds = babelfeed.ShardedCorpus(tmp_path / "a").open("train", "en-de", "en", 0)
    b_ds = babelfeed.ShardedCorpus(tmp_path / "b").open("train", "en-de", "en", 0)
    for x, y in zip(a_ds, b_ds):
        assert [d[int(t)] for t in x] == [db[int(t)] for t in y]
        assert x.tolist() != y.tolist() or len(x) == 1


def test_resume_skips_finished_shards_and_matches_a_clean_run(raw, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    binarize(opts(raw, clean), log=quiet)
    out = tmp_path / "out"
    real_finish = bz.run._finish
    finished = []

    def crash_after_first(*args, **kw):
        if finished:
            raise KeyboardInterrupt  # the kill arrives while the second shard is being written
        real_finish(*args, **kw)
        finished.append(1)

    monkeypatch.setattr(bz.run, "_finish", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        binarize(opts(raw, out, spm_model=str(clean / "spm.model"), train_spm=None), log=quiet)
    monkeypatch.setattr(bz.run, "_finish", real_finish)
    logs = []
    binarize(opts(raw, out, spm_model=str(clean / "spm.model"), train_spm=None), log=logs.append)
    assert any("1 of 5 shard(s) already finalized" in m for m in logs), logs
    assert "; 1 of 5 shard(s) were already done by an earlier run" in format_report(json.loads(
        (out / "binarize_report.json").read_text()))
    assert read_all(out) == read_all(clean)
    # A third run has nothing to do.
    logs.clear()
    report = binarize(opts(raw, out, spm_model=str(clean / "spm.model"), train_spm=None), log=logs.append)
    assert any("5 of 5 shard(s) already finalized" in m for m in logs), logs
    assert report["lines_processed_this_run"] == 0
    assert sum(e["kept"] for e in report["inputs"]) == 397 + 2 + 50
    # It says so, instead of "0 lines encoded in 0.0 s (0 sentences/s" under the recorded table (issue 25).
    text = format_report(report)
    assert "all 5 shard(s) were already done by an earlier run: nothing encoded, the table is the counts" in text
    assert "sentences/s" not in text and "0 lines encoded" not in text


def test_changed_input_redoes_its_shards(raw, tmp_path):
    out = tmp_path / "out"
    binarize(opts(raw, out), log=quiet)
    time.sleep(0.01)
    (raw / "train.fr").write_bytes(b"un\ndeux\n")
    logs = []
    binarize(opts(raw, out, spm_model=str(out / "spm.model"), train_spm=None), log=logs.append)
    assert len(babelfeed.ShardedCorpus(out).open("train", "fr", shard=0)) + len(
        babelfeed.ShardedCorpus(out).open("train", "fr", shard=1)) == 2


def test_stale_outputs_refused_then_overwritten(raw, tmp_path):
    out = tmp_path / "out"
    binarize(opts(raw, out, shards=2), log=quiet)
    with pytest.raises(BinarizeError, match="would not write"):
        binarize(opts(raw, out, shards=1), log=quiet)
    binarize(opts(raw, out, shards=1, overwrite=True), log=quiet)
    assert babelfeed.ShardedCorpus(out).shards == [0]


KILL_SCRIPT = """
import sys
from babelfeed.preprocess.binarize import BinarizeOptions, binarize, format_report
binarize(BinarizeOptions(input_dir=sys.argv[1], output_dir=sys.argv[2], spm_model=sys.argv[3], shards=6,
                         workers=1, max_len=200, chunk_lines=50, progress=False), log=lambda m: None)
"""


def test_sigkill_then_rerun_gives_the_clean_output(tmp_path):
    raw = tmp_path / "raw"
    make_raw(raw, n=6000, seed=3)
    clean = tmp_path / "clean"
    binarize(opts(raw, clean, shards=6, chunk_lines=50), log=quiet)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(raw), str(out), str(clean / "spm.model")])
    deadline = time.time() + 60
    records = out / ".binarize"
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and any(n.endswith(".json") and "shard" in n for n in os.listdir(records)):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; give it more work"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [n for n in os.listdir(records) if n.endswith(".json") and "shard" in n]
    assert 1 <= len(done) < 8  # killed with finished and unfinished shards on disk
    # Whatever the kill interrupted is either complete or invisible.
    for prefix in (p for p in babelfeed.ShardedCorpus(out, check=False).files):
        babelfeed.IndexedDataset(prefix.prefix)
    subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(raw), str(out), str(clean / "spm.model")], check=True)
    assert read_all(out) == read_all(clean)
    assert not [n for d, _, ns in os.walk(out) for n in ns if n.endswith(".partial")]


def test_sentencepiece_training_is_timed_apart_and_a_smaller_vocabulary_is_said(raw, tmp_path):
    logs = []
    report = binarize(opts(raw, tmp_path / "big", train_spm=5000), log=logs.append)
    trained = [m for m in logs if m.startswith("SentencePiece trained in")]
    assert len(trained) == 1 and "fewer than the 5,000 asked" in trained[0], logs
    assert any("no progress is shown until it ends" in m for m in logs)
    assert 0 < report["encode_seconds"] <= report["seconds"]
    assert f"{report['seconds']:.1f} s in all" in format_report(report)
    logs = []
    binarize(opts(raw, tmp_path / "small", train_spm=60), log=logs.append)
    assert not any("fewer than" in m for m in logs)


def test_character_coverage_lowers_the_unk_count_and_the_report_names_the_characters(tmp_path):
    """The default coverage (0.9995) left a user's rare accented letters out of the model: 251 <unk> and nothing
    to say which (issue 25). --character-coverage 1.0 gives them pieces; the report names what became <unk>,
    with its occurrences, counted across chunks and shards."""
    rng = np.random.default_rng(5)
    raw = tmp_path / "raw"
    raw.mkdir()
    en = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 6)) for _ in range(600)]
    es = [s.upper() for s in en]
    for i in (10, 300, 590):
        es[i] += " canci\u00f3n"  # 3 x ó
    for i in (70, 450):
        es[i] += " m\u00e1s"  # 2 x á
    (raw / "en-es.en").write_text("\n".join(en) + "\n")
    (raw / "en-es.es").write_text("\n".join(es) + "\n")
    default = binarize(opts(raw, tmp_path / "default", train_spm=100), log=quiet)
    [entry] = default["inputs"]
    # (each language keeps what its own sample needs at the coverage, so the rarest of Spanish's may stay out)
    chars = entry["unk_chars"]
    assert entry["unk_tokens"] == sum(chars.values()) >= 2 and set(chars) <= {"\u00f3", "\u00e1"}
    text = format_report(default)
    assert "unk tok: tokens encoded as <unk>" in text
    listed = ", ".join(f"{ch!r} {n}" for ch, n in chars.items())
    assert f"  train.en-es: {listed}" in text and "train with --character-coverage 1.0" in text
    logs = []
    full = binarize(opts(raw, tmp_path / "full", train_spm=100, spm_character_coverage=1.0), log=logs.append)
    assert full["inputs"][0]["unk_tokens"] == 0 and full["inputs"][0]["unk_chars"] == {}
    assert any("character coverage 1" in m for m in logs), logs
    assert "unk tok: tokens encoded as <unk>, text the SentencePiece model has no piece for: none" in \
        format_report(full)
    with pytest.raises(UsageError, match="--character-coverage 1 is a setting of SentencePiece training"):
        binarize(opts(raw, tmp_path / "x", train_spm=None, spm_model=str(tmp_path / "full" / "spm.model"),
                      spm_character_coverage=1.0), log=quiet)


@pytest.mark.parametrize("model", ["golden", "byte_fallback"])
def test_the_fewest_tokens_of_a_line_never_exceed_its_tokens(model, tmp_path):
    """The bound that drops a line before encoding it (issue 23 item 11) is a lower bound: random text of every
    kind (unknown characters, which SentencePiece merges into one <unk>; spaces it collapses; long words) never
    encodes to fewer tokens than it says."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import golden
    from babelfeed.preprocess.binarize.encode import _fewest_tokens

    if model == "golden":
        sp = spm.SentencePieceProcessor(model_file=golden.SPM)
    else:
        text = tmp_path / "t.txt"
        text.write_text("\n".join(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(9)) for i in range(300)))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "m"), vocab_size=290,
                                       byte_fallback=True, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))

    @given(st.lists(st.sampled_from(list("thecatsa mdogrun\t\u200b\u3000ﬁÅ日本€x") + ["  ", "the ", "cat"]),
                    max_size=300).map("".join))
    @settings(max_examples=300, deadline=None)
    def check(t):
        assert _fewest_tokens(sp, t) <= len(sp.encode(t))

    check()


def test_an_overlong_line_is_dropped_without_encoding_it(tmp_path):
    """A 50 MB line took 1.8 GB per worker to encode, only to be dropped (issue 23 item 11). A 30 MB line is
    dropped from its length: the binarize process's peak memory stays far below what encoding it takes."""
    raw = tmp_path / "raw"
    make_raw(raw, n=200, bad=False)
    with open(raw / "en-de.en", "ab") as f:
        f.write(b"cat sat on the mat " * 1_600_000 + b"\n")
    with open(raw / "en-de.de", "ab") as f:
        f.write(b"CAT\n")
    # the peak of this process's own memory (VmHWM): ru_maxrss also keeps the parent's peak from before the exec,
    # so under a pytest worker grown to 1.8 GB by earlier tests it read 1,820 MB whatever binarize did
    script = ("import sys\nfrom babelfeed.cli import main\nrc = main(sys.argv[1:])\n"
              "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1]\n"
              "print('peak', int(hwm) // 1024)\nsys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", script, "binarize", str(raw), "-o", str(tmp_path / "out"),
                          "--train-spm", "60", "--workers", "1", "--max-len", "200", "--no-progress"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    peak = int(out.stdout.strip().splitlines()[-1].split()[1])
    assert peak < 1000, f"peak {peak} MB"  # (encoding it took 1.8 GB)
    assert babelfeed.ShardedCorpus(tmp_path / "out").num_sentences("train", "en-de") == 200


def _children(pid: int) -> set:
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out |= {int(x) for x in f.read().split()}
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _binarize_with_workers_encoding(tmp_path, output=subprocess.PIPE):
    """``binarize --workers 2`` started in a process of its own, its TMPDIR ``tmp_path / "tmp"``, returned once both
    workers are encoding: ``(process, its children, tmp)``."""
    raw = tmp_path / "raw"
    make_raw(raw, n=60000, bad=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "babelfeed.cli", "binarize", str(raw), "-o", str(tmp_path / "out"),
                          "--train-spm", "60", "--workers", "2", "--shards", "4", "--chunk-lines", "500",
                          "--no-progress"], stdout=output, stderr=output, env=dict(os.environ, TMPDIR=str(tmp)))
    work = tmp_path / "out" / ".binarize" / "work"
    deadline = time.monotonic() + 120
    workers: set = set()
    while time.monotonic() < deadline and p.poll() is None:  # until both workers are encoding
        workers = {c for c in _children(p.pid) if _alive(c)}
        # (the resource tracker and two workers; and a chunk's file written: the pool also samples text for
        # SentencePiece, and a signal sent a fixed time after that could land after the last chunk, on a busy
        # machine, which made the SIGTERM test fail as if SIGTERM were ignored)
        if len(workers) >= 3 and work.is_dir() and any(f for _, _, fs in os.walk(work) for f in fs):
            break
        time.sleep(0.02)
    assert p.poll() is None, "binarize ended before its workers started: give it more work"
    return p, workers | _children(p.pid), tmp


def _wait_gone(pids, seconds: float) -> list:
    """The ``pids`` still alive after up to ``seconds`` (an exit is seen by polling, not after a fixed sleep)."""
    deadline = time.monotonic() + seconds
    while [w for w in pids if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.01)
    return [w for w in pids if _alive(w)]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads worker processes from /proc (Linux)")
def test_sigterm_stops_the_workers_and_cleans_up_as_ctrl_c_does(tmp_path):
    """SIGTERM (what Slurm, Kubernetes and timeout send) to binarize --workers 2 left the workers running, holding
    the caller's pipe, and the engine's temporary folder behind (issue 23 item 9): it exits with 143, its
    workers gone, nothing temporary left."""
    p, workers, tmp = _binarize_with_workers_encoding(tmp_path)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)  # hung for ever when the workers held the pipe
    assert p.returncode == 143 and "terminated (SIGTERM)" in err.decode(), (p.returncode, err.decode()[-2000:],
                                                                          out.decode()[-500:])
    assert not _wait_gone(workers, 10), "worker processes outlived binarize"
    assert not [n for n in os.listdir(tmp) if n.startswith("babelfeed-engine-")]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads worker processes from /proc (Linux)")
def test_sigkill_takes_the_workers_with_it_and_the_next_engine_removes_its_folder(tmp_path):
    """kill -9 of binarize --workers 2 (the OOM killer, a preempting scheduler) left 3 worker processes running 21 s
    later and the engine's temporary folder behind (issue 39 item 1). The workers watch their parent and end with
    it; the next local engine removes the folder of an engine whose process is gone."""
    from babelfeed.preprocess.engines import ORPHAN_POLL, _remove_orphaned_dirs
    p, workers, tmp = _binarize_with_workers_encoding(tmp_path, subprocess.DEVNULL)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert not _wait_gone(workers, 10 + 4 * ORPHAN_POLL), "worker processes outlived binarize killed with SIGKILL"
    left = [n for n in os.listdir(tmp) if n.startswith(f"babelfeed-engine-{p.pid}-")]
    assert left, "the killed run left no folder: nothing to test the clean-up on"
    mine = tmp / "babelfeed-engine-{}-live".format(os.getpid())  # a live process's folder is left alone
    mine.mkdir()
    assert _remove_orphaned_dirs(str(tmp)) == [str(tmp / left[0])]
    assert sorted(os.listdir(tmp)) == [mine.name]


def test_two_runs_into_one_output_the_second_is_refused_naming_the_first(tmp_path):
    """Two binarize runs into one output: one failed naming an internal work file (issue 23 item 16). The first
    holds a lock on the folder; the second is refused at once, naming the first's pid."""
    raw = tmp_path / "raw"
    make_raw(raw, n=60000, bad=False)
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "babelfeed.cli", "binarize", str(raw), "-o", str(out),
                              "--train-spm", "60", "--workers", "1", "--no-progress"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (out / ".binarize" / "lock").exists() or not (out / ".binarize" / "lock").read_text():
            assert time.monotonic() < deadline and first.poll() is None, "the first run did not start"
            time.sleep(0.05)
        with pytest.raises(BinarizeError, match=f"another binarize is writing into it \\(pid {first.pid} on "):
            binarize(opts(raw, out), log=quiet)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    binarize(opts(raw, out, chunk_lines=20000), log=quiet)  # the lock went with the first run: this one goes on
