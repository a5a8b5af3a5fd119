"""Random access and grain's dataset plan only the windows they reach: the epoch's length is not needed first."""

import babelfeed
import pytest

from synthetic import config_for, make_data_bin
from babelfeed.errors import OutOfRange


@pytest.fixture
def cfg(tmp_path):
    make_data_bin(tmp_path / "bin")
    c = config_for(str(tmp_path / "bin"))
    c.batching.window = 64  # several windows in the small epoch
    return c


@pytest.mark.parametrize("world", [1, 3])
def test_batch_at_plans_only_the_windows_up_to_the_batch(cfg, world):
    it = babelfeed.build_train_iterator(cfg, rank=world - 1, world_size=world)
    setup = it.planner.setup(1)
    assert setup.num_windows > 2
    first = it.batch_at(0)
    assert set(setup.window_batches) == {0}  # nothing past window 0 was planned
    n = len(it)  # now every window
    assert [it.has_batch(k) for k in (-1, 0, n - 1, n)] == [False, True, True, False]
    with pytest.raises(OutOfRange):
        it.batch_at(n)
    plain = babelfeed.build_train_iterator(cfg, rank=world - 1, world_size=world)
    assert all((first[k] == v).all() if hasattr(v, "shape") else first[k] == v for k, v in next(plain).items()
               if k != "net_input")


def test_grain_dataset_starts_without_the_length(cfg):
    from babelfeed.adapters import grain as grain_adapter

    it = iter(grain_adapter.batch_dataset(cfg))
    next(it)
    source = it._ds.source if hasattr(it, "_ds") else None
    assert source is not None and source._len is None  # no len() was taken
    assert set(source._it().planner.setup(1).window_batches) == {0}
    state = it.get_state()
    rest = list(it)
    again = iter(grain_adapter.batch_dataset(cfg))
    again.set_state(state)
    assert len(list(again)) == len(rest) == len(babelfeed.build_train_iterator(cfg)) - 1


def test_the_torch_dataset_starts_without_the_length(cfg, monkeypatch):
    from babelfeed.adapters import torch as torch_adapter
    from babelfeed.iterators.translation import BatchIterator

    built = []
    original = BatchIterator.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(BatchIterator, "__init__", spy)
    ds = torch_adapter.BatchDataset(cfg, tensors=False)
    stream = iter(ds)
    first = next(stream)
    assert set(built[-1].planner.setup(1).window_batches) == {0}  # only window 0 planned for the first batch
    rest = list(stream)
    want = list(babelfeed.build_train_iterator(cfg))
    assert len(rest) + 1 == len(want)
    assert first["id"].tolist() == want[0]["id"].tolist()
    assert [b["id"].tolist() for b in rest] == [b["id"].tolist() for b in want[1:]]


def test_a_grain_source_serves_many_threads_at_once(cfg, monkeypatch):
    """grain's read threads share one source; its iterator plans windows lazily and is not thread-safe, so the
    source lets one thread at a time into it (checked by an iterator that notices a second thread inside)."""
    import concurrent.futures
    import threading
    import time

    from babelfeed.adapters import grain as grain_adapter

    want = [b["id"].tolist() for b in babelfeed.build_train_iterator(cfg)]
    source = grain_adapter.BatchSource(cfg)
    it = source._it()
    inside, overlaps, real = [0], [0], it.batch_at
    guard = threading.Lock()

    def batch_at(k, base=0):
        with guard:
            inside[0] += 1
            overlaps[0] += inside[0] > 1
        time.sleep(0.002)  # long enough for another thread to come in, if it may
        try:
            return real(k)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(it, "batch_at", batch_at)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda k: source[k]["id"].tolist(), range(len(want))))
    assert got == want and overlaps[0] == 0
