"""Opening a data folder writes each index's verification stamp once, with every fact its opening found (the
full check, the ``</s>`` endings, the content digest): two or three writes per index made the first open of
thousands of corpora twice as slow. Held-back stamps are still written when the opening fails, and only the
thread that holds them back waits."""

import json
import os
import re
import threading

import pytest

import babelfeed
from babelfeed.storage import stamps
from babelfeed.storage.indexed import IndexedDataset

from synthetic import config_for, make_data_bin
from babelfeed.errors import InconsistentIndexError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)  # (files just written)
    stamps.forget()
    yield tmp_path / "cache" / "stamps"
    stamps.forget()


def _indexes(root) -> list[str]:
    """A synthetic data_bin made at ``root``: its index prefixes, sorted."""
    make_data_bin(root)
    return sorted(os.path.splitext(os.path.join(d, n))[0] for d, _, names in os.walk(root) for n in names
                  if n.endswith(".idx"))


def _count_writes(monkeypatch):
    writes = []
    real = os.replace

    def replace(src, dst, *a, **kw):
        if str(dst).endswith(".json") and "stamps" in str(dst):
            writes.append(str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    return writes


def test_a_data_folder_is_stamped_with_one_write_per_index_holding_every_fact(tmp_path, cache, monkeypatch):
    root = tmp_path / "bin"
    make_data_bin(root)
    writes = _count_writes(monkeypatch)
    it = babelfeed.build_train_iterator(config_for(root))
    files = {ds.index_file for c in it.planner.sources.components for ds in (c.src, c.tgt)}
    assert len(files) >= 4
    assert sorted(writes) == sorted({stamps._stamp_path(f) for f in files}), "one stamp write per index"
    eos = babelfeed.ShardedCorpus(str(root)).dictionary().eos()
    for f in files:
        facts = json.loads(open(stamps._stamp_path(f)).read())["facts"]
        assert facts["verified"] and facts[f"ends_with_{eos}"] and isinstance(facts["digest"], str), (f, facts)
    # a fresh process's opening (nothing in memory) reads them: no check again, nothing written
    stamps.forget()
    writes.clear()
    babelfeed.build_train_iterator(config_for(root))
    assert writes == []


def test_held_back_stamps_are_written_when_the_block_raises_and_nested_blocks_write_once(tmp_path, cache,
                                                                                          monkeypatch):
    prefixes = _indexes(tmp_path / "bin")[:3]
    writes = _count_writes(monkeypatch)
    with pytest.raises(RuntimeError, match="after two"):  # not babelfeed's: the block's own error goes through
        with stamps.deferred():
            with stamps.deferred():
                IndexedDataset(prefixes[0])
            IndexedDataset(prefixes[1])
            assert writes == [] and not cache.exists()  # held back, by the outermost block
            raise RuntimeError("after two")
    assert sorted(writes) == sorted(stamps._stamp_path(p + ".idx") for p in prefixes[:2])
    stamps.forget()
    assert stamps.lookup(prefixes[0] + ".idx", prefixes[0] + ".bin")["verified"]


def test_another_threads_stamps_are_not_held_back(tmp_path, cache, monkeypatch):
    prefix = _indexes(tmp_path / "bin")[0]
    writes = _count_writes(monkeypatch)
    with stamps.deferred():
        t = threading.Thread(target=IndexedDataset, args=(prefix,))
        t.start()
        t.join()
        assert writes == [stamps._stamp_path(prefix + ".idx")]


def test_a_damaged_index_mid_folder_is_named_and_the_indexes_checked_before_it_are_stamped(tmp_path, cache,
                                                                                            monkeypatch):
    from babelfeed.storage.verify import IndexChecks

    root = tmp_path / "bin"
    make_data_bin(root)
    order = []  # the indexes in the order they are opened
    real = IndexChecks.check_ends_with

    def ends(self, *a, **kw):
        order.append(self.index_file)
        return real(self, *a, **kw)

    monkeypatch.setattr(IndexChecks, "check_ends_with", ends)
    babelfeed.build_train_iterator(config_for(root))
    victim = order[len(order) // 2]
    stamps.forget()
    for p in cache.iterdir():
        p.unlink()
    raw = bytearray(open(victim, "rb").read())  # an inner pointer of the fairseq index off by 2 bytes
    n = int.from_bytes(raw[18:26], "little")
    at = 26 + 4 * n + 8 * 5
    raw[at:at + 8] = (int.from_bytes(raw[at:at + 8], "little") + 2).to_bytes(8, "little")
    open(victim, "wb").write(raw)
    order.clear()
    with pytest.raises(InconsistentIndexError, match=re.escape(victim)):
        babelfeed.build_train_iterator(config_for(root))
    before = order[:order.index(victim)] if victim in order else order
    assert len(before) >= 2
    stamped = {f for f in order + [victim] if os.path.exists(stamps._stamp_path(f))}
    assert stamped == set(before), "the indexes checked before the damaged one, and only they"
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]


def test_a_held_back_stamp_does_not_overwrite_a_newer_one_another_thread_wrote(tmp_path, cache):
    prefix = _indexes(tmp_path / "bin")[0]
    with stamps.deferred():
        ds = IndexedDataset(prefix)  # its check's stamp, held back
        t = threading.Thread(target=ds.check_ends_with, args=(2,))  # another thread adds a fact, written at once
        t.start()
        t.join()
    facts = json.loads(open(stamps._stamp_path(prefix + ".idx")).read())["facts"]
    assert facts["verified"] and facts["ends_with_2"], facts
