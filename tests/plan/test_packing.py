import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import babelfeed
from babelfeed.plan.packing import gpt_sample_index, pack, pack_pairs, pack_sentences
from babelfeed.errors import DataError


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=80), st.integers(1, 32))
def test_pack_places_every_token_once_without_overlap(lengths, row_length):
    plan = pack(lengths, row_length)
    lengths = np.array(lengths, dtype=np.int64)
    # every sequence is covered exactly by its pieces, in order
    for i, n in enumerate(lengths.tolist()):
        m = plan.sequence == i
        starts, sizes = plan.start[m], plan.length[m]
        order = np.argsort(starts)
        assert sizes.sum() == n and (np.cumsum(sizes[order]) - sizes[order] == starts[order]).all()
        assert (m.sum() <= 1) or (sizes[order][:-1] == row_length).all()  # split only into full rows
    seg = plan.segment_ids()
    assert (seg > 0).sum() == lengths.sum()  # no overlap: each token slot used once
    assert (plan.offset + plan.length <= row_length).all()
    lower = -(-int(lengths.sum()) // row_length)
    assert plan.num_rows <= max(lower, 1) * 2 + 1 or plan.num_rows == 0  # best fit is never far from the bound


def test_segments_and_positions():
    plan = pack([5, 3, 2, 6, 11], row_length=8)
    seg, pos = plan.segment_ids(), plan.positions()
    assert plan.num_rows == 4 and plan.efficiency == pytest.approx(27 / 32)
    for r in range(plan.num_rows):
        ids = seg[r][seg[r] > 0]
        assert (np.diff(ids) >= 0).all() and ids[0] == 1
        for s in np.unique(ids):
            assert pos[r][seg[r] == s].tolist() == list(range((seg[r] == s).sum()))
    tokens = [np.arange(n) + 100 * i for i, n in enumerate([5, 3, 2, 6, 11])]
    rows = plan.gather(lambda i: tokens[i], pad=-1)
    assert sorted(rows[rows >= 0].tolist()) == sorted(np.concatenate(tokens).tolist())


def test_lognormal_documents_pack_above_98_percent():
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, 20000), 8, 8192).astype(int)
    assert pack(lengths, 2048).efficiency > 0.98


def test_gpt_sample_index_reference():
    """Megatron's build_sample_idx on sizes [5,3,7,4], doc order [2,0,3,1], L=4 (reference §6.3)."""
    assert gpt_sample_index([5, 3, 7, 4], [2, 0, 3, 1], 4).tolist() == [[0, 0], [0, 4], [1, 1], [2, 0], [3, 0]]
    assert gpt_sample_index([5, 3, 7, 4], [2, 0, 3, 1], 4, drop_last=False).tolist()[-1] == [3, 2]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.integers(1, 16), st.integers(0, 9))
def test_gpt_samples_cover_the_stream(sizes, seq_len, seed):
    order = np.random.default_rng(seed).permutation(len(sizes))
    idx = gpt_sample_index(sizes, order, seq_len)
    stream_ends = np.cumsum(np.asarray(sizes)[order])
    starts = np.where(idx[:, 0] > 0, stream_ends[np.maximum(idx[:, 0] - 1, 0)], 0) + idx[:, 1]
    assert (starts == np.arange(len(idx)) * seq_len).all()
    assert starts[-1] + 1 <= stream_ends[-1]  # the last label token exists


def test_pack_sentences():
    samples = pack_sentences([3, 4, 5, 9, 2, 2], doc_idx=[0, 4, 6], max_length=8)
    assert samples.tolist() == [[0, 2], [2, 3], [3, 4], [4, 6]]


def test_pack_pairs_keeps_pairs_together():
    rng = np.random.default_rng(1)
    s = np.clip(rng.lognormal(3.2, 0.7, 3000), 2, 256).astype(int)
    t = np.clip(s * rng.lognormal(0, 0.15, 3000), 2, 256).astype(int)
    plan = pack_pairs(s, t, 256, 256)
    assert plan.efficiency > 0.97
    src_seg, tgt_seg = plan.segment_ids()
    for r in range(min(plan.num_rows, 50)):  # segment k holds the same pair on both sides
        members = np.flatnonzero(plan.row == r)
        order = members[np.argsort(plan.src_offset[members])]
        for k, i in enumerate(order, start=1):
            assert (src_seg[r] == k).sum() == s[i] and (tgt_seg[r] == k).sum() == t[i]
    with pytest.raises(DataError, match="longer than the row"):
        pack_pairs([300], [3], 256, 256)


def test_public_names():
    assert babelfeed.pack is pack and callable(babelfeed.blending_indices)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), rows=st.integers(1, 6), width=st.integers(1, 40))
def test_varlen_holds_the_invariants_megatron_and_flashattention_assume(data, rows, width):
    """cu_seqlens starts at 0, rises, ends at the real token count; each segment lies in one row, is one id's
    whole run and its positions restart at 0; the per-row form agrees; the flattened indices rebuild the ids."""
    from babelfeed.plan.packing import segments, varlen

    pieces = []
    for r in range(rows):  # pieces placed left to right, the rest of the row padding
        at = 0
        while at < width and data.draw(st.booleans()):
            n = data.draw(st.integers(1, width - at))
            pieces.append((r, at, n))
            at += n
    row, off, n = (np.array([p[i] for p in pieces], np.int64) for i in range(3)) if pieces else (np.zeros(0, np.int64),) * 3
    seg, pos, _, _ = segments(rows, width, row, off, n)
    v = varlen(seg)
    cu, idx = v["cu_seqlens"], v["indices"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == (seg > 0).sum() == len(idx)
    assert (np.diff(cu) > 0).all() and len(cu) == len(pieces) + 1
    assert v["max_seqlen"] == (n.max() if len(n) else 0)
    flat_seg, flat_pos = seg.reshape(-1), pos.reshape(-1)
    for a, b in zip(cu[:-1], cu[1:]):
        where = idx[a:b]
        assert len(set((where // width).tolist())) == 1 and (np.diff(where) == 1).all()  # one row, contiguous
        assert len(set(flat_seg[where].tolist())) == 1 and (flat_pos[where] == np.arange(b - a)).all()
    rebuilt = np.zeros(rows * width, np.int32)
    rebuilt[idx] = flat_seg[idx]
    assert (rebuilt.reshape(rows, width) == seg).all()
    per_row = v["row_cu_seqlens"]
    for r in range(rows):
        lens = np.diff(per_row[r])
        assert per_row[r][0] == 0 and per_row[r][-1] == (seg[r] > 0).sum()
        assert sorted(lens[lens > 0].tolist()) == sorted(n[row == r].tolist())
