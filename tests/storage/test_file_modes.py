"""Files babelfeed writes honour the umask (0o666 & ~umask), like files every other tool writes.

A temporary from ``tempfile.mkstemp`` is 0600 whatever the umask; renamed into place it left data_bins that
another user, or a container running under another uid, could not read.
"""

import json
import warnings
import os
import stat

import numpy as np
import pytest

import babelfeed
from babelfeed.preprocess.binarize import binarize
from babelfeed.lm.blending import IndexCache
from babelfeed.fileio import atomic_open, atomic_write
from test_binarize import make_raw, opts

UMASKS = [0o022, 0o002]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def assert_modes(paths, umask):
    want = 0o666 & ~umask
    wrong = {os.fspath(p): oct(mode(p)) for p in paths if mode(p) != want}
    assert not wrong, f"want {oct(want)} under umask {umask:03o}, got {wrong}"


def test_atomic_writes(tmp_path, umask):
    atomic_write(tmp_path / "a.json", json.dumps({"x": 1}).encode())
    with atomic_open(tmp_path / "b.bin") as f:
        f.write(b"\0" * 10)
    atomic_write(tmp_path / "a.json", b"{}")  # replacing an existing file
    assert_modes([tmp_path / "a.json", tmp_path / "b.bin"], umask)


@pytest.mark.parametrize("fmt", ["fairseq", "megatron"])
def test_indexed_dataset_builder(tmp_path, umask, fmt):
    with babelfeed.IndexedDatasetBuilder(tmp_path / "ds", np.uint16, format=fmt) as b:
        b.add_item([5, 6, 2])
        b.finalize()
    assert_modes([tmp_path / "ds.bin", tmp_path / "ds.idx"], umask)


def test_dictionary_and_index_cache(tmp_path, umask):
    d = babelfeed.Dictionary()
    d.add_symbol("hello")
    d.save(tmp_path / "dict.txt")
    cache = IndexCache(str(tmp_path / "cache"))
    cache.save("blend", {"n": 3}, {"index": np.arange(3)})
    written = [tmp_path / "dict.txt"] + [os.path.join(r, n) for r, _, ns in os.walk(tmp_path / "cache") for n in ns]
    assert len(written) >= 3
    assert_modes(written, umask)


def test_every_binarize_output(tmp_path, umask):
    make_raw(tmp_path / "raw")
    binarize(opts(tmp_path / "raw", tmp_path / "out"), log=lambda *_: None)
    written = [os.path.join(r, n) for r, _, ns in os.walk(tmp_path / "out") for n in ns]
    names = {os.path.basename(p).rsplit(".", 1)[-1] for p in written}
    assert {"bin", "idx", "txt", "model", "json"} <= names  # data, dict.txt, spm.model, report and records
    assert any(os.sep + ".binarize" + os.sep in p for p in written)  # the resume records
    assert_modes(written, umask)
    # and a resumed run (records read back, nothing rewritten) leaves them so
    binarize(opts(tmp_path / "raw", tmp_path / "out"), log=lambda *_: None)
    assert_modes(written, umask)


