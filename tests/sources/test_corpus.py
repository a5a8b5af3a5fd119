import os
import shutil

import numpy as np
import pytest

import babelfeed
from babelfeed import ShardedCorpus
from babelfeed.sources.corpus import parse_name


def write(prefix, seqs, fmt="fairseq"):
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with babelfeed.IndexedDatasetBuilder(prefix, np.uint16, format=fmt) as b:
        for s in seqs:
            b.add_item(s)
        b.finalize()


def test_fixture_data_bin(fixtures_dir, expected):
    corpus = ShardedCorpus(fixtures_dir / "data_bin")
    d = "eng_Latn-tur_Latn"
    assert corpus.splits == ["train"]
    assert corpus.directions() == [d]
    assert corpus.languages == ["eng_Latn", "tur_Latn"]
    assert corpus.shards == [0, 1]
    assert corpus.num_shards("train", d) == 2
    assert corpus.num_sentences("train", d) == 65
    assert corpus.num_sentences("train", d, shard=1) == 25
    src, tgt = corpus.open_pair("train", d, shard=1)
    e = expected["datasets"][f"data_bin/shard001/train.{d}.tur_Latn"]
    assert [s.tolist() for s in tgt] == e["sequences"]
    assert len(src) == len(tgt) == 25


def test_side_count_mismatch_names_both_files(fixtures_dir, tmp_path):
    root = tmp_path / "data_bin"
    shutil.copytree(fixtures_dir / "data_bin", root)
    d = root / "shard001"
    for ext in ("bin", "idx"):  # pair shard001's eng side with shard000's tur side
        os.chmod(d / f"train.eng_Latn-tur_Latn.tur_Latn.{ext}", 0o644)
        shutil.copy(root / "shard000" / f"train.eng_Latn-tur_Latn.tur_Latn.{ext}", d / f"train.eng_Latn-tur_Latn.tur_Latn.{ext}")
    with pytest.raises(babelfeed.SideMismatchError) as info:
        ShardedCorpus(root)
    msg = str(info.value)
    assert "shard001/train.eng_Latn-tur_Latn.eng_Latn.idx" in msg and "25 sentences" in msg
    assert "shard001/train.eng_Latn-tur_Latn.tur_Latn.idx has 40" in msg and "shard 1" in msg
    ShardedCorpus(root, check=False)  # opt out for inspection
    cfg = babelfeed.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "nllb_like.py"))
    cfg.data.path = str(root)
    d = babelfeed.Dictionary()
    d.add_language_tokens(["eng_Latn", "tur_Latn"])
    d.save(str(root / "dict.txt"))
    with pytest.raises(babelfeed.SideMismatchError, match="has 40"):  # the iterator checks what it opens
        babelfeed.build_train_iterator(cfg)


def test_missing_side_and_missing_bin(tmp_path):
    write(str(tmp_path / "shard000/train.en-de.en"), [[5, 2]])
    with pytest.raises(babelfeed.SideMismatchError, match="no de side"):
        ShardedCorpus(tmp_path)
    d = babelfeed.Dictionary()
    d.add_language_tokens(["en", "de"])
    d.save(str(tmp_path / "dict.txt"))
    cfg = babelfeed.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "nllb_like.py"))
    cfg.data.path = str(tmp_path)
    with pytest.raises(babelfeed.SideMismatchError, match="no de side"):
        babelfeed.build_train_iterator(cfg)
    os.unlink(tmp_path / "dict.txt")
    write(str(tmp_path / "shard000/train.en-de.de"), [[6, 2]])
    os.unlink(tmp_path / "shard000/train.en-de.de.bin")
    with pytest.raises(FileNotFoundError, match="no .bin"):
        ShardedCorpus(tmp_path)


