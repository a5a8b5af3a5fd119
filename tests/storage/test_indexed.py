"""Bad input: every failure is a FormatError subclass (or FileNotFoundError) naming the file and the problem."""

import os
import shutil
import struct

import numpy as np
import pytest

import babelfeed
from babelfeed.storage.indexed import IndexedDataset

from helpers import write_tntidx


def copy_fixture(fixtures_dir, name, dst):
    for ext in ("bin", "idx"):
        shutil.copy(fixtures_dir / f"{name}.{ext}", f"{dst}.{ext}")
        os.chmod(f"{dst}.{ext}", 0o644)
    return dst


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.fixture
def fs(fixtures_dir, tmp_path):
    return copy_fixture(fixtures_dir, "fairseq/uint16", tmp_path / "fs")


@pytest.fixture
def mg(fixtures_dir, tmp_path):
    return copy_fixture(fixtures_dir, "megatron/uint16_docs", tmp_path / "mg")


def test_missing_files(tmp_path, fs):
    with pytest.raises(FileNotFoundError, match="nothing"):
        IndexedDataset(tmp_path / "nothing")
    os.unlink(f"{fs}.bin")
    with pytest.raises(FileNotFoundError, match=r"fs\.bin"):
        IndexedDataset(fs)


def test_bad_magic(fs):
    patch(f"{fs}.idx", 0, b"NOTANIDX!")
    with pytest.raises(babelfeed.BadMagicError, match=r"fs\.idx.*not a fairseq/Megatron index"):
        IndexedDataset(fs)


@pytest.mark.parametrize("size", [0, 4, 20])
def test_truncated_header(fs, size):
    os.truncate(f"{fs}.idx", size)
    with pytest.raises(babelfeed.TruncatedFileError, match=r"fs\.idx"):
        IndexedDataset(fs)


def test_unknown_version(fs):
    patch(f"{fs}.idx", 9, struct.pack("<Q", 2))
    with pytest.raises(babelfeed.UnsupportedVersionError, match="version 2"):
        IndexedDataset(fs)


def test_unknown_dtype_code(fs):
    patch(f"{fs}.idx", 17, bytes([42]))
    with pytest.raises(babelfeed.UnknownDtypeError, match="dtype code 42"):
        IndexedDataset(fs)


def test_fairseq_only_code_in_megatron_layout(mg):
    patch(f"{mg}.idx", 17, bytes([9]))
    with pytest.raises(babelfeed.UnknownDtypeError, match="uint32 in fairseq"):
        IndexedDataset(mg)


def test_code_7_differs_between_libraries(tmp_path):
    """Code 7 is float32 in Megatron-LM and float64 in fairseq; each layout reads its own table."""
    for fmt, dtype in (("megatron", np.float32), ("fairseq", np.float64)):
        b = babelfeed.IndexedDatasetBuilder(tmp_path / fmt, dtype, format=fmt)
        b.add_item(np.array([1.5, 2.5]))
        b.finalize()
        patch(tmp_path / f"{fmt}.idx", 17, bytes([7]))
        ds = IndexedDataset(tmp_path / fmt)
        assert ds.dtype == np.dtype(dtype)
        assert ds[0].tolist() == [1.5, 2.5]


def test_bin_shorter_than_index(fs):
    os.truncate(f"{fs}.bin", os.path.getsize(f"{fs}.bin") - 2)
    for verify in ("full", "quick"):
        with pytest.raises(babelfeed.TruncatedFileError, match=r"fs\.bin.*cut short"):
            IndexedDataset(fs, verify=verify)


