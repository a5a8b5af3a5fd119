"""The fetcher against what an adversarial audit found (issue 38): a hung fetcher, a planted cache folder, credentials
in an endpoint, folder markers and stray keys in a listing, bodies cut short, a full disk, and an object replaced in
the store while its bytes are cached. Each test fails on the code before its fix."""

import itertools
import os
import signal
import time
import warnings

import numpy as np
import pytest

import babelfeed
import golden
from babelfeed.errors import BabelfeedError, StoreError, StoreNotice
from s3server import s3, s3_env  # noqa: F401  (fixtures)
from synthetic import config_for, make_data_bin
from test_remote import lm_config, same_batches

KW = dict(data__shards="all", batching__max_tokens=256)


def _open_in_another_process(url: str) -> None:
    """Another job on the host opens remote folder ``url`` (mirrors it through the host's fetcher), with this
    process's environment."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import sys; from babelfeed.storage.remote import client; "
                    "client.local_folder(sys.argv[1])", url], check=True, timeout=120)


def _remote():
    from babelfeed.storage.remote import client as remote
    return remote


def test_a_stopped_fetcher_is_noticed_killed_and_replaced(tmp_path, s3_env, monkeypatch):
    """SIGSTOP of the fetcher: every process of the host waited in recv for ever, silently. A request now asks the
    fetcher (a ping on another connection) whether it is alive while it waits; silent for BABELFEED_FETCHER_HUNG
    seconds, it is killed, a new one started (the run's folders mirrored again), and the user told once; the
    batches stay the local copy's."""
    remote = _remote()
    monkeypatch.setattr(remote, "HUNG_SECONDS", 1.5)
    monkeypatch.setattr(remote, "_SLICE", 0.3)
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "hung/data_bin")
    mine = list(babelfeed.build_train_iterator(config_for(local, **KW)))
    it = babelfeed.build_train_iterator(config_for(url, **KW))
    theirs = list(itertools.islice(it, 3))
    pid = remote.request({"op": "ping"})["pid"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs += list(it)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    same_batches(mine, theirs)
    said = [str(w.message) for w in caught if issubclass(w.category, StoreNotice)]
    assert len(said) == 1 and f"fetcher (pid {pid}) did not answer for 2 s" in said[0], said
    assert remote.request({"op": "ping"})["pid"] != pid and time.monotonic() - t0 < 60


def test_a_slow_answer_from_a_live_fetcher_is_waited_for(tmp_path, monkeypatch):
    """The liveness check must not kill a fetcher that is busy: an answer that takes several check intervals (a
    store retrying) arrives, because the fetcher answers pings meanwhile."""
    import socket
    import threading

    from babelfeed.storage.remote import wire

    remote = _remote()
    monkeypatch.setattr(remote, "HUNG_SECONDS", 1.0)
    monkeypatch.setattr(remote, "_SLICE", 0.2)
    path = str(tmp_path / "f.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)

    def answer(conn):
        msg = wire.receive(conn)
        if msg["op"] == "slow":
            time.sleep(2.5)  # (longer than HUNG_SECONDS, pinged meanwhile)
        wire.send(conn, {"ok": msg["op"]})

    def serve():  # (a thread per connection, as the fetcher's)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    conn = remote._connect(path)
    assert remote._exchange(conn, {"op": "slow"}, path) == {"ok": "slow"}
    server.close()


def test_a_planted_cache_folder_is_refused(tmp_path, monkeypatch):
    """In a shared BABELFEED_CACHE_DIR another user pre-created objects/ (or staging/) with fetcher.lock and
    fetcher.log as links: babelfeed followed them, creating and appending to files of their choosing. objects/ and
    staging/ are now refused as stamps/ is (a link, not ours, or writable by others), and the lock and log are
    never opened through a link."""
    remote = _remote()
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(cache))
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fetcher.log").symlink_to(victim)
    (elsewhere / "fetcher.lock").symlink_to(tmp_path / "created-by-us")
    (cache / "objects").symlink_to(elsewhere)
    with pytest.raises(StoreError, match=r"objects: refused as the folder of the fetcher's shadows.*it is a link"):
        remote._start(str(cache), str(tmp_path / "s.sock"))
    (cache / "objects").unlink()
    (cache / "objects").mkdir(mode=0o777)
    os.chmod(cache / "objects", 0o777)
    with pytest.raises(StoreError, match=r"writable by others \(mode 0o777\)"):
        remote._start(str(cache), str(tmp_path / "s.sock"))
    os.chmod(cache / "objects", 0o700)
    (cache / "objects" / "fetcher.lock").symlink_to(tmp_path / "created-by-us")
    with pytest.raises(OSError):  # (O_NOFOLLOW: the system refuses the link)
        remote._start(str(cache), str(tmp_path / "s.sock"))
    assert victim.read_text() == "theirs\n" and not (tmp_path / "created-by-us").exists()
    (cache / "staging").mkdir(mode=0o777)
    os.chmod(cache / "staging", 0o777)
    with pytest.raises(StoreError, match=r"staging: refused as the folder of staged output"):
        remote.staging("s3://bkt/out")


def test_credentials_in_an_endpoint_are_never_printed(tmp_path, s3_env, monkeypatch):
    """An endpoint URL may carry user:secret@; errors printed it (the store does not answer ... GET
    http://KEY:SECRET@host/...). Every message and the fetcher's log name it as ***@."""
    from s3server import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://KEYID:SUPERSECRET@127.0.0.1:{free_port()}")
    monkeypatch.setenv("BABELFEED_FETCH_RETRY_SECONDS", "1")
    with pytest.raises(babelfeed.BabelfeedError) as err:
        babelfeed.build_train_iterator(config_for("s3://bkt/nowhere/data_bin", **KW))
    text = str(err.value)
    assert "SUPERSECRET" not in text and "KEYID" not in text and "***@127.0.0.1" in text, text
    log = (tmp_path / "cache" / "objects" / "fetcher.log").read_text()
    assert "SUPERSECRET" not in log


def test_folder_markers_and_stray_keys_are_skipped(tmp_path, s3_env):
    """The S3 console's folder markers (zero-byte keys ending in /) made the folder unreadable ('shard000: no such
    object'); one stray key ('..', 'a//b') refused it all, worded as a network failure. Markers are ignored; stray
    keys are skipped with one warning naming them; the batches are the local copy's."""
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "odd/data_bin")
    c = s3_env.client()
    for key in ("odd/data_bin/", "odd/data_bin/shard000/", "odd/data_bin/empty/"):
        c.put_object(Bucket="bkt", Key=key, Body=b"")
    mine = list(babelfeed.build_train_iterator(config_for(local, **KW)))
    same_batches(mine, list(babelfeed.build_train_iterator(config_for(url, **KW))))
    for key in ("odd/data_bin/..", "odd/data_bin//stray", "odd/data_bin/shard000/./x"):
        c.put_object(Bucket="bkt", Key=key, Body=b"zz")
    _remote()._folders.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        theirs = list(babelfeed.build_train_iterator(config_for(url, **KW)))
    same_batches(mine, theirs)
    said = [str(w.message) for w in caught if issubclass(w.category, StoreNotice)]
    assert len(said) == 1 and "skipped 3 stray keys" in said[0] and "'odd/data_bin/..'" in said[0] and \
        "'odd/data_bin//stray'" in said[0], said


