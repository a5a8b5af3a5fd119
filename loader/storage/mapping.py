"""Read-only file mappings that hold no file descriptor, and flat address spaces over many files.

Python's ``mmap.mmap`` keeps a duplicate of the file descriptor for as long as the mapping lives, so a run that
maps the ``.idx`` and ``.bin`` of 10,000 corpora holds 40,000 descriptors and fails with "Too many open files"
(clusters often allow 1,024). POSIX lets a mapping outlive its descriptor; here the file is opened, mapped with
libc's ``mmap`` through ctypes and closed at once, so the number of open files never grows with the number of
corpora. Where libc's ``mmap`` is not reachable (Windows), :func:`map_file` falls back to Python's ``mmap``.

:class:`FlatSpace` maps many files back to back into one reserved range of address space, each at a page
boundary, with unmapped-file padding (zero pages) before and after. One numpy array then spans every file of a
dtype, so a batch whose rows come from a thousand corpora is one vectorised gather, not a thousand. The range
is reserved ``PROT_READ``/``MAP_NORESERVE``: it costs address space, not memory, and pages of the files come
from the page cache as with any mapping.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np

from ..errors import DataChangedError, StoreError, TruncatedFileError, UsageTypeError

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10  # the same value on Linux, macOS and the BSDs
_MAP_ANON = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Files up to this size are mapped with their page tables filled at once (MAP_POPULATE, Linux): a first read of
# each of thousands of small files otherwise costs a page fault in the middle of training.
POPULATE_BELOW = 1 << 18


def _load_libc():
    if os.name != "posix" or not _MAP_ANON:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int64]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()
_FAILED = ctypes.c_void_p(-1).value


def native_available() -> bool:
    """Whether descriptor-free mappings and flat spaces are available on this system."""
    return _LIBC is not None


def round_up(n: int, unit: int = PAGE) -> int:
    return -(-n // unit) * unit


class MappingError(StoreError):
    """A token file that cannot be mapped (the address space or the map count exhausted): names the file."""


def _mmap(addr, length: int, prot: int, flags: int, fd: int, what: str) -> int:
    out = _LIBC.mmap(addr, length, prot, flags, fd, 0)
    if out is None or out == _FAILED:
        err = ctypes.get_errno()
        hint = ""
        if err == errno.ENOMEM:
            hint = (f"; the process may have reached the kernel's limit on mappings (vm.max_map_count = "
                    f"{_max_map_count()}, {_map_count()} in use): raise it, or merge small files")
        raise MappingError(err, f"cannot map {what}: {os.strerror(err)}{hint}")
    return out


def _max_map_count() -> str:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _map_count() -> str:
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            return str(sum(1 for _ in f))
    except OSError:
        return "unknown"


class _Region:
    """Owns ``[addr, addr + length)``; unmapped when the last array viewing it is gone."""

    def __init__(self, addr: int, length: int):
        self.addr, self.length = addr, length

    def __del__(self):
        if self.length and _LIBC is not None:
            _LIBC.munmap(self.addr, self.length)
            self.length = 0


class _View:
    """An ``__array_interface__`` over part of a region; numpy keeps it (and so the region) as the array's base."""

    def __init__(self, region: _Region, offset: int, dtype: np.dtype, count: int):
        self.region = region
        self.__array_interface__ = {"data": (region.addr + offset, True), "shape": (count,),
                                    "typestr": np.dtype(dtype).str, "version": 3}


def _array(region: _Region, offset: int, dtype, count: int) -> np.ndarray:
    out = np.asarray(_View(region, offset, dtype, count))
    out.flags.writeable = False
    return out


def map_file(path: str, size: int | None = None, inode: int = 0) -> np.ndarray:
    """The whole file as a read-only uint8 array, mapped without keeping a file descriptor open (its first
    ``size`` bytes when the caller stat'ed it already). ``inode``: the file the caller opened at ``path`` (0: any);
    another file there now (the data was replaced since) is refused (:func:`same_file`)."""
    if size is None:
        size = os.stat(path).st_size
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    if _LIBC is None:
        with open(path, "rb") as f:
            same_file(f.fileno(), path, inode)
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(m, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        same_file(fd, path, inode)
        addr = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, path)
    finally:
        os.close(fd)
    return _array(_Region(addr, size), 0, np.uint8, size)


