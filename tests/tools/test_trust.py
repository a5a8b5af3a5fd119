"""No silent corruption under the default configuration: corrupt indexes, token ids outside the dictionary,
dtypes that wrap, data changed under a saved state."""

import os
import re
import struct

import numpy as np
import pytest

import babelfeed
from babelfeed.errors import ConfigError, FormatError, InconsistentIndexError, StateError, StateMismatch, UsageTypeError
from babelfeed.storage import stamps
from babelfeed.storage.indexed import IndexedDataset
from babelfeed.tools.stats import corpus_stats

from synthetic import config_for, make_data_bin

PREFIX = "shard000/train.aaa-bbb.aaa"


def _epoch(config):
    it = babelfeed.build_train_iterator(config)
    return [b for b in it]


def _patch_record(path_prefix, record: int, size_delta: int = 0, pointer_delta: int = 0):
    """Edit one record of a fairseq .idx in place: its size (+size_delta) and/or its pointer (+pointer_delta)."""
    idx = str(path_prefix) + ".idx"
    with open(idx, "r+b") as f:
        head = f.read(26)
        n = struct.unpack("<Q", head[18:26])[0]
        if size_delta:
            f.seek(26 + 4 * record)
            size = struct.unpack("<i", f.read(4))[0]
            f.seek(26 + 4 * record)
            f.write(struct.pack("<i", size + size_delta))
        if pointer_delta:
            f.seek(26 + 4 * n + 8 * record)
            ptr = struct.unpack("<q", f.read(8))[0]
            f.seek(26 + 4 * n + 8 * record)
            f.write(struct.pack("<q", ptr + pointer_delta))


@pytest.fixture
def data(tmp_path):
    make_data_bin(tmp_path / "bin")
    return tmp_path / "bin"


@pytest.mark.parametrize("edit", [dict(size_delta=1), dict(pointer_delta=2), dict(size_delta=-3),
                                  dict(size_delta=-10_000), dict(size_delta=1 << 30)])
def test_a_corrupt_record_mid_index_is_refused_under_the_shipped_config(data, edit):
    _patch_record(data / PREFIX, 5, **edit)
    config = config_for(data)
    assert config.data.verify == "full"  # what the shipped config gives every user
    with pytest.raises(InconsistentIndexError) as e:
        _epoch(config)
    # the record edited, or the next one, whose pointer no longer follows from the sizes
    assert str(data / PREFIX) + ".idx: " in str(e.value) and re.search(r"record [56]\b", str(e.value))
    assert "recompute_pointers" not in str(e.value)  # that advice is for fairseq's 2 GiB overflow only


def test_inspect_names_the_file_of_a_negative_size(data):
    _patch_record(data / PREFIX, 7, size_delta=-10_000)
    with pytest.raises(InconsistentIndexError, match=r"train\.aaa-bbb\.aaa\.idx: record 7 has negative size"):
        corpus_stats(data)


def test_static_shapes_under_a_quick_check_name_the_file_of_a_negative_size(data):
    """data.verify='quick' leaves sizes to be checked where they are read: the shape plan's length histogram (it
    said only 'lengths must be >= 1', a usage error naming nothing) names the file and record, as dynamic batches
    do."""
    _patch_record(data / PREFIX, 8, size_delta=-10_000)  # (not one of the quick check's evenly spaced records)
    with pytest.raises(InconsistentIndexError, match=r"train\.aaa-bbb\.aaa\.idx: record 8 has a negative size"):
        _epoch(config_for(data, data__verify="quick", batching__num_shapes=4))


