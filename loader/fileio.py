"""Atomic file writes: a temporary file beside the target, fsync, rename. A reader sees old or new, never half."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def atomic_open(path):
    """A binary file to write in place of ``path``: renamed into place (after fsync) when the block ends,
    removed if it raises. The temporary is ``.<name>.*.partial`` beside the target."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path) as f:
        f.write(data)
