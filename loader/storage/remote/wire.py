"""The messages between babelfeed processes and the host's fetcher: JSON with its arrays as raw bytes, framed by
length, over a Unix socket (``PROTOCOL``, in the socket's name).
"""

from __future__ import annotations

import json
import socket
import struct

import numpy as np


PROTOCOL = 3  # the messages' framing (in the socket's name: a fetcher of another framing is never reached; 3: a
# request's files flat, ranges.flat_files)


def send(sock: socket.socket, obj) -> None:
    """One message: ``obj`` as JSON, its arrays (:func:`pack`) carried after it as raw bytes (a million offsets
    cost a copy, not a text encoding)."""
    blobs: list = [0]  # (the bytes so far, then the arrays)
    head = json.dumps(_lift(obj, blobs)).encode()
    size, blobs = blobs[0], blobs[1:]
    sock.sendall(struct.pack("<II", len(head), size) + head)
    if size:  # (one send: thousands of files' arrays joined, not a system call each)
        sock.sendall(b"".join(memoryview(b).cast("B") for b in blobs if b.nbytes))


def receive(sock: socket.socket):
    lengths = _exactly(sock, 8)
    if lengths is None:
        return None
    n_head, n_blobs = struct.unpack("<II", lengths)
    head = _exactly(sock, n_head)
    blobs = _exactly(sock, n_blobs) if n_blobs else b""
    if head is None or blobs is None:
        return None
    return _lower(json.loads(head), blobs)


def _lift(obj, blobs: list):
    """``obj`` with each array replaced by ``{"$a": [offset, length, dtype]}`` into ``blobs`` (``blobs[0]``: their
    bytes so far)."""
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        at = blobs[0]
        blobs.append(a)
        blobs[0] += a.nbytes
        return {"$a": [at, len(a), a.dtype.str]}
    if isinstance(obj, dict):
        return {k: _lift(v, blobs) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_lift(v, blobs) for v in obj]
    return obj


def _lower(obj, blobs: bytes):
    if isinstance(obj, dict):
        if "$a" in obj and len(obj) == 1:
            at, n, dtype = obj["$a"]
            return np.frombuffer(blobs, dtype=np.dtype(dtype), count=n, offset=at)
        return {k: _lower(v, blobs) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_lower(v, blobs) for v in obj]
    return obj


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if not k:
            return None
        got += k
    return bytes(buf) if n < 4096 else buf
