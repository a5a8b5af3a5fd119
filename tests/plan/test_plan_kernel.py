"""The compiled planning kernel (loader/_native/_plan.c) against the numpy paths it replaces, for random inputs: the
Feistel permutations (one corpus and many), stratified draws, the length order and the greedy token-budget cut
must give the same integers, and the same errors."""

import contextlib
import os

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from babelfeed import permute
from babelfeed._native import plan_kernel
from babelfeed.plan import batching, mixing
from babelfeed.errors import BabelfeedError, ConfigError, DataError, UsageError

pytestmark = pytest.mark.skipif(plan_kernel.KERNEL is None, reason="the planning kernel is not built")

keys = st.integers(0, 2**63).map(lambda s: permute.derive_key(s, "test"))
sizes = st.one_of(st.integers(0, 70), st.integers(0, 70_000), st.integers(2**31, 2**33), st.integers(2**40, 2**62))


@contextlib.contextmanager
def plan_threads(k: int):
    """The kernel's passes split over k threads even for the few elements of a test (1: never split)."""
    old_min, old_env = plan_kernel.PARALLEL_MIN, os.environ.get("BABELFEED_PLAN_THREADS")
    plan_kernel.PARALLEL_MIN, os.environ["BABELFEED_PLAN_THREADS"] = 1, str(k)
    try:
        yield
    finally:
        plan_kernel.PARALLEL_MIN = old_min
        if old_env is None:
            del os.environ["BABELFEED_PLAN_THREADS"]
        else:
            os.environ["BABELFEED_PLAN_THREADS"] = old_env


def both(fn, *args):
    """fn(*args) with the kernel and without it."""
    compiled = fn(*args)
    kernel, plan_kernel.KERNEL = plan_kernel.KERNEL, None
    try:
        return compiled, fn(*args)
    finally:
        plan_kernel.KERNEL = kernel


@settings(max_examples=300, deadline=None)
@given(sizes, keys, st.integers(0, 2**32), st.integers(1, 300))
@example(2, permute.derive_key(0), 0, 2)
@example(2**32, permute.derive_key(1), 5, 50)   # 32 bits: the last narrow domain
@example(2**32 + 1, permute.derive_key(1), 5, 50)  # 34 bits: the first wide one
def test_permute(n, key, seed, m):
    pos = np.random.default_rng(seed).integers(0, max(n, 1), m) if n else np.zeros(0, np.int64)
    got, want = both(permute.permute, pos, n, key)
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sizes.filter(lambda n: n < 2**53), st.integers(1, 3)), min_size=1, max_size=6),
       st.integers(0, 2**32),
       st.integers(0, 9000))
@example([(2**32, 1)], 1, 50)  # exactly 2**32 rows: 32-bit lanes, a limit that does not fit them
def test_permute_many(corpora, seed, m):
    # below 2**53 rows: the numpy path's bit lengths come from float64 (permute._bit_length), exact only there
    rng = np.random.default_rng(seed)
    n = np.array([c for c, _ in corpora], np.int64)
    table_keys = np.stack([permute.derive_key(seed, i) for i in range(len(n))])
    runs = rng.integers(0, len(n), max(1, m // 1000 + 1))
    lens = rng.integers(0, 6000 if m > 4000 else 30, len(runs))  # long runs (scalar keys) and short ones
    which = np.repeat(runs, lens)
    pos = (rng.random(len(which)) * np.maximum(n[which], 1)).astype(np.int64)
    got, want = both(permute.permute_many, pos, n, table_keys, which)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.floats(0.01, 7.0), st.integers(0, 2**32), st.integers(1, 3000))
def test_stratified_draw(n, scale, seed, m):
    count = max(1, int(n * scale))
    draw = mixing.StratifiedDraw(n, count, (seed, "mix", 1, "a-b"))
    pos = np.random.default_rng(seed).integers(0, count, m)
    got, want = both(draw.rows, pos)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.floats(0.05, 4.0)), min_size=1, max_size=8),
       st.integers(0, 2**32))
