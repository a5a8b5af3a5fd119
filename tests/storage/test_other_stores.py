"""Data folders in Azure Blob Storage (``az://``), against Azure's own emulator (Azurite), and ``gs://`` where no
emulator from the package registries serves what the store client reads (issue 38 item 4).

Azurite gives the same answers as Azure where it matters here (listings, ranged reads with If-Match, ETags); the
tests are those of the S3 suite that depend on the store: batches equal to the local copy's, an object replaced
mid-run or between epochs refused by name, folder markers ignored, a missing container or prefix named.

GCS: the one emulator on PyPI (gcp-storage-emulator) serves Google's JSON API only; obstore reads GCS through the
XML API (``GET /bucket?list-type=2``, ``HEAD`` with ``Last-Modified``), which it answers with 501. Google's own
fake-gcs-server is a Go binary, not on the registries. So ``gs://`` is tested here up to the wire: the fetcher
is configured from the user's GOOGLE_ variables (an endpoint of our choosing through a service-account file, as
fake-gcs-server's users do) and an unreachable store is one error naming the folder."""

import json
import warnings

import pytest

import babelfeed
from azurite import az_env, azurite  # noqa: F401  (fixtures)
from babelfeed.errors import StoreError
from synthetic import config_for, make_data_bin
from test_remote import lm_config, same_batches

KW = dict(data__shards="all", batching__max_tokens=256)


def _remote():
    from babelfeed.storage.remote import client as remote
    return remote


def test_translation_batches_from_azure_equal_the_local_copy(tmp_path, az_env):
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = az_env.upload(str(local), "bkt", "runs/data_bin")
    mine = list(babelfeed.build_train_iterator(config_for(local, **KW)))
    theirs = list(babelfeed.build_train_iterator(config_for(url, **KW)))
    same_batches(mine, theirs)
    got = _remote().stats()
    assert got["requests"] > 0 and got["bytes"] > 0
    again = list(babelfeed.build_train_iterator(config_for(url, **KW)))  # (a new job reads what is held)
    same_batches(mine, again)
    assert _remote().stats()["bytes"] == got["bytes"]


def test_lm_batches_from_azure_equal_the_local_copy(tmp_path, az_env):
    import golden

    root = tmp_path / "local"
    golden.make_lm_data(root)
    url = az_env.upload(str(root / "lm"), "bkt", "lm")
    same_batches(list(babelfeed.build_iterator(lm_config(root / "lm", tmp_path, 20))),
                 list(babelfeed.build_iterator(lm_config(url, tmp_path, 20))))


def test_an_azure_blob_replaced_between_epochs_is_refused_by_name(tmp_path, az_env):
    """Azure's ETags are quoted in a blob's headers and bare in a listing (a comparison of the two would refuse
    every blob, or none). Replaced after epoch 1 cached every byte: refused at epoch 2."""
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [300], "aaa-ccc": [40]}, valid=False)
    url = az_env.upload(str(local), "bkt", "swap/data_bin")
    it = babelfeed.build_train_iterator(config_for(url, **KW))
    first = list(it)  # (epoch 1 whole, and no false alarm at epoch 2's check while nothing changed)
    assert len(first) > 0 and len(list(babelfeed.build_train_iterator(config_for(url, **KW)))) == len(first)
    victim = next(p for p in sorted(local.rglob("*.bin")) if "aaa-bbb" in p.name)
    key = f"swap/data_bin/{victim.relative_to(local).as_posix()}"
    az_env.put("bkt", key, victim.read_bytes()[::-1])  # same size, new ETag
    with pytest.raises(babelfeed.DataChangedError, match=rf"az://bkt/{key}: replaced in the store"):
        list(it)  # (epoch 2)


