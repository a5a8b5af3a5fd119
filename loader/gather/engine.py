"""The gather engine: tokens of planned rows into padded arrays, at a cost that follows the tokens of the batch.

Every ``.bin`` of a run is mapped into a *token space* (``storage/mapping.py``'s :class:`FlatSpace`): one flat
array per stored dtype, each file at a page boundary, with ``MARGIN`` zero tokens before the first file and after
the last. A row is then an address (token offset in the space) and a length, whatever corpus it comes from, and
a batch whose rows come from a thousand corpora is gathered in one vectorised step, not a thousand.

The padded gather reads each row as a fixed-width window of the space (a strided view whose row k is
``space[k : k + width]``, indexed by every row's first address at once: one copy of ``width`` tokens per row),
casts once, and overwrites padding and prefix cells. Cells a row does not own read whatever lies beside it,
inside the margins or a neighbouring file, and are always overwritten.

Where flat spaces are not available (no POSIX ``mmap`` through ctypes), every file is its own space and the
gather runs once per space present in the batch (the same results, slower with many corpora).

An optional compiled kernel (``_gather.c``, built by ``pip install`` where a C compiler exists) writes each
output cell once and prefetches the rows ahead; without it (or with ``BABELFEED_KERNEL=0``) the numpy path
gives the same arrays. The kernel also catches a read that faults (a ``.bin`` truncated in place while mapped,
failing storage): the error names the file instead of the process dying of SIGBUS.
"""

from __future__ import annotations

import os

import numpy as np

from babelfeed.plan.packing import ragged_arange
from babelfeed.storage.spaces import MARGIN, TokenSpaces  # noqa: F401  (part of the gather's face)
from babelfeed.errors import DataError

try:  # the optional compiled kernel (setup.py); BABELFEED_KERNEL=0 uses numpy only
    from babelfeed._native import _gather as _compiled
except ImportError:
    _compiled = None
KERNEL = _compiled if os.environ.get("BABELFEED_KERNEL", "1") != "0" else None
_FAULT = KERNEL.MappedReadError if KERNEL is not None and hasattr(KERNEL, "MappedReadError") else ()
_OUT_CODES = {np.dtype(np.int64): "q", np.dtype(np.int32): "i"}
_SPACE_CODES = frozenset("bBhHiIqQlL")


def first_outside(ids: np.ndarray | None, vocab: int) -> tuple[int, int] | None:
    """(row, column) of the first id outside ``[0, vocab)`` in a 2-D id array, or None. The common case costs one
    reduction: viewed as unsigned, a negative id is huge."""
    if ids is None or not ids.size or int(ids.view(f"u{ids.itemsize}").max()) < vocab:
        return None
    row, col = np.argwhere((ids >= vocab) | (ids < 0))[0]
    return int(row), int(col)


def _window_rows(spaces: "TokenSpaces", sid: int, first: np.ndarray, width: int) -> np.ndarray:
    """``out[r] = tokens[first[r] : first[r] + width]`` for every r, in the space's dtype."""
    tokens = spaces.tokens(sid)
    if width == 0 or len(first) == 0:
        return np.zeros((len(first), width), tokens.dtype)
    inside = int(first.min()) >= 0 and int(first.max()) + width <= len(tokens)
    if inside and spaces.margin(sid) >= width:  # a strided view whose row k starts at token k: one fancy index
        return spaces.view(sid, width)[first]
    # a window may reach past the ends of a space without margins (one file per space): the cells outside the
    # row are padding the caller writes over, so clipped reads are harmless there
    return np.take(tokens, first[:, None] + np.arange(width, dtype=np.int64), mode="clip")