def test_stratified_rows(corpora, seed):
    draws = [mixing.StratifiedDraw(n, max(1, int(n * f)), (seed, "mix", 1, i)) for i, (n, f) in enumerate(corpora)]
    rng = np.random.default_rng(seed)
    which = np.sort(rng.integers(0, len(draws), 4000)) if seed % 2 else rng.integers(0, len(draws), 4000)
    pos = (rng.random(len(which)) * np.array([d.count for d in draws])[which]).astype(np.int64)
    got, want = both(mixing.stratified_rows, draws, which, pos)
    np.testing.assert_array_equal(got, want)


def test_out_of_range_positions_raise():
    for n in (10, 2**40):
        for pos in ([-1], [n]):
            with pytest.raises(ValueError, match="positions must lie in"):  # not babelfeed's: the kernel's own
                permute.permute(np.array(pos), n, permute.derive_key(1))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([3, 40, 300, 1100, 65_535]), st.booleans(), st.integers(0, 2**32))
@example(1, 3, True, 0)
@example(70_000, 65_535, True, 0)  # 16 + 16 + 16 + 17 bits: too wide to pack, the numpy path answers
def test_length_order(n, top, with_tgt, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, top + 1, n)
    tgt = rng.integers(0, top + 1, n) if with_tgt else None
    got, want = both(lambda: batching.length_order(src, tgt, np.random.default_rng([seed, 7])))
    np.testing.assert_array_equal(got, want)
    rows = np.stack([src, src if tgt is None else tgt], axis=1).astype(np.int32)  # int32 columns, strided
    got32 = batching.length_order(rows[:, 0], None if tgt is None else rows[:, 1], np.random.default_rng([seed, 7]))
    np.testing.assert_array_equal(got32, want)


def test_length_order_too_long_raises():
    for kernel in (plan_kernel.KERNEL, None):
        old, plan_kernel.KERNEL = plan_kernel.KERNEL, kernel
        try:
            with pytest.raises(DataError, match="lengths above 65535"):
                batching.length_order(np.array([3, 70_000]), None, np.random.default_rng(0))
        finally:
            plan_kernel.KERNEL = old


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=3000), st.integers(600, 20_000), st.sampled_from([None, 0, 1, 7, 64]),
       st.sampled_from([1, 2, 8, 64]))
def test_batch_sorted(costs, max_tokens, max_sentences, multiple):
    cost = np.sort(np.array(costs, np.int64))
    got, want = both(batching.batch_sorted, cost, max_tokens, max_sentences, multiple)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cost, message", [([3, 2, 5], "non-decreasing"), ([0, 1], ">= 1"), ([5, 50], "exceeds")])
def test_batch_sorted_errors(cost, message):
    for kernel in (plan_kernel.KERNEL, None):
        old, plan_kernel.KERNEL = plan_kernel.KERNEL, kernel
        try:
            with pytest.raises(BabelfeedError, match=message):
                batching.batch_sorted(np.array(cost), 20, None, 1)
        finally:
            plan_kernel.KERNEL = old


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([np.uint16, np.int32, np.uint32, np.int64]), st.booleans(), st.integers(1, 5000),
       st.integers(0, 3), st.integers(0, 2), st.integers(0, 2**32), st.integers(1, 5))
