"""Data replaced under a running job, by rename (what the README advises for replacing data, and what binarize
--overwrite does): BatchLoader's workers served epoch 2 from the new data with a new fingerprint in the saved
state and no word, while the in-process iterator kept the old data (issue 23 item 5). Every path now stops at
the next epoch, naming what changed."""

import os
import pathlib
import shutil

import numpy as np
import pytest

import babelfeed
from helpers import run_fresh
from synthetic import config_for, make_data_bin


def replace_data(root, tmp_path):
    new = tmp_path / "new"
    make_data_bin(new, seed=7, directions={"aaa-bbb": [300, 250], "aaa-ccc": [60, 40], "aaa-ddd": [12, 9]})
    shutil.rmtree(root)
    os.replace(new, root)  # renamed into place


def replace_tokens(root, tmp_path):
    """Every .bin of ``root`` replaced by one of the same size holding other token ids (each word id moved to the
    next one the file uses; </s> and the other specials kept), renamed into place: data binarized again with
    another dictionary. The indexes, so the fingerprint, are the old ones."""
    new = tmp_path / "same_sizes"
    shutil.copytree(root, new)
    for p in sorted(new.rglob("*.bin")):
        tokens = np.fromfile(p, np.uint16)
        used = np.unique(tokens[tokens >= 4])
        words = tokens >= 4
        tokens[words] = used[(np.searchsorted(used, tokens[words]) + 1) % len(used)]
        tokens.tofile(p)
    shutil.rmtree(root)
    os.replace(new, root)


REPLACED = {"other sizes": (replace_data, "changed while it ran .*data of stream"),
            "same sizes": (replace_tokens, "replaced since the job started")}


@pytest.mark.parametrize("how", REPLACED)
def test_the_in_process_iterator_stops_at_the_next_epoch(tmp_path, how):
    """Data renamed into place under a running job is refused at the next epoch, also when only its tokens differ
    (the same sizes: the content digest, read from the index, is the old one's; it was taken as a file touched)."""
    root = tmp_path / "bin"
    make_data_bin(root)
    it = babelfeed.build_train_iterator(config_for(root))
    list(it)  # epoch 1
    REPLACED[how][0](root, tmp_path)
    with pytest.raises(babelfeed.FormatError, match="replaced or changed while the job ran"):
        next(it)  # epoch 2's first batch


def test_a_data_file_only_touched_is_not_refused(tmp_path):
    """The same file, its times changed (touched, or copied over with the same bytes): the next epoch goes on."""
    root = tmp_path / "bin"
    make_data_bin(root)
    ref = babelfeed.build_train_iterator(config_for(root))
    list(ref)
    it = babelfeed.build_train_iterator(config_for(root))
    list(it)
    for p in sorted(root.rglob("*.bin")):
        p.write_bytes(p.read_bytes())  # (in place: the same inode, new times)
    two, want = list(it), list(ref)
    assert len(two) == len(want) and all(np.array_equal(a["target"], b["target"]) for a, b in zip(two, want))


@pytest.mark.parametrize("workers, context", [(0, None), (2, "spawn"), (2, "fork")])
@pytest.mark.parametrize("how", REPLACED)
def test_the_torch_loader_stops_at_the_next_epoch_naming_what_changed(tmp_path, workers, context, how):
    """Forked workers (Linux's default) copy the dataset without pickling it: the pin, taken on first use in the
    training process, never reached them, and they served the new data (found by a review). The fork case runs in
    a fresh interpreter (this one may hold JAX's threads). Data of the same sizes and other tokens was served by
    the workers of the next epoch, with no word: the pin names the files themselves now."""
    pytest.importorskip("torch")
    if context == "fork":
        run_fresh("test_data_replaced", "torch_loader_stops_at_the_next_epoch", str(tmp_path), workers, context, how)
    else:
        torch_loader_stops_at_the_next_epoch(str(tmp_path), workers, context, how)


def torch_loader_stops_at_the_next_epoch(tmp_path: str, workers: int, context, how: str = "other sizes") -> None:
    from babelfeed.adapters.torch import BatchLoader

    tmp_path = pathlib.Path(tmp_path)
    root = tmp_path / "bin"
    make_data_bin(root)
    loader = BatchLoader(config_for(root), num_workers=workers, multiprocessing_context=context)
    first = 0
    replace, said = REPLACED[how]
    for _ in loader:  # (not list(loader): its len() call pinned the data and hid the fork case)
        first += 1
        if first == 3:
            replace(root, tmp_path)  # mid-epoch: the epoch's workers have the old files open
    assert first > 3
    with pytest.raises(babelfeed.DataChangedError, match=said):
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


@pytest.mark.parametrize("how", REPLACED)
def test_the_grain_loader_stops_at_the_next_epoch_naming_what_changed(tmp_path, how):
    """grain's EpochsDataset opens each epoch's source anew: it served replaced data of the same sizes at the
    next epoch, with no word."""
    pytest.importorskip("grain")
    from babelfeed.adapters.grain import EpochsDataset

    root = tmp_path / "bin"
    make_data_bin(root)
    replace, said = REPLACED[how]
    it = iter(EpochsDataset(config_for(root), num_workers=0, num_epochs=2))
    for _ in range(3):
        next(it)
    replace(root, tmp_path)  # (mid-epoch: the epoch's source has the old files open)
    with pytest.raises(babelfeed.DataChangedError, match=said):
        for _ in it:
            pass
