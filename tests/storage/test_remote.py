"""Data in an object store (issue 24): a data folder at s3://bucket/prefix gives the batches of the same data on
local disk, bit for bit, through the host's fetcher; indexes are fetched once and checked as local ones."""

import os
import pathlib

import numpy as np
import pytest

import babelfeed
from babelfeed.iterators import fetch_ahead
import golden
from helpers import run_fresh
from s3server import s3, s3_env  # noqa: F401  (fixtures)
from synthetic import config_for, make_data_bin


def leaves(batch, prefix=""):
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = np.asarray(v)
    return out


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        lx, ly = leaves(x), leaves(y)
        assert lx.keys() == ly.keys()
        for k in lx:
            assert lx[k].dtype == ly[k].dtype and np.array_equal(lx[k], ly[k]), k


def test_translation_batches_from_s3_equal_the_local_copy(tmp_path, s3_env):
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "runs/data_bin")
    from babelfeed.storage.remote import client as remote

    timed = babelfeed.Timed(babelfeed.build_train_iterator(config_for(local, data__shards="all")))
    mine = list(timed)
    local_wait = timed.telemetry()  # the loop's wait on local data: no fetcher started for it
    assert local_wait["data/batches"] == len(mine) and local_wait["data/wait_seconds"] > 0
    assert not remote.in_use() and not os.path.exists(remote.socket_path()) and remote.telemetry() == {}
    timed = babelfeed.Timed(babelfeed.build_train_iterator(config_for(url, data__shards="all")))
    theirs = list(timed)
    same_batches(mine, theirs)
    both = timed.telemetry()
    assert both["data/batches"] == len(theirs) and both["fetch/requests"] > 0
    assert all(isinstance(v, (int, float)) for v in both.values())

    got = remote.stats()
    assert got["bytes"] > 0 and got["requests"] > 0
    flat = remote.telemetry()  # a flat dict of numbers, as loggers take it
    assert all(isinstance(v, (int, float)) for v in flat.values()) and flat["fetch/latency_p50_ms"] > 0
    assert flat["fetch/wait_seconds"] > 0 and flat["fetch/bytes_held"] >= got["bytes"]  # (in 4 KiB blocks)
    import stat

    for folder in (tmp_path / "cache", tmp_path / "cache" / "objects"):  # the shadows are the user's alone
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    # a second epoch, and a new iterator, read what is held: nothing fetched again
    again = list(babelfeed.build_train_iterator(config_for(url, data__shards="all")))
    same_batches(mine, again)
    assert remote.stats()["bytes"] == got["bytes"]


def lm_config(where, tmp_path, batches: int):
    """The golden LM data's two datasets, blended, ``batches`` global batches of 12 rows of 24 tokens."""
    cfg = babelfeed.load_config("lm_packing")
    cfg.data_path = f"0.4 {where}/web 0.6 {where}/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * batches
    cfg.split, cfg.cache_dir = "90,10,0", str(tmp_path / "lmcache")
    return cfg


def test_lm_batches_from_s3_equal_the_local_copy(tmp_path, s3_env):
    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = s3_env.upload(str(root / "lm"), "bkt", "lm")

    def config(where):
        return lm_config(where, tmp_path, 20)

    same_batches(list(babelfeed.build_iterator(config(root / "lm"))), list(babelfeed.build_iterator(config(url))))