def test_a_passed_full_check_is_remembered_until_the_file_changes(data, monkeypatch):
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)
    stamps.forget()
    calls = []
    real = IndexedDataset._check_running_sum
    monkeypatch.setattr(IndexedDataset, "_check_running_sum", lambda self, *a: calls.append(1) or real(self, *a))
    IndexedDataset(data / PREFIX)
    assert len(calls) == 1
    stamps.forget()  # the stamp on disk is found by a new process just the same
    digest = IndexedDataset(data / PREFIX).content_digest
    assert len(calls) == 1
    # an edit (a later modification time, as any write gives) invalidates the stamp: checked again, refused
    _patch_record(data / PREFIX, 5, size_delta=1)
    st = os.stat(str(data / PREFIX) + ".idx")
    os.utime(str(data / PREFIX) + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(InconsistentIndexError):
        IndexedDataset(data / PREFIX)
    _patch_record(data / PREFIX, 5, size_delta=-1)
    os.utime(str(data / PREFIX) + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    assert IndexedDataset(data / PREFIX).content_digest == digest


def test_a_file_written_just_now_is_not_stamped(data):
    stamps.forget()
    IndexedDataset(data / PREFIX)
    assert stamps.lookup(str(data / PREFIX) + ".idx", str(data / PREFIX) + ".bin") == {}


def test_a_stamp_held_in_memory_never_matches_a_changed_file(data, monkeypatch):
    """The in-process memo spares reading the stamp file again, but every open still compares the identity of
    both files (size, inode, modification and change times): a file edited, replaced or grown is checked again."""
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)
    stamps.forget()
    prefix = str(data / PREFIX)
    IndexedDataset(prefix)
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: reads.append(str(f)) or real_open(f, *a, **k))
    assert IndexedDataset(prefix)._facts.get("verified")  # memo hit: no stamp file read, no check
    assert not [f for f in reads if f.endswith(".json")]
    monkeypatch.setattr("builtins.open", real_open)
    probes = []
    real_quick = IndexedDataset._quick_check
    monkeypatch.setattr(IndexedDataset, "_quick_check", lambda self, *a: probes.append(1) or real_quick(self, *a))
    assert IndexedDataset(prefix, verify="quick")._facts.get("verified")
    assert not probes  # a stamped file is not probed: the full check covered it
    # replaced by rename (another inode), same size and times: not the stamped file
    st = os.stat(prefix + ".idx")
    _patch_record(data / PREFIX, 5, size_delta=1)
    copy = prefix + ".idx.new"
    with open(prefix + ".idx", "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, prefix + ".idx")
    with pytest.raises(InconsistentIndexError):
        IndexedDataset(prefix)
    # the .bin grown in place (other size): the stamp of the pair no longer holds either
    _patch_record(data / PREFIX, 5, size_delta=-1)
    IndexedDataset(prefix)
    assert stamps.lookup(prefix + ".idx", prefix + ".bin").get("verified")
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\0\0")
    assert stamps.lookup(prefix + ".idx", prefix + ".bin") == {}


def test_a_stamp_describes_the_files_as_they_were_before_the_check(data, monkeypatch):
    """A file written while it is being checked must not inherit the stamp: the identity recorded is the one
    taken before the check read the file."""
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.0)
    stamps.forget()
    prefix = str(data / PREFIX)
    real = IndexedDataset._check_running_sum

    def edit_during_check(self, *a):
        real(self, *a)  # the check passes on what it read; then the file changes before the stamp is written
        st = os.stat(prefix + ".idx")
        _patch_record(data / PREFIX, 5, size_delta=1)
        os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    monkeypatch.setattr(IndexedDataset, "_check_running_sum", edit_during_check)
    IndexedDataset(prefix)
    monkeypatch.setattr(IndexedDataset, "_check_running_sum", real)
    with pytest.raises(InconsistentIndexError):
        IndexedDataset(prefix)


def test_quick_mode_is_an_explicit_choice_that_misses_mid_file_corruption(data):
    _patch_record(data / PREFIX, 5, size_delta=1)
    with pytest.raises(InconsistentIndexError):
        IndexedDataset(data / PREFIX)
    ds = IndexedDataset(data / PREFIX, verify="quick")  # documented: "quick" does not look at record 5
    assert len(ds[5]) == int(ds.sizes[5])


# ----------------------------------------------------------------------------------------- token ids
def _truncate_dictionary(root, keep: int):
    path = os.path.join(root, "dict.txt")
    with open(path) as f:
        lines = f.readlines()
    with open(path, "w") as f:
        f.writelines(lines[:keep])


