"""The gather engine never reads outside the data and never holds a file open per corpus."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
import babelfeed.gather
import babelfeed.sources.rows
from synthetic import config_for
from test_gather_property import make

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are


def corrupt_pointer(prefix: str, record: int, value: int) -> None:
    """Overwrite one byte pointer in the middle of a fairseq index (the quick check at open samples 256)."""
    with open(prefix + ".idx", "r+b") as f:
        head = f.read(26)
        n = int(np.frombuffer(head[18:26], "<u8")[0])
        f.seek(26 + 4 * n + 8 * record)
        f.write(np.int64(value).tobytes())


@pytest.mark.parametrize("table", [True, False])
def test_a_record_outside_its_bin_raises_naming_file_and_record(tmp_path, monkeypatch, table):
    monkeypatch.setattr(babelfeed.sources.rows.RowTable, "MIN_COMPONENTS", 0 if table else 10**9)
    root = tmp_path / "bin"
    os.makedirs(root / "shard000")
    d = babelfeed.Dictionary()
    for i in range(50):
        d.add_symbol(f"w{i}")
    d.add_language_tokens(["aa", "bb"])
    d.save(str(root / "dict.txt"))
    rng = np.random.default_rng(0)
    for lang in ("aa", "bb"):
        with babelfeed.IndexedDatasetBuilder(str(root / "shard000" / f"train.aa-bb.{lang}"), np.uint16,
                                          format="fairseq") as b:
            for _ in range(1000):
                b.add_item(np.append(rng.integers(4, 50, int(rng.integers(1, 20))), 2))
            b.finalize()
    corrupt_pointer(str(root / "shard000" / "train.aa-bb.bb"), 5, 10**9)
    # the default full check refuses it at open; with verify="quick" every record a window reads is still checked
    with pytest.raises(babelfeed.InconsistentIndexError, match=r"train\.aa-bb\.bb\.idx.*pointer of record 5 "):
        babelfeed.build_train_iterator(config_for(root, mixing__sampler="concat"))
    cfg = config_for(root, mixing__sampler="concat", data__verify="quick")
    with pytest.raises(babelfeed.InconsistentIndexError, match=r"train\.aa-bb\.bb\.idx.*record 5 .*outside"):
        for _ in babelfeed.build_train_iterator(cfg):
            pass


def test_the_kernel_refuses_addresses_outside_the_space():
    if babelfeed.gather.engine.KERNEL is None:
        pytest.skip("the compiled kernel is not built (tests/iterators/test_golden_batches.py says so)")
    space = np.arange(100, dtype=np.uint16)
    out = np.empty((2, 8), np.int64)
    args = lambda start: (space, "H", 0, np.array(start, np.int64), np.array([4, 4], np.int64),  # noqa: E731
                          np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros((2, 0), np.int64), 0, 1, out, "q",
                          None, 2)
    babelfeed.gather.engine.KERNEL.fill_rows(*args([0, 96]))
    assert out[1, :4].tolist() == [96, 97, 98, 99] and (out[1, 4:] == 1).all()
    with pytest.raises(IndexError, match="row 1"):  # not babelfeed's: the kernel's own check
        babelfeed.gather.engine.KERNEL.fill_rows(*args([0, 97]))
    with pytest.raises(IndexError, match="row 0"):  # not babelfeed's: the kernel's own check
        babelfeed.gather.engine.KERNEL.fill_rows(*args([-1, 0]))
    dest = np.zeros(10, np.int64)
    with pytest.raises(IndexError, match="piece 0"):  # not babelfeed's: the kernel's own check
        babelfeed.gather.engine.KERNEL.pieces(space, "H", 0, np.array([98], np.int64), np.array([3], np.int64),
                                    np.array([0], np.int64), dest, "q")


FD_CHILD = r"""
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
import babelfeed
from synthetic import config_for
cfg = config_for(sys.argv[2], data__shards="all", batching__max_tokens=2048)
it = babelfeed.build_train_iterator(cfg)
fds, batches = set(), 0
for batch in it:
    batches += 1
    fds.add(len(os.listdir("/proc/self/fd")))
