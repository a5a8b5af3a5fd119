"""Compatibility with files written by megatron-core's and fairseq's own builders (../shared/fixtures)."""

import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

import babelfeed

from helpers import write_tntidx
from babelfeed.errors import OutOfRange

NAMES = [
    "megatron/uint16_docs",
    "megatron/int32_docs",
    "fairseq/uint16",
    "fairseq/int32",
    "data_bin/shard000/train.eng_Latn-tur_Latn.eng_Latn",
    "data_bin/shard000/train.eng_Latn-tur_Latn.tur_Latn",
    "data_bin/shard001/train.eng_Latn-tur_Latn.eng_Latn",
    "data_bin/shard001/train.eng_Latn-tur_Latn.tur_Latn",
]


def test_every_fixture_is_covered(expected):
    assert sorted(expected["datasets"]) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("verify", ["full", "quick"])
def test_reads_every_record(fixtures_dir, expected, name, verify):
    e = expected["datasets"][name]
    ds = babelfeed.IndexedDataset(fixtures_dir / name, verify=verify)
    assert ds.format == e["format"].split("+")[0]
    assert ds.dtype == np.dtype(e["dtype"])
    assert ds.dtype_code == e["dtype_code"]
    assert len(ds) == e["num_sequences"]
    assert ds.num_tokens == e["num_tokens"]
    assert ds.sizes.tolist() == e["sequence_lengths"]
    assert ds.pointers.tolist() == e["sequence_pointers_bytes"]
    for i, seq in enumerate(e["sequences"]):
        got = ds[i]
        assert got.dtype == ds.dtype  # stored dtype, as Megatron's reader returns it
        assert got.tolist() == seq
    if e["document_indices"] is None:
        assert ds.doc_idx.tolist() == list(range(e["num_sequences"] + 1))
    else:
        assert ds.doc_idx.tolist() == e["document_indices"]
    assert ds[-1].tolist() == e["sequences"][-1]
    assert [a.tolist() for a in ds[1:4]] == e["sequences"][1:4]


@pytest.mark.parametrize("name", NAMES)
def test_get_slices_one_record(fixtures_dir, expected, name):
    seqs = expected["datasets"][name]["sequences"]
    ds = babelfeed.IndexedDataset(fixtures_dir / name)
    for i, seq in enumerate(seqs):
        for offset in range(len(seq) + 1):
            assert ds.get(i, offset=offset).tolist() == seq[offset:]
            for length in range(len(seq) - offset + 1):
                assert ds.get(i, offset, length).tolist() == seq[offset : offset + length]
        with pytest.raises(OutOfRange):
            ds.get(i, offset=len(seq) + 1)
        with pytest.raises(OutOfRange):
            ds.get(i, offset=0, length=len(seq) + 1)
    with pytest.raises(OutOfRange):
        ds[len(seqs)]


