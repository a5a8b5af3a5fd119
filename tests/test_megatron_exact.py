"""``gpt_sample_index`` is Megatron's ``build_sample_idx`` array, and the LM iterator serves the samples Megatron's
GPTDataset cuts from several epochs (shared/reference §6.3), checked against literal re-implementations."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loader.packing import gpt_sample_index


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