def padded(spaces: TokenSpaces, space: np.ndarray | int, start: np.ndarray, body: np.ndarray, prefix: np.ndarray,
           plen: np.ndarray, width: int, left_pad: bool, pad: int, dtype, prev_eos: int | None = None,
           largest: list | None = None):
    """Rows of ``prefix + tokens`` padded to ``width``: int ``dtype`` [B, width].

    Row r holds ``prefix[r, :plen[r]]`` then the ``body[r]`` tokens at space address ``start[r]`` of space
    ``space[r]`` (or one space id for every row), right-aligned with ``left_pad``. Rows longer than ``width``
    are the caller's error (it sizes ``width`` from the lengths). With ``prev_eos``, returns ``(rows, prev)``:
    ``prev`` is fairseq's ``prev_output_tokens`` of the rows (each shifted one column right behind ``prev_eos``).
    Where the compiled kernel wrote the rows, the largest id it wrote (as unsigned: a negative id is huge) is
    appended to ``largest``, so the dictionary check needs no second pass over them.
    """
    n = len(start)
    body = np.asarray(body, dtype=np.int64)
    plen = np.asarray(plen, dtype=np.int64)
    spaces.fetch(space, start, body)  # (rows of remote files: fetched now unless the prefetcher did already)
    if KERNEL is not None and isinstance(space, (int, np.integer)):  # one space, compiled: the common case, short
        code, tokens = _OUT_CODES.get(np.dtype(dtype)), spaces.tokens(int(space))
        if code and tokens.dtype.char in _SPACE_CODES:
            out = np.empty((n, width), dtype=dtype)
            prev = np.empty((n, width), dtype=dtype) if prev_eos is not None else None
            col0 = (width - body - plen) if left_pad else np.zeros(n, np.int64)
            pre = np.ascontiguousarray(prefix, dtype=np.int64)
            try:
                top = KERNEL.fill_rows(tokens, tokens.dtype.char, spaces.shift(int(space)),
                                       np.ascontiguousarray(start, dtype=np.int64), np.ascontiguousarray(body),
                                       np.ascontiguousarray(col0), np.ascontiguousarray(plen), pre, pre.shape[1],
                                       pad, out, code, prev, prev_eos or 0)
            except _FAULT as e:
                raise spaces.read_fault(int(space), e.args[1]) from None
            except IndexError as e:  # the kernel's bounds check: a row past its token space
                raise DataError(f"token space {int(space)} ({len(tokens)} tokens): {e}: a corrupt index?") from None
            if largest is not None:
                largest.append(top)
            return out if prev is None else (out, prev)
    total = body + plen
    col0 = (width - total) if left_pad else np.zeros(n, np.int64)
    start = np.asarray(start, dtype=np.int64)
    out = np.empty((n, width), dtype=dtype)
    prev = np.empty((n, width), dtype=dtype) if prev_eos is not None else None
    sids = [int(space)] if np.ndim(space) == 0 else np.unique(space).tolist()
    code = _OUT_CODES.get(np.dtype(dtype))
    for sid in sids:
        rows = slice(None) if len(sids) == 1 else np.flatnonzero(space == sid)
        tokens = spaces.tokens(sid)
        if KERNEL is not None and code and tokens.dtype.char in _SPACE_CODES:
            one = len(sids) == 1
            part = out if one else np.empty((len(rows), width), dtype=dtype)
            part_prev = prev if one or prev is None else np.empty((len(rows), width), dtype=dtype)
            pre = np.ascontiguousarray(prefix[rows], dtype=np.int64)
            try:
                KERNEL.fill_rows(tokens, tokens.dtype.char, spaces.shift(sid), np.ascontiguousarray(start[rows]),
                                 np.ascontiguousarray(body[rows]), np.ascontiguousarray(col0[rows]),
                                 np.ascontiguousarray(plen[rows]), pre, pre.shape[1], pad, part, code, part_prev,
                                 prev_eos or 0)
            except _FAULT as e:
                raise spaces.read_fault(sid, e.args[1]) from None
            except IndexError as e:  # the kernel's bounds check: a row past its token space
                raise DataError(f"token space {sid} ({len(tokens)} tokens): {e}: a corrupt index?") from None
            if not one:
                out[rows] = part
                if prev is not None:
                    prev[rows] = part_prev
            continue
        if n and (int(start[rows].min()) < 0 or int((start[rows] + body[rows]).max()) > len(tokens)):
            raise DataError(f"a row's tokens lie outside token space {sid} ({len(tokens)} tokens): a corrupt index?")
        vals = _window_rows(spaces, sid, start[rows] - col0[rows] - plen[rows], width)
        shift = spaces.shift(sid)
        if shift:
            vals = vals.astype(np.int64) - shift
        out[rows] = vals
        cols = np.arange(width, dtype=np.int32)
        block = out[rows] if len(sids) > 1 else out
        if left_pad:
            np.putmask(block, cols < col0[rows].astype(np.int32)[:, None], pad)
        else:
            np.putmask(block, cols >= total[rows].astype(np.int32)[:, None], pad)
        put_prefix(block, prefix[rows], plen[rows], col0[rows])
        if len(sids) > 1:
            out[rows] = block
        if prev is not None:
            prev[rows] = shifted(block, col0[rows], total[rows], pad, prev_eos)
    return out if prev is None else (out, prev)


