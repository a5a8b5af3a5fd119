"""Fuzz the index parser: any byte string gives a dataset that reads within bounds, or a clean error.

Never a segfault, a hang, garbage beyond the file, or an exception outside FormatError/FileNotFoundError.
"""

import os
import shutil
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import babelfeed

SEEDS = ["fairseq/uint16", "megatron/uint16_docs", "megatron/int32_docs", "fairseq/int32"]


def _exercise(prefix, verify):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # trailing .bin bytes only warn; the fuzzer makes many
            ds = babelfeed.IndexedDataset(prefix, verify=verify)
    except babelfeed.FormatError:
        return
    n = len(ds)
    bin_size = os.path.getsize(f"{prefix}.bin")
    assert ds.num_tokens * ds.dtype.itemsize <= bin_size or verify == "quick"
    for i in range(min(n, 64)):
        try:
            tokens = ds[i]
        except babelfeed.FormatError:
            continue
        assert tokens.ndim == 1 and len(tokens) == int(ds.sizes[i])
    if n:
        try:
            ds[n - 1]
        except babelfeed.FormatError:
            pass


mutation = st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=9))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.sampled_from(SEEDS),
    mutations=st.lists(mutation, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 400)),
    bin_cut=st.one_of(st.none(), st.integers(0, 800)),
    verify=st.sampled_from(["full", "quick"]),
)
def test_mutated_index(tmp_path_factory, fixtures_dir, seed, mutations, cut, bin_cut, verify):
    d = tmp_path_factory.mktemp("fz")
    prefix = d / "x"
    shutil.copy(fixtures_dir / f"{seed}.bin", f"{prefix}.bin")
    data = bytearray((fixtures_dir / f"{seed}.idx").read_bytes())
    for offset, patch in mutations:
        offset %= max(len(data), 1)
        data[offset : offset + len(patch)] = patch
    if cut is not None:
        del data[cut:]
    with open(f"{prefix}.idx", "wb") as f:
        f.write(data)
    os.chmod(f"{prefix}.bin", 0o644)
    if bin_cut is not None:
        os.truncate(f"{prefix}.bin", min(bin_cut, os.path.getsize(f"{prefix}.bin")))
    _exercise(prefix, verify)


@settings(max_examples=300, deadline=None)
@given(head=st.sampled_from([b"", b"MMIDIDX\x00\x00", b"TNTIDX\x00\x00"]), body=st.binary(max_size=300),
       bin_data=st.binary(max_size=300))
def test_random_bytes(tmp_path_factory, head, body, bin_data):
    d = tmp_path_factory.mktemp("rb")
    prefix = d / "x"
    with open(f"{prefix}.idx", "wb") as f:
        f.write(head + body)
    with open(f"{prefix}.bin", "wb") as f:
        f.write(bin_data)
    _exercise(prefix, "full")
    _exercise(prefix, "quick")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 2**64 - 1), d=st.integers(0, 2**64 - 1), code=st.integers(0, 255))
def test_huge_counts_in_header(tmp_path_factory, n, d, code):
    """Absurd counts must not allocate or loop; the size check rejects them up front."""
    prefix = tmp_path_factory.mktemp("hc") / "x"
    header = b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([code]) + n.to_bytes(8, "little")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(header + d.to_bytes(8, "little") + np.zeros(4, np.int64).tobytes())
    open(f"{prefix}.bin", "wb").close()
    _exercise(prefix, "full")