@pytest.mark.parametrize("name", NAMES)
def test_builder_reproduces_library_bytes(fixtures_dir, expected, tmp_path, name):
    """Fed the same sequences as the library's own builder, ours writes the same bytes."""
    e = expected["datasets"][name]
    fmt = e["format"].split("+")[0]
    docs = e["document_indices"] or list(range(e["num_sequences"] + 1))
    prefix = tmp_path / "out"
    with babelfeed.IndexedDatasetBuilder(prefix, np.dtype(e["dtype"]), format=fmt) as b:
        for d in range(len(docs) - 1):
            for i in range(docs[d], docs[d + 1]):
                b.add_item(np.array(e["sequences"][i], dtype=np.int64))  # the fixtures were fed int64 tensors
            b.end_document()
        b.finalize()
    for ext in ("bin", "idx"):
        data = (tmp_path / f"out.{ext}").read_bytes()
        meta = e["files"][f"{name}.{ext}"]
        assert len(data) == meta["bytes"]
        assert hashlib.sha256(data).hexdigest() == meta["sha256"]


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("megatron/")])
def test_add_items_matches_library_bytes(fixtures_dir, expected, tmp_path, name):
    """The vectorised add_items writes the same bytes as fairseq's per-item builder."""
    e = expected["datasets"][name]
    fmt = e["format"]
    seqs = e["sequences"]
    with babelfeed.IndexedDatasetBuilder(tmp_path / "out", np.dtype(e["dtype"]), format=fmt) as b:
        b.add_items(np.concatenate([np.array(s, dtype=np.int64) for s in seqs]), [len(s) for s in seqs])
        b.finalize()
    assert (tmp_path / "out.idx").read_bytes() == (fixtures_dir / f"{name}.idx").read_bytes()
    assert (tmp_path / "out.bin").read_bytes() == (fixtures_dir / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", ["fairseq/uint16", "fairseq/int32", "megatron/uint16_docs", "megatron/int32_docs"])
def test_convert_between_layouts(fixtures_dir, expected, tmp_path, name):
    """fairseq -> Megatron makes every sentence a document; Megatron -> fairseq keeps the tokens."""
    e = expected["datasets"][name]
    src_fmt = e["format"]
    dst_fmt = "megatron" if src_fmt == "fairseq" else "fairseq"
    babelfeed.convert_index(fixtures_dir / name, tmp_path / "conv", dst_fmt)
    ds = babelfeed.IndexedDataset(tmp_path / "conv")
    assert ds.format == dst_fmt
    assert [s.tolist() for s in ds] == e["sequences"]
    assert (tmp_path / "conv.bin").read_bytes() == (fixtures_dir / f"{name}.bin").read_bytes()
    if dst_fmt == "megatron":
        assert ds.doc_idx.tolist() == list(range(len(ds) + 1))
        # Back again gives the library's own fairseq bytes.
        babelfeed.convert_index(tmp_path / "conv", tmp_path / "back", "fairseq")
        assert (tmp_path / "back.idx").read_bytes() == (fixtures_dir / f"{name}.idx").read_bytes()


def test_uint32_parallel_fixture_is_fairseq_only(fixtures_dir, tmp_path):
    """NLLB-size vocabularies are stored as uint32 (code 9); Megatron's table cannot hold it."""
    name = fixtures_dir / "data_bin/shard000/train.eng_Latn-tur_Latn.eng_Latn"
    with pytest.raises(babelfeed.UnsupportedDtypeError, match="uint32"):
        babelfeed.convert_index(name, tmp_path / "conv", "megatron")
    assert not os.listdir(tmp_path)


def test_every_sentence_ends_with_eos(fixtures_dir, expected):
    for name, e in expected["datasets"].items():
        if "eos" in e:
            ds = babelfeed.IndexedDataset(fixtures_dir / name)
            assert all(int(s[-1]) == e["eos"] for s in ds)


LEGACY = pathlib.Path(__file__).parent.parent / "fixtures" / "fairseq_legacy"


def test_legacy_fixture_written_by_fairseq(tmp_path):
    """TNTIDX files from fairseq's own legacy builder: every sequence back, ids minus the stored +1."""
    e = json.loads((LEGACY / "expected.json").read_text())["lazy_int32"]
    for ext in ("bin", "idx"):
        data = (LEGACY / f"lazy_int32.{ext}").read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["files"][f"lazy_int32.{ext}"]["sha256"]
    for verify in ("full", "quick"):
        ds = babelfeed.IndexedDataset(LEGACY / "lazy_int32", verify=verify)
        assert ds.format == "legacy" and ds.dtype == np.int32 and ds.dtype_code == 4
        assert ds.sizes.tolist() == e["sequence_lengths"]
        assert [s.tolist() for s in ds] == e["sequences"]
        assert ds.get(7, 4, 2).tolist() == e["sequences"][7][4:6]
    # Our spec-built test writer produces fairseq's bytes, so the legacy error tests exercise real layouts.
    write_tntidx(tmp_path / "ours", e["sequences"])
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours.{ext}").read_bytes() == (LEGACY / f"lazy_int32.{ext}").read_bytes()


def test_pickles_for_worker_processes(fixtures_dir, expected):
    import pickle

    name = "megatron/uint16_docs"
    ds = babelfeed.IndexedDataset(fixtures_dir / name)
    clone = pickle.loads(pickle.dumps(ds))
    assert [s.tolist() for s in clone] == expected["datasets"][name]["sequences"]
    assert clone.doc_idx.tolist() == expected["datasets"][name]["document_indices"]
