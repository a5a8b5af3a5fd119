"""The fast pair histogram and assignment give exactly what the previous implementations gave.

``previous_pair_cells`` and ``previous_assign`` are frozen copies of loader/shape_boxes.py and loader/shapes.py
as of commit 589dbcb (one bincount over a whole int64 key array; three whole-array gathers). Plans, shares,
padded and real tokens must not change, bit for bit, with or without weights, and with lengths long enough
that the histogram is binned by a power of two.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loader.shape_boxes as shape_boxes
from loader.shape_boxes import GRID_CELLS, pair_cells
from loader.shapes import assign, plan_shapes


def previous_pair_cells(lengths, tops, weights):
    s, t = lengths[:, 0], lengths[:, 1]
    top_s, top_t = int(tops[0]), int(tops[1])
    q = 1
    while (top_s // q + 2) * (top_t // q + 2) > GRID_CELLS:
        q *= 2
    if q > 1:
        s, t = -(-s // q), -(-t // q)
    ns, nt = -(-top_s // q) + 1, -(-top_t // q) + 1
    key = np.multiply(s, nt, dtype=np.int64)
    key += t
    count = np.bincount(key, weights=weights, minlength=ns * nt).astype(np.float64)
    occupied = count > 0 if weights is None else np.bincount(key, minlength=ns * nt) > 0
    cells = np.flatnonzero(occupied)
    cs, ct = np.divmod(cells, nt)
    if q > 1:
        cs, ct = np.minimum(cs * q, top_s), np.minimum(ct * q, top_t)
    return np.stack([cs, ct], axis=1).astype(np.int64), count[cells]


def previous_assign(widths, src, tgt=None):
    widths = np.asarray(widths, dtype=np.int64)
    widths = widths[:, None] if widths.ndim == 1 else widths
    cols = [np.asarray(src)] if tgt is None else [np.asarray(src), np.asarray(tgt)]
    widths = widths[:, :len(cols)]
    luts, bounds = [], []
    for d in range(len(cols)):
        u = np.unique(widths[:, d])
        lut = np.searchsorted(u, np.arange(int(u[-1]) + 2), side="left")
        luts.append(lut.astype(np.int32))
        bounds.append(np.append(u, np.iinfo(np.int64).max))
    grids = np.meshgrid(*bounds, indexing="ij")
    fits = np.ones((len(widths),) + grids[0].shape, dtype=bool)
    for d, g in enumerate(grids):
        fits &= widths[:, d].reshape((-1,) + (1,) * len(grids)) >= g[None]
    table = np.where(fits.any(axis=0), fits.argmax(axis=0), -1).ravel()
    if len(cols) == 1:
        return np.take(table[luts[0]], cols[0], mode="clip")
    cell = np.take(luts[0] * len(bounds[1]), cols[0], mode="clip")
    cell += np.take(luts[1], cols[1], mode="clip")
    return np.take(table, cell)


def random_pairs(seed, n, top, skew):
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(np.log(top) / 2, 0.8, n), 1, top)
    tgt = np.clip(src * rng.choice([1.0, skew], n) * rng.lognormal(0, 0.2, n), 1, top)
    pairs = np.stack([src, tgt], axis=1).astype(np.int64)
    pairs[0] = (top, max(1, top // 3))  # the longest source: past 2048, the histogram is binned
    return pairs


def random_weights(seed, n, kind):
    rng = np.random.default_rng(seed + 1)
    if kind == "none":
        return None
    w = rng.random(n) * 3
    if kind == "zeros":
        w[rng.random(n) < 0.3] = 0.0
    return w


cases = st.tuples(st.integers(0, 10**6), st.integers(1, 3000), st.sampled_from([8, 40, 300, 2100, 5000]),
                  st.sampled_from([1.0, 0.5, 2.0]), st.sampled_from(["none", "positive", "zeros"]))


@settings(max_examples=60, deadline=None)
@given(cases)
def test_pair_cells_equal_the_previous_histogram(case):
    seed, n, top, skew, kind = case
    lengths = random_pairs(seed, n, top, skew)
    w = random_weights(seed, n, kind)
    cells, count, exact = pair_cells(lengths, w, lengths.max())
    tops = lengths.max(axis=0)
    assert exact == ((tops[0] + 2) * (tops[1] + 2) <= GRID_CELLS)  # not binned
    old_cells, old_count = previous_pair_cells(lengths, lengths.max(axis=0), w)
    assert cells.dtype == old_cells.dtype and np.array_equal(cells, old_cells)
    assert count.dtype == old_count.dtype and np.array_equal(count, old_count)


@settings(max_examples=25, deadline=None)
@given(cases, st.integers(1, 6), st.sampled_from([0, 1, 3]))
def test_plans_equal_the_plans_on_the_previous_histogram(case, k, windows):
    seed, n, top, skew, kind = case
    lengths = random_pairs(seed, n, top, skew)
    w = random_weights(seed, n, kind)
    plan = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(shape_boxes, "pair_cells", lambda x, w, longest: (*previous_pair_cells(x, x.max(axis=0), w), False))
        old = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    for name in ("edges", "widths", "batch_sizes", "share"):
        assert np.array_equal(getattr(plan, name), getattr(old, name)), name
    for name in ("efficiency", "padded", "real"):
        assert getattr(plan, name) == getattr(old, name), name
    w = None if w is not None and not w.sum() > 0 else w  # nothing weighs anything: the samples as they are
    real = lengths.sum() if w is None else w @ lengths[:, 0] + w @ lengths[:, 1]
    assert plan.real == float(real)


widths_2d = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=9)


@settings(max_examples=80, deadline=None)
@given(widths_2d, st.integers(0, 10**6), st.integers(0, 70_000), st.booleans())
def test_assign_equals_the_previous_gathers(widths, seed, n, one_side):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 340, (n, 2))  # past every width, and 0
    w = np.array(widths)
    src, tgt = lengths[:, 0], (None if one_side else lengths[:, 1])
    got, want = assign(w, src, tgt), previous_assign(w, src, tgt)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    got, want = assign(w[:, 0], src), previous_assign(w[:, 0], src)  # 1-D widths
    assert got.dtype == want.dtype and np.array_equal(got, want)
    strided = np.asfortranarray(lengths)  # columns of other layouts and dtypes
    for s, t in ((strided[:, 0], strided[:, 1]), (src.astype(np.int32), lengths[:, 1].astype(np.int32))):
        got, want = assign(w, s, t), previous_assign(w, s, t)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_assign_keeps_the_shape_of_its_inputs():
    w = np.array([(4, 8), (8, 4)])
    src, tgt = np.array([[1, 5], [9, 3]]), np.array([[7, 2], [1, 1]])
    assert np.array_equal(assign(w, src, tgt), previous_assign(w, src, tgt))
    assert np.array_equal(assign(w, 5, 2), previous_assign(w, 5, 2))


@pytest.mark.parametrize("n", [1, 2, 65_537])
def test_bucket_equals_the_previous_assignment(n):
    lengths = random_pairs(n, n, 256, 1.8)
    plan = plan_shapes(lengths, 8, 16384)
    assert np.array_equal(plan.bucket(lengths), previous_assign(plan.widths, lengths[:, 0], lengths[:, 1]))
