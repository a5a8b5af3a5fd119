"""How the host's fetcher turns ranges asked for into requests, without a server: the interval arithmetic against a
brute-force model, requests joined across hints, the order (a waiting gather first, then hints by due), whole
blocks for files the host reads nearly whole, small gaps for files it shares with other hosts, and the room the
cache must have before a hint is fetched; and the iterator side, which asks for its own batches only."""

import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babelfeed.errors import UsageError
from babelfeed.storage.remote import limits, pieces, ranges, server, wire
from babelfeed.storage.remote.pieces import Piece, Pieces

intervals = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=25).map(
    lambda xs: (np.array([a for a, _ in xs], np.int64), np.array([a + n for a, n in xs], np.int64)))


def covered(a, b, size=400) -> np.ndarray:
    m = np.zeros(size, bool)
    for x, y in zip(a.tolist(), b.tolist()):
        m[x:y] = True
    return m


def as_intervals(mask) -> list:
    out, k = [], 0
    while k < len(mask):
        if mask[k]:
            j = k
            while j < len(mask) and mask[j]:
                j += 1
            out.append((k, j))
            k = j
        else:
            k += 1
    return out


@settings(max_examples=150, deadline=None)
@given(intervals, intervals)
def test_interval_arithmetic_equals_a_byte_by_byte_model(q, h):
    a, b = q
    ha, hb = ranges.merged(*h)
    ma, mb = ranges.merged(a, b)
    assert list(zip(ma.tolist(), mb.tolist())) == as_intervals(covered(a, b))
    sa, sb = ranges.subtract(a, b, ha, hb)
    assert list(zip(sa.tolist(), sb.tolist())) == as_intervals(covered(a, b) & ~covered(ha, hb))
    qi, pi = ranges.overlap_pairs(a, b, ha, hb)
    want = {(i, j) for i in range(len(a)) for j in range(len(ha)) if a[i] < hb[j] and ha[j] < b[i] and a[i] < b[i]}
    assert set(zip(qi.tolist(), pi.tolist())) == want and len(qi) == len(want)
    pieces = Pieces()
    for x, y in zip(ha.tolist(), hb.tolist()):
        pieces.add(Piece(None, x, y))
    assert pieces.covers(a, b) == (not (covered(a, b) & ~covered(ha, hb)).any())
    d = np.arange(len(a), dtype=np.float64)
    da, db, dd = ranges.merged_dues(a, b, d)
    for x, y, due in zip(da.tolist(), db.tolist(), dd.tolist()):  # each joined range: the earliest due in it
        inside = [d[i] for i in range(len(a)) if a[i] < b[i] and x <= a[i] and b[i] <= y]
        assert due == min(inside)


class FakeStore:
    def __init__(self):
        self.got = []

    async def get_range_async(self, key, a, b, etag):
        self.got.append((a, b))
        return bytes((i % 251 for i in range(a, b)))


@pytest.fixture
def paused(monkeypatch, tmp_path):
    """A fetcher whose network takes nothing by itself (no connections): requests are formed by hand."""
    monkeypatch.setattr(limits, "CONCURRENCY", 0)
    monkeypatch.setattr(limits, "GAP", 1000)
    monkeypatch.setattr(limits, "LARGEST_REQUEST", 1 << 16)
    monkeypatch.setenv("BABELFEED_FETCH_CACHE_MB", "1")
    fet = server.Fetcher(str(tmp_path))
    files = []

    def make(size=1 << 18):
        path = os.path.join(str(tmp_path), f"f{len(files)}.bin")
        with open(path, "wb") as f:
            f.truncate(size)
        remote = pieces.RemoteFile(FakeStore(), "k", size, "", path)
        fet.remotes[path] = remote
        files.append(remote)
        return remote

    yield fet, make
    for r in files:
        os.close(r.fd)


def ask(fet, remote, a, b, due):
    with remote.lock:
        fet._ask(remote, np.array(a), np.array(b), np.full(len(a), float(due)))