def test_bodies_closed_before_their_length_are_retried(tmp_path, s3_env, monkeypatch):
    """A connection closed before its Content-Length, every time for more tries than the store client makes on
    its own: the fetcher asks again (with backoff, within the retry bound) and serves the whole body, never a
    short one."""
    from s3proxy import FaultProxy

    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [400], "aaa-ccc": [60]}, valid=False)  # (few objects: each GET
    # waits out its backoff)
    url = s3_env.upload(str(local), "bkt", "cut/data_bin")
    proxy = FaultProxy(s3_env.port, cut_first=12)  # (each object's first 12 GETs cut short: more than the
    # store client's own 10 retries)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("BABELFEED_FETCH_BACKOFF_MS", "1")  # (the fetcher this test starts waits little)
    try:
        theirs = list(babelfeed.build_train_iterator(config_for(url, **KW)))
    finally:
        proxy.stop()
    same_batches(list(babelfeed.build_train_iterator(config_for(local, **KW))), theirs)
    assert proxy.counts["cut"] >= 12, proxy.counts


@pytest.mark.parametrize("kind", ["translation", "lm"])
def test_a_mirror_that_failed_part_way_then_succeeds_serves_the_local_copys_batches(tmp_path, s3_env, monkeypatch,
                                                                                    kind):
    """One index unreadable at the first open (404: the error names it); the store fixed, the next open on the
    same host (its fetcher still running) serves exactly the local copy's batches. The failed mirror had made the
    .bin shadows, and the next one made them again but kept their first records, so the fetcher wrote where no
    reader looked: rows of zeros (translation: 'damaged'; LM: silently)."""
    from s3proxy import FaultProxy

    from babelfeed.storage.remote import client as remote

    if kind == "lm":
        golden.make_lm_data(tmp_path / "local")
        local = tmp_path / "local" / "lm"
        build = lambda where: babelfeed.build_iterator(lm_config(where, tmp_path, 20))  # noqa: E731
        broken = "books.idx"
    else:
        local = tmp_path / "data_bin"
        make_data_bin(local, directions={"aaa-bbb": [300], "aaa-ccc": [60]}, valid=False)
        build = lambda where: babelfeed.build_train_iterator(config_for(where, **KW))  # noqa: E731
        broken = "aaa-ccc.aaa.idx"
    url = s3_env.upload(str(local), "bkt", f"half-{kind}/data")
    proxy = FaultProxy(s3_env.port)
    proxy.refuse[broken] = 404
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        with pytest.raises(BabelfeedError, match=broken.replace(".", r"\.") + ": no such object"):
            build(url)
        proxy.refuse.clear()
        remote._folders.clear()
        theirs = list(build(url))
    finally:
        proxy.stop()
    same_batches(list(build(str(local))), theirs)