@pytest.mark.parametrize("mask", [0o002, 0o000])
def test_the_stamps_are_the_users_alone_and_a_folder_others_can_write_is_not_trusted(tmp_path, monkeypatch, mask):
    """The stamps record which indexes passed the full check; they followed the umask, so under 002 or 000 others
    could plant one for a corrupted index and skip its check (issue 23 item 8). The folder is 0700 and each stamp
    0600 whatever the umask; a folder others can write to is not trusted: the check runs, with a warning."""
    from babelfeed.storage import stamps

    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)  # (stamp files just written)
    stamps.forget()
    old = os.umask(mask)
    try:
        with babelfeed.IndexedDatasetBuilder(tmp_path / "ds", np.uint16) as b:
            for i in range(50):
                b.add_item([5 + i % 7] * (1 + i % 5) + [2])
            b.finalize()
        babelfeed.IndexedDataset(tmp_path / "ds")  # checked in full, stamped
        folder = tmp_path / "cache" / "stamps"
        assert mode(folder) == 0o700 and [mode(p) for p in folder.iterdir()] == [0o600]
        assert mode(tmp_path / "cache") == 0o700  # the cache folder made for it too (it came out 0777 under 000)
        # a corrupted index (a size changed), and a stamp planted for it, as another user could if they could write
        corrupt = tmp_path / "ds.idx"
        raw = bytearray(corrupt.read_bytes())
        header = 9 + 8 + 1 + 8 + 8  # MMIDIDX magic, version, dtype, count, doc count
        raw[header] = (raw[header] + 1) % 256  # record 0's size
        corrupt.write_bytes(bytes(raw))
        stamps.forget()
        with pytest.raises(babelfeed.InconsistentIndexError):
            babelfeed.IndexedDataset(tmp_path / "ds")
        ids = [stamps.identity(str(tmp_path / "ds.idx")), stamps.identity(str(tmp_path / "ds.bin"))]
        planted = {"version": 1, "index": str(corrupt), "files": ids, "facts": {"verified": True}}
        os.chmod(folder, 0o777)  # as a umask of 000 left it before
        (folder / "planted.json").write_text("{}")
        os.replace(folder / "planted.json", stamps._stamp_path(str(corrupt)))
        with open(stamps._stamp_path(str(corrupt)), "w") as f:
            json.dump(planted, f)
        stamps.forget()
        with pytest.warns(UserWarning, match="others can write to it .* its stamps are ignored"):
            with pytest.raises(babelfeed.InconsistentIndexError):
                babelfeed.IndexedDataset(tmp_path / "ds")
        os.chmod(folder, 0o700)  # the user's again: the planted stamp would be believed (the threat, shown)
        stamps.forget()
        babelfeed.IndexedDataset(tmp_path / "ds")
    finally:
        os.umask(old)
        stamps.forget()


@pytest.mark.parametrize("damage", [b'{"version": 1, "files": [], "facts": [["verified", true]]}', b"{not json",
                                    b"[1, 2]", b'{"version": 1, "files": [], "facts": {"shortest": "abc"}}',
                                    b'{"version": 1, "files": [], "facts": {"verified": 1, "digest": 5}}'])
def test_a_damaged_stamp_is_ignored_with_a_warning_and_written_anew(tmp_path, monkeypatch, damage):
    """A corrupted stamp file gave 'ValueError: dictionary update sequence element #0' (issue 23 item 16)."""
    from babelfeed.storage import stamps

    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)
    stamps.forget()
    try:
        with babelfeed.IndexedDatasetBuilder(tmp_path / "ds", np.uint16) as b:
            b.add_item([5, 6, 2])
            b.finalize()
        babelfeed.IndexedDataset(tmp_path / "ds")
        path = stamps._stamp_path(str(tmp_path / "ds.idx"))
        if damage.startswith(b'{"version"'):  # damaged facts in a stamp of these very files
            ids = [stamps.identity(str(tmp_path / "ds.idx")), stamps.identity(str(tmp_path / "ds.bin"))]
            damage = json.dumps({**json.loads(damage), "files": ids}).encode()
        with open(path, "wb") as f:
            f.write(damage)
        stamps.forget()
        with warnings.catch_warnings(record=True) as said:  # (a stamp of the wrong types: int('abc') in plan)
            warnings.simplefilter("always")
            assert len(babelfeed.IndexedDataset(tmp_path / "ds")) == 1
        damaged = [w for w in said if "a damaged verification stamp" in str(w.message)]
        assert len(damaged) == 1, [str(w.message) for w in said]  # said once, not once per read
        stamps.forget()
        assert stamps.lookup(str(tmp_path / "ds.idx"), str(tmp_path / "ds.bin")).get("verified") is True
    finally:
        stamps.forget()