def test_ranges_of_two_hints_are_joined_into_one_request(paused):
    fet, make = paused
    r = make()
    ask(fet, r, [100], [200], 5)
    ask(fet, r, [700], [800], 9)  # another message, 500 bytes on: within the gap
    job = fet._take()
    assert (job.a, job.b) == (100, 800) and not job.urgent
    assert fet._take() is None  # (nothing left pending)


def test_a_waiting_gather_goes_before_every_hint_and_hints_go_by_due(paused):
    fet, make = paused
    r1, r2 = make(), make()
    ask(fet, r1, [50_000], [50_100], 7)
    ask(fet, r2, [90_000], [90_100], 3)
    ask(fet, r1, [10_000], [10_100], -np.inf)
    order = [(j.remote is r1, j.a, j.urgent) for j in (fet._take(), fet._take(), fet._take())]
    assert order == [(True, 10_000, True), (False, 90_000, False), (True, 50_000, False)]


def test_a_file_read_nearly_whole_is_fetched_in_aligned_blocks_and_a_shared_one_row_by_row(paused, monkeypatch):
    """With ``BABELFEED_FETCH_SPARSE_GAP`` 0 (its own rows only), a file other hosts read too is fetched row by
    row."""
    fet, make = paused
    monkeypatch.setattr(limits, "SPARSE_GAP", 0)
    whole, shared = make(), make()
    assert fet.plan({whole.path: 1.0, shared.path: 0.5}, hosts=2)["dense"] == 1
    ask(fet, whole, [70_000], [70_010], 1)
    job = fet._take()
    block = limits.LARGEST_REQUEST
    assert (job.a, job.b) == (70_000 // block * block, 70_000 // block * block + block)
    ask(fet, shared, [1000, 1400], [1100, 1500], 1)  # 300 bytes apart: more than the shared file's gap
    assert [(j.a, j.b) for j in (fet._take(), fet._take())] == [(1000, 1100), (1400, 1500)]


def test_a_hint_waits_for_room_in_the_cache_and_a_gather_does_not(paused, monkeypatch):
    fet, make = paused
    r = make(4 << 20)
    fet.limit = 100_000
    fet.held_bytes = 95_000  # (nearly full of pinned bytes: nothing can be evicted)
    ask(fet, r, [0], [20_000], 4)
    assert fet._take() is None
    ask(fet, r, [3 << 20], [(3 << 20) + 100], -np.inf)
    job = fet._take()
    assert job.urgent and job.a == 3 << 20


def test_landed_bytes_are_the_object_bytes_and_a_request_never_spans_held_ones(paused):
    fet, make = paused
    r = make()
    ask(fet, r, [1000], [1100], -np.inf)
    job = fet._take()
    import asyncio

    fet._landed(job, asyncio.run(r.store.get_range_async("k", job.a, job.b, None)), None)
    ask(fet, r, [900, 1200], [950, 1300], 1)  # both sides of the held piece, within the gap
    jobs = [fet._take(), fet._take()]
    assert sorted((j.a, j.b) for j in jobs) == [(900, 950), (1200, 1300)]
    for j in jobs:
        fet._landed(j, asyncio.run(r.store.get_range_async("k", j.a, j.b, None)), None)
    with open(r.path, "rb") as f:
        data = f.read(1300)
    want = bytes(i % 251 for i in range(1300))
    for x, y in [(900, 950), (1000, 1100), (1200, 1300)]:
        assert data[x:y] == want[x:y]
    assert fet.counters["bytes"] == 250  # (no byte fetched twice)


def test_the_iterator_asks_for_its_own_batches_only(monkeypatch):
    """A process that makes every other batch (a DataLoader worker of two) pins and hints those only; the first
    group is the first batch alone, the later ones a group each."""
    from babelfeed.iterators import fetch_ahead
    from babelfeed.storage.remote import client as remote

    calls = []
    monkeypatch.setattr(remote, "ensure_many", lambda files, group=False, due=None: calls.append(("ensure", files)))
    monkeypatch.setattr(remote, "hint", lambda files, due=None: calls.append(("hint", files)))
    monkeypatch.setattr(remote, "plan", lambda shares, hosts=1, rank=None, epoch=None: calls.append(("plan", shares)))
    asked = []

    def rows(ks, base):
        ks = [k for k in ks if k < 500]
        asked.append(list(ks))
        return [["x.bin", np.array(ks) * 100, np.array(ks) * 100 + 10]], len(ks)

    fa = fetch_ahead.FetchAhead(rows, lambda: ({"x.bin": 1.0}, 1))
    for k in range(1, 200, 2):  # this worker's batches: 1, 3, 5, ...
        assert fa.before(k, 0, 1)
    ks = {k for a in asked for k in a}
    assert ks and all(k % 2 == 1 for k in ks)  # (the first batch alone; then the stride read from the next)
    assert [c[0] for c in calls[:3]] == ["plan", "ensure", "ensure"] and asked[0] == [1]
    groups = [c[1][0][1] // 100 for c in calls if c[0] == "ensure"]
    assert len(groups[1]) == fetch_ahead.GROUP  # (then twice the last, while its bytes are few)
    assert all(len(b) in (len(a), 2 * len(a)) for a, b in zip(groups[1:-2], groups[2:-1]))
    assert all(np.all(np.diff(g) == 2) for g in groups)
    served = set(range(1, 200, 2))
    assert served <= {int(k) for g in groups for k in g}  # every batch made was pinned by a group first


def test_an_explicit_stride_is_used_from_the_first_batch(monkeypatch):
    from babelfeed.iterators import fetch_ahead
    from babelfeed.storage.remote import client as remote

    monkeypatch.setattr(remote, "ensure_many", lambda files, group=False, due=None: None)
    monkeypatch.setattr(remote, "hint", lambda files, due=None: None)
    asked = []

    def rows(ks, base):
        asked.extend(ks)
        return [], len(ks)

    fa = fetch_ahead.FetchAhead(rows)
    fa.stride = 3
    fa.before(2, 0, 1)
    assert asked and all(k % 3 == 2 for k in asked)


def test_the_shares_of_a_plan_mark_dense_files_only_while_the_cache_holds_them(paused):
    fet, make = paused
    a, b = make(600_000), make(600_000)
    fet.limit = 1_000_000  # (80% of it: one of the two)
    assert fet.plan({a.path: 1.0, b.path: 1.0})["dense"] == 1
    assert a.dense != b.dense


def test_the_share_a_file_is_fetched_at_counts_the_gaps_its_requests_join():
    """A file whose rows read lie closer than the gap is fetched whole anyway: planned as dense (in blocks). The
    closed form against a simulation of rows taken at random and joined across short gaps."""
    from babelfeed.storage.remote.ranges import joined_share

    rng = np.random.default_rng(0)
    rows, row = 200_000, 100
    for share, gap in [(0.01, 16 << 10), (0.02, 4096), (0.3, 1000), (0.5, 0), (0.05, 100)]:
        read = np.flatnonzero(rng.random(rows) < share)
        runs = np.diff(read) - 1  # rows not read between two read ones
        brought = len(read) + runs[runs * row < gap].sum()
        assert joined_share(share, rows, rows * row, gap) == pytest.approx(brought / rows, abs=0.02)
    assert joined_share(0.4, 0, 1000, 1 << 20) == 0.4  # (rows not known: the share as it is)
    assert joined_share(1.0, 10, 1000, 0) == 1.0


def test_a_file_read_sparsely_but_closely_is_planned_dense(paused, monkeypatch):
    """Rows read close together are fetched in blocks, on several hosts too (a host's rows are a random share of
    every file: its own alone are a request each); with ``BABELFEED_FETCH_SPARSE_GAP`` 0, a host's own rows only."""
    fet, make = paused
    a, b = make(600_000), make(600_000)
    assert fet.plan({a.path: [0.3, 6000], b.path: [0.3, 60]})["dense"] == 1  # rows of 100 bytes, of 10 KB
    assert a.dense and not b.dense
    assert fet.plan({a.path: [0.3, 6000], b.path: [0.3, 60]}, hosts=2)["dense"] == 1
    assert a.dense and not a.shared and b.shared
    monkeypatch.setattr(limits, "SPARSE_GAP", 0)
    assert fet.plan({a.path: [0.3, 6000], b.path: [0.3, 60]}, hosts=2)["dense"] == 0  # (the others' rows)
    assert a.shared and not a.dense


def test_a_message_carries_its_arrays_exactly():
    """Arrays travel as raw bytes after the JSON head: every value, dtype and nesting comes back, empty arrays
    and a message of megabytes included, and a connection closed mid-message reads as closed."""
    import socket

    rng = np.random.default_rng(3)
    big = rng.integers(0, 1 << 40, 600_000)
    dues = ranges.pack(rng.random(600_000), "<f8")
    msg = {"op": "hint", "files": [["/a.bin", ranges.pack(big), ranges.pack(big + 7), dues],
                                   ["/b.bin", ranges.pack([]), ranges.pack([]), None]], "due": 3.5, "keep": True}
    x, y = socket.socketpair()
    try:
        import threading

        t = threading.Thread(target=wire.send, args=(x, msg))
        t.start()
        got = wire.receive(y)
        t.join()
        assert got["op"] == "hint" and got["due"] == 3.5 and got["keep"] is True
        (pa, a, b, d), (pb, e, f, none) = got["files"]
        assert (pa, pb, none) == ("/a.bin", "/b.bin", None)
        assert np.array_equal(ranges.unpack(a), big) and np.array_equal(ranges.unpack(b), big + 7)
        assert np.array_equal(ranges.unpack(d, "<f8"), msg["files"][0][3])
        assert len(ranges.unpack(e)) == 0 and len(ranges.unpack(f)) == 0
        x.sendall(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"op\"")  # (a head of 16 bytes, cut after 5)
        x.close()
        assert wire.receive(y) is None
    finally:
        y.close()


def test_a_requests_files_travel_flat_and_come_back_per_file():
    """``flat_files`` (the client) and ``split_files`` (the fetcher) across the wire: each file's path, ranges and
    dues and inodes come back exactly, files without ranges, without dues (NaN: the message's due) and without an
    inode (0) included."""
    import socket
    import threading

    rng = np.random.default_rng(5)
    files = []
    for i in range(300):
        n = int(rng.integers(0, 40))
        a = np.sort(rng.integers(0, 1 << 40, n))
        f = [f"/d/f{i}.bin", a, a + rng.integers(1, 100, n), rng.random(n) if i % 3 else None, i + 7]
        files.append(f if i % 5 else f[:4])  # (a file without an inode: 0, not said)
    x, y = socket.socketpair()
    try:
        t = threading.Thread(target=wire.send, args=(x, {"files": ranges.flat_files(files, dues=True)}))
        t.start()
        got = ranges.split_files(wire.receive(y)["files"])
        t.join()
    finally:
        x.close()
        y.close()
    assert len(got) == len(files)
    for f, (p, a, b, d, ino) in zip(files, got):
        assert p == f[0] and np.array_equal(a, f[1]) and np.array_equal(b, f[2]) and ino == (f[4:] or [0])[0]
        assert np.array_equal(d, f[3]) if f[3] is not None else (len(d) == len(f[1]) and np.isnan(d).all())
    assert ranges.split_files(ranges.flat_files([])) == []
    plain = ranges.flat_files([f[:3] for f in files[:2]])
    assert "dues" not in plain and "inodes" not in plain
    assert [x[3:] for x in ranges.split_files(plain)] == [[None, 0], [None, 0]]
    odd = ranges.split_files(ranges.flat_files([["/a", np.array([[1, 2]]), np.array([[2, 3]])], ["/b", 5, 7]]))
    assert [(p, a.tolist(), b.tolist()) for p, a, b, *_ in odd] == [("/a", [1, 2], [2, 3]), ("/b", [5], [7])]
    with pytest.raises(UsageError, match="/a: 2 range starts, 1 ends"):
        ranges.flat_files([["/a", [1, 2], [3]]])
    with pytest.raises(UsageError, match="3 dues"):
        ranges.flat_files([["/a", [1, 2], [3, 4], [0.0, 1.0, 2.0]]], dues=True)


def test_a_block_request_spans_short_held_runs_and_splits_at_long_ones(paused, monkeypatch):
    """A dense file's block: a run held (fetched for a gather) shorter than SPAN_HELD is spanned (counted in
    bytes_again, never written twice); one as long or longer splits the block, and what lies past it is the
    next request's."""
    import asyncio

    monkeypatch.setattr(limits, "SPAN_HELD", 5000)
    monkeypatch.setattr(limits, "WHOLE_AT_ONCE", 0)  # (gathers fetch their ranges, not the small file whole)
    fet, make = paused
    r = make(1 << 16)  # (one block: LARGEST_REQUEST is 64 KiB here)
    assert fet.plan({r.path: 1.0})["dense"] == 1
    for a, b in [(10_000, 10_100), (30_000, 38_000)]:  # a short run held, and a long one
        ask(fet, r, [a], [b], -np.inf)
        job = fet._take()
        fet._landed(job, asyncio.run(r.store.get_range_async("k", job.a, job.b, None)), None)
    ask(fet, r, [0, 50_000], [100, 50_100], 1)
    first, second = fet._take(), fet._take()
    assert (first.a, first.b) == (0, 30_000) and first.parts == [(0, 10_000), (10_100, 30_000)]
    assert (second.a, second.b) == (38_000, 1 << 16)
    assert fet._take() is None
    for j in (first, second):
        fet._landed(j, asyncio.run(r.store.get_range_async("k", j.a, j.b, None)), None)
    assert fet.counters["bytes_again"] == 100 and fet.counters["bytes"] == (1 << 16) + 100
    with open(r.path, "rb") as f:
        assert f.read() == bytes(i % 251 for i in range(1 << 16))


def test_a_gather_on_a_small_dense_file_fetches_it_whole_at_once(paused, monkeypatch):
    """At 1,000 directions a batch reads a row or two of each file: a gather's rows were one request, the file's
    block a second one, and the next batches waited on it. A dense file up to WHOLE_AT_ONCE is one urgent
    request, whole; a larger one, the gather's ranges alone."""
    import asyncio

    monkeypatch.setattr(limits, "WHOLE_AT_ONCE", 1 << 15)
    fet, make = paused
    small, large = make(1 << 15), make(1 << 16)
    assert fet.plan({small.path: 1.0, large.path: 1.0})["dense"] == 2
    for r in (small, large):
        ask(fet, r, [1000], [1100], -np.inf)
        job = fet._take()
        assert job.urgent and ((job.a, job.b) == ((0, 1 << 15) if r is small else (1000, 1100))), (job.a, job.b)
        fet._landed(job, asyncio.run(r.store.get_range_async("k", job.a, job.b, None)), None)
    assert fet._take() is None
    with open(small.path, "rb") as f:
        assert f.read() == bytes(i % 251 for i in range(1 << 15))


def test_hints_leave_connections_for_gathers(paused, monkeypatch):
    """Hints never take the last RESERVED connections: a gather that comes while the lookahead's blocks fill the
    others is requested at once, not after a block lands."""
    import asyncio

    fet, make = paused
    monkeypatch.setattr(limits, "CONCURRENCY", 4)
    monkeypatch.setattr(limits, "RESERVED", 1)
    r = make(1 << 20)
    ask(fet, r, [0, 100_000, 200_000, 300_000, 400_000], [10, 100_010, 200_010, 300_010, 400_010], 5)
    hints = [fet._take() for _ in range(3)]
    assert all(j is not None and not j.urgent for j in hints)
    assert fet._take() is None  # (a fourth hint would take the gathers' connection)
    ask(fet, r, [900_000], [900_010], -np.inf)
    job = fet._take()
    assert job.urgent and job.a == 900_000
    fet._landed(hints[0], asyncio.run(r.store.get_range_async("k", hints[0].a, hints[0].b, None)), None)
    assert not fet._take().urgent  # (one hint landed: the next may go)


def test_the_ranks_of_one_host_are_planned_as_one_host(paused, monkeypatch):
    """Two ranks of two on one host (one fetcher): each says it reads half of a file; together the host reads it
    all, so it is fetched in blocks, not row by row as if another host read the rows between (with
    ``BABELFEED_FETCH_SPARSE_GAP`` 0, where that differs). A rank that disconnects no longer counts."""
    fet, make = paused
    monkeypatch.setattr(limits, "SPARSE_GAP", 0)
    a = make(600_000)
    c0, c1 = server.Client(), server.Client()
    fet.clients |= {c0, c1}
    assert fet.plan({a.path: [0.5, 6000]}, hosts=2, rank=0, client=c0)["dense"] == 0
    assert a.shared and not a.dense
    assert fet.plan({a.path: [0.5, 6000]}, hosts=2, rank=1, client=c1)["dense"] == 1
    assert a.dense and not a.shared
    fet.clients.discard(c1)
    assert fet.plan({a.path: [0.5, 6000]}, hosts=2, rank=0, client=c0)["dense"] == 0


def test_the_batch_clock_reaches_the_fetcher_as_an_argument(monkeypatch):
    """What the fetcher needs from the iterator (the batch's clock, whether its rows were fetched ahead) is passed
    with each request: the group request carries the clock given to ``before``, a gather of a prefetched batch
    asks for nothing, and one not prefetched asks with its clock (no thread-local clock, no flag toggled on the
    token spaces around a call)."""
    from babelfeed.iterators import fetch_ahead
    from babelfeed.storage.remote import client as remote
    from babelfeed.storage.spaces import Reading

    dues = []
    monkeypatch.setattr(remote, "ensure_many", lambda files, group=False, due=None: dues.append((group, due)))
    monkeypatch.setattr(remote, "hint", lambda files, due=None: None)
    fa = fetch_ahead.FetchAhead(lambda ks, base: ([["x.bin", np.array(ks) * 100, np.array(ks) * 100 + 10]], len(ks)))
    assert fa.before(0, 0, 1, None, 7.0)
    assert dues[0] == (True, 7.0)

    class Spaces:
        remote = True

        def fetch(self, space, start, length, due=None):
            dues.append(("gather", due))

    Reading(Spaces(), 9.0, prefetched=True).fetch(0, [0], [4])
    Reading(Spaces(), 11.0, prefetched=False).fetch(0, [0], [4])
    assert dues[1:] == [("gather", 11.0)]
    assert not hasattr(remote, "set_clock")


def test_a_hint_message_is_cut_to_what_its_rows_take_to_work_out(monkeypatch):
    """The rows of a hint message are worked out in the thread that makes batches: a message of thousands of
    batches held up the next batch for 40-140 ms (training at 1M tokens/s waited on it). Each message is cut to
    the batches that fit in STEP_SECONDS at the last message's cost (at least SMALLEST_CHUNK), while the
    lookahead still fills: bytes ahead grow past half of it within a few batches."""
    from babelfeed.iterators import fetch_ahead
    from babelfeed.storage.remote import client as remote

    monkeypatch.setattr(remote, "ensure_many", lambda files, group=False, due=None: None)
    hinted = []
    monkeypatch.setattr(remote, "hint", lambda files, due=None: hinted.append(len(files[0][1])))
    monkeypatch.setattr(remote, "plan", lambda shares, hosts=1, rank=None, epoch=None: None)
    cost = 0.0002  # seconds a batch's rows take to work out: 10 fit in STEP_SECONDS

    def rows(ks, base):
        ks = list(ks)
        time.sleep(cost * len(ks))
        return [["x.bin", np.array(ks) * 100, np.array(ks) * 100 + 10]], len(ks)

    monkeypatch.setenv("BABELFEED_FETCH_AHEAD_MB", "0.05")  # (52,428 bytes ahead: 5,243 batches of 10)
    fa = fetch_ahead.FetchAhead(rows, lambda: ({"x.bin": 1.0}, 1))
    for k in range(60):
        fa.before(k, 0, 1)
    assert hinted[0] == fetch_ahead.CHUNK  # (the first message: no cost known yet)
    later = hinted[1:]
    assert later and max(later) <= fetch_ahead.SMALLEST_CHUNK * 1.5, hinted  # (without the cut: 1,310)
    assert sum(hinted) >= 60 + fetch_ahead.CHUNK  # (it keeps ahead of the batches made)