def test_lm_batches_from_s3_are_fetched_ahead_in_groups_on_each_rank(tmp_path, s3_env, monkeypatch):
    """The LM iterator fetches its next batches' pieces ahead (pinned in groups, the later ones hinted): its
    gathers ask the fetcher nothing, and each of two ranks equals the local copy's rank, every leaf."""
    from babelfeed.storage.remote import client as remote

    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = s3_env.upload(str(root / "lm"), "bkt", "lm2")

    def config(where):
        return lm_config(where, tmp_path, 40)

    ops = []
    real = remote.request
    monkeypatch.setattr(remote, "request", lambda msg: ops.append(msg["op"]) or real(msg))
    for rank in (0, 1):
        mine = list(babelfeed.build_iterator(config(root / "lm"), rank=rank, world_size=2))
        ops.clear()
        theirs = list(babelfeed.build_iterator(config(url), rank=rank, world_size=2))
        same_batches(mine, theirs)
        assert len(theirs) == 40 and 2 <= ops.count("ensure") <= 4, ops  # (1 batch, 16, then the rest: not 40)
        assert ops.count("hint") >= 1 and ops.count("plan") == 1


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_workers_read_s3_through_the_one_fetcher(tmp_path, s3_env, context):
    """DataLoader workers (forked: an object-store client in the parent would hang them) gather from the shadow;
    the host's one fetcher downloads each byte once."""
    pytest.importorskip("torch")
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "w/data_bin")
    if context == "fork":  # (in a fresh interpreter: this one may hold JAX's threads)
        run_fresh("test_remote", "torch_workers_read_s3", str(local), url, context)
    else:
        torch_workers_read_s3(str(local), url, context)


def torch_workers_read_s3(local: str, url: str, context: str) -> None:
    from babelfeed.adapters.torch import BatchLoader
    from babelfeed.storage.remote import client as remote

    local = pathlib.Path(local)
    mine = list(babelfeed.build_train_iterator(config_for(local, data__shards="all")))
    loader = BatchLoader(config_for(url, data__shards="all"), num_workers=2, multiprocessing_context=context,
                         tensors=False)
    theirs = [b for b in loader]
    same_batches(mine, theirs)
    st = remote.stats()
    data = sum(p.stat().st_size for p in local.rglob("*.bin"))
    # no byte downloaded for two workers: what came back is each byte once, plus what a block request spanned
    # that was here already (runs shorter than the gap, each spanned once at most: never written twice; how
    # much depends on how many gathers waited before the blocks came, so on the machine's load)
    assert st["bytes"] - st["bytes_again"] <= data and st["bytes_again"] <= data, st  # (not twice over)


def test_an_object_replaced_in_the_store_mid_run_is_refused_by_name(tmp_path, s3_env, monkeypatch):
    """The fetcher reads every range with the ETag the job opened as a precondition: a .bin replaced in the
    store (same size) is refused at its next range, never mixed with the bytes fetched before."""
    monkeypatch.setenv("BABELFEED_FETCH_GAP", "128")  # neighbouring rows only: the rest is fetched as batches ask
    monkeypatch.setenv("BABELFEED_FETCH_DENSE", "2")  # (never whole blocks: this epoch reads every row)
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.002")  # (a few batches ahead)
    monkeypatch.setattr(fetch_ahead, "GROUP", 2)
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [6000], "aaa-ccc": [100]}, valid=False)  # (the open check reads
    # the last 4,096 records' ends: the first rows of aaa-bbb are left to the batches)
    url = s3_env.upload(str(local), "bkt", "r/data_bin")
    it = babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    next(it)
    victim = next(p for p in sorted(local.rglob("*.bin")) if "aaa-bbb" in p.name)
    key = f"r/data_bin/{victim.relative_to(local).as_posix()}"
    s3_env.client().put_object(Bucket="bkt", Key=key, Body=victim.read_bytes()[::-1])  # same size, new ETag
    with pytest.raises(babelfeed.DataChangedError, match=rf"s3://bkt/{key}: changed in the store while the job "
                                                         rf"reads it"):
        for _ in it:
            pass


