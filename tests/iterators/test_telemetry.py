"""Stall telemetry by stage and over ranks (issue 38 item 5): each stage of making batches is timed where it
runs (plan, fetch, gather, collate, transfer), ``Timed.telemetry()`` reports them with the loop's wait, and
``reduce_over_ranks`` gives each number's maximum and mean over the ranks of a job."""

import subprocess
import sys
import textwrap

import pytest

import babelfeed
import golden
from babelfeed.stages import STAGES, Stages
from synthetic import config_for, make_data_bin


@pytest.fixture
def fresh_stages(monkeypatch):
    """The process's stage timers from zero (other tests of this process made batches too)."""
    from babelfeed.storage.remote import client as remote

    fresh = Stages()
    monkeypatch.setattr(STAGES, "__dict__", fresh.__dict__)
    monkeypatch.setattr(remote, "_waited", {"seconds": 0.0, "calls": 0})  # (another test's remote reads)
    return STAGES


def test_translation_stages_are_timed_and_add_up(tmp_path, fresh_stages):
    make_data_bin(tmp_path / "bin")
    timed = babelfeed.Timed(babelfeed.build_train_iterator(config_for(tmp_path / "bin", data__shards="all")))
    batches = list(timed)
    t = timed.telemetry()
    assert t["stage/batches"] == len(batches) == t["data/batches"]  # (the epoch's end is no batch)
    for stage in ("plan", "gather", "collate"):
        assert t[f"stage/{stage}_seconds"] > 0, (stage, t)
    assert t["stage/fetch_seconds"] == 0 and t["stage/fetch_wait_seconds"] == 0  # (local data)
    # collate is the rest of making the batches: what their timed stages inside did not take (a window may be
    # planned before the first batch too: plan counts it, collate does not)
    assert fresh_stages.inside <= t["stage/plan_seconds"] + t["stage/gather_seconds"] + 1e-6
    assert t["stage/collate_seconds"] == pytest.approx(fresh_stages.making - fresh_stages.inside, abs=1e-5)


def test_lm_stages_are_timed(tmp_path, fresh_stages):
    golden.make_lm_data(tmp_path)
    cfg = babelfeed.load_config("lm_packing")
    cfg.data_path = f"0.4 {tmp_path}/lm/web 0.6 {tmp_path}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * 20
    cfg.split, cfg.cache_dir = "90,10,0", str(tmp_path / "lmcache")
    timed = babelfeed.Timed(babelfeed.build_iterator(cfg))
    assert len(list(timed)) == 20
    t = timed.telemetry()
    assert t["stage/batches"] == 20 and t["stage/gather_seconds"] > 0 and t["stage/collate_seconds"] > 0, t


def test_the_torch_adapter_times_the_transfer(tmp_path, fresh_stages):
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import TorchBatches

    make_data_bin(tmp_path / "bin")
    batches = TorchBatches(babelfeed.build_train_iterator(config_for(tmp_path / "bin", data__shards="all")),
                           device="cpu", prefetch=2)
    timed = babelfeed.Timed(batches)
    n = sum(1 for _ in timed)
    batches.close()
    t = timed.telemetry()
    assert n > 0 and t["stage/transfer_seconds"] > 0 and t["stage/batches"] == n, t


def test_reduce_over_ranks_alone_gives_each_number_as_max_and_mean():
    got = babelfeed.reduce_over_ranks({"data/wait_seconds": 1.5, "stage/batches": 3, "name": "x", "flag": True})
    assert got == {"data/wait_seconds/max": 1.5, "data/wait_seconds/mean": 1.5, "stage/batches/max": 3.0,
                   "stage/batches/mean": 3.0}


def test_reduce_over_ranks_through_torch_distributed(tmp_path):
    """Two ranks (gloo, two processes) with different numbers: each gets the maximum and the mean of both."""
    pytest.importorskip("torch")
    script = textwrap.dedent(f"""
        import sys
        import torch.distributed as dist
        import babelfeed
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
        got = babelfeed.reduce_over_ranks({{"data/wait_seconds": 1.0 + 3 * rank, "stage/batches": 10 + rank}})
        print(got["data/wait_seconds/max"], got["data/wait_seconds/mean"], got["stage/batches/mean"], flush=True)
        dist.destroy_process_group()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] == ["4.0", "2.5", "10.5"], outs