def test_a_full_cache_disk_names_the_folder_and_the_settings(tmp_path, monkeypatch):
    """ENOSPC writing fetched bytes was a bare 'No space left on device': it now names the cache folder and the
    two settings that move or bound it."""
    import errno
    import tempfile

    from babelfeed.storage.remote import pieces, server

    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.truncate(1 << 16)

        class FakeStore:
            async def get_range_async(self, key, a, b, etag):
                return bytes(b - a)

        def full(*args):
            raise OSError(errno.ENOSPC, "No space left on device")

        remote = pieces.RemoteFile(FakeStore(), "k", 1 << 16, "", f.name)
        fet = server.Fetcher(str(tmp_path))
        fet.remotes[f.name] = remote
        monkeypatch.setattr(server.os, "pwrite", full)
        with pytest.raises(StoreError, match=rf"{tmp_path}: the cache's disk is full \(No space left on device "
                                             rf"writing .*BABELFEED_FETCH_CACHE_MB.*BABELFEED_CACHE_DIR"):
            fet.ensure(f.name, [1000], [1100])
        assert remote.held.missing(np.array([1000]), np.array([1100])) != []  # (nothing held that was not written)
        os.close(remote.fd)


def test_an_object_replaced_in_the_store_is_refused_at_the_next_epoch_though_cached(tmp_path, s3_env):
    """Every byte of epoch 1 is cached; the store's .bin is replaced (same size, new bytes). Epoch 2 served the
    cached bytes of the old object beside fetched ones of the new, silently: the fetcher now checks the job's
    objects against the store once per epoch and refuses a replaced one by name."""
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [300], "aaa-ccc": [40]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "swap/data_bin")
    it = babelfeed.build_train_iterator(config_for(url, **KW))
    list(it)  # (epoch 1 whole: every row it reads is cached)
    victim = next(p for p in sorted(local.rglob("*.bin")) if "aaa-bbb" in p.name)
    key = f"swap/data_bin/{victim.relative_to(local).as_posix()}"
    s3_env.client().put_object(Bucket="bkt", Key=key, Body=victim.read_bytes()[::-1])  # same size, new ETag
    with pytest.raises(babelfeed.DataChangedError, match=rf"s3://bkt/{key}: replaced in the store .* since the job "
                                                         rf"opened it"):
        list(it)  # (epoch 2)


