"""Data replaced under a running job, by rename (what the README advises for replacing data, and what binarize
--overwrite does): BatchLoader's workers served epoch 2 from the new data with a new fingerprint in the saved
state and no word, while the in-process iterator kept the old data (issue 23 item 5). Every path now stops at
the next epoch, naming what changed."""

import os
import shutil

import pytest

import babelfeed
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


@pytest.mark.parametrize("workers", [0, 2])
def test_the_torch_loader_stops_at_the_next_epoch_naming_what_changed(tmp_path, workers):
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader

    root = tmp_path / "bin"
    make_data_bin(root)
    loader = BatchLoader(config_for(root), num_workers=workers, multiprocessing_context="spawn" if workers else None)
    first = list(loader)
    assert first
    replace_data(root, tmp_path)
    with pytest.raises(babelfeed.DataChangedError, match="changed while it ran .*data of stream"):
        list(loader)
