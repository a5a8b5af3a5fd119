"""IndexedDatasetBuilder: round trips, refusals, and atomic writes."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import babelfeed
from babelfeed.storage import builder as builder_mod
from babelfeed.errors import CallOrderError, DataError

INT_DTYPES = {
    "fairseq": [np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64],
    "megatron": [np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16],
}


@st.composite
def corpora(draw):
    fmt = draw(st.sampled_from(["fairseq", "megatron"]))
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES[fmt])))
    info = np.iinfo(dtype)
    hi = min(int(info.max), 2**40)
    lo = max(int(info.min), -(2**40))
    docs = draw(
        st.lists(
            st.lists(st.lists(st.integers(lo, hi), max_size=12), max_size=4),
            max_size=8,
        )
    )
    return fmt, dtype, docs


@settings(max_examples=150, deadline=None)
@given(corpora(), st.booleans())
def test_round_trip(tmp_path_factory, corpus, vectorised):
    fmt, dtype, docs = corpus
    prefix = tmp_path_factory.mktemp("rt") / "ds"
    seqs = [s for d in docs for s in d]
    with babelfeed.IndexedDatasetBuilder(prefix, dtype, format=fmt) as b:
        for d in docs:
            if vectorised:
                flat = np.array([t for s in d for t in s], dtype=np.int64) if d else np.zeros(0, np.int64)
                b.add_items(flat, [len(s) for s in d])
            else:
                for s in d:
                    b.add_item(np.array(s, dtype=np.int64))
            b.end_document()
        b.finalize()
    for verify in ("full", "quick"):
        ds = babelfeed.IndexedDataset(prefix, verify=verify)
        assert ds.format == fmt and ds.dtype == dtype and len(ds) == len(seqs)
        assert [s.tolist() for s in ds] == seqs
        assert ds.num_tokens == sum(map(len, seqs))
        if fmt == "megatron":
            assert ds.doc_idx.tolist() == np.cumsum([0] + [len(d) for d in docs]).tolist()
        else:
            assert ds.doc_idx.tolist() == list(range(len(seqs) + 1))


def test_open_document_is_closed_at_finalize(tmp_path):
    with babelfeed.IndexedDatasetBuilder(tmp_path / "d", np.uint16, format="megatron") as b:
        b.add_item([1, 2])
        b.end_document()
        b.add_item([3])
        b.finalize()
    assert babelfeed.IndexedDataset(tmp_path / "d").doc_idx.tolist() == [0, 1, 2]


def test_multimodal_modes(tmp_path):
    with babelfeed.IndexedDatasetBuilder(tmp_path / "m", np.int32, format="megatron", multimodal=True) as b:
        b.add_item([1, 2], mode=0)
        b.add_item([3], mode=1)
        b.end_document()
        b.finalize()
    ds = babelfeed.IndexedDataset(tmp_path / "m")
    assert ds.modes.tolist() == [0, 1]
    assert [s.tolist() for s in ds] == [[1, 2], [3]]
    # one mode per sequence, checked before anything is written (a short list wrote an index nothing could read)
    with babelfeed.IndexedDatasetBuilder(tmp_path / "n", np.int32, format="megatron", multimodal=True) as b:
        with pytest.raises(babelfeed.UsageError, match=r"1 mode\(s\) for 2 sequence\(s\)"):
            b.add_items([1, 2, 3], [2, 1], modes=[1])
        b.add_items([1, 2, 3], [2, 1], modes=[1, 0])
        b.end_document()
        b.finalize()
    n = babelfeed.IndexedDataset(tmp_path / "n")
    assert n.modes.tolist() == [1, 0] and [s.tolist() for s in n] == [[1, 2], [3]]


@pytest.mark.parametrize(
    "fmt,dtype", [("megatron", np.uint32), ("megatron", np.uint64), ("fairseq", np.float32), ("fairseq", np.complex64)]
)
def test_refuses_dtype_the_format_cannot_hold(tmp_path, fmt, dtype):
    with pytest.raises(babelfeed.UnsupportedDtypeError, match=np.dtype(dtype).name):
        babelfeed.IndexedDatasetBuilder(tmp_path / "x", dtype, format=fmt)
    assert os.listdir(tmp_path) == []


def test_refuses_values_that_do_not_fit(tmp_path):
    with babelfeed.IndexedDatasetBuilder(tmp_path / "x", np.uint16, format="fairseq") as b:
        with pytest.raises(DataError, match="70000 does not fit uint16"):
            b.add_item([1, 70000])
        with pytest.raises(DataError, match="-1 does not fit uint16"):
            b.add_items([1, -1], [2])
        with pytest.raises(DataError, match="must be integers"):
            b.add_item([1.5])
        with pytest.raises(DataError, match="add up to"):
            b.add_items([1, 2, 3], [1, 1])
        b.add_item([65535])
        b.finalize()
    assert babelfeed.IndexedDataset(tmp_path / "x")[0].tolist() == [65535]


def test_dtype_for_vocab_thresholds():
    assert babelfeed.dtype_for_vocab(65499) == np.uint16
    assert babelfeed.dtype_for_vocab(65500) == np.uint32  # 65500, not 65536, in both libraries
    assert babelfeed.dtype_for_vocab(256206) == np.uint32  # NLLB
    assert babelfeed.dtype_for_vocab(256206, "megatron") == np.int32
    assert babelfeed.dtype_for_vocab(2**32) == np.int64


def test_add_index_merges_documents(tmp_path):
    for name, docs in (("a", [[[1], [2, 3]], [[4]]]), ("b", [[[5, 6]], [[7], [8]]])):
        with babelfeed.IndexedDatasetBuilder(tmp_path / name, np.int32, format="megatron") as b:
            for d in docs:
                for s in d:
                    b.add_item(s)
                b.end_document()
            b.finalize()
    with babelfeed.IndexedDatasetBuilder(tmp_path / "ab", np.int32, format="megatron") as b:
        b.add_index(tmp_path / "a")
        b.add_index(tmp_path / "b")
        b.finalize()
    ds = babelfeed.IndexedDataset(tmp_path / "ab")
    assert [s.tolist() for s in ds] == [[1], [2, 3], [4], [5, 6], [7], [8]]
    assert ds.doc_idx.tolist() == [0, 2, 3, 4, 6]


# -------------------------------------------------------------------------------------------- atomicity
def test_abort_and_exception_leave_nothing(tmp_path):
    b = babelfeed.IndexedDatasetBuilder(tmp_path / "x", np.uint16, format="fairseq")
    b.add_item([1, 2, 3])
    b.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(KeyError):  # not babelfeed's: the block's own error goes through
        with babelfeed.IndexedDatasetBuilder(tmp_path / "y", np.uint16, format="fairseq") as b:
            b.add_item([1])
            raise KeyError("boom")
    assert os.listdir(tmp_path) == []


def test_leaving_with_block_without_finalize_is_an_error(tmp_path):
    with pytest.raises(CallOrderError, match="without finalize"):
        with babelfeed.IndexedDatasetBuilder(tmp_path / "x", np.uint16, format="fairseq") as b:
            b.add_item([1])
    assert os.listdir(tmp_path) == []


KILLED_WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, babelfeed
    b = babelfeed.IndexedDatasetBuilder(sys.argv[1], np.uint16, format=sys.argv[2])
    for i in range(2000):
        b.add_item(np.arange(50) % 300)
    b._data.flush()
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("fmt", ["fairseq", "megatron"])
def test_killed_writer_leaves_nothing_openable(tmp_path, fmt):
    prefix = tmp_path / "shard"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(prefix), fmt], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    leftovers = os.listdir(tmp_path)
    assert leftovers and all(name.endswith(".partial") for name in leftovers)
    with pytest.raises(FileNotFoundError):
        babelfeed.IndexedDataset(prefix)


def test_crash_between_renames_leaves_no_index(tmp_path, monkeypatch):
    """Overwriting: the old .idx goes first, so a crash mid-rename never pairs an old index with a new .bin."""
    prefix = tmp_path / "shard"
    with babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="fairseq") as b:
        b.add_item([1, 2, 3])
        b.finalize()
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(builder_mod.os, "replace", failing_replace)
    b = babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="fairseq")
    b.add_item([4, 5])
    with pytest.raises(OSError, match="simulated"):
        b.finalize()
    with pytest.raises(FileNotFoundError):
        babelfeed.IndexedDataset(prefix)