def test_token_ids_beyond_a_truncated_dictionary_are_refused_naming_file_and_record(data):
    _truncate_dictionary(data, 100)
    config = config_for(data, data__source_prefix="", data__target_prefix="")
    with pytest.raises(FormatError, match=r"\.bin: record \d+ \((source|target) of aaa-\w+, shard \d\) holds token id "
                                          r"\d+, outside the dictionary of 104 symbols"):
        _epoch(config)
    with pytest.raises(FormatError, match=r"\.bin: record \d+ holds token id \d+, outside the dictionary"):
        corpus_stats(data, check_tokens=True)


def test_one_foreign_token_in_one_record_is_found(tmp_path):
    root = tmp_path / "bin"
    make_data_bin(root, directions={"aaa-bbb": [50]}, valid=False)
    prefix = root / "shard000/train.aaa-bbb.bbb"
    ds = IndexedDataset(prefix)
    ptr = int(ds.pointers[31])
    del ds
    with open(str(prefix) + ".bin", "r+b") as f:
        f.seek(ptr + 2)
        f.write(struct.pack("<H", 65000))
    with pytest.raises(FormatError, match=r"train\.aaa-bbb\.bbb\.bin: record 31 \(target of aaa-bbb"):
        _epoch(config_for(root))
    with pytest.raises(FormatError, match=r"train\.aaa-bbb\.bbb\.bin: record 31 holds token id 65000"):
        corpus_stats(root, check_tokens=True)
    assert corpus_stats(root)  # without --verify the tokens are not read


def test_a_dtype_that_cannot_hold_the_vocabulary_is_refused_at_build(data):
    with pytest.raises(ConfigError, match=r"collate.dtype"):
        babelfeed.build_train_iterator(config_for(data, collate__dtype="int8"))
    from babelfeed.gather.collate import CollateOptions

    with pytest.raises(ConfigError, match=r"collate.dtype='int16' cannot hold token ids up to 69999"):
        CollateOptions(dtype="int16", vocab_size=70_000)
    assert CollateOptions(dtype="int16", vocab_size=30_000).dtype == "int16"


# ----------------------------------------------------------------------------------------- fingerprint
def test_the_fingerprint_changes_when_the_lengths_change_with_the_same_counts(tmp_path):
    make_data_bin(tmp_path / "a", seed=0)
    make_data_bin(tmp_path / "b", seed=1)  # the same sentence counts, other lengths (another tokenizer)
    a = babelfeed.build_train_iterator(config_for(tmp_path / "a"))
    b = babelfeed.build_train_iterator(config_for(tmp_path / "b"))
    state = a.get_state()
    assert a.fingerprint() != b.fingerprint()
    with pytest.raises(StateMismatch, match="different data or settings"):
        b.set_state(state)
    # the same data under another path is the same data
    os.rename(tmp_path / "a", tmp_path / "moved")
    assert babelfeed.build_train_iterator(config_for(tmp_path / "moved")).fingerprint() == state["fingerprint"]


# ----------------------------------------------------------------------------------------- LM identity
def _lm_corpus(root, seed=0, docs=80):
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    for name in ("web", "books"):
        with babelfeed.IndexedDatasetBuilder(os.path.join(root, name), np.int32, format="megatron") as b:
            for _ in range(docs):
                for _ in range(int(rng.integers(1, 4))):
                    b.add_item(rng.integers(10, 1000, int(rng.integers(3, 40))))
                b.end_document()
            b.finalize()


def _lm_batches(data_path, **kw):
    it = babelfeed.LMIterator.build(data_path, seq_len=16, global_batch=4, num_samples=200, split="90,10,0",
                                 mode="pack", **kw)
    return it.fingerprint(), [b for b in it]