@pytest.mark.parametrize("when", ["mid-epoch", "next epoch"])
def test_an_object_replaced_and_opened_by_another_job_is_refused_to_the_running_one(tmp_path, s3_env, monkeypatch,
                                                                                    when):
    """A job reads; the store's .bin is replaced (same size); another job on the host opens the folder (its
    mirror makes the new version's shadow file). The running job's reads named the path alone and were served
    into the new file while it read the old one: rows of zeros ('damaged'). Its requests now carry the file it
    reads, and it gets DataChangedError naming the object, mid-epoch or at its next epoch."""
    monkeypatch.setenv("BABELFEED_FETCH_GAP", "128")  # neighbouring rows only: the rest is fetched as batches ask
    monkeypatch.setenv("BABELFEED_FETCH_DENSE", "2")  # (never whole blocks)
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.002")  # (a few batches ahead)
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [1500], "aaa-ccc": [100]}, valid=False)
    url = s3_env.upload(str(local), "bkt", f"other-{when[0]}/data_bin")
    it = babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    if when == "mid-epoch":
        next(it)
    else:
        list(it)
    victim = next(p for p in sorted(local.rglob("*.bin")) if "aaa-bbb" in p.name)
    key = f"other-{when[0]}/data_bin/{victim.relative_to(local).as_posix()}"
    s3_env.client().put_object(Bucket="bkt", Key=key, Body=victim.read_bytes()[::-1])  # same size, new ETag
    _open_in_another_process(url)
    with pytest.raises(babelfeed.DataChangedError, match=rf"s3://bkt/{key}: (replaced in the store .*since the job "
                                                         rf"opened it|changed in the store while the job reads it|"
                                                         rf"replaced or changed while the job ran \(replaced in the "
                                                         rf"store)"):
        list(it)


def test_an_object_replaced_and_opened_again_by_the_same_process_is_refused_to_the_older_iterator(tmp_path, s3_env,
                                                                                                   monkeypatch):
    """A notebook reads iterator A; it uploads a new version of the folder and opens it again (iterator B, same
    process). The check of the file each request serves was kept per process and path, and the new mirror reset
    it: A's reads were served into B's file while A read its own, and A read zeros ('damaged'). Each reader now
    names the file it opened: A gets DataChangedError naming the object, and B reads the new version exactly."""
    monkeypatch.setenv("BABELFEED_FETCH_GAP", "128")  # neighbouring rows only: the rest is fetched as batches ask
    monkeypatch.setenv("BABELFEED_FETCH_DENSE", "2")  # (never whole blocks)
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.002")  # (a few batches ahead)
    remote = _remote()
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [1500], "aaa-ccc": [100]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "again/data_bin")
    a = babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    next(a)
    new = tmp_path / "new_version"
    make_data_bin(new, seed=5, directions={"aaa-bbb": [1500], "aaa-ccc": [100]}, valid=False)
    remote.upload(str(new), url, log=None)
    b = babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    with pytest.raises(babelfeed.DataChangedError, match=r"s3://bkt/again/data_bin/\S*aaa-bbb\S*\.bin: replaced in the "
                                                         r"store since the job opened it \(the folder was opened again"):
        list(a)
    same_batches(list(babelfeed.build_train_iterator(config_for(new, data__shards="all"))), list(b))