def test_bin_longer_than_index_warns(fs):
    with open(f"{fs}.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.warns(UserWarning, match="2 trailing bytes"):
        IndexedDataset(fs)


def test_idx_size_matches_no_layout(fs):
    with open(f"{fs}.idx", "ab") as f:
        f.write(b"\0" * 3)
    with pytest.raises(babelfeed.InconsistentIndexError, match="declares 20 sequences"):
        IndexedDataset(fs)


def test_a_cut_index_is_measured_against_the_layouts_its_header_can_be(fs, mg):
    """A fairseq .idx cut short also printed what "Megatron-LM needs" from a document count read out of its
    sizes (8 * 103079215115 bytes): a count larger than the sequences + 1 is no Megatron header, and is left out."""
    os.truncate(f"{fs}.idx", 50)
    with pytest.raises(babelfeed.TruncatedFileError, match=r"fairseq needs 26 \+ 12\*20 = 266 bytes") as e:
        IndexedDataset(fs)
    assert "Megatron" not in str(e.value)
    os.truncate(f"{mg}.idx", os.path.getsize(f"{mg}.idx") - 8)  # a Megatron index cut short: both layouts said
    with pytest.raises(babelfeed.FormatError, match="Megatron-LM needs 34"):
        IndexedDataset(mg)


def test_negative_size(fs):
    patch(f"{fs}.idx", 26 + 4 * 3, struct.pack("<i", -5))
    with pytest.raises(babelfeed.InconsistentIndexError, match="record 3 has negative size -5"):
        IndexedDataset(fs)


def test_overlapping_records(fs):
    n = 20
    patch(f"{fs}.idx", 26 + 4 * n + 8 * 5, struct.pack("<q", 2))
    with pytest.raises(babelfeed.InconsistentIndexError, match="record 5.*overlap"):
        IndexedDataset(fs)


def _overflowed_fairseq(tmp_path, n=6):
    """A fairseq file whose pointers wrapped like fairseq issue #5532 (int32 arithmetic)."""
    seqs = [np.arange(i, i + 5, dtype=np.int64) for i in range(n)]
    b = babelfeed.IndexedDatasetBuilder(tmp_path / "wrap", np.uint16, format="fairseq")
    for s in seqs:
        b.add_item(s)
    b.finalize()
    idx = tmp_path / "wrap.idx"
    ptr_off = 26 + 4 * n
    good = np.frombuffer(idx.read_bytes()[ptr_off:], dtype=np.int64)
    bad = good.copy()
    bad[3:] -= 2**32  # what an int32 running sum stored into int64 produces past the wrap
    patch(idx, ptr_off, bad.tobytes())
    return tmp_path / "wrap", seqs


def test_pointer_overflow_detected_and_recomputed(tmp_path):
    prefix, seqs = _overflowed_fairseq(tmp_path)
    with pytest.raises(babelfeed.InconsistentIndexError, match=r"record 3.*#5532.*recompute_pointers=True"):
        IndexedDataset(prefix)
    with pytest.raises(babelfeed.InconsistentIndexError):
        IndexedDataset(prefix, verify="quick")
    ds = IndexedDataset(prefix, recompute_pointers=True)
    assert [s.tolist() for s in ds] == [s.tolist() for s in seqs]


def test_quick_mode_still_bounds_every_read(tmp_path):
    """A corrupt pointer that the sampled check misses is caught when that record is read."""
    n = 5000
    b = babelfeed.IndexedDatasetBuilder(tmp_path / "big", np.uint16, format="fairseq")
    b.add_items(np.ones(n * 3, np.uint16), np.full(n, 3))
    b.finalize()
    idx = tmp_path / "big.idx"
    victim = 2504  # not among the 256 evenly spaced probes of 5000 records
    probes = set(((np.arange(256) * (n - 1)) // 255).tolist())
    assert victim not in probes and victim - 1 not in probes
    patch(idx, 26 + 4 * n + 8 * victim, struct.pack("<q", 10**9))
    ds = IndexedDataset(tmp_path / "big", verify="quick")
    with pytest.raises(babelfeed.InconsistentIndexError, match=f"record {victim}"):
        ds[victim]
    with pytest.raises(babelfeed.InconsistentIndexError, match=f"record {victim}"):
        IndexedDataset(tmp_path / "big", verify="full")


def test_document_index_must_end_at_sequence_count(mg):
    n, d = 17, 7
    patch(f"{mg}.idx", 34 + 12 * n + 8 * (d - 1), struct.pack("<q", 16))
    with pytest.raises(babelfeed.InconsistentIndexError, match="document index runs from 0 to 16"):
        IndexedDataset(mg)


@pytest.mark.parametrize("verify", ["full", "quick"])
def test_document_index_must_not_decrease(mg, verify):
    """In both modes (issue 39 item 2: an LM opened with verify='quick' served a document index that dips; an LM
    samples by documents, and the pass over them is cheap)."""
    n = 17
    patch(f"{mg}.idx", 34 + 12 * n + 8 * 2, struct.pack("<q", 1))
    with pytest.raises(babelfeed.InconsistentIndexError, match="decreases at document 1: 5 then 1"):
        IndexedDataset(mg, verify=verify)


def test_messages_are_format_errors(fs):
    patch(f"{fs}.idx", 0, b"garbage!!")
    with pytest.raises(babelfeed.FormatError) as info:
        IndexedDataset(fs)
    assert info.value.path == f"{fs}.idx"
    assert isinstance(info.value, ValueError)


# ------------------------------------------------------------------------------------------- legacy TNTIDX
def test_legacy_tntidx_reads_one_based_tokens(tmp_path):
    seqs = [[5, 6, 7, 2], [8, 2], [], [9, 10, 11, 12, 2]]
    write_tntidx(tmp_path / "lz", seqs)
    # The .bin holds ids + 1 (fairseq's Lua heritage); the reader gives the ids back.
    assert np.fromfile(tmp_path / "lz.bin", dtype=np.int32)[:4].tolist() == [6, 7, 8, 3]
    ds = IndexedDataset(tmp_path / "lz")
    assert ds.format == "legacy" and ds.dtype == np.int32 and len(ds) == 4
    assert [s.tolist() for s in ds] == seqs
    assert ds.sizes.tolist() == [4, 2, 0, 5]
    assert ds.pointers.tolist() == [0, 16, 24, 24]
    assert ds.get(3, 1, 2).tolist() == [10, 11]
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert os.path.getsize(tmp_path / "lz.idx") == 48 + 16 * 5 + 8 * 4


def test_legacy_three_item_example_is_136_bytes(tmp_path):
    write_tntidx(tmp_path / "lz", [[5, 6, 7], [2], [8, 2]])
    assert os.path.getsize(tmp_path / "lz.idx") == 136  # the size reported for fairseq's own writer


def test_legacy_errors(tmp_path):
    write_tntidx(tmp_path / "lz", [[5, 6], [7]])
    patch(tmp_path / "lz.idx", 24, struct.pack("<Q", 8))  # element size 8 for int32
    with pytest.raises(babelfeed.InconsistentIndexError, match="element size 8"):
        IndexedDataset(tmp_path / "lz")
    write_tntidx(tmp_path / "lz", [[5, 6], [7]])
    os.truncate(tmp_path / "lz.idx", 60)
    with pytest.raises(babelfeed.TruncatedFileError, match="implies"):
        IndexedDataset(tmp_path / "lz")
    write_tntidx(tmp_path / "lz", [[5, 6], [7]])
    patch(tmp_path / "lz.idx", 48 + 24 + 8, struct.pack("<q", 1))  # data offset of item 1
    with pytest.raises(babelfeed.InconsistentIndexError, match="data offset of record 1"):
        IndexedDataset(tmp_path / "lz")


def test_a_bin_whose_tail_was_zeroed_serves_nothing(tmp_path):
    """568 of 3,000 served rows were a prefix and id 0 with no </s> when a .bin's tail was zeroed (a sparse
    file after a crash); build, iteration and inspect --verify accepted them (issue 23 item 3). Every record of
    a fairseq data_bin ends with </s>: checked at open (full: every record, once per file; quick: the tail
    and a spread), the file and record named."""
    import babelfeed
    from babelfeed.tools.cli import main
    from synthetic import config_for, make_data_bin

    root = tmp_path / "bin"
    make_data_bin(root, valid=False)
    target = root / "shard001" / "train.aaa-bbb.bbb.bin"
    size = target.stat().st_size
    with open(target, "r+b") as f:  # the last quarter zeroed, as a sparse file after a crash reads
        f.seek(size - size // 4)
        f.write(b"\0" * (size // 4))
    for verify in ("full", "quick"):
        with pytest.raises(babelfeed.FormatError, match=r"train\.aaa-bbb\.bbb\.bin: record \d+ ends with token 0, "
                                                        r"not </s> \(id 2\)"):
            babelfeed.build_train_iterator(config_for(root, data__shards="all", data__verify=verify))
    assert main(["inspect", str(root), "--verify"]) != 0


def test_a_full_disk_or_a_file_size_limit_names_the_file(tmp_path):
    """"[Errno 28] No space left on device" named no path (issue 23 item 16). Under a file-size limit (the same
    path through write(2): EFBIG), the builder's and the atomic writer's errors name the file being written."""
    import subprocess
    import sys

    code = r"""
import os, resource, signal, sys
import numpy as np
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
import babelfeed
from babelfeed.fileio import atomic_write
out = sys.argv[1]
for what in ("builder", "atomic"):
    try:
        if what == "builder":
            with babelfeed.IndexedDatasetBuilder(os.path.join(out, "big"), np.int32) as b:
                for _ in range(100):
                    b.add_item(np.arange(1000))
                b.finalize()
        else:
            atomic_write(os.path.join(out, "big.json"), b"x" * (1 << 18))
        print(what, "no error")
    except OSError as e:
        print(what, e.filename, e.errno)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["builder"].startswith(str(tmp_path / "big.bin")), out.stdout
    assert lines["atomic"].startswith(str(tmp_path / "big.json")), out.stdout
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]  # nothing that looks complete, or half


def test_format_errors_keep_their_type_across_processes():
    """A worker's error reaches the training loop through pickling or torch's re-raise (``type(e)(message)``):
    a DataChangedError from a DataLoader worker arrived as a RuntimeError, so a loop catching babelfeed's errors
    caught it in-process only."""
    import pickle

    import babelfeed.errors as errors

    kinds = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.FormatError)]
    assert errors.DataChangedError in kinds and len(kinds) >= 6
    for cls in kinds:
        e = cls("/data/x.bin", "truncated while the job reads it")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.path == e.path and back.reason == e.reason
        again = cls(f"Caught {cls.__name__} in DataLoader worker process 1.\nOriginal Traceback ...\n{e}")
        assert type(again) is cls and str(e) in str(again)


def test_a_write_into_a_missing_folder_names_the_file_asked_for(tmp_path):
    """replay --out /missing/x.npz named the temporary file (/missing/.x.npz.<hex>.partial) the user never asked for."""
    from babelfeed.fileio import atomic_open

    target = tmp_path / "missing" / "x.npz"
    with pytest.raises(FileNotFoundError) as e:
        with atomic_open(target) as f:
            f.write(b"x")
    assert e.value.filename == str(target) and "cannot write into" in str(e.value) and ".partial" not in str(e.value)


def _renamed_over(path) -> None:
    """``path`` replaced by another file of the same bytes, renamed into place (a new inode, as ``binarize
    --overwrite`` or a new mirror of a replaced object makes)."""
    shutil.copy(path, f"{path}.new")
    os.replace(f"{path}.new", path)


def test_a_bin_replaced_between_open_and_first_read_is_refused(fs):
    """The .bin is mapped on first read, from its path: a file renamed over it after the index was opened was
    mapped and read with the old file's index (garbage, or zeros for a shadow of an object replaced in the store
    and mirrored again by the same process). The mapping now refuses a file other than the one opened."""
    ds = IndexedDataset(fs)
    _renamed_over(f"{fs}.bin")
    with pytest.raises(babelfeed.DataChangedError, match=rf"{fs}\.bin: replaced since the job opened it"):
        ds.get(0)
    fresh = IndexedDataset(fs)  # (opened after: reads the file there now)
    assert fresh.bin_inode == os.stat(f"{fs}.bin").st_ino and len(fresh.get(0)) == fresh.sizes[0]


def test_a_dataset_sent_to_a_worker_after_its_files_were_replaced_is_refused(fs):
    """A worker reopens a pickled dataset from its path: a file renamed over it since the sending process opened
    it was read with the sender's plan (two versions of the data). Both the .idx and the .bin are checked."""
    import pickle

    for ext in ("idx", "bin"):
        ds = IndexedDataset(fs)
        sent = pickle.dumps(ds)
        assert len(pickle.loads(sent)) == len(ds)  # (unchanged: reopened)
        _renamed_over(f"{fs}.{ext}")
        with pytest.raises(babelfeed.DataChangedError, match=rf"{fs}\.{ext}: replaced since the process that sent"):
            pickle.loads(sent)
