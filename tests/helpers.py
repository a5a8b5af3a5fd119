"""Test helpers: writers for layouts we only read (legacy TNTIDX), built from the documented byte tables."""

import hashlib
import struct

import numpy as np


def write_tntidx(prefix, sequences, dtype=np.int32, code=4):
    """fairseq's legacy IndexedDatasetBuilder layout: header, dim offsets, data offsets (elements), sizes;
    token values stored +1 (shared/reference/fairseq-megatron-semantics.md §1.7)."""
    sizes = np.array([len(s) for s in sequences], dtype=np.int64)
    data_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    dim_offsets = np.arange(len(sequences) + 1, dtype=np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for s in sequences:
            f.write((np.asarray(s, dtype=np.int64) + 1).astype(dtype).tobytes())
    itemsize = np.dtype(dtype).itemsize
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"TNTIDX\x00\x00")
        f.write(struct.pack("<QQQQQ", 1, code, itemsize, len(sequences), len(sizes)))
        f.write(dim_offsets.tobytes() + data_offsets.tobytes() + sizes.tobytes())


def hist(state):
    """The views of a state's history (``babelfeed.run.history``): ``.steps``, ``.weights``, ``.updates``,
    ``.edits``; a state of an older version is upgraded first."""
    from babelfeed.run.history import check, upgrade

    state = upgrade(state)
    return check(state["history"])


def as_v1(state):
    """``state`` as babelfeed wrote it before the history list (version 1: four logs)."""
    v = hist(state)
    out = {k: x for k, x in state.items() if k not in ("history", "seal")}  # (nor a seal, which came later)
    out["version"] = 1
    out["steps"] = v.steps
    if v.weights:
        out["weights"] = v.weights
    if v.edits:
        out["edits"] = v.edits
    if v.updates and isinstance(out.get("stream"), dict):
        out["stream"] = {**out["stream"], "updates": v.updates}
    return out


def run_fresh(module: str, function: str, *args, timeout: float = 300) -> None:
    """``module.function(*args)`` in a fresh interpreter (nothing imported: no JAX, no fetcher client), for a
    test of a path that forks. Fails the calling test with the child's output when the child fails."""
    import subprocess
    import sys

    import pytest

    code = f"import sys, {module}; {module}.{function}(*{args!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        pytest.fail(f"{module}.{function}{args!r} failed in a fresh process:\n{out.stderr[-4000:]}", pytrace=False)


class TouchEach:
    """A batch transform (picklable, for DataLoader workers) that leaves one file per batch in ``folder`` before
    handing the batch on: a test waits on those files instead of sleeping."""

    def __init__(self, folder: str):
        self.folder = folder

    def __call__(self, batch):
        import os
        import uuid

        open(os.path.join(self.folder, uuid.uuid4().hex), "w").close()
        return batch


def wait_for_files(folder: str, count: int, timeout: float = 120.0) -> None:
    """Block until ``folder`` holds ``count`` files (a worker's progress), at most ``timeout`` seconds."""
    import os
    import time

    end = time.monotonic() + timeout
    while len(os.listdir(folder)) < count:
        if time.monotonic() > end:
            raise TimeoutError(f"{folder}: {len(os.listdir(folder))} of {count} files after {timeout} s")
        time.sleep(0.01)


def decode_ids(it):
    """id -> (key, shard, row) for every component of the iterator's sources."""
    comps = it.planner.sources.components
    base = it.collater.id_base

    def f(i):
        c = int(np.searchsorted(base, i, side="right") - 1)
        return comps[c].key, comps[c].shard, int(i - base[c])
    return f


def digest(batch) -> str:
    h = hashlib.sha256()
    for key in ("id", "weight", "direction", "target"):
        h.update(np.ascontiguousarray(batch[key]).tobytes())
    for key in ("src_tokens", "src_lengths", "prev_output_tokens"):
        h.update(np.ascontiguousarray(batch["net_input"][key]).tobytes())
    h.update(str((batch["ntokens"], batch["nsentences"])).encode())
    return h.hexdigest()


def unimax_as_written(sizes, budget, max_epochs):
    """Algorithm 1 of Chung et al. (2023), UniMax, transcribed as printed: languages sorted by size ascending;
    each takes the remaining budget split evenly over the languages left, at most N epochs of its data."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    remaining, alloc = float(budget), [0.0] * len(sizes)
    for i, lang in enumerate(order):
        share = remaining / (len(order) - i)
        alloc[lang] = min(share, sizes[lang] * max_epochs)
        remaining -= alloc[lang]
    return alloc
