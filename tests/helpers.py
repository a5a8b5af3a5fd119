"""Test helpers: writers for layouts we only read (legacy TNTIDX), built from the documented byte tables."""

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
    out = {k: x for k, x in state.items() if k != "history"}
    out["version"] = 1
    out["steps"] = v.steps
    if v.weights:
        out["weights"] = v.weights
    if v.edits:
        out["edits"] = v.edits
    if v.updates and isinstance(out.get("stream"), dict):
        out["stream"] = {**out["stream"], "updates": v.updates}
    return out