print(json.dumps({"batches": batches, "max_fds": max(fds), "files": sum(len(f) for _, _, f in os.walk(sys.argv[2]))}))
"""


def test_open_files_do_not_grow_with_corpora(tmp_path):
    """600 directions x 2 shards are 4,800 files; the iterator runs a whole epoch with 64 file descriptors."""
    make(str(tmp_path), 600, 2, seed=7)
    out = subprocess.run([sys.executable, "-c", FD_CHILD, HERE, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["files"] > 4800 and report["batches"] > 10
    assert report["max_fds"] < 20


@pytest.mark.parametrize("mode", ["concat", "pack", "sentences"])
@pytest.mark.parametrize("field", ["pointer", "size"])
def test_lm_records_outside_the_bin_raise(tmp_path, mode, field):
    prefix = str(tmp_path / "web")
    rng = np.random.default_rng(0)
    with babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format="megatron") as b:
        for _ in range(5000):
            b.add_item(np.append(rng.integers(10, 500, int(rng.integers(3, 40))), 2))
            b.end_document()
        b.finalize()
    ds = babelfeed.IndexedDataset(prefix)
    n = len(ds)
    with open(prefix + ".idx", "r+b") as f:  # record 1010: neither sampled by the quick check at open nor beside one
        if field == "pointer":
            f.seek(34 + 4 * n + 8 * 1010)
            f.write(np.int64(ds.bin_size + 4096).tobytes())
        else:
            f.seek(34 + 4 * 1010)
            f.write(np.int32(10**6).tobytes())
    babelfeed.IndexedDataset(prefix, verify="quick")  # opens: the corruption is where the quick check does not look
    with pytest.raises(babelfeed.InconsistentIndexError, match=r"web\.idx: "):  # the default full check refuses it
        babelfeed.LMIterator.build(f"1 {prefix}", seq_len=32, global_batch=4, num_samples=400, split="100,0,0",
                                mode=mode)
    it = babelfeed.LMIterator.build(f"1 {prefix}", seq_len=32, global_batch=4, num_samples=400, split="100,0,0",
                                 mode=mode, verify="quick")
    with pytest.raises(babelfeed.InconsistentIndexError, match=r"web\.idx: record 1010 .*outside"):
        for _ in it:
            pass


def test_a_bin_that_shrank_before_mapping_is_refused(tmp_path):
    root = tmp_path
    make(str(root), 3, 1, seed=1)
    it = babelfeed.build_train_iterator(config_for(root, mixing__sampler="concat"))
    victim = next(p for p in sorted((root / "shard000").iterdir()) if p.suffix == ".bin" and p.stat().st_size > 8)
    os.truncate(victim, victim.stat().st_size - 4)  # shrunk after the iterator planned on its size
    with pytest.raises(babelfeed.TruncatedFileError, match="changed under the loader"):
        next(it)


@pytest.mark.parametrize("code,dtype", [("H", np.uint16), ("i", np.int32), ("q", np.int64), ("B", np.uint8)])
@pytest.mark.parametrize("out_code", ["q", "i"])
def test_the_kernel_reports_the_largest_id_it_wrote(code, dtype, out_code):
    """The dictionary check trusts fill_rows' largest id instead of a second pass: it must be the largest of the
    prefixes and tokens written (pad excluded), a negative id counting as huge."""
    if babelfeed.gather.engine.KERNEL is None:
        pytest.skip("the compiled kernel is not built (tests/iterators/test_golden_batches.py says so)")
    rng = np.random.default_rng(len(code) * 7 + ord(code) + ord(out_code))
    hi = min(np.iinfo(dtype).max, 2**31 - 1)
    for trial in range(60):
        space = rng.integers(0, min(hi, 50 + trial * 1000), 500).astype(dtype)
        if dtype in (np.int32, np.int64) and trial % 5 == 0:
            space[rng.integers(0, 500)] = -3  # a corrupt negative id
        n, width = int(rng.integers(1, 20)), 40
        body = rng.integers(0, 30, n).astype(np.int64)
        plen = rng.integers(0, 3, n).astype(np.int64)
        prefix = rng.integers(0, 60_000, (n, 2)).astype(np.int64)
        start = rng.integers(0, 500 - 30, n).astype(np.int64)
        col0 = rng.integers(0, width - 32, n).astype(np.int64)
        shift = int(rng.integers(0, 3)) if code in "iq" else 0
        out = np.empty((n, width), np.int64 if out_code == "q" else np.int32)
        top = babelfeed.gather.engine.KERNEL.fill_rows(space, code, shift, start, body, col0, plen, prefix, 2, 1, out, out_code,
                                             None, 2)
        written = [int(p) for r in range(n) for p in prefix[r, :plen[r]]]
        written += [int(v) - shift for r in range(n) for v in space[start[r]:start[r] + body[r]]]
        assert top == max((v % 2**64 for v in written), default=0)


def test_a_bin_truncated_while_mapped_is_named_at_the_next_window_not_a_sigbus(tmp_path):
    """A .bin truncated in place while mapped killed the process with SIGBUS, printing nothing (issue 23 item
    15). Each planning window begins with one stat per mapped file: the next window refuses, naming the file.
    (A child process: a read past the new end inside a window still faults.)"""
    import subprocess
    import sys

    from synthetic import make_data_bin

    make_data_bin(tmp_path)
    code = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from synthetic import config_for
root = sys.argv[2]
it = babelfeed.build_train_iterator(config_for(root, mixing__sampler="concat", batching__window=40,
                                               batching__max_tokens=128))
next(it)
while True:  # to the end of the first window
    where = it.planner.locate(it.epoch, it.consumed)
    if where is not None and where[1] == 0:
        break
    next(it)
for name in sorted(os.listdir(os.path.join(root, "shard000"))):
    if name.endswith(".bin"):
        os.truncate(os.path.join(root, "shard000", name), 0)
try:
    for _ in range(10):
        next(it)
    print("no error")
except babelfeed.FormatError as e:
    print("refused", e)
"""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, here, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "refused" in out.stdout and ".bin: truncated while the job reads it" in out.stdout, out.stdout