def test_an_lm_dataset_replaced_and_opened_again_by_the_same_process_is_refused_to_the_older_iterator(
        tmp_path, s3_env, monkeypatch):
    """The LM side of the test above: iterator A of the blended datasets reads two batches, books.bin is replaced
    in the store, and the same process opens the folder again (iterator B). A is refused by name (it read zeros,
    with nothing said), and B equals the new version's local copy, every leaf."""
    import shutil

    monkeypatch.setenv("BABELFEED_FETCH_GAP", "16")
    monkeypatch.setenv("BABELFEED_FETCH_DENSE", "2")
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.0005")
    remote = _remote()
    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = s3_env.upload(str(root / "lm"), "bkt", "lm-again")
    a = babelfeed.build_iterator(lm_config(url, tmp_path, 20))
    next(a)
    next(a)
    new = tmp_path / "new_version"
    shutil.copytree(root / "lm", new)
    (new / "books.bin").write_bytes((new / "books.bin").read_bytes()[::-1])  # (same size, other tokens)
    remote.upload(str(new), url, log=None)
    b = babelfeed.build_iterator(lm_config(url, tmp_path, 20))
    with pytest.raises(babelfeed.DataChangedError, match=r"s3://bkt/lm-again/books\.bin: replaced in the store since"):
        list(a)
    same_batches(list(babelfeed.build_iterator(lm_config(new, tmp_path, 20))), list(b))


@pytest.mark.parametrize("kind", ["translation", "lm"])
def test_a_folder_replaced_in_the_store_by_another_client_is_read_anew_by_a_later_iterator(tmp_path, s3_env, kind):
    """A new version put into the store by another client (boto3, aws s3 cp, another host: not babelfeed's
    upload) while iterator A reads; iterator B built after it in the same process. The folder was remembered
    once per process: B read the old version for the whole epoch, silently. Each build checks the store now: B
    equals the new version's local copy, every leaf; A never mixes the two (refused by name, or the old version
    whole). The fetcher gives back the replaced shadows' descriptors and bytes: what it holds after B is one
    version's, not two."""
    import shutil

    remote = _remote()
    old, new = tmp_path / "old", tmp_path / "new"
    if kind == "lm":
        golden.make_lm_data(tmp_path / "lmdata")
        shutil.copytree(tmp_path / "lmdata" / "lm", old)
        shutil.copytree(old, new)
        (new / "books.bin").write_bytes((new / "books.bin").read_bytes()[::-1])  # (same size, other tokens)

        def build(where):
            return babelfeed.build_iterator(lm_config(where, tmp_path, 20))
    else:
        make_data_bin(old, directions={"aaa-bbb": [400], "aaa-ccc": [60]}, valid=False)
        make_data_bin(new, seed=5, directions={"aaa-bbb": [400], "aaa-ccc": [60]}, valid=False)

        def build(where):
            return babelfeed.build_train_iterator(config_for(where, **KW))
    url = s3_env.upload(str(old), "bkt", f"swap-{kind}/data")
    a = build(url)
    first = [next(a)]
    held_one = remote.stats()["bytes_held"]
    for p in sorted(new.rglob("*")):
        if p.is_file():
            s3_env.client().put_object(Bucket="bkt", Key=f"swap-{kind}/data/{p.relative_to(new).as_posix()}",
                                       Body=p.read_bytes())
    b = list(build(url))
    same_batches(list(build(new)), b)
    try:
        same_batches(list(build(old)), first + list(a))
    except babelfeed.DataChangedError as e:
        assert f"s3://bkt/swap-{kind}/data/" in str(e)
    pid = remote.request({"op": "ping"})["pid"]
    deleted = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert not [f for f in deleted if "(deleted)" in f and "objects" in f], deleted
    bins = [p.stat().st_size for p in new.rglob("*.bin")]
    assert held_one > 0 and remote.stats()["bytes_held"] <= sum(bins) + 2 * 4096 * len(bins)  # (one version)