def test_an_azure_blob_replaced_mid_run_is_refused_by_name(tmp_path, az_env, monkeypatch):
    """Every range is read with the ETag the job opened as a precondition (If-Match): a .bin replaced mid-run is
    refused at its next range, never mixed with the bytes fetched before."""
    monkeypatch.setenv("BABELFEED_FETCH_GAP", "128")  # neighbouring rows only: the rest fetched as batches ask
    monkeypatch.setenv("BABELFEED_FETCH_DENSE", "2")
    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.002")
    from babelfeed.iterators import fetch_ahead

    monkeypatch.setattr(fetch_ahead, "GROUP", 2)
    local = tmp_path / "data_bin"
    make_data_bin(local, directions={"aaa-bbb": [6000], "aaa-ccc": [100]}, valid=False)
    url = az_env.upload(str(local), "bkt", "mid/data_bin")
    it = babelfeed.build_train_iterator(config_for(url, data__shards="all"))
    next(it)
    victim = next(p for p in sorted(local.rglob("*.bin")) if "aaa-bbb" in p.name)
    key = f"mid/data_bin/{victim.relative_to(local).as_posix()}"
    az_env.put("bkt", key, victim.read_bytes()[::-1])
    with pytest.raises(babelfeed.DataChangedError, match=rf"az://bkt/{key}: changed in the store while the job "
                                                         rf"reads it"):
        for _ in it:
            pass


def test_azure_folder_markers_are_ignored_and_a_stray_blob_is_named(tmp_path, az_env):
    """Zero-byte blobs ending in / (what tools make for folders) are not data; a blob name the store client cannot
    read (an empty segment) is one error naming it and the fix (Azure has no second lister, as S3 has boto3)."""
    local = tmp_path / "data_bin"
    make_data_bin(local)
    url = az_env.upload(str(local), "bkt", "odd/data_bin")
    for key in ("odd/data_bin/", "odd/data_bin/shard000/"):
        az_env.put("bkt", key, b"")
    same_batches(list(babelfeed.build_train_iterator(config_for(local, **KW))),
                 list(babelfeed.build_train_iterator(config_for(url, **KW))))
    az_env.put("bkt", "odd/data_bin//stray", b"zz")
    _remote()._folders.clear()
    with pytest.raises(StoreError, match=r"az://bkt/odd/data_bin: the listing holds the key 'odd/data_bin//stray'.*"
                                         r"az storage blob delete"):
        list(babelfeed.build_train_iterator(config_for(url, **KW)))


def test_a_missing_azure_container_or_prefix_is_one_line_naming_it(az_env, capsys):
    from babelfeed.tools.cli import main

    az_env.container("empty")
    assert main(["inspect", "az://empty/nothing/here"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "az://empty/nothing/here: no objects under this prefix" in err[0], err
    assert main(["inspect", "az://no-such-container/data"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "az://no-such-container" in err[0] and "Traceback" not in err[0], err


def test_gcs_is_read_from_the_users_google_settings_and_an_unreachable_store_is_named(tmp_path, monkeypatch,
                                                                                     capsys):
    """No GCS emulator from the registries serves obstore's requests (see the module's note): this test goes as
    far as the wire. The fetcher takes the GOOGLE_ variables of the process that asks (a service-account file
    naming an endpoint), tries that endpoint (a closed port here), and the user gets one line naming the folder."""
    pytest.importorskip("obstore")
    from s3server import free_port, stop_fetcher

    account = tmp_path / "account.json"
    account.write_text(json.dumps({"gcs_base_url": f"http://127.0.0.1:{free_port()}", "disable_oauth": True,
                                   "client_email": "", "private_key": "", "private_key_id": ""}))
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(account))
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BABELFEED_FETCH_RETRY_SECONDS", "2")
    _remote()._folders.clear()
    _remote()._local.conn = None
    from babelfeed.tools.cli import main

    def said():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert main(["inspect", "gs://bkt/data_bin"]) != 0
        finally:
            stop_fetcher(str(tmp_path / "cache"))
            _remote()._folders.clear()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "gs://bkt" in err[0] and "Traceback" not in err[0], err
        return err[0]

    assert "set GOOGLE_ALLOW_HTTP=true (or data.storage.allow_http)" in said()  # (GCS's own variable, not AWS's)
    monkeypatch.setenv("GOOGLE_ALLOW_HTTP", "true")
    err = said()
    assert "gs://bkt/data_bin" in err and "does not answer" in err, err
