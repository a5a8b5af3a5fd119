"""Atomic file writes: a temporary file beside the target, fsync, rename. A reader sees old or new, never half.

Files are created with mode 0o666 less the umask, as every other tool creates them."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from babelfeed.errors import StoreError


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


def create_temp(directory: str, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file ``directory/prefix<random>suffix`` opened for writing: ``(fd, path)``.

    Like ``tempfile.mkstemp`` (exclusive create, a fresh name on a collision) but created with mode 0o666, so
    the kernel applies the umask (and a directory's default ACL) as for any file a tool writes. mkstemp's
    0600 survives the rename into place and leaves outputs unreadable by other users and other uids.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary name {prefix}*{suffix} after 100 tries")


class NamedWrites:
    """A binary file whose write errors name ``path``: a full disk (ENOSPC) or a file-size limit (EFBIG) raised
    "[Errno 28] No space left on device" with no file at all."""

    def __init__(self, f, path: str):
        self._f, self.path = f, os.fspath(path)

    def _named(self, e: OSError) -> OSError:
        return OSError(e.errno, e.strerror, self.path) if e.filename is None else e

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            raise self._named(e) from None

    def flush(self) -> None:
        try:
            self._f.flush()
        except OSError as e:
            raise self._named(e) from None

    def close(self) -> None:
        try:
            self._f.close()
        except OSError as e:
            raise self._named(e) from None

    def fsync(self) -> None:
        try:
            os.fsync(self._f.fileno())
        except OSError as e:
            raise self._named(e) from None

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextlib.contextmanager
def atomic_open(path):
    """A binary file to write in place of ``path``: renamed into place (after fsync) when the block ends,
    removed if it raises. The temporary is ``.<name>.*.partial`` beside the target."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = create_temp(directory, f".{os.path.basename(path)}.", ".partial")
    except (FileNotFoundError, NotADirectoryError, PermissionError) as e:
        # named as the file asked for (the error named the temporary, a file the user never heard of)
        raise type(e)(e.errno, f"{e.strerror} (cannot write into {directory})", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield NamedWrites(f, path)
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                raise OSError(e.errno, e.strerror, path) if e.filename is None else e from None
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path) as f:
        f.write(data)


def cache_dir() -> str:
    """babelfeed's per-user cache folder: ``$BABELFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/babelfeed`` or
    ``~/.cache/babelfeed`` (verification stamps, the shadows of remote data folders)."""
    root = os.environ.get("BABELFEED_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "babelfeed")
    return root


def private_folders(folder: str) -> None:
    """``os.makedirs(folder)`` with every folder it makes 0700 (makedirs gives only the last one its mode: the
    cache folder itself came out 0777 under umask 000)."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for f in reversed(missing):
        try:
            os.mkdir(f, 0o700)  # (the umask only takes bits away)
        except FileExistsError:
            pass


def not_private(st: os.stat_result) -> str | None:
    """Why a folder of these stats is not this user's alone (``"a link"``, ``"owned by uid N"``, ``"writable by
    others (mode ...)"``, ``"not a folder"``), or None when it is (always None where the system has no users)."""
    if not hasattr(os, "getuid"):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"writable by others (mode {oct(st.st_mode & 0o777)})"
    return None


def private_folder(folder: str, what: str) -> str:
    """:func:`private_folders`, then ``folder`` refused unless it is a real folder (not a link), this user's, and
    nobody else can write to it: ``what`` babelfeed keeps there (a lock, a log, a socket, staged output) would
    otherwise be a file another user chose (a link planted in a shared cache folder). Returns ``folder``."""

    private_folders(folder)
    kind = not_private(os.lstat(folder))
    if kind is not None:
        raise StoreError(f"{folder}: refused as the folder of {what}: it is {kind}, so another user could choose "
                         f"the files babelfeed writes there. Remove it (or chmod 700 it, as its owner), or set "
                         f"BABELFEED_CACHE_DIR to a folder of your own")
    return folder


def open_private(path: str, flags: int = os.O_RDWR | os.O_CREAT | os.O_APPEND):
    """``open(path)`` in binary mode that never follows a link at ``path`` (a planted one is refused by the system)
    and creates the file 0600."""
    return os.fdopen(os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o600),
                     "r+b" if flags & os.O_RDWR else "ab")
