from collections import Counter

import numpy as np
import pytest

from loader.bins import LengthBinSampler


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
    state = s.state_dict()
    t = LengthBinSampler(lengths, max_tokens=4096, bins=4, seed=1)
    t.load_state_dict(state)
    assert head + list(t) == e1


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
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    assert len(loader) == len(sampler)
    seen = []
    for batch in loader:
        assert batch.numel() <= 2048  # padded to the batch's longest, within its bin's edge
        seen += batch[:, 0].tolist()
    assert sorted(seen) == list(range(600))