def test_a_missing_bucket_or_prefix_is_one_line_naming_it(tmp_path, s3_env, capsys):
    from babelfeed.tools.cli import main

    s3_env.client().create_bucket(Bucket="empty")
    assert main(["inspect", "s3://empty/nothing/here"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3://empty/nothing/here: no objects under this prefix" in err[0], err
    assert main(["inspect", "s3://no-such-bucket/data"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3://no-such-bucket" in err[0] and "Traceback" not in err[0], err


@pytest.mark.parametrize("fault", ["503", "cut"])
def test_throttling_and_bodies_cut_short_are_retried_and_never_served(tmp_path, s3_env, monkeypatch, fault):
    """Through a proxy that answers 503 (SlowDown) to a third of the requests or cuts a third of the bodies short:
    the batches are still the local copy's, bit for bit (a short body is retried or refused, never served)."""
    from s3proxy import FaultProxy

    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", f"f{fault}/data_bin")
    proxy = FaultProxy(s3_env.port, fail_rate=0.33 if fault == "503" else 0.0,
                       cut_rate=0.33 if fault == "cut" else 0.0, seed=3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        mine = list(babelfeed.build_train_iterator(config_for(local, data__shards="all")))
        theirs = list(babelfeed.build_train_iterator(config_for(url, data__shards="all")))
    finally:
        proxy.stop()
    same_batches(mine, theirs)
    assert proxy.counts["failed" if fault == "503" else "cut"] > 3, proxy.counts


def test_a_store_that_keeps_failing_is_one_error_naming_the_object_within_the_bound(tmp_path, s3_env, monkeypatch):
    import time

    from s3proxy import FaultProxy

    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "down/data_bin")
    proxy = FaultProxy(s3_env.port, fail_rate=1.0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("BABELFEED_FETCH_RETRY_SECONDS", "2")
    t0 = time.monotonic()
    try:
        with pytest.raises(babelfeed.BabelfeedError, match=r"s3://bkt/down/data_bin.*failed \(after \d+ "
                                                           r"retries; retries: at most \d+ within 2 s\)") as err:
            babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    finally:
        proxy.stop()
    assert time.monotonic() - t0 < 30 and "testing" not in str(err.value)  # bounded; no credential in it


def test_the_config_storage_section_names_the_endpoint(tmp_path, s3_env, monkeypatch):
    """data.storage.endpoint and allow_http, for a store the environment does not name."""
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "cfg/data_bin")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    cfg = config_for(url, data__shards="all", data__storage__endpoint=s3_env.endpoint, data__storage__allow_http=True)
    same_batches(list(babelfeed.build_train_iterator(config_for(local, data__shards="all"))),
                 list(babelfeed.build_train_iterator(cfg)))


def test_a_cache_smaller_than_the_data_evicts_and_the_batches_stay_exact(tmp_path, s3_env, monkeypatch):
    """BABELFEED_FETCH_CACHE_MB below the data's size: the fetcher punches holes in what no hint needs (never in
    what a gather may be reading), counts the disk in 4 KiB blocks and keeps near its limit, and the batches are
    still the local copy's, every leaf. (Here every batch touches most blocks of the data, so the cache thrashes:
    correctness, not speed; benchmarks/bench_remote.py measures the cache at sizes that fit a lookahead.)"""
    monkeypatch.setenv("BABELFEED_FETCH_CACHE_MB", "0.08")
    monkeypatch.setenv("BABELFEED_FETCH_GAP", "2048")
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.002")  # (a few batches ahead)
    monkeypatch.setattr(fetch_ahead, "GROUP", 2)
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [6000], "aaa-ccc": [1500], "aaa-ddd": [200]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "small/data_bin")
    kw = dict(data__shards="all", batching__max_tokens=256)
    n = 80
    mine = [b for _, b in zip(range(n), babelfeed.build_train_iterator(config_for(local, **kw)))]
    from babelfeed.storage.remote import client as remote

    theirs = [b for _, b in zip(range(n), babelfeed.build_train_iterator(config_for(url, **kw)))]
    same_batches(mine, theirs)
    import time

    st = remote.stats()
    for _ in range(50):  # (the last batches' lookahead may still be fetching: wait until the fetcher is quiet)
        time.sleep(0.1)
        st, before = remote.stats(), st
        if st["bytes"] == before["bytes"] and st["bytes_held"] == before["bytes_held"]:
            break
    data = sum(p.stat().st_size for p in local.rglob("*.bin"))
    assert st["cache_limit"] < data * 0.7 and st["evicted_bytes"] > 0 and st["bytes"] > st["cache_limit"]
    # quiet: what is held beyond the last batch's pins is within the limit, and the disk is what is held
    assert st["bytes_held"] - st["bytes_pinned"] <= st["cache_limit"], st
    files = list((tmp_path / "cache" / "objects").rglob("*.bin"))
    disk = sum(p.stat().st_blocks * 512 for p in files)
    assert disk <= st["bytes_held"] + (16 << 10) * len(files), (disk, st)  # (+ the file system's own blocks:
    # extent metadata, delayed allocation; a few blocks a file, seen under load)


def test_requests_never_span_a_held_piece(monkeypatch):
    """Coalescing two missing ranges across a held piece made overlapping pieces: evicting the inner one
    punched a hole in bytes the outer one still held, and a batch was served zeros (the cache test found it)."""
    import os
    import tempfile

    from babelfeed.storage.remote import limits, pieces, server

    monkeypatch.setattr(limits, "GAP", 16 << 10)  # (whatever another test of this process set)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.truncate(1 << 16)

        class FakeStore:
            async def get_range_async(self, key, a, b, etag):
                return bytes(b - a)

        remote = pieces.RemoteFile(FakeStore(), "k", 1 << 16, "", f.name)
        fet = server.Fetcher(tempfile.gettempdir())
        fet.remotes[f.name] = remote
        fet.ensure(f.name, [1000], [1100])
        fet.ensure(f.name, [900, 1200], [950, 1300])  # both sides of the held piece, within the gap
        pieces = [(p.a, p.b) for p in remote.held.items]
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(pieces, pieces[1:])), pieces
        assert remote.held.missing(np.array([900, 1200]), np.array([950, 1300])) == []
        assert fet.counters["bytes"] == 100 + 50 + 100  # (no byte fetched twice)
        fet.ensure(f.name, [5000, 7000], [5010, 7010])  # a gap with nothing held in it is bridged: one request
        assert fet.counters["requests"] == 4 and remote.held.missing(np.array([5000]), np.array([7010])) == []
        os.close(remote.fd)


def test_records_read_one_by_one_from_a_remote_folder_are_fetched_first(tmp_path, s3_env):
    """IndexedDataset.get on a shadow .bin (what preview, trace's text and tools read) fetches the record before
    reading it: a hole would read as zeros."""
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "one/data_bin")
    corpus = babelfeed.ShardedCorpus(url)
    mine = babelfeed.ShardedCorpus(local)
    rng = np.random.default_rng(0)
    for f, g in zip(corpus.files, mine.files):
        assert (f.split, f.direction, f.lang, f.shard) == (g.split, g.direction, g.lang, g.shard)
        a, b = babelfeed.IndexedDataset(f.prefix), babelfeed.IndexedDataset(g.prefix)
        for i in rng.choice(len(a), min(len(a), 5), replace=False).tolist():
            assert np.array_equal(a.get(i), b.get(i))


def test_the_command_line_inspects_plans_and_traces_an_s3_folder(tmp_path, s3_env, capsys):
    from babelfeed.tools.cli import main

    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "cli/data_bin")
    sets = ["--set", f"data.path={url}", "--set", "filter.max_source_positions=128",
            "--set", "filter.max_target_positions=128", "--set", "batching.max_tokens=512"]
    assert main(["inspect", url]) == 0
    assert "aaa-bbb" in capsys.readouterr().out
    assert main(["plan", "nllb_like", *sets]) == 0
    assert "padding efficiency" in capsys.readouterr().out
    assert main(["trace", "nllb_like", *sets, "--step", "3"]) == 0
    out = capsys.readouterr().out
    assert main(["trace", "nllb_like", "--set", f"data.path={local}", *sets[2:], "--step", "3"]) == 0
    assert capsys.readouterr().out == out  # the same samples as from the local copy


