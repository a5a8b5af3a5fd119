"""LM samples over blended Megatron-style datasets: concat-and-slice and document-aware packing."""

import numpy as np
import pytest

import babelfeed
from babelfeed.lm.iterator import LMIterator


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    rng = np.random.default_rng(0)
    docs = {}
    for name, n_docs in (("web", 60), ("books", 30)):
        prefix = root / name
        seqs = []
        with babelfeed.IndexedDatasetBuilder(prefix, np.int32, format="megatron") as b:
            for d in range(n_docs):
                for _ in range(int(rng.integers(1, 4))):
                    s = rng.integers(10, 1000, int(rng.integers(3, 40)))
                    s[0] = 100000 * (1 + (name == "books")) + len(seqs)  # marks dataset and sequence
                    b.add_item(s)
                    seqs.append(s)
                b.end_document()
            b.finalize()
        docs[name] = (prefix, seqs)
    return root, docs


def test_concat_samples_are_slices_of_the_shuffled_stream(corpora):
    root, docs = corpora
    prefix, seqs = docs["web"]
    it = LMIterator.build(f"1.0 {prefix}", seq_len=16, global_batch=4, num_samples=40, split="90,10,0",
                          cache_dir=root / "cache")
    src = it.sources[0]
    order = src.epoch(1)["order"]
    stream = np.concatenate([seqs[i] for i in order])
    per_epoch = src.samples_per_epoch(1)
    seen = []
    for g, batch in enumerate(it):
        epochs, served = src.locate(np.arange(g * 4, g * 4 + 4))  # the k-th samples drawn: (epoch, sample)
        for row, (e, j) in enumerate(zip(epochs.tolist(), served.tolist())):
            if e != 1:
                continue
            got = np.append(batch["tokens"][row], batch["labels"][row, -1])
            assert got.tolist() == stream[j * 16: j * 16 + 17].tolist()  # 16 tokens plus the label token
            seen.append(j)
    assert len(seen) == len(set(seen)) == min(per_epoch, 40)  # epoch 1 serves distinct samples, all if it can
    # the train split holds the first 90% of documents only
    ds = babelfeed.IndexedDataset(prefix)
    train_docs = babelfeed.document_splits(ds, "90,10,0")["train"][1]
    assert set(order.tolist()) == set(range(train_docs.start, train_docs.stop))
    assert src.epoch(2)["order"].tolist() != order.tolist()  # reshuffled per epoch, not once for all epochs


def test_batches_blend_resume_and_ranks(corpora):
    root, docs = corpora
    path = f"0.3 {docs['web'][0]} 0.7 {docs['books'][0]}"
    kw = dict(seq_len=16, global_batch=8, num_samples=200, split="100,0,0", cache_dir=root / "cache")
    full = list(LMIterator.build(path, **kw))
    assert len(full) == 25 and all(b["tokens"].shape == (8, 16) for b in full)
    share = np.concatenate([b["dataset"] for b in full])
    assert abs((share == 1).mean() - 0.7) < 0.02
    for b in full:
        assert (b["labels"][:, :-1] == b["tokens"][:, 1:]).all()
    a = LMIterator.build(path, **kw)
    head = [next(a) for _ in range(5)]
    b = LMIterator.build(path, **kw)
    b.set_state(a.get_state())
    assert all((x["tokens"] == y["tokens"]).all() for x, y in zip(head + list(b), full))
    halves = [list(LMIterator.build(path, rank=r, world_size=2, **kw)) for r in range(2)]
    for g, batch in enumerate(full):  # rank r holds its rows of every global batch
        assert (np.concatenate([halves[0][g]["tokens"], halves[1][g]["tokens"]]) == batch["tokens"]).all()


def test_pack_mode_keeps_documents_apart(corpora):
    root, docs = corpora
    prefix, seqs = docs["books"]
    it = LMIterator.build(f"{prefix}", seq_len=32, global_batch=2, num_samples=20, split="100,0,0", mode="pack",
                          cache_dir=root / "cache")
    lookup = {int(s[0]): s for s in seqs}
    for batch in it:
        for row in range(2):
            tok, seg, pos = batch["tokens"][row], batch["segment_ids"][row], batch["positions"][row]
            for k in np.unique(seg[seg > 0]):
                piece = tok[seg == k]
                assert (pos[seg == k] == np.arange(len(piece))).all()
                first = int(piece[0])
                if first in lookup:  # a whole sequence (or the start of a split one)
                    assert piece.tolist() == lookup[first][: len(piece)].tolist()
            lm = batch["loss_mask"][row]
            crossing = (seg[1:] != seg[:-1]) | (seg[:-1] == 0)
            assert (lm[:-1][crossing] == 0).all()  # no label across documents or into padding
    src = it.sources[0]
    rows = src.samples_per_epoch(1)
    real = sum(len(s) for s in seqs)
    assert real / (rows * 33) > 0.85


def test_cache_is_reused(corpora, tmp_path):
    root, docs = corpora
    kw = dict(seq_len=16, global_batch=4, num_samples=40, split="100,0,0", cache_dir=tmp_path)
    list(LMIterator.build(str(docs["web"][0]), **kw))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert any("-blend-" in f for f in files) and any("-lm-" in f for f in files)
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    list(LMIterator.build(str(docs["web"][0]), **kw))
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == mtimes  # nothing rebuilt


def test_sentence_mode_keeps_documents_whole(corpora):
    root, docs = corpora
    prefix, seqs = docs["web"]
    it = LMIterator.build(str(prefix), seq_len=48, global_batch=2, num_samples=20, split="100,0,0",
                          mode="sentences", cache_dir=root / "cache")
    src = it.sources[0]
    ds = babelfeed.IndexedDataset(prefix)
    doc_of = np.searchsorted(ds.doc_idx, np.arange(len(ds)), side="right") - 1
    ranges = src.epoch(1)["sentence_ranges"]
    assert sorted(i for a, b in ranges for i in range(a, b)) == list(range(len(ds)))  # every sentence once
    for a, b in ranges:
        assert len(set(doc_of[a:b].tolist())) == 1  # never across documents
        assert b - a == 1 or ds.sizes[a:b].sum() <= 49
    for batch in it:
        assert batch["tokens"].shape == (2, 48)
