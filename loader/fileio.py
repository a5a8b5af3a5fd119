"""Atomic file writes: a temporary file beside the target, fsync, rename. A reader sees old or new, never half."""

from __future__ import annotations

import os
import tempfile


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the temporary (``.<name>.*.partial``) is removed on failure."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
