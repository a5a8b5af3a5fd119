"""Files babelfeed writes honour the umask (0o666 & ~umask), like files every other tool writes.

A temporary from ``tempfile.mkstemp`` is 0600 whatever the umask; renamed into place it left data_bins that
another user, or a container running under another uid, could not read.
"""

import json
import os
import stat

import numpy as np
import pytest

import babelfeed
from babelfeed.binarize import binarize
from babelfeed.blending import IndexCache
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