def test_a_remote_row_that_does_not_end_with_eos_is_refused_naming_the_file(tmp_path, s3_env):
    """A remote .bin is not read whole at open (that would download it): each row's </s> is checked as the
    gather fetches it, so a damaged object is refused by name instead of served."""
    local = tmp_path / "data_bin"
    make_data_bin(local, valid=False)
    victim = next(p for p in sorted(local.rglob("*.bin")) if p.name == "train.aaa-bbb.bbb.bin")
    ds = babelfeed.IndexedDataset(str(victim)[:-4])
    ptr, size = ds._span(7)
    data = bytearray(victim.read_bytes())
    data[ptr + (size - 1) * 2: ptr + size * 2] = (0).to_bytes(2, "little")  # record 7 ends with <s>, not </s>
    victim.write_bytes(bytes(data))
    url = s3_env.upload(str(local), "bkt", "bad/data_bin")
    with pytest.raises(babelfeed.FormatError, match=r"train\.aaa-bbb\.bbb\.bin: a row of aaa-bbb \(shard 0\) ends "
                                                    r"with token 0, not </s>"):
        for _ in babelfeed.build_train_iterator(config_for(url, data__shards="all")):
            pass


def _as_nobody(code: str):
    """Run ``code`` as uid 65534 (another user) in a child; its first line of output, and the child."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import os, socket, time  # (before: the interpreter's files may be root's only)\n"
                              "os.setgid(65534); os.setuid(65534)\n" + code],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child.stdout.readline().strip(), child


def test_no_other_user_can_take_the_fetchers_socket_or_serve_it(tmp_path, monkeypatch, request):
    """Issue 38: the socket's name was predictable in the shared temporary folder, so any local user could bind it
    first (our reads blocked until the cache folder changed). It now lies in a folder only this user can write
    (another user binding it is refused by the system); a folder of that name made first by someone else is not
    used (the socket goes to /tmp's, or the cache's private objects/); and a socket served by another user's process
    is still refused by the kernel's peer credentials."""
    import os
    import shutil

    from babelfeed.storage.remote import client as remote

    if os.getuid() != 0:
        pytest.skip("needs root to act as another user (CI runs as root)")
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    import tempfile
    tmp = tempfile.mkdtemp(prefix="bf", dir="/tmp")  # (short: a socket's path stays under ~100 bytes)
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    os.chmod(tmp, 0o1777)
    os.chmod(tmp_path, 0o755)
    path = remote.socket_path()
    folder = os.path.dirname(path)
    assert folder == os.path.join(tmp, f"babelfeed-{os.getuid()}") and os.stat(folder).st_mode & 0o777 == 0o700
    said, child = _as_nobody(f"import socket; s = socket.socket(socket.AF_UNIX)\ntry:\n s.bind({path!r}); print('bound')"
                             f"\nexcept PermissionError: print('refused')")
    child.wait()
    assert said == "refused", child.stderr.read()
    # another user made the folder first: not used; the cache's private objects/ holds the socket
    os.rmdir(folder)
    said, child = _as_nobody(f"import os; os.mkdir({folder!r}, 0o777); os.chmod({folder!r}, 0o777); print('made')")
    child.wait()
    assert said == "made" and os.stat(folder).st_uid == 65534
    path = remote.socket_path()  # (the next candidate: /tmp's, else the cache's objects/)
    st = os.stat(os.path.dirname(path))
    assert os.path.dirname(path) != folder and st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700, path
    # a socket another user's process serves (a folder where it could bind one): refused by peer credentials
    theirs = os.path.join(tmp, "fetcher.sock")
    said, child = _as_nobody(f"import socket, time; s = socket.socket(socket.AF_UNIX); s.bind({theirs!r}); "
                             f"s.listen(1); print('ready', flush=True); time.sleep(30)")
    try:
        assert said == "ready", child.stderr.read()
        with pytest.raises(babelfeed.BabelfeedError, match="served by another user's process"):
            remote._connect(theirs)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("sparse_gap", [None, "0"])
