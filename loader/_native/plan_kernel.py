"""The optional compiled planning kernel (``_plan.c``): the same integers as the numpy paths, faster.

``permute.permute``/``permute_many``, ``mixing.StratifiedDraw.rows``/``stratified_rows``,
``batching.length_order``, ``batching.batch_sorted``, ``copies.deferred_cut`` and the planner's window order
(``sorted_rows``) ask here first; each function returns None where the
kernel is not built (setup.py builds it where a C compiler exists), ``BABELFEED_KERNEL=0`` is set, or the input
is one the kernel does not take, and the caller's numpy path answers instead (tests/plan/test_plan_kernel.py checks
that both give the same arrays). ``KERNEL`` is read at every call, so tests can switch it off. Over big windows the
kernel's passes use up to ``threads()`` cores (``BABELFEED_PLAN_THREADS``); the arrays do not depend on it.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from babelfeed.errors import ConfigError

try:
    from babelfeed._native import _plan as _compiled
except ImportError:
    _compiled = None
KERNEL = _compiled if os.environ.get("BABELFEED_KERNEL", "1") != "0" else None
PARALLEL_MIN = 1 << 18  # elements per thread, at least: below it one thread answers


def threads() -> int:
    """Threads for the kernel's pure per-element passes (draws, length lookups) over big windows:
    ``BABELFEED_PLAN_THREADS``, else the cores this process may use, at most 4."""
    env = os.environ.get("BABELFEED_PLAN_THREADS", "").strip()
    if env:
        if not (env.isascii() and env.isdigit()) or int(env) < 1:
            raise ConfigError(f"BABELFEED_PLAN_THREADS={env!r}: expected a whole number of threads, 1 or more")
        return min(int(env), 16)  # the kernel's limit
    try:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(4, os.cpu_count() or 1))


def split(n: int, fn) -> list:
    """``fn(a, b)`` over consecutive parts of ``[0, n)``, each in its own thread where n is large (the kernel
    drops the GIL, and every element's result depends on that element alone: the same arrays whatever the
    thread count). Threads are started per call, never pooled, so a forked worker process holds none."""
    k = min(threads(), n // PARALLEL_MIN)
    if k <= 1:
        return [fn(0, n)]
    bounds = [n * i // k for i in range(k + 1)]
    results: list = [None] * k
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = fn(bounds[i], bounds[i + 1])
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    started = []
    for i in range(1, k):
        t = threading.Thread(target=run, args=(i,), daemon=True)
        try:
            t.start()
        except RuntimeError:  # no thread to be had (a container at its process limit): this thread does the part
            run(i)
            continue
        started.append(t)
    run(0)
    for t in started:
        t.join()
    if errors:
        raise errors[0]
    return results


def stratified(positions, which, table, okeys, ekeys) -> np.ndarray | None:
    """Rows of stratified draws: per position of corpus ``c = which[i]`` (row 0 of the tables when ``which`` is
    None), ``table[c] = (n, count, full)`` and round keys ``okeys[c]``, ``ekeys[c]`` (uint64 [k, >=4])."""
    kernel = KERNEL
    if kernel is None:
        return None
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    okeys, ekeys = np.asarray(okeys, np.uint64).reshape(len(table), -1), np.asarray(ekeys, np.uint64).reshape(len(table), -1)
    if okeys.shape[1] < 4 or ekeys.shape[1] < 4:
        return None
    out = np.empty(pos.shape, dtype=np.int64)
    kernel.stratified(pos.reshape(-1), None if which is None else np.ascontiguousarray(which, dtype=np.int64),
                      np.ascontiguousarray(table, dtype=np.int64), np.ascontiguousarray(okeys[:, :4]),
                      np.ascontiguousarray(ekeys[:, :4]), out.reshape(-1))
    return out


def stratified_spans(spans, table, okeys, ekeys) -> np.ndarray | None:
    """``stratified`` over runs of consecutive positions: ``spans`` [S, 3] of (corpus, first position, count),
    their rows one run after another, with no position array."""
    kernel = KERNEL
    if kernel is None:
        return None
    spans = np.ascontiguousarray(spans, dtype=np.int64).reshape(-1, 3)
    okeys, ekeys = (np.asarray(k, np.uint64).reshape(len(table), -1) for k in (okeys, ekeys))
    if okeys.shape[1] < 4 or ekeys.shape[1] < 4:
        return None
    out = np.empty(int(spans[:, 2].sum()), dtype=np.int64)
    table, okeys, ekeys = (np.ascontiguousarray(table, dtype=np.int64), np.ascontiguousarray(okeys[:, :4]),
                           np.ascontiguousarray(ekeys[:, :4]))
    split(len(out), lambda a, b: kernel.stratified_spans(_cut_spans(spans, a, b), table, okeys, ekeys, out[a:b]))
    return out


def _cut_spans(spans: np.ndarray, a: int, b: int) -> np.ndarray:
    """The (corpus, first position, count) runs covering outputs ``[a, b)`` of ``spans`` laid end to end."""
    end = np.cumsum(spans[:, 2])
    start = end - spans[:, 2]
    keep = (end > a) & (start < b)
    part = spans[keep].copy()
    lo, hi = np.maximum(start[keep], a), np.minimum(end[keep], b)
    part[:, 1] += lo - start[keep]
    part[:, 2] = hi - lo
    return np.ascontiguousarray(part)


def permute(positions, n: int, key) -> np.ndarray | None:
    """``permute.permute`` (n > 1): a stratified draw whose count and size are both n."""
    return stratified(positions, None, np.array([[n, n, n]], np.int64), key, key)


def permute_many(positions, n, keys, which) -> np.ndarray | None:
    """``permute.permute_many`` with per-corpus tables ``n``, ``keys`` and ``which``."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    return stratified(positions, which, np.repeat(n[:, None], 3, axis=1), keys, keys)