def test_take_lengths(dtype, with_tgt, n, splen, tplen, seed, threads):
    rng = np.random.default_rng(seed)
    src, tgt = (rng.integers(0, 300, n).astype(dtype) for _ in range(2))
    rows = rng.integers(0, n, int(rng.integers(0, 3000)))
    got = np.zeros((len(rows), 3), np.int64)
    pairs = got[:, :2].view(np.int32)
    with plan_threads(threads):
        assert plan_kernel.take_lengths(src, tgt if with_tgt else None, rows, splen, tplen, pairs)
    want = np.zeros_like(got)
    want[:, :2].view(np.int32)[:, 2] = src[rows].astype(np.int64) + splen
    if with_tgt:
        want[:, :2].view(np.int32)[:, 3] = tgt[rows].astype(np.int64) + tplen
    np.testing.assert_array_equal(got, want)
    assert not plan_kernel.take_lengths(src, None, np.array([n]), 0, 0, np.zeros((1, 4), np.int32))  # numpy raises


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 4), st.integers(0, 2**32))
def test_take_rows(n, width, seed):
    rng = np.random.default_rng(seed)
    m = rng.integers(-2**62, 2**62, (n, width))
    idx = rng.integers(0, max(n, 1), int(rng.integers(0, 4000))) if n else np.zeros(0, np.int64)
    np.testing.assert_array_equal(plan_kernel.take_rows(m, idx), np.take(m, idx, axis=0))
    if n:
        assert plan_kernel.take_rows(m, np.array([n])) is None and plan_kernel.take_rows(m, np.array([-1])) is None


def test_take_lengths_strided_sizes():
    rng = np.random.default_rng(3)
    pair = rng.integers(0, 300, (1000, 2)).astype(np.uint16)  # both sides interleaved, as Component pairs them
    rows = rng.integers(0, 1000, 5000)
    pairs = np.zeros((len(rows), 4), np.int32)
    assert plan_kernel.take_lengths(pair[:, 0], pair[:, 1], rows, 1, 2, pairs)
    np.testing.assert_array_equal(pairs[:, 2], pair[rows, 0] + 1)
    np.testing.assert_array_equal(pairs[:, 3], pair[rows, 1] + 2)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 4000), st.sampled_from([3, 40, 300, 600, 1100, 65_535, 70_000]), st.booleans(),
       st.integers(1, 6), st.booleans(), st.integers(0, 2**32), st.integers(1, 5))
