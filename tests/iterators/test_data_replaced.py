"""Data replaced under a running job, by rename (what the README advises for replacing data, and what binarize
--overwrite does): BatchLoader's workers served epoch 2 from the new data with a new fingerprint in the saved
state and no word, while the in-process iterator kept the old data (issue 23 item 5). Every path now stops at
the next epoch, naming what changed."""

import os
import pathlib
import shutil

import pytest

import babelfeed
from helpers import run_fresh
from synthetic import config_for, make_data_bin


def replace_data(root, tmp_path):
    new = tmp_path / "new"
    make_data_bin(new, seed=7, directions={"aaa-bbb": [300, 250], "aaa-ccc": [60, 40], "aaa-ddd": [12, 9]})
    shutil.rmtree(root)
    os.replace(new, root)  # renamed into place


def test_the_in_process_iterator_stops_at_the_next_epoch(tmp_path):
    root = tmp_path / "bin"
    make_data_bin(root)
    it = babelfeed.build_train_iterator(config_for(root))
    list(it)  # epoch 1
    replace_data(root, tmp_path)
    with pytest.raises(babelfeed.FormatError, match="replaced or changed while the job ran"):
        next(it)  # epoch 2's first batch


@pytest.mark.parametrize("workers, context", [(0, None), (2, "spawn"), (2, "fork")])
def test_the_torch_loader_stops_at_the_next_epoch_naming_what_changed(tmp_path, workers, context):
    """Forked workers (Linux's default) copy the dataset without pickling it: the pin, taken on first use in the
    training process, never reached them, and they served the new data (found by a review). The fork case runs in
    a fresh interpreter (this one may hold JAX's threads)."""
    pytest.importorskip("torch")
    if context == "fork":
        run_fresh("test_data_replaced", "torch_loader_stops_at_the_next_epoch", str(tmp_path), workers, context)
    else:
        torch_loader_stops_at_the_next_epoch(str(tmp_path), workers, context)


def torch_loader_stops_at_the_next_epoch(tmp_path: str, workers: int, context) -> None:
    from babelfeed.adapters.torch import BatchLoader

    tmp_path = pathlib.Path(tmp_path)
    root = tmp_path / "bin"
    make_data_bin(root)
    loader = BatchLoader(config_for(root), num_workers=workers, multiprocessing_context=context)
    first = 0
    for _ in loader:  # (not list(loader): its len() call pinned the data and hid the fork case)
        first += 1
        if first == 3:
            replace_data(root, tmp_path)  # mid-epoch: the epoch's workers have the old files open
    assert first > 3
    with pytest.raises(babelfeed.DataChangedError, match="changed while it ran .*data of stream"):
        for _ in loader:
            pass


def test_a_bin_replaced_before_the_first_batch_is_refused_by_the_gather(tmp_path):
    """The iterator plans from the files it opened and maps them at the first gather: a .bin renamed over between
    the two (same size, other tokens) was mapped and read with the old index. Mapping now refuses it by name."""
    root = tmp_path / "bin"
    make_data_bin(root)
    it = babelfeed.build_train_iterator(config_for(root))
    victim = sorted(root.rglob("*.bin"))[0]
    data = victim.read_bytes()
    (tmp_path / "other.bin").write_bytes(data[len(data) // 2:] + data[:len(data) // 2])
    os.replace(tmp_path / "other.bin", victim)
    with pytest.raises(babelfeed.DataChangedError, match=rf"{victim}: replaced since the job opened it"):
        next(it)
