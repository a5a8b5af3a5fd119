"""Verification stamps: what a full check of an index found, remembered by the identity of its files.

Checking every pointer of a 20M-record index costs ~0.2 s and pulls the whole index into memory; hashing its
sizes (the data fingerprint of a resumable run) costs as much again. Both are done once per file: the result
is stored as a small JSON stamp keyed by the index's absolute path and checked against the identity of the
``.idx`` and ``.bin`` (device, inode, size, modification and change times, in nanoseconds). A file rewritten,
replaced, truncated or touched no longer matches its stamp and is checked again.

As git does with its index, a stamp is not written for a file modified less than ``RACY_SECONDS`` ago: a
write within the same clock tick as the check would leave the times unchanged. Such a file is simply checked
again on the next open.

Stamps live in ``$BABELFEED_CACHE_DIR`` (default ``$XDG_CACHE_HOME/babelfeed`` or ``~/.cache/babelfeed``),
under ``stamps/``. Deleting the folder is always safe. When it cannot be written, the stamps are kept for the
life of the process only.

A stamp skips a check, so only the user may write them: the folder is made 0700 and each stamp 0600 whatever
the umask, and a folder that is not the user's or that others can write to is not trusted (its stamps are
ignored, every index is checked in full, and a warning says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import warnings

from babelfeed.fileio import cache_dir, not_private, private_folders  # noqa: F401  (cache_dir: part of this module's face)
from babelfeed.storage.remote.client import is_shadow


RACY_SECONDS = 2.0
_VERSION = 1
_memo: dict[str, dict] = {}  # stamp file -> its content, once read or written
_paths: dict[tuple, str] = {}  # (cache folder, absolute index path) -> stamp file
_trusted: dict[str, bool] = {}  # stamps folder -> whether only this user can write to it


def identity(path: str) -> list[int]:
    return identity_of(os.stat(path), path)


def identity_of(st: os.stat_result, path: str | None = None) -> list[int]:
    """What must not change for a stamp to stay valid: device, inode, size, modification and change times. A
    ``.bin`` in the shadow of a remote folder (``storage/remote/client.py``) leaves its times out: the fetcher writes the
    ranges batches read into it; the object itself changing gives a new file (a new inode)."""
    if path is not None and path.endswith(".bin"):
        if is_shadow(path):
            return [st.st_dev, st.st_ino, st.st_size, 0, 0]
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def replaced(was, now) -> bool:
    """Whether the file identity ``now`` (``identity_of``; device and inode first) is another file than ``was``
    at the same path: the same device, another inode (a file renamed over it). Across devices nothing can be
    told."""
    return was[0] == now[0] and was[1] != now[1]


def _stamp_path(idx_path: str) -> str:
    # Keyed by the absolute path as spelled (no realpath: resolving every component costs a syscall each, and
    # far more on network file systems). The key only decides where the stamp is looked for; whether it holds
    # is decided by the files' identity alone, so two spellings of one file merely keep two stamps.
    root = cache_dir()
    absolute = os.path.abspath(idx_path)
    path = _paths.get((root, absolute))
    if path is None:
        key = hashlib.blake2b(absolute.encode(), digest_size=16).hexdigest()
        path = _paths[(root, absolute)] = os.path.join(root, "stamps", key + ".json")
    return path


def _folder_trusted(folder: str) -> bool:
    """Whether the stamps in ``folder`` can be believed: it is this user's and nobody else can write to it (a
    missing folder holds nothing to believe). Said once per folder when not."""
    known = _trusted.get(folder)
    if known is not None:
        return known
    try:
        st = os.stat(folder)
    except OSError:
        return True  # nothing there yet (not remembered: it may be made)
    ok = not_private(st) is None
    if not ok:
        warnings.warn(f"{folder}: the verification stamps folder is not yours or others can write to it (mode "
                      f"{oct(st.st_mode & 0o777)}): a planted stamp could skip an index's check, so its stamps are "
                      f"ignored and every index is checked in full. Fix it with chmod 700 {folder} (as its owner), "
                      f"or set BABELFEED_CACHE_DIR to a folder of your own", stacklevel=4)
    _trusted[folder] = ok
    return ok


def _ids(idx_path: str, bin_path: str) -> list | None:
    try:
        return [identity(idx_path), identity(bin_path)]
    except OSError:
        return None


def lookup(idx_path: str, bin_path: str) -> dict:
    """What earlier checks recorded about these exact files ({} when nothing, or when the files changed)."""
    ids = _ids(idx_path, bin_path)
    return {} if ids is None else lookup_ids(idx_path, ids)


def lookup_ids(idx_path: str, ids: list) -> dict:
    """:func:`lookup` for files whose identities (``[identity(idx), identity(bin)]``) the caller took already.

    A stamp read once is remembered for the process, so a later open of the same files reads no stamp file."""
    path = _stamp_path(idx_path)
    if not _folder_trusted(os.path.dirname(path)):
        return {}
    stamp = _memo.get(path)
    if stamp is None or stamp.get("files") != ids:
        try:
            with open(path, "rb") as f:
                stamp = json.loads(f.read())
        except OSError:
            return {}
        except ValueError:
            stamp = None
    if not _sound(stamp):
        # a damaged stamp: as none (the index is checked again and a new stamp kept), said once per process
        if path not in _damaged:
            _damaged.add(path)
            warnings.warn(f"{path}: a damaged verification stamp (for {idx_path}) is ignored; the index is checked "
                          f"again and the stamp written anew", stacklevel=3)
        return {}
    if stamp.get("version") != _VERSION or stamp.get("files") != ids:
        return {}
    _memo[path] = stamp
    return dict(stamp.get("facts", {}))


_damaged: set = set()  # stamp files found damaged in this process (warned about once)


def _sound(stamp) -> bool:
    """A stamp as written: a dict whose facts are of the types recorded (``digest`` a string, ``shortest`` a
    count, every other fact a flag). JSON of other types (an edit, another tool) is damage, not facts."""
    if not isinstance(stamp, dict) or not isinstance(stamp.get("facts", {}), dict):
        return False
    for key, value in stamp.get("facts", {}).items():
        if key == "digest":
            ok = isinstance(value, str)
        elif key == "shortest":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else:
            ok = isinstance(value, bool)
        if not ok:
            return False
    return True


def record_ids(idx_path: str, ids: list, **facts) -> None:
    """Remember ``facts`` (JSON values) about the files as they were when the caller took ``ids`` (before it
    read them: a file changed since no longer matches the stamp), next to what is known already. Nothing is
    recorded for files modified in the last ``RACY_SECONDS`` (see the module docstring). Inside
    :func:`deferred`, the stamp file is written when the outermost ``deferred`` ends."""
    newest = max(ids[0][3], ids[1][3], ids[0][4], ids[1][4]) / 1e9
    if time.time() - newest < RACY_SECONDS:
        return
    path = _stamp_path(idx_path)
    known = lookup_ids(idx_path, ids)
    known.update(facts)
    stamp = {"version": _VERSION, "index": os.path.abspath(idx_path), "files": ids, "facts": known}
    _memo[path] = stamp
    pending = getattr(_deferral, "pending", None)
    if pending is not None:
        pending[path] = None
        return
    _write([path])


def _write(paths) -> None:
    """Write the stamp files ``paths`` as this process knows them now (each the newest merged stamp, which may
    hold facts another thread added since it was held back), each atomically."""
    checked: set = set()
    for path in paths:
        stamp = _memo.get(path)
        if stamp is None:  # (forgotten since)
            continue
        folder = os.path.dirname(path)
        try:
            if folder not in checked:
                private_folders(folder)
                checked.add(folder)
            if not _folder_trusted(folder):
                continue
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"  # (threads write the same stamp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(stamp, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: the stamp lives for this process only


_deferral = threading.local()  # .pending: {stamp file: None} whose writes deferred() holds back, in this thread


@contextlib.contextmanager
def deferred():
    """Hold this thread's stamp writes back until the block ends, then write each stamp file once: opening a
    data folder records two facts per index (its check, then its ``</s>`` endings), and thousands of corpora made
    that two file writes each. Stamps are remembered in memory at once, and written even when the block raises
    (the files checked before the error were checked)."""
    if getattr(_deferral, "pending", None) is not None:  # (nested: the outermost block writes)
        yield
        return
    _deferral.pending = {}
    try:
        yield
    finally:
        pending, _deferral.pending = _deferral.pending, None
        _write(pending)


def forget() -> None:
    """Drop the stamps held in memory (tests; the files on disk stay)."""
    _memo.clear()
    _damaged.clear()
    _paths.clear()
    _trusted.clear()