@example(1, 3, True, 1, False, 0, 1)
@example(3000, 1100, True, 3, True, 1, 1)  # (cost, src) over 18 bits: the caller orders them (None)
@example(4000, 300, True, 4, True, 2, 3)  # costs shared out among three threads
def test_sorted_rows(n, top, with_tgt, spans, filtered, seed, threads):
    """The planner's rows written in length order = the rows built, ordered by length_order, and moved."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, top + 1, (n, 2)).astype(np.int32)
    if not with_tgt and seed % 3 == 0:
        lens[:, 1] = 0  # no target: the column the planner leaves at 0
    rows = rng.integers(0, 2**40, n)
    ends = np.sort(np.concatenate([rng.integers(0, n + 1, spans - 1), [n]]))
    pairs = rng.integers(0, 2**31, (spans, 2)).astype(np.int32).view(np.int64).reshape(-1)
    keep = np.flatnonzero(rng.random(n) < 0.8) if filtered else None
    sel = np.arange(n) if keep is None else keep
    rkey = batching.random_key(np.random.default_rng([seed, 7]), len(sel))
    sums = np.full((spans, 3), -1, np.int64)
    with plan_threads(threads):  # scatter and per-cost sorts in parallel: the same rows
        got = plan_kernel.sorted_rows(lens, with_tgt, keep, rkey, rows, ends, pairs, span_sums=sums)
    m = np.zeros((n, 3), np.int64)
    m[:, 0] = np.repeat(pairs, np.diff(ends, prepend=0))
    m[:, :2].view(np.int32)[:, 2:] = lens
    m[:, 2] = rows
    kernel, plan_kernel.KERNEL = plan_kernel.KERNEL, None
    try:
        order = batching.length_order(lens[sel, 0], lens[sel, 1] if with_tgt else None, None, rkey)
    except ValueError:  # a cost over 16 bits: numpy raises, and the kernel leaves it to numpy
        order = None
    finally:
        plan_kernel.KERNEL = kernel
    cost = np.maximum(lens[sel, 0], lens[sel, 1]) if with_tgt else lens[sel, 0]
    src_bits = int(lens[sel, 0].max()).bit_length() if with_tgt and len(sel) else 0
    fits = not len(sel) or (lens[sel].max() <= 65_535 and int(cost.max()).bit_length() + src_bits <= 18)
    if not fits:
        assert got is None
        return
    assert got is not None and order is not None
    np.testing.assert_array_equal(got, m[sel[order]])
    span = np.searchsorted(ends, sel, side="right")  # per selected sample: its span (the window's totals by span)
    want = np.stack([np.bincount(span, minlength=spans), np.bincount(span, lens[sel, 0], spans),
                     np.bincount(span, lens[sel, 1], spans)], axis=1).astype(np.int64)
    np.testing.assert_array_equal(sums, want)


def test_take_lengths_into_two_columns():
    """A window's [n, 2] length table: the last two columns, as for the planner's [n, 4] int32 pairs."""
    rng = np.random.default_rng(4)
    src, tgt = rng.integers(0, 300, (2, 1000)).astype(np.uint16)
    rows = rng.integers(0, 1000, 3000)
    lens = np.empty((len(rows), 2), np.int32)
    assert plan_kernel.take_lengths(src, tgt, rows, 1, 2, lens)
    np.testing.assert_array_equal(lens, np.stack([src[rows] + 1, tgt[rows] + 2], axis=1))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.floats(0.05, 4.0)), min_size=1, max_size=6),
       st.integers(0, 2**32), st.integers(1, 4))
@example([(1, 1.0)], 0, 1)  # one row: the trivial permutation
@example([(3000, 2.0), (500, 0.5)], 3, 3)  # runs cut between threads
def test_stratified_span_rows(corpora, seed, threads):
    """Runs of consecutive positions (a window's slice of each direction) = the same positions spelled out."""
    draws = [mixing.StratifiedDraw(n, max(1, int(n * f)), (seed, "mix", 1, i)) for i, (n, f) in enumerate(corpora)]
    rng = np.random.default_rng(seed)
    spans = []
    for _ in range(int(rng.integers(1, 8))):
        d = int(rng.integers(0, len(draws)))
        lo = int(rng.integers(0, draws[d].count))
        spans.append((d, lo, int(rng.integers(0, draws[d].count - lo + 1))))
    with plan_threads(threads):
        got, want = both(mixing.stratified_span_rows, draws, spans)
    np.testing.assert_array_equal(got, want)
    which = np.repeat([d for d, _, _ in spans], [c for _, _, c in spans])
    pos = np.concatenate([np.arange(lo, lo + c) for _, lo, c in spans])
    np.testing.assert_array_equal(got, mixing.stratified_rows(draws, which, pos) if len(pos) else np.zeros(0))
    with pytest.raises(ValueError, match="positions must lie in"):  # not babelfeed's: the kernel's own
        d = spans[0][0]
        mixing.stratified_span_rows(draws, [(d, draws[d].count - 1, 2)] if draws[d].count > 1 else [(d, -1, 1)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=3000), st.integers(600, 20_000), st.sampled_from([None, 0, 1, 7, 64]),
       st.sampled_from([1, 2, 8, 64]), st.integers(0, 2**32))
def test_dynamic_cut_reads_both_columns(costs, max_tokens, max_sentences, multiple, seed):
    """cutting.dynamic with the kernel reading the planner's int32 (src, tgt) columns in place = numpy's max."""
    from babelfeed.plan import cutting

    cost = np.sort(np.array(costs, np.int64))
    rng = np.random.default_rng(seed)
    m = np.zeros((len(cost), 3), np.int64)
    pairs = m[:, :2].view(np.int32)
    side = rng.random(len(cost)) < 0.5  # which side is the longer one
    pairs[:, 2] = np.where(side, cost, (cost * rng.random(len(cost))).astype(np.int64))
    pairs[:, 3] = np.where(side, (cost * rng.random(len(cost))).astype(np.int64), cost)
    got, want = both(cutting.dynamic, pairs[:, 2], pairs[:, 3], max_tokens, max_sentences, multiple)
    np.testing.assert_array_equal(got, want)
    trusted = cutting.dynamic(pairs[:, 2], pairs[:, 3], max_tokens, max_sentences, multiple, ordered=True)
    np.testing.assert_array_equal(trusted, want)  # the planner's order: only the costs the cut reads compared


def test_an_ordered_cut_still_refuses_costs_that_fall_where_it_reads():
    """``ordered=True`` leaves out the pass over every pair, not the comparison of the costs each batch is cut by:
    a cost that falls below the batch before at a batch's first or last sample is caught, and numpy raises."""
    from babelfeed.plan import cutting

    cost = np.repeat(np.arange(1, 41, dtype=np.int64), 50)  # 2,000 costs, batches of a few dozen
    ends = plan_kernel.batch_ends(cost, 1000, len(cost), 1, ordered=True)
    np.testing.assert_array_equal(ends, batching.batch_sorted(cost, 1000))
    bad = cost.copy()
    bad[ends[5]] = 1  # the first sample of batch 6 costs less than the batch before it
    assert plan_kernel.batch_ends(bad, 1000, len(bad), 1, ordered=True) is None
    with pytest.raises(UsageError, match="non-decreasing"):
        cutting.dynamic(bad, bad, 1000, 0, 1, ordered=True)


def test_sorted_rows_declines_rows_it_cannot_carry():
    """Rows at or over 2^48 do not fit beside the source length in a sort entry: the caller orders them."""
    lens = np.array([[3, 4], [5, 2]], np.int32)
    args = (lens, True, None, np.array([1, 0], np.uint16))
    spans = (np.array([2]), np.array([7]))
    assert plan_kernel.sorted_rows(*args, np.array([2**48, 1]), *spans) is None
    got = plan_kernel.sorted_rows(*args, np.array([2**48 - 1, 1]), *spans)
    np.testing.assert_array_equal(got[:, 2], [2**48 - 1, 1])


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_sorted_rows_in_threads_equal_one_thread(threads):
    """Windows big enough for every parallel pass (scatter parts, per-cost sorts, rows written out in chunks
    from the top): the same rows as one thread, with and without a target, filtered or not, several spans."""
    rng = np.random.default_rng(threads)
    n = 60_000
    lens = rng.integers(1, 300, (n, 2)).astype(np.int32)
    rows = rng.integers(0, 2**40, n)
    ends = np.array([7_000, 31_000, n], np.int64)
    pairs = rng.integers(0, 2**31, (3, 2)).astype(np.int32).view(np.int64).reshape(-1)
    for with_tgt in (True, False):
        for keep in (None, np.flatnonzero(rng.random(n) < 0.7)):
            rkey = batching.random_key(np.random.default_rng(5), n if keep is None else len(keep))
            s1, sk = np.zeros((3, 3), np.int64), np.zeros((3, 3), np.int64)
            with plan_threads(1):
                one = plan_kernel.sorted_rows(lens, with_tgt, keep, rkey, rows, ends, pairs, span_sums=s1)
            with plan_threads(threads):
                many = plan_kernel.sorted_rows(lens, with_tgt, keep, rkey, rows, ends, pairs, span_sums=sk)
            assert one is not None and one.shape == many.shape
            np.testing.assert_array_equal(many, one)
            np.testing.assert_array_equal(sk, s1)  # parts' span sums added up: the same whatever the threads
            assert s1[:, 0].sum() == len(one) and s1[:, 1].sum() == (one[:, 1] & 0xFFFFFFFF).sum()  # (src: low half)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_refused_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("BABELFEED_PLAN_THREADS", value)
    with pytest.raises(ConfigError, match="BABELFEED_PLAN_THREADS"):
        plan_kernel.threads()
    monkeypatch.setenv("BABELFEED_PLAN_THREADS", "64")
    assert plan_kernel.threads() == 16


def test_split_does_the_parts_itself_when_no_thread_can_start(monkeypatch):
    import threading

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with plan_threads(4):
        parts = plan_kernel.split(40, lambda a, b: (a, b))
    assert parts == [(0, 10), (10, 20), (20, 30), (30, 40)]
    monkeypatch.setenv("BABELFEED_PLAN_THREADS", "²")
    with pytest.raises(ConfigError, match="BABELFEED_PLAN_THREADS"):
        plan_kernel.threads()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 40), st.sampled_from(["rows", "int64"]), st.integers(0, 2**32))
