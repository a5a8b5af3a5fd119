"""Streaming reads of raw text for ``babelfeed binarize``: plain or compressed files, records counted and read
without ever holding a whole file.

Compression is recognised by content, and a name that says otherwise is refused: gzip (``.gz``), zstd (``.zst``,
with the ``zstandard`` package: ``pip install babelfeed[zstd]``), xz (``.xz``) and bzip2 (``.bz2``). gzip, zstd and
xz data start with bytes that no UTF-8 text starts with, so a compressed file without its suffix is still read as
what it is; bzip2 (``BZh``) is taken only with its suffix.

Two kinds of record:

* ``line``: one record per ``\\n``-terminated line (a last line without ``\\n`` counts; a trailing ``\\r`` is
  dropped). Parallel text, monolingual text and JSONL.
* ``block``: a document of plain text, the lines between blank lines (a line holding only whitespace is blank).

A plain file can be entered in the middle: :func:`count_records` notes the byte offset (and line number) of
every ``every``-th record, and :class:`RecordReader` seeks there. A compressed stream is always read from its
start, so a unit of work over a compressed file skips its records from the start of the file.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import zlib

import numpy as np

from babelfeed.errors import MissingExtraError, TextInputError, UsageError


_BLOCK = 1 << 22
_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bz2"}
_MAGIC = (("gzip", b"\x1f\x8b"), ("zstd", b"\x28\xb5\x2f\xfd"), ("xz", b"\xfd7zXZ\x00"))
KINDS = ("line", "block")


def strip_compression(name: str) -> tuple[str, str | None]:
    """``("en-de.en", "gzip")`` for ``"en-de.en.gz"``; ``(name, None)`` without a compression suffix."""
    root, ext = os.path.splitext(name)
    kind = _SUFFIXES.get(ext.lower())
    return (root, kind) if kind else (name, None)


def compression_of(path: str) -> str | None:
    """The compression of ``path`` (``"gzip"``, ``"zstd"``, ``"xz"``, ``"bz2"``) or None for plain text.

    Decided by the first bytes; a suffix that disagrees with them is an error naming the file.
    """
    with open(path, "rb") as f:
        head = f.read(6)
    sniffed = next((kind for kind, magic in _MAGIC if head.startswith(magic)), None)
    _, named = strip_compression(os.path.basename(path))
    if named == "bz2" and head.startswith(b"BZh"):
        sniffed = "bz2"
    if named and not head:
        return None  # an empty file is empty text, whatever its name
    if named and sniffed != named:
        found = f"{sniffed} data" if sniffed else "no compressed data (plain text?)"
        raise TextInputError(f"{path}: named as {named} but holds {found}; rename it to what it holds")
    return sniffed


def _open_stream(path: str, compression: str | None):
    if compression is None:
        return open(path, "rb")
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    if compression == "bz2":
        return bz2.open(path, "rb")
    return _Zstd(path)


class _Zstd:
    """A zstd file's frames one after another, decompressed; a stream that ends inside a frame is an error
    (``zstandard``'s stream reader takes a cut-off frame for the end)."""

    def __init__(self, path: str):
        try:
            import zstandard  # optional: babelfeed[zstd]
        except ImportError:
            raise MissingExtraError(f"{path}: zstd input needs the zstandard package: pip install "
                                    f"'babelfeed[zstd]'") from None
        self._d = zstandard.ZstdDecompressor()
        self._obj = self._d.decompressobj()
        self._open = False  # bytes of the current frame were fed
        self._f = open(path, "rb")
        self._buf = bytearray()
        self._done = False

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and not self._done:
            chunk = self._f.read(1 << 16)
            if not chunk:
                if self._open and not self._obj.eof:
                    raise EOFError("the stream ends inside a zstd frame")
                self._done = True
                break
            while chunk:
                self._buf += self._obj.decompress(chunk)
                self._open = True
                if self._obj.eof:  # the frame ended: the rest of the chunk starts the next one
                    chunk = self._obj.unused_data
                    self._obj = self._d.decompressobj()
                    self._open = False
                else:
                    chunk = b""
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        self._f.close()


def _decompress_errors():
    errors = [OSError, EOFError, zlib.error, lzma.LZMAError]
    try:
        import zstandard  # optional: babelfeed[zstd]

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


class _Bytes:
    """Decompressed blocks of a file, with errors that name the file and how far it was read."""

    def __init__(self, path: str, start_byte: int | None = None, end_byte: int | None = None):
        self.path = path
        self.end = end_byte  # a plain file is read no further than this (where the next unit of work starts)
        self.compression = compression_of(path)
        if self.compression is not None and start_byte:
            raise UsageError(f"{path}: a {self.compression} stream cannot be entered at byte {start_byte}")
        self._f = _open_stream(path, self.compression)
        if start_byte:
            self._f.seek(start_byte)
        self.offset = start_byte or 0  # decompressed bytes before the next block

    def read(self) -> bytes:
        # compressed: smaller reads, so a damaged stream's error says about where the damage is
        size = (_BLOCK if self.compression is None else 1 << 16) if self.end is None else min(_BLOCK, self.end - self.offset)
        if size <= 0:
            return b""
        try:
            block = self._f.read(size)
        except _decompress_errors() as e:
            raise TextInputError(f"{self.path}: the {self.compression or 'file'} data is damaged or cut short after "
                                 f"{self.offset:,} bytes of its text ({type(e).__name__}: {e})") from None
        self.offset += len(block)
        return block

    def close(self) -> None:
        self._f.close()


def _lines(stream: _Bytes):
    """Every line of the stream (bytes, without ``\\n``) with the byte offset where it starts."""
    rest = b""
    start = stream.offset
    while block := stream.read():
        data = rest + block if rest else block
        parts = data.split(b"\n")
        rest = parts.pop()
        for ln in parts:
            yield ln, start
            start += len(ln) + 1
    if rest:
        yield rest, start


def _clean(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def check_encoding(path: str, head: bytes) -> None:
    """Refuse text that is detectably not UTF-8, from its first bytes ``head``: a UTF-16 or UTF-32 byte order
    mark, NUL bytes in a pattern UTF-16/32 leaves, or lines most of which do not decode (Latin-1 or
    Windows-1252 text), naming the encoding it looks like and how to convert. Decoding such text line by line
    dropped most of it (or turned it into <unk>), and the run reported success."""
    convert = "convert it to UTF-8 first (e.g. iconv -f {enc} -t UTF-8 FILE > FILE.utf8)"
    for bom, enc in ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe", "UTF-16LE"),
                     (b"\xfe\xff", "UTF-16BE")):
        if head.startswith(bom):
            raise TextInputError(f"{path}: {enc} text (it starts with that byte order mark), not UTF-8: "
                                 + convert.format(enc=enc))
    if len(head) >= 64:
        even, odd = head[0::2].count(0), head[1::2].count(0)
        if max(even, odd) > len(head) // 8:
            lanes = [head[k::4].count(0) for k in range(4)]  # ASCII as UTF-32: three NULs in every four bytes
            if min(lanes[1:]) > len(head) // 5 and lanes[0] < len(head) // 16:
                enc = "UTF-32LE"
            elif min(lanes[:3]) > len(head) // 5 and lanes[3] < len(head) // 16:
                enc = "UTF-32BE"
            else:
                enc = "UTF-16BE" if even > odd else "UTF-16LE"
            raise TextInputError(f"{path}: {head.count(0):,} NUL bytes in its first {len(head):,}: UTF-16 or UTF-32 "
                                 f"text without a byte order mark (likely {enc}), not UTF-8: " + convert.format(enc=enc))
    lines = head.split(b"\n")[:-1] or [head]
    bad = 0
    for ln in lines:
        try:
            ln.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    if bad >= 5 and bad > len(lines) // 5:
        try:
            sample = next(ln for ln in lines if not _utf8(ln)).decode("cp1252")
            looks = f"; it decodes as Windows-1252 / Latin-1 ({sample[:40]!r})"
        except (UnicodeDecodeError, StopIteration):
            looks = ""
        raise TextInputError(f"{path}: {bad} of its first {len(lines):,} lines are not UTF-8{looks}: "
                             + convert.format(enc="CP1252" if looks else "ENCODING"))


def _utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def count_records(path: str, kind: str = "line", every: int = 0) -> dict:
    """Records in ``path`` and, for a plain file, where every ``every``-th one starts.

    Returns ``{"records": n, "compression": c, "marks": [[byte, line], ...] or None}``: mark ``j`` is the byte
    offset and 0-based line number of record ``j * every``. A compressed stream has no marks (it is read
    from its start).
    """
    if kind not in KINDS:
        raise UsageError(f"record kind must be one of {KINDS}, got {kind!r}")
    stream = _Bytes(path)
    plain = stream.compression is None
    keep_marks = plain and every > 0
    marks: list[list[int]] = []
    checked = False
    try:
        if kind == "line":
            n = 0
            last = b"\n"
            pos = 0
            while block := stream.read():
                if not checked:
                    check_encoding(path, block[:1 << 16])
                    checked = True
                if keep_marks:
                    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                    if pos == 0:
                        marks.append([0, 0])  # line 0 at byte 0
                    # line k (k >= 1) starts one byte after newline k-1: newlines n .. n + len(nl) - 1 are in
                    # this block, so it starts lines n + 1 .. n + len(nl)
                    first = -(-(n + 1) // every) * every
                    for k in range(first, n + len(nl) + 1, every):
                        marks.append([pos + int(nl[k - 1 - n]) + 1, k])
                    n += len(nl)
                else:
                    n += block.count(b"\n")
                pos += len(block)
                last = block[-1:]
            records = n + (last != b"\n")
            if keep_marks:
                marks = [m for m in marks if m[1] < records]
        else:
            head = _Bytes(path)
            try:
                check_encoding(path, head.read()[:1 << 16])
            finally:
                head.close()
            records = 0
            blank = True
            for i, (ln, start) in enumerate(_lines(stream)):
                empty = not ln.strip()
                if blank and not empty:
                    if keep_marks and records % every == 0:
                        marks.append([start, i])
                    records += 1
                blank = empty
    finally:
        stream.close()
    return {"records": records, "compression": stream.compression, "marks": marks if keep_marks else None}


class RecordReader:
    """Records of one file from a position: ``take(n)`` returns up to ``n`` of them.

    ``start_byte``/``start_line`` enter a plain file at a mark of :func:`count_records`, and ``end_byte`` (a later
    mark, or None) bounds what is read; ``skip`` records are then passed over (the whole way from the start for a compressed stream). A ``line`` record is ``bytes``; a
    ``block`` record is ``(first_line, [line bytes, ...])`` with the 0-based number of its first line.
    """

    def __init__(self, path: str, kind: str = "line", start_byte: int = 0, start_line: int = 0, skip: int = 0,
                 end_byte: int | None = None):
        if kind not in KINDS:
            raise UsageError(f"record kind must be one of {KINDS}, got {kind!r}")
        self.path = path
        self.kind = kind
        self._stream = _Bytes(path, start_byte, end_byte)
        self._buf: list[bytes] = []
        self._i = 0
        self._rest = b""
        self._eof = False
        self.line = start_line  # 0-based number of the next line to be read
        if skip:
            self.take(skip, keep=False)

    def _fill(self) -> bool:
        """Refill the line buffer; False at the end of the file."""
        while self._i >= len(self._buf):
            if self._eof:
                return False
            block = self._stream.read()
            if not block:
                self._eof = True
                self._buf, self._i = ([self._rest] if self._rest else []), 0
                self._rest = b""
                continue
            parts = (self._rest + block if self._rest else block).split(b"\n")
            self._rest = parts.pop()
            self._buf, self._i = parts, 0
        return True

    def _lines(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        while len(out) < n and self._fill():
            k = min(n - len(out), len(self._buf) - self._i)
            out.extend(self._buf[self._i:self._i + k])
            self._i += k
        self.line += len(out)
        return out

    def take(self, n: int, keep: bool = True) -> list:
        if self.kind == "line":
            lines = self._lines(n)
            return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines] if keep else []
        out = []
        while len(out) < n:
            # pass blank lines, then gather lines up to the next blank one
            while self._fill() and not self._buf[self._i].strip():
                self._i += 1
                self.line += 1
            if not self._fill():
                break
            first = self.line
            lines = []
            while self._fill() and (ln := self._buf[self._i]).strip():
                lines.append(_clean(ln))
                self._i += 1
                self.line += 1
            if keep:
                out.append((first, lines))
            else:
                out.append(None)
        return out if keep else []

    def close(self) -> None:
        self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