_INSIDE = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
root, kind = sys.argv[2], sys.argv[3]
if kind == "lm":
    import golden
    golden.make_lm_data(root)
    cfg = babelfeed.load_config("lm_packing")
    cfg.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * 30
    cfg.split, cfg.cache_dir = "90,10,0", os.path.join(root, "cache")
    it = babelfeed.build_iterator(cfg)
    bins = [os.path.join(root, "lm", n + ".bin") for n in ("web", "books")]
else:
    from synthetic import config_for, make_data_bin
    make_data_bin(root)
    it = babelfeed.build_train_iterator(config_for(root, mixing__sampler="concat", batching__max_tokens=128))
    bins = [os.path.join(root, "shard000", n) for n in os.listdir(os.path.join(root, "shard000")) if n.endswith(".bin")]
next(it)  # the window is planned and the files mapped
for b in bins:
    os.truncate(b, 0)
try:
    next(it)
    print("no error")
except babelfeed.DataChangedError as e:
    print("refused", e)
"""


@pytest.mark.parametrize("kind", ["translation", "lm"])
def test_a_bin_truncated_inside_a_window_is_named_not_a_silent_sigbus(tmp_path, kind):
    """A read past a .bin's new end inside a planning window killed the process with SIGBUS, printing nothing
    (issue 23 item 15). The compiled gather catches the fault around its copy and the error names the file."""
    if babelfeed.gather.engine.KERNEL is None:
        pytest.skip("the compiled kernel is not built (tests/iterators/test_golden_batches.py says so)")
    out = subprocess.run([sys.executable, "-c", _INSIDE, HERE, str(tmp_path), kind], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "refused" in out.stdout and ".bin: truncated while the job reads it" in out.stdout, out.stdout


def test_a_bus_error_outside_the_gather_still_ends_the_process():
    """The gather's SIGBUS guard hands every other SIGBUS on: to faulthandler where it is enabled (which prints
    the stack), else to the default action (the process dies of it), even after the guard was installed."""
    if babelfeed.gather.engine.KERNEL is None:
        pytest.skip("the compiled kernel is not built (tests/iterators/test_golden_batches.py says so)")
    code = r"""
import faulthandler, os, signal, sys
import numpy as np
if sys.argv[1] == "fh":
    faulthandler.enable()
from babelfeed.gather.engine import KERNEL
space = np.arange(100, dtype=np.uint16)
out = np.empty((1, 8), np.int64)
z = np.zeros(1, np.int64)
KERNEL.fill_rows(space, "H", 0, z, np.ones(1, np.int64), z, z, np.zeros((1, 0), np.int64), 0, 1, out, "q", None, 2)
print("guard installed", flush=True)
os.kill(os.getpid(), signal.SIGBUS)
print("survived", flush=True)
"""
    for mode in ("plain", "fh"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60)
        assert out.returncode == -7, (mode, out.returncode, out.stderr[-1000:])
        assert "guard installed" in out.stdout and "survived" not in out.stdout
        assert ("Fatal Python error: Bus error" in out.stderr) == (mode == "fh"), out.stderr[-1000:]