def test_two_hosts_each_fetch_their_own_rows_and_serve_the_local_copys_batches(tmp_path, s3_env, monkeypatch,
                                                                              sparse_gap):
    """Ranks 0 and 1 of 2, each with a cache (and fetcher) of its own, as two hosts: each serves exactly the local
    copy's batches of its rank. By default each fetches the files whole in a few requests (its rows, ~20 bytes, are
    a random half of each file: a request each would cost more than the bytes between); with
    ``BABELFEED_FETCH_SPARSE_GAP=0``, far less than the whole data (the rows of its own batches only; every row is
    read about once an epoch here, so about half), in many requests."""
    from babelfeed.storage.remote import client as remote
    from s3server import stop_fetcher

    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [1200], "aaa-ccc": [800]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "hosts/data_bin")
    data = sum(p.stat().st_size for p in local.rglob("*.bin"))
    kw = dict(data__shards="all", batching__max_tokens=512)
    if sparse_gap is not None:
        monkeypatch.setenv("BABELFEED_FETCH_SPARSE_GAP", sparse_gap)  # (read by the fetcher each host starts)
    for rank in (0, 1):
        cache = tmp_path / f"host{rank}"
        monkeypatch.setenv("BABELFEED_CACHE_DIR", str(cache))
        remote._folders.clear()
        remote._local.conn = None
        try:
            mine = list(babelfeed.build_train_iterator(config_for(local, **kw), rank=rank, world_size=2))
            theirs = list(babelfeed.build_train_iterator(config_for(url, **kw), rank=rank, world_size=2))
            same_batches(mine, theirs)
            st = remote.stats()
            if sparse_gap is None:
                assert data * 0.95 <= st["bytes"] <= data * 1.05 and st["requests"] <= 8, st
            else:
                assert 0 < st["bytes"] < 0.75 * data and st["requests"] > 100, st
        finally:
            stop_fetcher(str(cache))