def shifted(rows: np.ndarray, col0: np.ndarray, total: np.ndarray, pad: int, eos: int) -> np.ndarray:
    """fairseq's ``prev_output_tokens``: each row's ``total`` cells from column ``col0`` shifted one column right
    behind ``eos`` (``[eos, t0, ..., t_{n-2}]``), pad elsewhere; an empty row stays all pad."""
    out = np.empty_like(rows)
    out[:, 0] = pad
    out[:, 1:] = rows[:, :-1]
    cols = np.arange(rows.shape[1])
    np.putmask(out, (cols < col0[:, None]) | (cols >= (col0 + total)[:, None]), pad)
    real = np.flatnonzero(total > 0)
    out[real, col0[real]] = eos
    return out


def put_prefix(out: np.ndarray, prefix: np.ndarray, plen: np.ndarray, col0: np.ndarray, rows=None) -> None:
    """``out[rows[i], col0[i] + k] = prefix[i, k]`` for ``k < plen[i]`` (``rows`` default: row i of ``out``)."""
    if prefix.shape[1] == 0 or not plen.any():
        return
    rows = np.arange(len(prefix)) if rows is None else np.asarray(rows)
    if prefix.shape[1] == 1 and (plen == 1).all():  # one language token per row: the common case
        out[rows, col0] = prefix[:, 0]
        return
    i, k = np.nonzero(np.arange(prefix.shape[1]) < plen[:, None])
    out[rows[i], col0[i] + k] = prefix[i, k]


def from_ragged(out: np.ndarray, rows, tokens: np.ndarray, lengths: np.ndarray, left_pad: bool) -> None:
    """Write ragged rows (``tokens`` back to back) into rows ``rows`` of ``out`` (pre-filled with pad), aligned
    left or right; a row longer than ``out`` keeps its first ``out.shape[1]`` tokens (the caller masks it)."""
    width = out.shape[1]
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = np.minimum(lengths, width)
    if (keep < lengths).any():
        starts = np.cumsum(lengths) - lengths
        tokens = tokens[np.arange(len(tokens)) - np.repeat(starts, lengths) < np.repeat(keep, lengths)]
    cols = np.arange(width)
    mask = cols >= (width - keep)[:, None] if left_pad else cols < keep[:, None]
    block = out[rows]
    block[mask] = tokens
    out[rows] = block


def scatter(spaces: TokenSpaces, space, start: np.ndarray, length: np.ndarray, out: np.ndarray,
            dest: np.ndarray) -> None:
    """Pieces ``[start, start + length)`` (space addresses) written at flat offsets ``dest`` of ``out`` (a C-ordered
    int array of any shape), one copy per token."""
    start = np.ascontiguousarray(start, dtype=np.int64)
    length = np.ascontiguousarray(length, dtype=np.int64)
    dest = np.ascontiguousarray(dest, dtype=np.int64)
    flat = out.reshape(-1)
    code = _OUT_CODES.get(out.dtype)
    spaces.fetch(space, start, length)
    sids = [int(space)] if np.ndim(space) == 0 else np.unique(space).tolist()
    for sid in sids:
        sel = None if len(sids) == 1 else np.flatnonzero(space == sid)
        st, ln, ds = (start, length, dest) if sel is None else (start[sel], length[sel], dest[sel])
        tokens = spaces.tokens(sid)
        if KERNEL is not None and code and tokens.dtype.char in _SPACE_CODES:
            try:
                KERNEL.pieces(tokens, tokens.dtype.char, spaces.shift(sid), st, ln, ds, flat, code)
            except _FAULT as e:
                raise spaces.read_fault(sid, e.args[1]) from None
            except IndexError as e:  # the kernel's bounds check: a row past its token space
                raise DataError(f"token space {sid} ({len(tokens)} tokens): {e}: a corrupt index?") from None
            continue
        src = ragged_arange(st, ln)
        if len(src) and (int(st.min()) < 0 or int((st + ln).max()) > len(tokens)):
            raise DataError(f"a piece lies outside token space {sid} ({len(tokens)} tokens): a corrupt index?")
        vals = tokens[src]
        if spaces.shift(sid):
            vals = vals.astype(np.int64) - spaces.shift(sid)
        flat[ragged_arange(ds, ln)] = vals