def test_stream_totals(n, streams, layout, seed):
    """A window's samples and tokens per stream, read in place from the planner's int32 sample rows (strided) or
    from int64 arrays: the same as numpy's three bincounts."""
    from babelfeed.plan import totals

    rng = np.random.default_rng(seed)
    d, s, t = rng.integers(0, streams, n), rng.integers(0, 1 << 20, n), rng.integers(0, 1 << 20, n)
    if layout == "rows":  # (the planner's [n, 3] int64 rows: direction, component, src, tgt as int32 in the first two)
        m = np.zeros((n, 3), np.int64)
        q = m[:, :2].view(np.int32)
        q[:, 0], q[:, 2], q[:, 3] = d, s, t
        d, s, t = q[:, 0], q[:, 2], q[:, 3]
    if seed % 2:  # runs of one stream (a window of few directions, summed a run at a time)
        d = np.sort(d)
    compiled, plain = both(totals.window_totals, d, s, t, streams)
    assert compiled.dtype == plain.dtype == np.int64 and np.array_equal(compiled, plain)
    if n:  # a stream out of range: the kernel declines and numpy answers (its error)
        bad = np.array(d)
        bad[-1] = streams
        assert plan_kernel.stream_totals(bad, s, t, streams) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_totals_of_a_big_window_in_threads(threads):
    """Over a window big enough to be summed in parts (one per thread): the same integers as numpy."""
    from babelfeed.plan import totals

    rng = np.random.default_rng(threads)
    n = 3 * plan_kernel.PARALLEL_MIN + 17
    m = np.zeros((n, 3), np.int64)
    q = m[:, :2].view(np.int32)
    q[:, 0] = np.sort(rng.integers(0, 5, n)) if threads == 2 else rng.integers(0, 5, n)
    q[:, 2], q[:, 3] = rng.integers(0, 1 << 16, (2, n))
    with plan_threads(threads):
        compiled, plain = both(totals.window_totals, q[:, 0], q[:, 2], q[:, 3], 5)
    np.testing.assert_array_equal(compiled, plain)