def test_binarize_to_the_store_stages_resumes_and_uploads_the_same_bytes(tmp_path, s3_env, monkeypatch):
    """``binarize -o s3://...`` writes to a staging folder in the cache, resumes there after an interruption (no
    object written before the run ends), then uploads: every object equals the file of a local run."""
    from babelfeed.preprocess import binarize as bz
    from babelfeed.preprocess.options import BinarizeOptions

    raw = tmp_path / "raw"
    raw.mkdir()
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    rng = np.random.default_rng(0)
    lines = [" ".join(words[i] for i in rng.integers(0, 8, int(rng.integers(1, 9)))) for _ in range(300)]
    (raw / "en-de.en").write_text("\n".join(lines) + "\n")
    (raw / "en-de.de").write_text("\n".join(x.upper() for x in lines) + "\n")
    (raw / "en-fr.en").write_text("\n".join(lines[:100]) + "\n")
    (raw / "en-fr.fr").write_text("\n".join(x[::-1] for x in lines[:100]) + "\n")

    def opts(out, **kw):
        base = dict(input_dir=str(raw), output_dir=str(out), train_spm=40, shards=2, workers=1, chunk_lines=64,
                    progress=False)
        return BinarizeOptions(**{**base, **kw})

    clean = tmp_path / "clean"
    bz.binarize(opts(clean), log=lambda *a: None)
    url = "s3://bkt/written/data_bin"
    s3_env.client().create_bucket(Bucket="bkt")
    real_finish = bz.run._finish
    finished = []

    def crash_after_first(*args, **kw):
        if finished:
            raise KeyboardInterrupt
        real_finish(*args, **kw)
        finished.append(1)

    monkeypatch.setattr(bz.run, "_finish", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        bz.binarize(opts(url, spm_model=str(clean / "spm.model"), train_spm=None), log=lambda *a: None)
    c = s3_env.client()
    assert "Contents" not in c.list_objects_v2(Bucket="bkt", Prefix="written/")  # nothing that looks complete
    monkeypatch.setattr(bz.run, "_finish", real_finish)
    logs = []
    bz.binarize(opts(url, spm_model=str(clean / "spm.model"), train_spm=None), log=logs.append)
    assert any("already finalized" in m for m in logs) and any("uploaded" in m for m in logs), logs
    keys = {o["Key"][len("written/data_bin/"):] for o in c.list_objects_v2(Bucket="bkt", Prefix="written/")["Contents"]}
    want = {str(p.relative_to(clean)) for p in clean.rglob("*") if p.is_file() and ".binarize" not in str(p)}
    assert keys == want
    for k in keys:
        body = c.get_object(Bucket="bkt", Key=f"written/data_bin/{k}")["Body"].read()
        if k.endswith((".bin", ".idx", "dict.txt", "spm.model")):
            assert body == (clean / k).read_bytes(), k
    got = list(babelfeed.build_train_iterator(config_for(url, data__shards="all", batching__max_tokens=256)))
    mine = list(babelfeed.build_train_iterator(config_for(clean, data__shards="all", batching__max_tokens=256)))
    same_batches(mine, got)


def test_binarize_to_a_prefix_holding_another_runs_shards_refuses_or_replaces_them(tmp_path, s3_env):
    """A prefix written with --shards 2, then binarized into again with --shards 1 from another machine (no
    staging folder): refused before anything is uploaded; with --overwrite the other run's shards are deleted,
    and the folder reads as the new run alone (never a mix of the two)."""
    import os

    from babelfeed.preprocess import binarize as bz
    from babelfeed.preprocess.options import BinarizeOptions
    from babelfeed.storage.remote import client as remote

    raw = tmp_path / "raw"
    raw.mkdir()
    lines = [" ".join(["w%d" % (i * j % 7) for j in range(1 + i % 6)]) for i in range(120)]
    (raw / "en-de.en").write_text("\n".join(lines) + "\n")
    (raw / "en-de.de").write_text("\n".join(x.upper() for x in lines) + "\n")

    def opts(out, shards, **kw):
        return BinarizeOptions(**{**dict(input_dir=str(raw), output_dir=str(out), train_spm=30, shards=shards,
                                         workers=1, progress=False), **kw})

    url = "s3://bkt/twice/data_bin"
    s3_env.client().create_bucket(Bucket="bkt")
    bz.binarize(opts(url, 2), log=lambda *a: None)
    assert not os.listdir(remote.staging(url))  # (uploaded: the staging folder is removed, so this is as from
    # another machine)
    with pytest.raises(babelfeed.BinarizeError, match=r"s3://bkt/twice/data_bin holds 4 file\(s\).*shard001.*--overwrite"):
        bz.binarize(opts(url, 1), log=lambda *a: None)
    assert any("shard001" in n for n in remote.listing(url))  # (nothing deleted, nothing uploaded)
    bz.binarize(opts(url, 1, overwrite=True), log=lambda *a: None)
    assert not any("shard001" in n for n in remote.listing(url))
    local = tmp_path / "one"
    bz.binarize(opts(local, 1, spm_model=remote.local_folder(url) + "/spm.model", train_spm=None),
                log=lambda *a: None)
    remote._folders.clear()
    kw = dict(data__shards="all", batching__max_tokens=256)
    same_batches(list(babelfeed.build_train_iterator(config_for(local, **kw))),
                 list(babelfeed.build_train_iterator(config_for(url, **kw))))
    # a raw-text task (subword sampling with the folder's spm.model) reads the same from the store
    from babelfeed.config import task

    (local / "raw").mkdir()
    for lang, text in (("en", "\n".join(lines)), ("de", "\n".join(x.upper() for x in lines))):
        (local / "raw" / f"train.en-de.{lang}").write_text(text + "\n")
        s3_env.client().put_object(Bucket="bkt", Key=f"twice/data_bin/raw/train.en-de.{lang}", Body=text + "\n")
    remote._folders.clear()

    def sampled(where):
        cfg = config_for(where, **kw)
        with cfg.unlocked():
            cfg.tasks.raw = task("en-de", text="raw/{split}.{key}.{lang}", alpha=0.1, nbest=16)
        return list(babelfeed.build_train_iterator(cfg))

    same_batches(sampled(local), sampled(url))


def test_a_fetcher_killed_mid_run_is_replaced_and_the_batches_stay_exact(tmp_path, s3_env):
    """The host's fetcher dies (OOM killer, an operator) while a job reads: the next request starts a new one,
    which mirrors the job's folders again; the run goes on, batch for batch equal to the local copy."""
    import itertools
    import os
    import signal

    from babelfeed.storage.remote import client as remote

    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "killed/data_bin")
    kw = dict(data__shards="all", batching__max_tokens=256)
    mine = list(babelfeed.build_train_iterator(config_for(local, **kw)))
    it = babelfeed.build_train_iterator(config_for(url, **kw))
    theirs = list(itertools.islice(it, 5))
    os.kill(remote.request({"op": "ping"})["pid"], signal.SIGKILL)
    theirs += list(it)
    same_batches(mine, theirs)