def test_the_counters_survive_a_fetcher_restart_and_the_log_is_rotated(tmp_path, s3_env, monkeypatch):
    """Telemetry went back to zero when a fetcher was replaced (killed, idle exit): its counters are saved as they
    change and the next fetcher adds to them (fetcher_starts counts the fetchers, one killed within a second of
    its start included). fetcher.log grew for ever: a new fetcher rotates a long one to fetcher.log.1."""
    remote = _remote()
    monkeypatch.setattr(remote, "LOG_BYTES", 10)
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "count/data_bin")
    list(babelfeed.build_train_iterator(config_for(url, **KW)))
    before = remote.stats()
    assert before["requests"] > 0 and before["fetcher_starts"] == 1
    log = tmp_path / "cache" / "objects" / "fetcher.log"
    with open(log, "a") as f:
        f.write("an earlier fetcher's lines\n")
    time.sleep(1.5)  # (saved within a second)
    os.kill(remote.request({"op": "ping"})["pid"], signal.SIGKILL)
    time.sleep(0.2)
    after = remote.stats()  # (a new fetcher)
    assert after["fetcher_starts"] == 2 and after["requests"] >= before["requests"], (before, after)
    assert "an earlier fetcher's lines" in (log.parent / "fetcher.log.1").read_text()
    os.kill(remote.request({"op": "ping"})["pid"], signal.SIGKILL)  # (within its first second: counted at start)
    time.sleep(0.2)
    assert remote.stats()["fetcher_starts"] == 3


def test_a_direction_deleted_from_the_store_is_gone_for_a_new_job_though_cached(tmp_path, s3_env):
    """A new process on a warm cache trained on a direction deleted from the bucket (its shadow files stayed):
    the mirror now removes what the store no longer holds, so the new job's data is the store's."""
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [200], "aaa-ccc": [60]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "del/data_bin")
    list(babelfeed.build_train_iterator(config_for(url, **KW)))  # (every row it reads cached)
    c = s3_env.client()
    gone = [p for p in sorted(local.rglob("*aaa-ccc*"))]
    assert gone
    for p in gone:
        c.delete_object(Bucket="bkt", Key=f"del/data_bin/{p.relative_to(local).as_posix()}")
        p.unlink()
    _remote()._folders.clear()  # (a new job)
    same_batches(list(babelfeed.build_train_iterator(config_for(local, **KW))),
                 list(babelfeed.build_train_iterator(config_for(url, **KW))))


