"""The LM path at parity with translation where it applies: a ledger that equals a recount of the rows served,
trace naming each step's samples (rank, dataset, epoch, records, documents) as the ranks received them, and
the command line: plan and trace on an LM config, inspect on a binarize --documents output."""

import json
import os

import numpy as np
import pytest

import babelfeed
import golden
from babelfeed.tools.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("lmparity")
    golden.make_lm_data(r)
    return r


def lm_config(root, mode="pack"):
    cfg = babelfeed.load_config("lm_packing")
    cfg.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * 30
    cfg.split, cfg.mode, cfg.cache_dir = "90,10,0", mode, str(root / "cache")
    return cfg


@pytest.mark.parametrize("mode", ["pack", "concat", "sentences"])
def test_the_ledger_equals_a_recount_of_the_rows_served(root, mode):
    it = babelfeed.build_iterator(lm_config(root, mode))
    names = it.dataset_names()
    samples, tokens = np.zeros(len(names), np.int64), np.zeros(len(names), np.int64)
    rng = np.random.default_rng(3)
    stops = set(rng.choice(np.arange(1, len(it)), 4, replace=False).tolist()) | {len(it)}
    for k in range(1, len(it) + 1):
        b = next(it)
        d = np.asarray(b["dataset"], np.int64)
        samples += np.bincount(d, minlength=len(names))
        tokens += np.bincount(d, weights=(np.asarray(b["segment_ids"]) > 0).sum(axis=1), minlength=len(names)
                              ).astype(np.int64)
        if k in stops:  # the ledger at this position, also from a fresh iterator (counted from the plan)
            fresh = babelfeed.build_iterator(lm_config(root, mode))
            fresh.set_state(it.get_state())
            for ledger in (it.ledger(), fresh.ledger()):
                assert [ledger[f"ledger/{n}/samples"] for n in names] == samples.tolist(), (mode, k)
                assert [ledger[f"ledger/{n}/tokens"] for n in names] == tokens.tolist(), (mode, k)
                assert ledger["ledger/step"] == k and ledger["ledger/samples"] == k * it.global_batch
    passes = [it.ledger()[f"ledger/{n}/passes"] for n in names]
    assert all(p >= 0 for p in passes) and max(passes) >= 1  # the small datasets are read more than once


@pytest.mark.parametrize("world", [1, 3])
def test_trace_names_the_rows_each_rank_received(root, world):
    cfg = lm_config(root)
    its = [babelfeed.build_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    probe = babelfeed.build_iterator(cfg, world_size=world)
    names = probe.dataset_names()
    for step in range(1, 9):
        batches = [next(it) for it in its]
        rows = probe.trace(step, its[0].get_state())
        assert len(rows) == cfg.global_batch and all(r["step"] == step for r in rows)
        for rank, b in enumerate(batches):
            mine = [r for r in rows if r["rank"] == rank]
            assert [names.index(r["dataset"]) for r in mine] == np.asarray(b["dataset"]).tolist()
            assert [r["tokens"] for r in mine] == (np.asarray(b["segment_ids"]) > 0).sum(axis=1).tolist()
            for r, tokens in zip(mine, np.asarray(b["tokens"])):  # the records hold the row's first tokens
                src = probe.sources[names.index(r["dataset"])]
                first = np.asarray(src.ds[r["records"][0]])
                assert r["records"] and r["documents"] and np.isin(tokens[:2], first).any()
    with pytest.raises(ValueError, match="past the run's end"):
        probe.trace(len(probe) + 1)


def test_the_command_plans_and_traces_an_lm_config_and_inspects_documents(root, tmp_path, capsys):
    cfg_file = tmp_path / "lm.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_lm_parity import lm_config\n"
                        f"import pathlib\ndef get_config():\n    return lm_config(pathlib.Path({str(root)!r}))\n")
    assert main(["plan", str(cfg_file)]) == 0
    out = capsys.readouterr().out
    assert "LM run: 30 global batches of 12 samples" in out and "web" in out and "books" in out
    assert main(["trace", str(cfg_file), "--step", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    it = babelfeed.build_iterator(lm_config(root))
    assert [r["sample"] for r in rows] == list(range(36, 48))
    assert [r["dataset"] for r in rows] == [it.dataset_names()[d] for d in it.dataset_index[36:48]]
    assert main(["trace", str(cfg_file), "--step", "4"]) == 0
    assert "documents" in capsys.readouterr().out
    # a binarize --documents output: its datasets, documents and tokens
    assert main(["inspect", str(root / "lm"), "--json"]) == 0
    stats = {r["dataset"]: r for r in json.loads(capsys.readouterr().out)}
    web = babelfeed.IndexedDataset(str(root / "lm" / "web"))
    assert stats["web"]["documents"] == len(web.doc_idx) - 1 and stats["web"]["tokens"] == web.num_tokens
    assert main(["inspect", str(root / "lm")]) == 0
    assert "documents" in capsys.readouterr().out


def test_the_loaders_report_an_lm_runs_ledger(root):
    """BatchLoader's ledger over an LM config is the iterator's at the batches the loop received (it raised);
    the read-ahead adapters leave an LM run's ledger to an iterator of its config, saying so."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader, TorchBatches

    cfg = lm_config(root)
    loader = BatchLoader(cfg)
    for _ in zip(range(5), loader):
        pass
    want = babelfeed.build_iterator(cfg).ledger(consumed=5)
    assert loader.ledger() == want and want["ledger/step"] == 5
    batches = TorchBatches(babelfeed.build_iterator(cfg), device="cpu")
    next(batches)
    with pytest.raises(TypeError, match="an LM run's ledger is counted from its position"):
        batches.ledger()
    batches.close()
