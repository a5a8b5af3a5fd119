import pytest

import babelfeed
from babelfeed import Dictionary
from babelfeed.errors import DataError


def test_specials_and_file_order(tmp_path):
    (tmp_path / "dict.txt").write_text("▁the 100\nhello 5\nwith space 3\n")
    d = Dictionary.load(tmp_path / "dict.txt")
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert d.index("▁the") == 4 and d.index("hello") == 5
    assert d.index("with space") == 6  # split on the last space only
    assert d.index("missing") == d.unk()
    assert len(d) == 7


def test_language_tokens_appended_last(tmp_path):
    (tmp_path / "dict.txt").write_text("a 1\nb 1\n")
    d = Dictionary.load(tmp_path / "dict.txt")
    ids = d.add_language_tokens(["eng_Latn", "tur_Latn"])
    # fairseq: id(__lang_k__) = 4 + L + k for a dict.txt of L lines
    assert ids == [6, 7]
    assert d.language_tokens == {"eng_Latn": 6, "tur_Latn": 7}
    assert d.add_language_tokens(["eng_Latn"]) == [6]  # existing tokens keep their id
    assert d.lang_token_index("tur_Latn") == 7
    with pytest.raises(DataError, match="__fra_Latn__"):
        d.lang_token_index("fra_Latn")
    assert babelfeed.lang_token("eng_Latn", "mbart") == "[eng_Latn]"


def test_save_load_round_trip(tmp_path):
    d = Dictionary()
    for sym, n in [("x", 3), ("y", 1), ("x", 2)]:
        d.add_symbol(sym, n)
    d.add_language_tokens(["deu_Latn"])
    d.save(tmp_path / "dict.txt")
    assert (tmp_path / "dict.txt").read_text() == "x 5\ny 1\n__deu_Latn__ 1\n"
    assert Dictionary.load(tmp_path / "dict.txt") == d
    assert [p.name for p in tmp_path.iterdir()] == ["dict.txt"]


def test_overwrite_flag(tmp_path):
    (tmp_path / "dict.txt").write_text("a 1\n<unk> 7 #fairseq:overwrite\n")
    d = Dictionary.load(tmp_path / "dict.txt")
    assert d.index("<unk>") == 3 and d.count[3] == 7 and len(d) == 5


@pytest.mark.parametrize(
    "text,match",
    [("a 1\na 2\n", "line 2: duplicate token 'a'"), ("a 1\nb\n", "line 2: expected"), ("a x\n", "line 1"),
     ("a 1\n\nb 1\n", "line 2: empty line")],
)
def test_bad_files_name_the_line(tmp_path, text, match):
    (tmp_path / "dict.txt").write_text(text)
    with pytest.raises(babelfeed.FormatError, match=match) as info:
        Dictionary.load(tmp_path / "dict.txt")
    assert str(tmp_path / "dict.txt") in str(info.value)


def test_string():
    d = Dictionary()
    a, b = d.add_symbol("▁hi"), d.add_symbol("!")
    assert d.string([0, a, b, 2, 1]) == "▁hi !"
    assert d.string([a, 2], skip_special=False) == "▁hi </s>"
