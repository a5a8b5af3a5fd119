import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from babelfeed.plan.bins import LengthBinSampler
from babelfeed.errors import StateError, UsageError, UsageTypeError


@pytest.fixture
def lengths():
    return np.clip(np.random.default_rng(0).lognormal(3.2, 0.7, 5000), 2, 256).astype(int)


@pytest.mark.parametrize("bins", ["quarters", 6])
def test_every_sample_once_per_epoch_with_bin_batch_sizes(lengths, bins):
    s = LengthBinSampler(lengths, max_tokens=4096, bins=bins, seed=3)
    batches = list(s)
    assert len(batches) == len(s)
    seen = Counter(i for b in batches for i in b)
    assert sorted(seen) == list(range(len(lengths))) and max(seen.values()) == 1
    for b in batches:  # one bin per batch, its batch size at most, within the token budget
        k = set(s.bin_of[b].tolist())
        assert len(k) == 1
        k = k.pop()
        assert len(b) <= s.plan.batch_sizes[k] and len(b) * s.plan.widths[k] <= 4096
    if bins == "quarters":  # seed 004's bins: L/4, L/2, 3L/4, L of the longest sample
        m = int(lengths.max())
        assert s.plan.widths.tolist() == [-(-m * q // 4) for q in (1, 2, 3, 4)]


def test_epochs_reshuffle_and_resume(lengths):
    s = LengthBinSampler(lengths, max_tokens=4096, bins=4, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and sorted(map(tuple, e0)) != sorted(map(tuple, e1))
    s.set_epoch(1)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = s.state_dict(7)
    t = LengthBinSampler(lengths, max_tokens=4096, bins=4, seed=1)
    t.load_state_dict(state)
    tail = list(t)
    assert head + tail == e1
    for bad, match in (({"version": 2, "epoch": 1, "consumed": 3}, "babelfeed iterator's state"),
                       ({"epoch": 1}, "'batches_done'"), ({"epoch": 1, "batches_done": 10**9}, "'batches_done'"),
                       ({"epoch": "1", "batches_done": 2}, "'epoch'")):
        with pytest.raises(StateError, match=match):
            LengthBinSampler(lengths, max_tokens=4096, bins=4, seed=1).load_state_dict(bad)
    t.load_state_dict(state)  # a resumed iteration counts from where it began
    it = iter(t)
    more = [next(it) for _ in range(5)]
    assert more == tail[:5] and t.state_dict(5) == {"epoch": 1, "batches_done": 12}
    with pytest.raises(UsageTypeError, match="batches the training loop received"):
        s.state_dict()  # what the sampler yielded is not what training saw (DataLoader workers read ahead)
    with pytest.raises(UsageError, match="batches_seen=99999"):
        s.state_dict(99999)


def test_ranks_take_equal_shares(lengths):
    ranks = [LengthBinSampler(lengths, max_tokens=4096, bins=4, seed=1, rank=r, world_size=3) for r in range(3)]
    lists = [list(r) for r in ranks]
    assert len({len(x) for x in lists}) == 1 and all(len(x) == len(r) for x, r in zip(lists, ranks))
    covered = {i for x in lists for b in x for i in b}
    assert covered == set(range(len(lengths)))


def test_torch_dataloader_uses_it(lengths):
    import torch  # in the test extras (pinned CPU wheel): a missing torch fails rather than skips

    data = [torch.full((int(n),), i) for i, n in enumerate(lengths[:600])]

    def collate(items):
        width = max(len(x) for x in items)
        return torch.stack([torch.nn.functional.pad(x, (0, width - len(x)), value=-1) for x in items])

    sampler = LengthBinSampler(lengths[:600], max_tokens=2048, bins=4, seed=0)
    dl = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    assert len(dl) == len(sampler)
    seen = []
    for batch in dl:
        assert batch.numel() <= 2048  # padded to the batch's longest, within its bin's edge
        seen += batch[:, 0].tolist()
    assert sorted(seen) == list(range(600))


RESUME = r"""
import json, sys
import numpy as np
import torch
from babelfeed.plan.bins import LengthBinSampler


def collate(items):
    width = max(len(x) for x in items)
    return torch.stack([torch.nn.functional.pad(x, (0, width - len(x)), value=-1) for x in items])


if __name__ == "__main__":
    lengths = np.array(json.loads(sys.argv[2]))
    data = [torch.full((int(n),), i) for i, n in enumerate(lengths)]
    out = []
    for workers, arg in json.loads(sys.argv[3]):
        s = LengthBinSampler(lengths, max_tokens=2048, bins=4, seed=5)
        if sys.argv[1] == "save":  # the whole epoch, a state saved at each cut (arg)
            s.set_epoch(1)
        else:  # resume from the state (arg)
            s.load_state_dict(arg)
        dl = torch.utils.data.DataLoader(data, batch_sampler=s, collate_fn=collate, num_workers=workers)
        if sys.argv[1] == "resume":
            out.append([b.tolist() for b in dl])
            continue
        full, states = [], []
        for step, batch in enumerate(dl, 1):
            full.append(batch.tolist())
            if step in arg:  # mid-iteration, with the workers' read-ahead in flight
                states.append(s.state_dict(step))
        out.append({"full": full, "len": len(s), "states": states})
    print(json.dumps(out))
"""


def test_dataloader_workers_resume_exactly_in_a_fresh_process(lengths, tmp_path):
    """The state counts the batches the loop received, not the index lists DataLoader workers took ahead: a
    resume in a fresh process continues with the next batch, every batch equal, for 0, 1 and 2 workers. (Both
    sides run in processes of their own: DataLoader forks its workers, and this test's process may hold JAX's
    threads, which fork is not safe with.)"""
    lengths = lengths[:700]
    n = len(LengthBinSampler(lengths, max_tokens=2048, bins=4, seed=5))
    rng = np.random.default_rng(11)
    cuts = {workers: sorted(rng.choice(np.arange(1, n - 1), 3, replace=False).tolist()) for workers in (0, 1, 2)}
    script = tmp_path / "resume_bins.py"
    script.write_text(RESUME)

    def run(mode, jobs):
        out = subprocess.run([sys.executable, str(script), mode, json.dumps(lengths.tolist()), json.dumps(jobs)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    saved = run("save", list(cuts.items()))
    jobs, expect = [], []
    for (workers, at), got in zip(cuts.items(), saved):
        assert len(got["full"]) == got["len"] == n
        assert got["states"] == [{"epoch": 1, "batches_done": c} for c in at]
        jobs += [(workers, state) for state in got["states"]]
        expect += [(c, got["full"]) for c in at]
    resumed = run("resume", jobs)
    assert len(resumed) == len(expect) == 9
    for (c, full), rest in zip(expect, resumed):
        assert len(rest) == len(full) - c
        assert rest == full[c:]  # every batch, every index, in order