def length_order(src, tgt, rkey: np.ndarray) -> np.ndarray | None:
    """``batching.length_order`` given its random key: order by (max(src, tgt), src, rkey, index)."""
    kernel = KERNEL
    if kernel is None:
        return None
    src = _lengths(src)
    tgt = None if tgt is None else _lengths(tgt)
    out = np.empty(len(src), dtype=np.int64)
    return out if kernel.length_order(src, tgt, np.ascontiguousarray(rkey, dtype=np.uint16), out) else None


def _lengths(x) -> np.ndarray:
    """int32 or int64 1-D lengths as they are (any stride: the planner's int32 columns), else as int64."""
    x = np.asarray(x)
    return x if x.ndim == 1 and x.dtype in (np.int32, np.int64) else np.ascontiguousarray(x, dtype=np.int64)


def batch_ends(cost, max_tokens: int, cap: int, multiple: int, other=None, ordered: bool = False
               ) -> np.ndarray | None:
    """``batching.batch_sorted`` over costs already checked to lie in [1, max_tokens] at both ends; None where
    they decrease somewhere (the numpy path raises). ``other``: the costs are ``max(cost, other)`` (the planner's
    source and target columns, read in place). ``ordered``: the caller put the costs in order itself, so only the
    costs the cut reads are compared, not every pair."""
    kernel = KERNEL
    if kernel is None or cap < 1 or multiple < 1:
        return None
    cost = _lengths(cost)
    other = None if other is None else _lengths(other)
    out = np.empty(len(cost), dtype=np.int64)
    nb = kernel.batch_ends(cost, other, int(max_tokens), int(cap), int(multiple), out, bool(ordered))
    return None if nb < 0 else out[:nb].copy()


def deferred_cut(row, cost, src, tgt, lim_src, lim_tgt, nrows: int, max_tokens: int, cap: int, multiple: int):
    """``copies.deferred_cut`` (contiguous int64 arrays); None where the kernel is not built or refuses the input
    (the Python reference answers, and raises what is wrong)."""
    kernel = KERNEL
    if kernel is None or getattr(kernel, "deferred_cut", None) is None:
        return None
    n = len(row)
    order, ends = np.empty(n, np.int64), np.empty(max(n, 1), np.int64)
    nb = kernel.deferred_cut(row, cost, src, tgt, lim_src, lim_tgt, int(nrows), int(max_tokens), int(cap),
                             int(multiple), order, ends)
    return None if nb < 0 else (order, ends[:nb].copy())


def take_lengths(src_sizes, tgt_sizes, rows, src_plen: int, tgt_plen: int, pairs: np.ndarray) -> bool:
    """``sources.Component.lengths``: ``pairs[:, -2]`` (and ``[:, -1]`` with ``tgt_sizes``) = sizes of ``rows`` plus
    the prefix lengths, as int32. False where the numpy path must answer (no kernel, or rows it does not take)."""
    kernel = KERNEL
    if kernel is None or not (pairs.dtype == np.int32 and pairs.ndim == 2):
        return False
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return all(split(len(rows), lambda a, b: kernel.take_lengths(src_sizes, tgt_sizes, rows[a:b], int(src_plen),
                                                                 int(tgt_plen), pairs[a:b])))