def test_flat_layout_monolingual_and_splits(tmp_path):
    write(str(tmp_path / "train.en-de.en"), [[5, 2], [6, 7, 2]])
    write(str(tmp_path / "train.en-de.de"), [[8, 2], [9, 2]])
    write(str(tmp_path / "valid.en-de.en"), [[5, 2]])
    write(str(tmp_path / "valid.en-de.de"), [[8, 2]])
    write(str(tmp_path / "train.fr"), [[4, 2]] * 3)
    write(str(tmp_path / "train.sw-None.sw"), [[4, 2]])  # fairseq-preprocess --only-source
    (tmp_path / "notes.idx").write_bytes(b"")
    with pytest.warns(UserWarning, match="ignored"):
        corpus = ShardedCorpus(tmp_path)
    assert corpus.splits == ["train", "valid"]
    assert corpus.directions("valid") == ["en-de"]
    assert corpus.monolingual("train") == ["fr", "sw"]
    assert corpus.shards == [0]
    assert corpus.num_sentences("train", "fr") == 3
    assert len(corpus.open("train", "fr")) == 3
    assert corpus.unrecognized == [str(tmp_path / "notes.idx")]


def test_mixed_layout_rejected(tmp_path):
    write(str(tmp_path / "train.en-de.en"), [[5, 2]])
    write(str(tmp_path / "shard000/train.en-de.en"), [[5, 2]])
    with pytest.raises(babelfeed.FormatError, match="mixes"):
        ShardedCorpus(tmp_path)


def test_empty_or_missing_root(tmp_path):
    with pytest.raises(babelfeed.FormatError, match="no .idx files"):
        ShardedCorpus(tmp_path)
    with pytest.raises(FileNotFoundError):
        ShardedCorpus(tmp_path / "absent")


@pytest.mark.parametrize(
    "stem,parsed",
    [
        ("train.eng_Latn-tur_Latn.tur_Latn", ("train", "eng_Latn-tur_Latn", "tur_Latn")),
        ("train1.en-de.de", ("train1", "en-de", "de")),
        ("train.en", ("train", None, "en")),
        ("train.en-None.en", ("train", None, "en")),
        ("train.en-de.fr", None),
        ("dict", None),
    ],
)
def test_parse_name(stem, parsed):
    assert parse_name(stem) == parsed


def test_dictionary_lookup(tmp_path):
    write(str(tmp_path / "shard000/train.en-de.en"), [[5, 2]])
    write(str(tmp_path / "shard000/train.en-de.de"), [[5, 2]])
    corpus = ShardedCorpus(tmp_path)
    with pytest.raises(FileNotFoundError, match="no dictionary"):
        corpus.dictionary()
    (tmp_path / "shard000/dict.en.txt").write_text("hello 1\n")
    assert corpus.dictionary().index("hello") == 4


def test_an_iterator_built_beside_another_reuses_its_open_files_unless_they_changed(tmp_path):
    """Inside ``reusing`` (an edit builds the edited config's iterator beside the run's), an open of the same
    unchanged files gets the run's dataset and dictionary; a file replaced since is opened anew, and outside the
    block everything is."""
    import time

    from babelfeed.sources.corpus import load_dictionary, open_shared, reusing
    from synthetic import make_data_bin

    make_data_bin(tmp_path)
    corpus = ShardedCorpus(tmp_path)
    f = corpus.files[0]
    ds, dictionary = open_shared(f.prefix), corpus.dictionary()
    with reusing([ds], [dictionary]):
        assert open_shared(f.prefix) is ds and corpus.dictionary() is dictionary
        assert open_shared(f.prefix, verify="quick") is not ds  # (other options: another dataset)
    assert open_shared(f.prefix) is not ds and corpus.dictionary() is not dictionary
    time.sleep(0.01)
    for path in (f.prefix + ".idx", os.path.join(tmp_path, "dict.txt")):  # replaced: same bytes, a new file
        shutil.copyfile(path, path + ".new")
        os.replace(path + ".new", path)
    with reusing([ds], [dictionary]):
        again = open_shared(f.prefix)
        assert again is not ds and len(again) == len(ds)
        assert load_dictionary(os.path.join(tmp_path, "dict.txt")) is not dictionary
