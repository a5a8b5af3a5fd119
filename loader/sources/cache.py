"""A disk cache of computed index arrays (raw-text line offsets and lengths, LM sample indexes, subword
segmentations), keyed by a hash of a written description of what was built."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import warnings

import numpy as np

from babelfeed.errors import UsageTypeError
from babelfeed.fileio import atomic_open, atomic_write


def _identity(path: str) -> list[int]:
    """What an edit or a replacement of a cache file changes: its size, modification and change times."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class IndexCache:
    """Computed index arrays kept as ``.npy`` files, keyed by a hash of everything they depend on.

    ``get(name, description, build)`` returns ``{array name: array}``: loaded (memory-mapped) when a complete,
    matching entry exists, else built by ``build()`` and saved. The file names carry the hash of the
    description, so a changed input can never hit a stale entry; the stored description is compared too (not
    only the file's existence), every array is checked against its recorded dtype and shape, and a corrupt or
    partial entry is rebuilt. Writes are atomic and the description is written last, so ranks sharing the
    directory see either a complete entry or none. The description also records each array file's size and
    modification and change times as written: a file edited or replaced since (a change time cannot be set back)
    is not served but rebuilt, with a warning, as the verification stamps treat an index.
    """

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    @staticmethod
    def key(description: dict) -> str:
        blob = json.dumps(description, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def _path(self, key: str, name: str, affix: str) -> str:
        return os.path.join(self.directory, f"{key}-{name}-{affix}")

    def load(self, name: str, description: dict) -> dict | None:
        key = self.key(description)
        try:
            with open(self._path(key, name, "description.json")) as f:
                stored = json.load(f)
        except (OSError, ValueError):
            return None
        if stored.get("description") != json.loads(json.dumps(description, sort_keys=True, default=str)):
            return None
        arrays = {}
        for array, meta in stored.get("arrays", {}).items():
            path = self._path(key, name, f"{array}.npy")
            try:
                written = _identity(path)
                a = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError):
                return None
            if meta.get("file") != written:
                warnings.warn(f"{path}: this cached index changed after babelfeed wrote it (size or times differ "
                              f"from its record): it is not used but built again", stacklevel=3)
                return None
            if str(a.dtype) != meta["dtype"] or list(a.shape) != meta["shape"]:
                return None
            arrays[array] = a
        return arrays

    def save(self, name: str, description: dict, arrays: dict) -> None:
        if not isinstance(arrays, dict) or not all(isinstance(k, str) for k in arrays):
            raise UsageTypeError(f"IndexCache {name!r}: the arrays to cache must be a dict of name -> array (what build() "
                                 f"returns for get()), got {type(arrays).__name__}")
        key = self.key(description)
        meta = {}
        for array, values in arrays.items():
            values = np.ascontiguousarray(values)
            path = self._path(key, name, f"{array}.npy")
            with atomic_open(path) as f:
                np.save(f, values, allow_pickle=False)
            meta[array] = {"dtype": str(values.dtype), "shape": list(values.shape), "file": _identity(path)}
        record = {"description": json.loads(json.dumps(description, sort_keys=True, default=str)), "arrays": meta}
        atomic_write(self._path(key, name, "description.json"), json.dumps(record, indent=2).encode())

    def get(self, name: str, description: dict, build) -> dict:
        cached = self.load(name, description)
        if cached is not None:
            return cached

        # one builder at a time per entry (DataLoader workers, ranks of a host): a second writer replacing the
        # first's files between its save and load made the first refuse its own entry as edited since
        lock = self._path(self.key(description), name, "lock")
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            cached = self.load(name, description)  # (built by another while this one waited)
            if cached is not None:
                return cached
            arrays = build()
            self.save(name, description, arrays)
            cached = self.load(name, description)
        # (None only when another host writes the entry at once, on a file system without locks: these arrays
        # are the same, built here)
        return cached if cached is not None else {k: np.asarray(v) for k, v in arrays.items()}