def pair_sizes(src_sizes, tgt_sizes) -> np.ndarray | None:
    """Both sides' sizes interleaved, uint16 [n, 2], in one pass; None where the kernel is not built, a size lies
    outside [0, 65535] or the arrays are ones it does not read (numpy answers)."""
    kernel = KERNEL
    if kernel is None:
        return None
    out = np.empty((len(src_sizes), 2), np.uint16)
    try:
        ok = kernel.pair_sizes(src_sizes, tgt_sizes, out)
    except (TypeError, ValueError, BufferError):  # (an array the buffer protocol does not give as is)
        return None
    return out if ok else None


def take_rows(m: np.ndarray, idx) -> np.ndarray | None:
    """``np.take(m, idx, axis=0)`` for a C-contiguous 2-D ``m``; None where numpy must answer."""
    kernel = KERNEL
    if kernel is None or m.ndim != 2 or not m.flags.c_contiguous or not isinstance(idx, np.ndarray) \
            or idx.dtype != np.int64 or idx.ndim != 1:
        return None
    out = np.empty((len(idx), m.shape[1]), dtype=m.dtype)
    return out if kernel.take_rows(m, np.ascontiguousarray(idx), out) else None


def rows_with_lengths(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lens)``: a window's sample rows to come (int64 [n, 3], for ``sorted_rows``) and, in their top third,
    room for its lengths (int32 [n, 2]), which ``sorted_rows`` reads there before it writes over them: the window
    touches no fresh memory for its lengths."""
    out = np.empty((n, 3), dtype=np.int64)
    return out, out.reshape(-1)[2 * n:].view(np.int32).reshape(n, 2)


def sorted_rows(lens: np.ndarray, has_t: bool, keep, rkey: np.ndarray, rows: np.ndarray, span_ends: np.ndarray,
                span_pairs: np.ndarray, out: np.ndarray | None = None, span_sums: np.ndarray | None = None
                ) -> np.ndarray | None:
    """The planner's sample rows [n, 3] of a window in ``batching.length_order``'s order given its random key:
    sample j is window sample ``keep[j]`` (every one when ``keep`` is None), with lengths ``lens`` (int32 [N, 2]),
    row ``rows`` (int64 [N]) and the (direction, component) int32 pair ``span_pairs`` (int64 view) of the span
    (``span_ends``, cumulative) it lies in. None where the caller must order and gather them itself (``lens``
    then as they were). ``out``: where the rows go (int64 [n, 3]; ``rows_with_lengths``, whose lengths are then
    overwritten), else a new array. ``span_sums`` (int64 [S, 3], C-contiguous): receives per span its selected
    samples, source tokens and target tokens (a window's totals without a pass over its rows)."""
    kernel = KERNEL
    if kernel is None:
        return None
    if out is None or out.shape != (len(rkey), 3) or out.dtype != np.int64 or not out.flags.c_contiguous:
        out = np.empty((len(rkey), 3), dtype=np.int64)
    keep = None if keep is None else np.ascontiguousarray(keep, dtype=np.int64)
    ok = kernel.sorted_rows(np.ascontiguousarray(lens, dtype=np.int32), bool(has_t), keep,
                            np.ascontiguousarray(rkey, dtype=np.uint16), np.ascontiguousarray(rows, dtype=np.int64),
                            np.ascontiguousarray(span_ends, dtype=np.int64),
                            np.ascontiguousarray(span_pairs, dtype=np.int64), out,
                            max(1, min(threads(), len(rkey) // PARALLEL_MIN)), span_sums)
    return out if ok else None


def stream_totals(direction, src_len, tgt_len, streams: int) -> np.ndarray | None:
    """``totals.window_totals`` in one pass (int32 or int64 columns of any stride, read in place); None where
    numpy must answer."""
    kernel = KERNEL
    if kernel is None:
        return None

    def part(a: int, b: int) -> np.ndarray | None:
        out = np.empty((3, int(streams)), np.int64)
        try:
            ok = kernel.stream_totals(direction[a:b], src_len[a:b], tgt_len[a:b], int(streams), out)
        except (TypeError, ValueError, BufferError):  # (an array the buffer protocol does not give as is)
            return None
        return out if ok else None

    parts = split(len(direction), part)  # sums of parts: the same integers whatever the thread count
    return None if any(p is None for p in parts) else parts[0] if len(parts) == 1 else sum(parts)
