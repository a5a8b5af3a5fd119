"""``gpt_sample_index`` is Megatron's ``build_sample_idx`` array, and the LM iterator serves the samples Megatron's
GPTDataset cuts from several epochs (shared/reference §6.3), checked against literal re-implementations."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import babelfeed
from babelfeed.lm.iterator import LMIterator
from babelfeed.plan.packing import gpt_sample_index


def megatron_build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, drop_last_partial_sequence,
                              add_extra_token_to_sequence):
    """helpers.cpp ``build_sample_idx`` statement by statement (with helpers.py's choice of int32 or int64)."""
    sample_idx_max = max(doc_idx.shape[0], sizes.max())
    dtype = np.int32 if sample_idx_max <= np.iinfo(np.int32).max else np.int64
    extra = 1 if add_extra_token_to_sequence else 0
    if drop_last_partial_sequence:
        num_samples = (num_epochs * tokens_per_epoch - extra) // seq_length
    else:  # ceil(float(...) / seq_length): a C++ float
        num_samples = int(np.ceil(np.float32(num_epochs * tokens_per_epoch - extra) / np.float32(seq_length)))
    sample_idx = np.zeros(2 * (num_samples + 1), dtype=dtype)
    sample_idx_index = 0
    document_idx_index = 0
    doc_offset = 0
    sample_idx[2 * sample_idx_index] = document_idx_index
    sample_idx[2 * sample_idx_index + 1] = doc_offset
    sample_idx_index += 1
    while sample_idx_index <= num_samples:
        remaining_seq_length = seq_length + extra
        while remaining_seq_length != 0:
            document_index = doc_idx[document_idx_index]
            document_length = int(sizes[document_index]) - doc_offset
            remaining_seq_length -= document_length
            if remaining_seq_length <= 0:
                doc_offset += remaining_seq_length + document_length - extra
                remaining_seq_length = 0
            else:
                if document_idx_index == doc_idx.shape[0] - 1:
                    assert sample_idx_index == num_samples
                    doc_offset = int(sizes[doc_idx[document_idx_index]]) - extra
                    break
                document_idx_index += 1
                doc_offset = 0
        sample_idx[2 * sample_idx_index] = document_idx_index
        sample_idx[2 * sample_idx_index + 1] = doc_offset
        sample_idx_index += 1
    return sample_idx.reshape(num_samples + 1, 2)


def megatron_document_index(documents, num_epochs, seed):
    """gpt_dataset._build_document_index without the separate final epoch: tiled, int32, shuffled once."""
    document_index = np.mgrid[0:num_epochs, 0:len(documents)][1]
    document_index[:] = documents
    document_index = document_index.reshape(-1).astype(np.int32)
    np.random.RandomState(seed).shuffle(document_index)
    return document_index


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=25), seq_length=st.integers(2, 9),
       num_epochs=st.integers(1, 3), extra=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**31))
@example(sizes=[0, 4, 4], seq_length=4, num_epochs=1, extra=False, drop_last=True, seed=0)
@example(sizes=[4, 4], seq_length=4, num_epochs=1, extra=False, drop_last=True, seed=0)
def test_gpt_sample_index_is_megatrons_array(sizes, seq_length, num_epochs, extra, drop_last, seed):
    sizes = np.asarray(sizes, dtype=np.int32)
    tokens_per_epoch = int(sizes.sum())
    if tokens_per_epoch <= 1:  # helpers.cpp asserts tokens_per_epoch > 1
        return
    doc_idx = megatron_document_index(np.arange(len(sizes)), num_epochs, seed)
    if not drop_last and seed % 2:  # validation builds a single unshuffled epoch too
        doc_idx = np.arange(len(sizes), dtype=np.int32)
        num_epochs = 1
    want = megatron_build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, drop_last, extra)
    got = gpt_sample_index(sizes, doc_idx, seq_length, add_extra_token=extra, drop_last=drop_last)
    assert got.tolist() == want.tolist()
    assert got.dtype == want.dtype


# ------------------------------------------------------------------------------------------- LM iterator
def _dataset(tmp_path, lengths, seed=0):
    rng = np.random.default_rng(seed)
    prefix = tmp_path / "lm"
    with babelfeed.IndexedDatasetBuilder(prefix, np.int32, format="megatron") as b:
        for n in lengths:
            b.add_item(rng.integers(10, 1000, int(n)))
            b.end_document()
        b.finalize()
    return prefix


def test_concat_epochs_carry_their_leftover_tokens_into_the_next(tmp_path):
    """Megatron cuts the samples of e epochs from the concatenation of their documents: (e T - 1) // L samples
    (T tokens per epoch), an epoch's last tokens starting the next epoch's first sample. Over 4 epochs of
    1,766 tokens at L = 16 that is 441 samples; cutting every epoch on its own gives 4 x 110 = 440."""
    lengths = list(np.random.default_rng(1).integers(5, 50, 59))
    lengths.append(1766 - sum(lengths))
    assert lengths[-1] > 0
    prefix = _dataset(tmp_path, lengths)
    L = 16
    it = LMIterator.build(str(prefix), seq_len=L, global_batch=1, num_samples=441, split="100,0,0")
    src = it.sources[0]
    T = int(src.ds.sizes[src.sequences].sum())
    assert T == 1766
    assert sum(src.samples_per_epoch(e) for e in range(1, 5)) == (4 * T - 1) // L == 441
    # read every sample of epochs 1..4 in cut order: they tile the stream of the epochs' shuffled documents
    stream = []
    for e in range(1, 5):
        n = src.samples_per_epoch(e)
        count, p = src.pieces(e, np.arange(n), L + 1)
        text = np.zeros((n, L + 1), np.int64)
        rows = np.repeat(np.arange(n), count)
        babelfeed.gather.engine.scatter(it.spaces, int(it.space_of[0]), p["start"], p["length"], text,
                              rows * (L + 1) + p["column"])
        assert (p["length"].reshape(-1) >= 0).all() and np.bincount(rows, weights=p["length"],
                                                                    minlength=n).tolist() == [L + 1] * n
        stream.append(text)
    text = np.concatenate(stream)
    assert (text[1:, 0] == text[:-1, -1]).all()  # consecutive samples overlap by the label token
    flat = np.concatenate([text[:, :L].reshape(-1), text[-1:, L]])
    all_tokens = np.sort(np.concatenate([src.ds[int(i)] for i in src.sequences]))
    for e in range(3):  # each full epoch's T tokens are every token of the split once
        assert np.sort(flat[e * T:(e + 1) * T]).tolist() == all_tokens.tolist()