def test_lm_torch_workers_read_s3_ahead_each_its_own(tmp_path, s3_env):
    """Two DataLoader workers over an LM run on S3: each fetches ahead the batches it makes (the adapter tells
    it the stride); the batches equal the local copy's, every leaf."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader

    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = s3_env.upload(str(root / "lm"), "bkt", "lm3")

    def config(where):
        return lm_config(where, tmp_path, 30)

    mine = list(babelfeed.build_iterator(config(root / "lm")))
    theirs = list(BatchLoader(config(url), num_workers=2, tensors=False, multiprocessing_context="spawn"))
    assert len(theirs) == 30
    same_batches(mine, theirs)


def test_each_process_reads_the_store_its_own_environment_names(tmp_path, s3_env, monkeypatch):
    """The host's fetcher outlives the process that started it: a process with another endpoint (two stores
    holding a bucket of one name) reads its own store, never the first one's, and an endpoint that is down is
    an error, not the starter's data."""
    from s3server import S3Server

    from babelfeed.storage.remote import client as remote

    one, two = tmp_path / "one", tmp_path / "two"
    make_data_bin(one, directions={"aaa-bbb": [40]}, valid=False)
    make_data_bin(two, directions={"aaa-ccc": [30]}, valid=False)
    url = s3_env.upload(str(one), "bkt", "same/data_bin")
    other = S3Server()
    try:
        assert other.upload(str(two), "bkt", "same/data_bin") == url
        first = remote.local_folder(url)
        assert any("aaa-bbb" in n for n in os.listdir(os.path.join(first, "shard000")))
        monkeypatch.setenv("AWS_ENDPOINT_URL", other.endpoint)
        remote._folders.clear()
        second = remote.local_folder(url)
        names = os.listdir(os.path.join(second, "shard000"))
        assert second != first and any("aaa-ccc" in n for n in names) and not any("aaa-bbb" in n for n in names)
    finally:
        other.stop()
    remote._folders.clear()
    with pytest.raises(babelfeed.errors.BabelfeedError, match="s3://bkt"):
        remote.local_folder(url)  # (the second store is gone: its endpoint refuses)


def test_inspect_verify_on_the_store_checks_the_objects_bytes(tmp_path, s3_env, capsys):
    """``inspect --verify`` on s3:// checks the tokens of the objects (fetched whole), not the holes of their
    shadows: a .bin whose last rows were zeroed is refused as locally."""
    from babelfeed.tools.cli import main

    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [300]}, valid=False)
    clean = s3_env.upload(str(local), "bkt", "clean/data_bin")
    assert main(["inspect", clean, "--verify"]) == 0, capsys.readouterr().err  # (its holes would read as zeros)
    victim = sorted(local.rglob("*.bin"))[0]
    data = bytearray(victim.read_bytes())
    data[-64:] = bytes(64)
    victim.write_bytes(bytes(data))
    url = s3_env.upload(str(local), "bkt", "zeroed/data_bin")
    assert main(["inspect", str(local), "--verify"]) != 0
    want = capsys.readouterr().err
    assert main(["inspect", url, "--verify"]) != 0
    err = capsys.readouterr().err
    assert "ends with token 0" in want and "ends with token 0" in err, (want, err)
    assert f"{url}/shard000/train.aaa-bbb" in err and "objects" not in err  # (the object named, not its shadow)