@pytest.mark.parametrize("threads", [1, 2])
def test_sorted_rows_reads_lengths_from_its_own_top_third(threads):
    """The planner's lengths written into the top third of the rows to come (``rows_with_lengths``): the same rows
    as from lengths of their own; lengths anywhere else in the output, or rows in it, are refused."""
    rng = np.random.default_rng(threads)
    n = 2 * plan_kernel.PARALLEL_MIN + 5 if threads == 2 else 5_000
    lens = rng.integers(1, 300, (n, 2)).astype(np.int32)
    rows = rng.integers(0, 2**40, n)
    ends = np.array([n // 3, n], np.int64)
    pairs = rng.integers(0, 2**31, (2, 2)).astype(np.int32).view(np.int64).ravel()
    rkey = batching.random_key(np.random.default_rng(3), n)
    with plan_threads(threads):
        want = plan_kernel.sorted_rows(lens, True, None, rkey, rows, ends, pairs)
        table, inside = plan_kernel.rows_with_lengths(n)
        inside[:] = lens
        got = plan_kernel.sorted_rows(inside, True, None, rkey, rows, ends, pairs, table)
    assert got is table
    np.testing.assert_array_equal(got, want)
    table = np.empty((n, 3), np.int64)
    low = table.reshape(-1)[:n].view(np.int32).reshape(n, 2)  # where the sort entries go
    low[:] = lens
    with pytest.raises(ValueError, match="top third"):  # not babelfeed's: the raw kernel's own argument check
        plan_kernel.KERNEL.sorted_rows(low, True, None, rkey, rows, ends, pairs, table, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.sampled_from([np.int32, np.uint16, np.int64, np.int16]), st.booleans(),
       st.sampled_from([0, 1, 65_535, 65_536, -1]), st.integers(0, 2**32))
def test_pair_sizes(n, dtype, strided, extreme, seed):
    """Both sides' sizes interleaved as uint16 in one pass = numpy's copies; a size outside [0, 65535] (or one
    the dtype cannot hold) is declined, for numpy to answer."""
    rng = np.random.default_rng(seed)
    both_sides = rng.integers(0, 2000, (n, 2)).astype(dtype)
    if n and np.can_cast(np.min_scalar_type(extreme), dtype):
        both_sides[rng.integers(0, n), rng.integers(0, 2)] = extreme
    src, tgt = (both_sides[:, 0], both_sides[:, 1]) if strided else (both_sides[:, 0].copy(), both_sides[:, 1].copy())
    got = plan_kernel.pair_sizes(src, tgt)
    fits = not n or (int(both_sides.min()) >= 0 and int(both_sides.max()) <= 65_535)
    if not fits:
        assert got is None
        return
    assert got is not None and got.dtype == np.uint16
    np.testing.assert_array_equal(got.astype(np.int64), both_sides.astype(np.int64))


def test_kernel_edges_found_in_review():
    """A run of bad streams at the start (or at a thread's part) is declined, not dropped; an ordered cut over a 0
    cost is declined, not a crash; unaligned int32 sizes (a fairseq .idx holds them at byte 34) read right; an
    argument inside the output sorted_rows writes is refused."""
    from babelfeed.plan import totals

    d, s, t = np.array([-1, -1, 0, 1]), np.array([1, 1, 1, 2]), np.array([3, 3, 3, 4])
    assert plan_kernel.stream_totals(d, s, t, 2) is None
    n = 2 * plan_kernel.PARALLEL_MIN
    d = np.zeros(n, np.int64)
    d[n // 2:n // 2 + 10] = -1  # at the start of the second thread's part
    with plan_threads(2):
        assert plan_kernel.stream_totals(d, np.ones(n, np.int64), np.ones(n, np.int64), 1) is None
    with pytest.raises(ValueError):  # not babelfeed's: numpy's bincount answers a negative stream
        totals.window_totals(d, np.ones(n, np.int64), np.ones(n, np.int64), 1)
    assert plan_kernel.batch_ends(np.array([3, 3, 3, 0, 0, 5]), 9, 3, 1, ordered=True) is None
    raw = np.zeros(4 * 1000 + 2, np.uint8)  # int32 sizes at an odd address
    sizes = raw[2:].view(np.int32)
    assert not sizes.flags.aligned
    sizes[:] = np.arange(1000)
    got = plan_kernel.pair_sizes(sizes, sizes[::-1])
    np.testing.assert_array_equal(got, np.stack([np.arange(1000), np.arange(1000)[::-1]], axis=1))
    m = 64
    table, lens = plan_kernel.rows_with_lengths(m)
    lens[:] = 5
    rkey = table.reshape(-1)[:m // 4].view(np.uint16)  # the random keys where the sort entries go
    with pytest.raises(ValueError, match="no other argument"):  # not babelfeed's: the raw kernel's argument check
        plan_kernel.KERNEL.sorted_rows(lens, True, None, rkey, np.arange(m), np.array([m]), np.array([0]), table, 1)