def test_a_malformed_endpoint_is_one_line_naming_the_setting(tmp_path, s3_env, capsys):
    """The store client panics on an endpoint that is not a URL (a BaseException): the fetcher's request thread
    died with it and the user read 'the fetcher closed the connection'."""
    from babelfeed.tools.cli import main

    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = s3_env.upload(str(local), "bkt", "ep/data_bin")
    assert main(["plan", "nllb_like", "--set", f"data.path={url}", "--set", "data.storage.endpoint=not a url"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the endpoint is not a valid URL (data.storage.endpoint" in err[0], err


def test_credentials_advice_names_each_stores_own_settings():
    from babelfeed.storage.remote.objects import _set_credentials

    assert "AWS_ACCESS_KEY_ID" in _set_credentials("s3://b")
    assert "GOOGLE_SERVICE_ACCOUNT" in _set_credentials("gs://b") and "AWS" not in _set_credentials("gs://b")
    assert "AZURE_STORAGE_ACCOUNT_KEY" in _set_credentials("az://c") and "AWS" not in _set_credentials("az://c")


def test_a_bad_cache_size_setting_is_named_before_a_fetcher_starts(tmp_path, s3_env, monkeypatch):
    monkeypatch.setenv("BABELFEED_FETCH_CACHE_MB", "abc")
    with pytest.raises(babelfeed.UsageError, match=r"BABELFEED_FETCH_CACHE_MB='abc': give the cache's size in MiB"):
        _remote().local_folder("s3://bkt/anything")


def test_one_fetcher_serves_a_cache_folder_whatever_the_socket_path_a_process_works_out(tmp_path, monkeypatch):
    """Two processes of one cache folder whose environments put the socket elsewhere (``XDG_RUNTIME_DIR``: an ssh
    session has one, a cron or SLURM job may not) started a fetcher each, which punched holes in each other's
    files. The running fetcher writes its socket in ``objects/``, a process finds it there, and a second fetcher
    of the folder refuses to start."""
    import subprocess
    import sys

    remote = _remote()
    cache = tmp_path / "cache"
    import shutil
    import tempfile

    xdg_a, xdg_b = (tempfile.mkdtemp(prefix="bf-xdg-", dir="/tmp") for _ in range(2))  # (short: a socket's path
    # must stay under ~100 bytes)
    for d in (xdg_a, xdg_b):
        os.chmod(d, 0o700)
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg_a))
    remote._local.conn = None
    try:
        pid = remote.request({"op": "ping"})["pid"]
        code = ("import json; from babelfeed.storage.remote import client as r; "
                "print(json.dumps([r.request({'op': 'ping'})['pid'], r.socket_path(), r._local.path]))")
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "XDG_RUNTIME_DIR": str(xdg_b)},
                             capture_output=True, text=True, timeout=120, check=True).stdout
        theirs, worked_out, used = __import__("json").loads(out.strip().splitlines()[-1])
        assert worked_out.startswith(str(xdg_b)) and used.startswith(str(xdg_a)), (worked_out, used)
        assert theirs == pid  # (one fetcher)
        second = subprocess.run([sys.executable, "-m", "babelfeed.storage.remote.server", str(tmp_path / "x.sock"),
                                 str(cache)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 3 and "another fetcher serves the cache folder" in second.stdout, second
    finally:
        from s3server import stop_fetcher

        stop_fetcher(str(cache))
        for d in (xdg_a, xdg_b):
            shutil.rmtree(d, ignore_errors=True)


def test_a_cache_folder_reached_through_a_link_is_one_folder(tmp_path, s3_env, monkeypatch):
    """One job names the cache folder by its path, another through a symlink: one fetcher, and both read the
    local copy's batches. Under two names, the second took the fetcher's shadows for local files and read their
    holes: zeros."""
    remote = _remote()
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [300], "aaa-ccc": [40]}, valid=False)
    url = s3_env.upload(str(local), "bkt", "link/data_bin")
    real = os.environ["BABELFEED_CACHE_DIR"]
    link = tmp_path / "cache-link"
    link.symlink_to(real)
    _open_in_another_process(url)  # (the fetcher, by the cache's own path)
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(link))
    remote._folders.clear()
    remote._local.conn = None
    assert remote.socket_path() == remote.socket_path(real)
    same_batches(list(babelfeed.build_train_iterator(config_for(local, **KW))),
                 list(babelfeed.build_train_iterator(config_for(url, **KW))))


def test_a_fetcher_of_another_version_on_the_cache_folder_is_refused_by_name(tmp_path, monkeypatch):
    """A fetcher of an older protocol (it writes no fetcher.socket) listening beside this version's socket for the
    same cache folder: the process refuses to start a second fetcher there, naming the other one."""
    import socket

    remote = _remote()
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    remote._local.conn = None
    path = remote.socket_path()
    old = path.replace(f"-p{remote.PROTOCOL}.sock", "-p2.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(old)
    s.listen(8)
    try:
        with pytest.raises(StoreError, match=r"served by the fetcher of another babelfeed version .*-p2\.sock"):
            remote.request({"op": "ping"})
    finally:
        s.close()
        os.unlink(old)
        remote._local.conn = None