def same_file(fd: int, path: str, inode: int = 0) -> os.stat_result:
    """``fstat`` of ``fd``, opened at ``path``; refused when ``inode`` (non-zero) is not its inode: the reader
    planned from another file at that path (data replaced by a rename since it was opened, or an object
    replaced in the store and mirrored again by a job of this host). Its index would not describe these bytes."""
    st = os.fstat(fd)
    if inode and st.st_ino != inode:
        raise DataChangedError(path, "replaced since the job opened it (another file is there now): its index "
                                     "describes the old one, and the rest of the run would mix two versions of the "
                                     "data. Restart from the last saved state")
    return st


class FlatSpace:
    """Files of one dtype mapped back to back into one array of tokens.

    ``files``: paths; ``sizes``: their sizes in bytes (as stat'ed when the layout was planned: a file that grew
    since is mapped at its planned size; one that shrank is refused); ``inodes``: the files planned from (one per
    path, 0: any), another file at a path now refused (:func:`same_file`). File i's first token is
    ``tokens[base[i]]``. ``pad_tokens`` zero tokens lie before the first file and after the last, so a reader may
    run up to that far past either end of the space; between files, a reader running past a file's end reads the
    next file. The layout (``base``) is a pure function of the sizes: :func:`flat_layout` gives it without mapping.

    Like any reader of mapped files (Megatron's and fairseq's included), a process reading a file that another
    process truncates *in place* gets SIGBUS; replace data files by writing new ones and renaming them, as
    babelfeed's own writers do. (The compiled gather catches the fault and names the file; see
    ``TokenSpaces.read_fault``.) Files up to ``POPULATE_BELOW`` bytes are mapped with their page tables filled.
    """

    def __init__(self, files, sizes, dtype, pad_tokens: int = 1 << 20, inodes=None):
        if _LIBC is None:
            raise MappingError(errno.ENOSYS, "flat spaces need POSIX mmap through ctypes")
        self.dtype = np.dtype(dtype)
        self.files = list(files)
        self.base, total, self.pre = flat_layout(sizes, self.dtype, pad_tokens)
        flags = mmap.MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE
        addr = _mmap(None, total, mmap.PROT_READ, flags, -1, f"a {total}-byte address range")
        self._region = _Region(addr, total)
        item = self.dtype.itemsize
        for i, (path, size, base) in enumerate(zip(self.files, sizes, self.base.tolist())):
            size = int(size)
            if not size:
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                actual = same_file(fd, path, inodes[i] if inodes is not None else 0).st_size
                if actual < size:
                    raise TruncatedFileError(path, f"{actual} bytes, {size} when the loader opened it: the file "
                                                   f"changed under the loader (replace data files, do not rewrite "
                                                   f"them in place)")
                flags = mmap.MAP_SHARED | _MAP_FIXED | (_MAP_POPULATE if size <= POPULATE_BELOW else 0)
                _mmap(addr + base * item, size, mmap.PROT_READ, flags, fd, path)
            finally:
                os.close(fd)
        self.tokens = _array(self._region, 0, self.dtype, total // item)

    def __len__(self) -> int:
        return len(self.tokens)

    def __reduce__(self):
        raise UsageTypeError("a FlatSpace is process-local: rebuild it from its files in the other process")


def flat_layout(sizes, dtype, pad_tokens: int = 1 << 20) -> tuple[np.ndarray, int, int]:
    """(token offset of each file, total bytes, padding bytes before the first file) for :class:`FlatSpace`."""
    item = np.dtype(dtype).itemsize
    pre = round_up(max(int(pad_tokens), 1) * item)
    spans = np.array([round_up(int(s)) for s in sizes], dtype=np.int64)
    starts = pre + np.concatenate([[0], np.cumsum(spans)[:-1]]) if len(spans) else np.zeros(0, np.int64)
    total = pre + int(spans.sum()) + pre
    return (starts // item).astype(np.int64), total, pre
