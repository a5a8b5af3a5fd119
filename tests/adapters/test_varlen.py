"""Packed batches in the varlen form (cu_seqlens, max_seqlen, indices) through the torch loader, made in its
workers: the same as computed in the training process from the bare iterator's batches, holding Megatron's
invariants, and an attention mask built from cu_seqlens is the segment ids' block-diagonal mask."""

import os

import numpy as np
import pytest

import babelfeed
import golden
from babelfeed.adapters.varlen import Varlen
from babelfeed.errors import UsageError
from babelfeed.plan.packing import varlen
from synthetic import config_for, make_data_bin

torch = pytest.importorskip("torch")
from babelfeed.adapters.torch import BatchLoader  # noqa: E402  (needs torch)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MP = "forkserver"  # (other tests load JAX into this process: no fork)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("varlen")
    make_data_bin(r)
    golden.make_lm_data(r)
    return r


def lm_config(root):
    cfg = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "lm_packing.py"))
    cfg.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 8, 8 * 6
    cfg.split, cfg.mode, cfg.cache_dir = "90,10,0", "pack", str(root / "cache")
    return cfg


def packed_config(root):
    return config_for(root, batching__pack="64x64", filter__max_source_positions=64, filter__max_target_positions=64,
                      batching__max_tokens=1024)


def mask_from_cu(cu, indices, rows, width):
    """[rows*width, rows*width] attention allowed within a segment, built from cu_seqlens alone."""
    allowed = torch.zeros(rows * width, rows * width, dtype=torch.bool)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        where = torch.as_tensor(indices[a:b])
        allowed[where[:, None], where[None, :]] = True
    return allowed


@pytest.mark.parametrize("kind", ["lm", "translation"])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_adds_the_varlen_form_of_every_packed_side(root, kind, workers):
    cfg = lm_config(root) if kind == "lm" else packed_config(root)
    sides = [("", None)] if kind == "lm" else [("src_", "net_input"), ("tgt_", "net_input")]
    plain = list(babelfeed.build_iterator(cfg))
    loader = BatchLoader(cfg, transform=Varlen(), num_workers=workers, multiprocessing_context=MP if workers else None)
    got = list(loader)
    assert len(got) == len(plain) > 0
    for mine, theirs in zip(got, plain):
        for prefix, under in sides:
            m = mine[under] if under else mine
            t = theirs[under] if under else theirs
            seg = np.asarray(t[f"{prefix}segment_ids"])
            want = varlen(seg)
            cu = m[f"{prefix}cu_seqlens"].numpy()
            assert m[f"{prefix}cu_seqlens"].dtype == torch.int32 and (cu == want["cu_seqlens"]).all()
            assert cu[0] == 0 and (np.diff(cu) > 0).all() and cu[-1] == (seg > 0).sum()
            assert int(m[f"{prefix}max_seqlen"]) == want["max_seqlen"]
            idx = m[f"{prefix}indices"].numpy()
            assert (idx == want["indices"]).all()
            pos = np.asarray(t[f"{prefix}positions"]).reshape(-1)
            for a, b in zip(cu[:-1], cu[1:]):
                assert len(set((idx[a:b] // seg.shape[1]).tolist())) == 1  # no segment crosses a row
                assert (pos[idx[a:b]] == np.arange(b - a)).all()  # positions restart per segment
        if kind == "lm" and workers == 0:  # the attention mask from cu_seqlens is the segment ids' own
            seg = torch.as_tensor(np.asarray(theirs["segment_ids"])).reshape(-1)
            rows, width = np.asarray(theirs["segment_ids"]).shape
            row = torch.arange(rows * width) // width
            by_ids = (seg[:, None] == seg[None, :]) & (row[:, None] == row[None, :]) & (seg[:, None] > 0)
            assert torch.equal(mask_from_cu(cu, idx, rows, width), by_ids)


def test_an_unpacked_batch_is_refused_by_name(root):
    batch = next(iter(babelfeed.build_train_iterator(config_for(root))))
    with pytest.raises(UsageError, match="Varlen takes packed batches"):
        Varlen()(batch)


def test_a_loader_of_unpacked_batches_with_varlen_is_refused_when_made(root):
    """Varlen on a padded config failed inside the DataLoader's workers, as torch's 'Caught UsageError in
    DataLoader worker' traceback (found by a review): the loader refuses it when it is made."""
    cfg = config_for(root)
    with pytest.raises(UsageError, match="Varlen takes packed batches .* this config's batches are padded"):
        BatchLoader(cfg, transform=Varlen(), num_workers=2, multiprocessing_context=MP)
    lm = lm_config(root)
    lm.mode = "concat"
    with pytest.raises(UsageError, match="Varlen takes packed batches"):
        BatchLoader(lm, transform=Varlen())
    BatchLoader(packed_config(root), transform=Varlen())  # packed: taken