def _same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_lm_batches_do_not_depend_on_how_the_path_is_spelled(tmp_path, monkeypatch):
    _lm_corpus(tmp_path / "data")
    fp, ref = _lm_batches(f"0.3 {tmp_path}/data/web 0.7 {tmp_path}/data/books")
    os.symlink(tmp_path / "data", tmp_path / "link")
    os.rename(tmp_path / "data", tmp_path / "mounted_elsewhere")
    os.symlink(tmp_path / "mounted_elsewhere", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    for spelled in ("0.3 data/web 0.7 data/books", "0.3 ./data/web 0.7 ./data//books",
                    "0.3 link/web 0.7 link/books", "0.3 mounted_elsewhere/web 0.7 mounted_elsewhere/books"):
        got_fp, got = _lm_batches(spelled)
        assert got_fp == fp, spelled
        _same_batches(ref, got)


def test_lm_state_refuses_other_data_with_the_same_counts(tmp_path):
    _lm_corpus(tmp_path / "a", seed=0)
    _lm_corpus(tmp_path / "b", seed=1)
    a = babelfeed.LMIterator.build(f"1 {tmp_path}/a/web", seq_len=16, global_batch=4, num_samples=200, split="90,10,0")
    b = babelfeed.LMIterator.build(f"1 {tmp_path}/b/web", seq_len=16, global_batch=4, num_samples=200, split="90,10,0")
    next(a)
    with pytest.raises(StateMismatch, match="different data or settings"):
        b.set_state(a.get_state())


# ----------------------------------------------------------------------------------------- states
BAD_TRANSLATION_STATES = [
    ("consumed", -5, "'consumed' must be an integer >= 0, got -5"),
    ("consumed", 7.5, "'consumed' must be an integer >= 0, got 7.5"),
    ("consumed", True, "'consumed' must be an integer >= 0, got True"),
    ("consumed", "3", "'consumed' must be an integer >= 0, got '3'"),
    ("consumed", 10**9, "consumed=1000000000 is past the end of epoch 1, which has \\d+ global batches"),
    ("epoch", 0, "'epoch' must be an integer >= 1, got 0"),
    ("epoch", 1e6, "'epoch' must be an integer >= 1, got 1000000.0"),
    ("total_steps", -1, "'total_steps' must be an integer >= 0, got -1"),
    ("name", "valid", "is for the 'valid' iterator, this one is 'train'"),
    ("version", 7, "unknown iterator state version 7"),
    ("fingerprint", 5, "fingerprint must be a string"),
    ("surprise", 1, "unknown fields \\['surprise'\\]"),
]


@pytest.mark.parametrize("key,value,message", BAD_TRANSLATION_STATES)
def test_every_field_of_a_translation_state_is_validated(data, key, value, message):
    it = babelfeed.build_train_iterator(config_for(data))
    next(it)
    state = dict(it.get_state(), **{key: value})
    fresh = babelfeed.build_train_iterator(config_for(data))
    with pytest.raises(StateError, match=message):
        fresh.set_state(state)
    with pytest.raises(StateError, match=message):  # not a fingerprint question: refused with keep_position too
        fresh.set_state(state, mixture_change="keep_position")


@pytest.mark.parametrize("key", ["version", "name", "epoch", "consumed", "total_steps"])
def test_a_missing_field_is_named(data, key):
    it = babelfeed.build_train_iterator(config_for(data))
    state = it.get_state()
    del state[key]
    with pytest.raises(StateError, match=f"lacks \\['{key}'\\]" if key != "version" else "version None"):
        babelfeed.build_train_iterator(config_for(data)).set_state(state, mixture_change="keep_position")


@pytest.mark.parametrize("state,message", [(None, "got NoneType"), ('{"epoch": 1}', "JSON string"),
                                           ([1, 2], "got list")])
def test_a_state_that_is_not_a_dict_is_refused(data, state, message):
    with pytest.raises(UsageTypeError, match=message):
        babelfeed.build_train_iterator(config_for(data)).set_state(state)


def test_a_stream_state_is_validated(data):
    config = config_for(data, mixing__sampler="stream", data__shards="all")
    it = babelfeed.build_train_iterator(config)
    next(it)
    state = it.get_state()
    assert "stream" in state
    for bad in ({"positions": [-1] * len(state["stream"]["positions"]), "batches": 0}, {"positions": "x"},
                {"positions": state["stream"]["positions"], "batches": 1.5}):
        with pytest.raises(StateError, match="'stream'"):
            babelfeed.build_train_iterator(config).set_state(dict(state, stream=bad))
    with pytest.raises(StateError, match="needs \\d+ non-negative positions"):
        babelfeed.build_train_iterator(config).set_state(dict(state, stream={"positions": [0], "batches": 0}))
    del state["stream"]
    with pytest.raises(StateError, match="lacks 'stream'"):
        babelfeed.build_train_iterator(config).set_state(state)


@pytest.mark.parametrize("value,message", [(-4, "must be an integer >= 0"), (6, "multiple of global_batch=4"),
                                           (4.0, "must be an integer >= 0"), (10**9, "at most num_samples=200")])
def test_every_field_of_an_lm_state_is_validated(tmp_path, value, message):
    _lm_corpus(tmp_path)
    build = lambda: babelfeed.LMIterator.build(f"1 {tmp_path}/web", seq_len=16, global_batch=4,  # noqa: E731
                                            num_samples=200, split="90,10,0")
    state = build().get_state()
    with pytest.raises(StateError, match=message):
        build().set_state(dict(state, consumed_samples=value))
    with pytest.raises(StateError, match="unknown fields"):
        build().set_state(dict(state, epoch=1))
    with pytest.raises(StateError, match="is for the 'valid' iterator"):
        build().set_state(dict(state, name="valid"))


# ----------------------------------------------------------------------------------------- schedules
def _scheduled(data, weights, boundaries="5", **kw):
    cfg = config_for(data, data__shards="all", mixing__schedule__boundaries=boundaries,
                     mixing__schedule__weights=weights, **kw)
    with cfg.unlocked():
        cfg.tasks.big = babelfeed.config.task("aaa-bbb", weight=1.0)
        cfg.tasks.small = babelfeed.config.task("aaa-ccc,aaa-ddd", weight=1.0)
    return cfg


@pytest.mark.parametrize("virtual", ["fairseq", "sum"])
def test_a_schedule_that_zeroes_the_largest_stream_runs_past_epoch_boundaries(data, virtual):
    cfg = _scheduled(data, "big:1,small:1 | big:0,small:1", mixing__virtual_size=virtual)
    it = babelfeed.build_train_iterator(cfg)
    epochs = 0
    for _ in range(400):
        try:
            next(it)
        except StopIteration:
            epochs += 1
            if epochs == 3:
                break
    assert epochs == 3
    streams = it.planner.sources.streams
    batch = next(it)
    assert {streams[int(d)].task for d, w in zip(batch["direction"], batch["weight"]) if w > 0} == {"small"}


def test_every_schedule_phase_is_checked_at_build(data):
    cfg = _scheduled(data, "big:1,small:1 | big:1,small:0 | big:0,small:0", boundaries="5,10")
    with pytest.raises(ConfigError, match=r"mixing.schedule weight list 2: .*not all 0"):
        babelfeed.build_train_iterator(cfg)


# ----------------------------------------------------------------------------------------- transforms
@pytest.mark.parametrize("spec,message", [
    ("token_drop:rate=x", "rate='x' .* must be a number"),
    ("token_drop:rate=1.5", "must be a probability in"),
    ("token_drop:rate=-0.1", "must be a probability in"),
    ("token_drop:rat=0.1", "has no parameter 'rat'"),
    ("token_drop", "needs \\['rate'\\]"),
    ("local_reorder:k=2.5", "must be an integer >= 0"),
    ("insert_tokens:rate=0.1,low=20,high=10", "low=20 must be below high=10"),
    ("insert_tokens:rate=0.1,low=4,high=100000", "past the dictionary"),
    ("span_mask:ratio=0.3,mask_id=<nope>", "neither a token id nor a dictionary symbol"),
    ("span_mask:ratio=0.3,mask_id=3,mean_span=0", "must be > 0"),
    ("span_mask:ratio=0.3,mask_id=3,infill=2", "must be 0 or 1"),
    ("span_mask:ratio=0.3,mask_id=4294967298", r"past the dictionary's \d+ symbols"),
    ("span_mask:ratio=0.3,mask_id=3,mean_span=inf", "must be a finite number"),
    ("local_reorder:k=nan", "must be a finite number"),
    ("token_drop:rate=0.1,rate=0.9", "sets 'rate' twice"),
])
def test_transform_parameters_are_checked_when_parsed(data, spec, message):
    from babelfeed.gather.transforms import parse_steps

    dictionary = babelfeed.ShardedCorpus(data).dictionary()
    with pytest.raises(ConfigError, match=message):
        parse_steps(spec, dictionary)
    with pytest.raises(ConfigError, match=message):  # at build, before any batch
        babelfeed.build_train_iterator(config_for(data, data__noise=spec))


def test_good_transform_parameters_parse(data):
    from babelfeed.gather.transforms import parse_steps

    dictionary = babelfeed.ShardedCorpus(data).dictionary()
    assert parse_steps("token_drop:rate=0.1;span_mask:ratio=0.3,mask_id=<unk>,infill=0;local_reorder:k=3",
                       dictionary) == [("token_drop", {"rate": 0.1}),
                                       ("span_mask", {"ratio": 0.3, "mask_id": dictionary.unk(), "infill": 0}),
                                       ("local_reorder", {"k": 3})]


def test_limits_that_filter_out_a_whole_direction_are_refused(data):
    with pytest.raises(ConfigError, match=r"filter.max_source_positions=2 filters out every sample of aaa-\w+: its "
                                         r"shortest source has \d+ tokens"):
        babelfeed.build_train_iterator(config_for(data, filter__max_source_positions=2))


@pytest.mark.parametrize("mode", ["concat", "pack", "sentences"])
def test_lm_token_ids_beyond_the_vocabulary_name_their_record(tmp_path, mode):
    _lm_corpus(tmp_path)
    it = babelfeed.LMIterator.build(f"0.5 {tmp_path}/web 0.5 {tmp_path}/books", seq_len=16, global_batch=4,
                                 num_samples=200, split="90,10,0", mode=mode, vocab_size=900)
    with pytest.raises(FormatError) as e:
        for _ in it:
            pass
    m = re.match(r"(.*)\.bin: record (\d+) holds token id (\d+), outside the vocabulary of 900", str(e.value))
    assert m, str(e.value)
    record = IndexedDataset(m.group(1))[int(m.group(2))]
    assert int(m.group(3)) >= 900 and int(m.group(3)) in record.tolist()
    assert [b for b in babelfeed.LMIterator.build(f"1 {tmp_path}/web", seq_len=16, global_batch=4, num_samples=40,
                                               split="90,10,0", mode=mode, vocab_size=1000)]


# ----------------------------------------------------------------------------------------- packed batches
def test_packed_batches_refuse_source_noise_and_check_token_ids(data):
    packed = dict(batching__pack="128x128", batching__max_tokens=1024)
    with pytest.raises(ConfigError, match="batching.pack places sources as stored, without transforms"):
        babelfeed.build_train_iterator(config_for(data, data__noise="token_drop:rate=0.5", **packed))
    assert _epoch(config_for(data, **packed))
    _truncate_dictionary(data, 100)
    with pytest.raises(FormatError, match=r"\.bin: record \d+ \((source|target) of aaa-\w+, shard \d\) holds token id "
                                          r"\d+, outside the dictionary of 104 symbols"):
        _epoch(config_for(data, data__source_prefix="", data__target_prefix="", **packed))


def test_a_collate_dtype_narrower_than_the_stored_ids_is_refused(tmp_path):
    root = tmp_path / "bin"
    make_data_bin(root, directions={"aaa-bbb": [30]}, valid=False)
    for lang in ("aaa", "bbb"):  # the same ids, stored as int64
        prefix = str(root / f"shard000/train.aaa-bbb.{lang}")
        seqs = [np.array(s, dtype=np.int64) for s in IndexedDataset(prefix)]
        with babelfeed.IndexedDatasetBuilder(prefix, np.int64, format="fairseq") as b:
            for s in seqs:
                b.add_item(s)
            b.finalize()
    with pytest.raises(ConfigError, match=r"collate.dtype='int32' is narrower than the int64 token ids of .*\.bin"):
        babelfeed.build_train_iterator(config_for(root, collate__dtype="int32"))
    assert _epoch(config_for(root))  # int64, the default


def test_a_worker_reopens_unchanged_files_without_a_check_and_checks_replaced_ones(data, monkeypatch):
    import pickle

    ds = IndexedDataset(data / PREFIX)  # written just now: no stamp, the full check ran
    blob = pickle.dumps(ds)
    calls = []
    real = IndexedDataset._check_running_sum
    monkeypatch.setattr(IndexedDataset, "_check_running_sum", lambda self, *a: calls.append(1) or real(self, *a))
    assert len(pickle.loads(blob)) == len(ds) and calls == []
    _patch_record(data / PREFIX, 5, size_delta=1)
    st = os.stat(str(data / PREFIX) + ".idx")
    os.utime(str(data / PREFIX) + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(InconsistentIndexError):
        pickle.loads(blob)


def test_state_version_and_epoch_bounds(data):
    it = babelfeed.build_train_iterator(config_for(data))
    state = it.get_state()
    for bad in (dict(version=True), dict(version=1.0), dict(version="1")):
        with pytest.raises(StateError, match="unknown iterator state version"):
            babelfeed.build_train_iterator(config_for(data)).set_state(dict(state, **bad))
    with pytest.raises(StateError, match="must be below 2\\*\\*31"):
        babelfeed.build_train_iterator(config_for(data)).set_state(dict(state, epoch=2**32 + 1))


def test_an_empty_epoch_is_refused_at_build(data):
    with pytest.raises(ConfigError, match=r"the epoch would hold no sample \(mixing.virtual_size='fairseq', "
                                         r"mixing.max_scale_up=1e-300\)"):
        babelfeed.build_train_iterator(config_for(data, mixing__max_scale_up=1e-300))


# ----------------------------------------------------------------------------------------- prefetcher
def test_the_prefetcher_holds_no_thread_between_epochs_and_close_keeps_the_position(data):
    from babelfeed.adapters.prefetch import Prefetcher, _live

    it = babelfeed.build_train_iterator(config_for(data))
    want = [b["id"].tolist() for b in it] + [b["id"].tolist() for b in it]  # epochs 1 and 2
    p = Prefetcher(babelfeed.build_train_iterator(config_for(data)), lambda b: b["id"].tolist(), depth=3)
    got = [next(p) for _ in range(5)]
    p.close()  # drops the read-ahead; the next call continues after the 5th batch
    assert p._thread is None and p not in _live
    got += list(p)
    assert p._thread is None and p not in _live  # the epoch ended: nothing runs until the next call
    got += list(p)
    assert got == want


def test_an_empty_direction_that_is_sampled_is_refused_at_build_by_every_sampler(tmp_path):
    root = tmp_path / "bin"
    make_data_bin(root, directions={"aaa-bbb": [50], "aaa-ccc": [0]}, valid=False)
    for sampler in ("stratified", "stream"):
        with pytest.raises(ConfigError, match=r"\['aaa-ccc'\] have no sentences in epoch 1 but are sampled"):
            babelfeed.build_train_iterator(config_for(root, data__shards="all", mixing__sampler=sampler,
                                                   mixing__method="uniform"))
    # empty in every shard: no advice to read every shard (it is read), whichever way shards are read
    root = tmp_path / "bin2"
    make_data_bin(root, directions={"aaa-bbb": [50, 40], "aaa-ccc": [0, 0]}, valid=False)
    for shards in ("all", "cycle"):
        with pytest.raises(ConfigError, match=r"\['aaa-ccc'\] have no sentences in epoch 1") as got:
            babelfeed.build_train_iterator(config_for(root, data__shards=shards, mixing__method="uniform"))
        assert "data.shards='all'" not in str(got.value) and "data.directions" in str(got.value)


def test_an_empty_cycled_shard_is_refused_at_build_naming_its_direction_and_shard(tmp_path):
    """Epoch 2 reads shard 1: an empty one stopped training at epoch 2, hours in (issue 23 item 14). Every
    shard a cycled direction reads is checked at build, for every sampler that sizes epochs."""
    root = tmp_path / "bin"
    make_data_bin(root, directions={"aaa-bbb": [60, 40, 50], "aaa-ccc": [30, 20, 0]}, valid=False)
    for kw in (dict(compat="fairseq", mixing__sampler="fairseq"), {}, dict(mixing__probabilities_from="total")):
        with pytest.raises(ConfigError, match=r"epoch 3 reads shard 2 of each direction \(data.shards='cycle'\), "
                                             r"and that shard of \['aaa-ccc'\] has no sentences"):
            babelfeed.build_train_iterator(config_for(root, **kw))
    it = babelfeed.build_train_iterator(config_for(root, mixing__probabilities_from="shard"))  # not sampled there
    for _ in range(3):
        assert list(it)
