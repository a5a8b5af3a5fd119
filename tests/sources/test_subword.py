import pickle

import numpy as np
import pytest

import babelfeed
from babelfeed.lm.blending import IndexCache
from babelfeed.tools.demo import build_corpus
from babelfeed.sources.subword import RawText, SubwordSampler
from babelfeed.errors import ConfigError, OutOfRange


def test_raw_text_random_access(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes("α one\r\ntwo\n\nfour last".encode())
    rt = RawText(p, IndexCache(tmp_path / "cache"))
    assert len(rt) == 4 and rt.lines([3, 0, 2, 1]) == ["four last", "α one", "", "two"]
    p2 = tmp_path / "u.txt"
    p2.write_bytes(b"a\nb\n")
    assert len(RawText(p2)) == 2 and RawText(p2).lines([1]) == ["b"]
    assert len(RawText(p2, IndexCache(tmp_path / "cache"))) == 2
    with pytest.raises(OutOfRange, match="out of range"):
        rt.lines([4])


@pytest.fixture(scope="module")
def spm_bin(tmp_path_factory):
    from babelfeed.preprocess.binarize import BinarizeOptions, binarize

    root = tmp_path_factory.mktemp("sw")
    build_corpus(str(root / "raw"), scale=0.05)
    binarize(BinarizeOptions(input_dir=str(root / "raw"), output_dir=str(root / "bin"), train_spm=800, workers=1,
                             progress=False, max_len=256), log=lambda m: None)
    return root


def test_sampled_segmentations_are_seeded_per_sample(spm_bin):
    d = babelfeed.Dictionary.load(spm_bin / "bin" / "dict.txt")
    sampler = SubwordSampler(spm_bin / "bin" / "spm.model", d, alpha=0.1, seed=3)
    text = RawText(spm_bin / "raw" / "eng_Latn-deu_Latn.eng_Latn")
    rows = np.arange(40)
    lines = text.lines(rows)
    a = sampler(lines, rows, epoch=1).to_lists()
    assert sampler(lines, rows, epoch=1).to_lists() == a  # a resumed run sees the same segmentation
    b = sampler(lines, rows, epoch=2).to_lists()
    assert sum(x != y for x, y in zip(a, b)) > 20  # a new epoch samples anew
    alone = sampler(lines[5:6], rows[5:6], epoch=1).to_lists()[0]
    assert alone == a[5]  # independent of the other samples in the batch
    best = sampler.deterministic(lines).to_lists()
    sp_decode = sampler.sp
    for seq, line in zip(a + best, lines + lines):
        assert seq[-1] == d.eos()
        pieces = [d[t] for t in seq[:-1]]
        assert sp_decode.decode_pieces(pieces) == line or "<unk>" in pieces  # same text, other pieces
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone(lines, rows, epoch=1).to_lists() == a


def test_full_lattice_sampling_is_refused(spm_bin):
    d = babelfeed.Dictionary.load(spm_bin / "bin" / "dict.txt")
    with pytest.raises(ConfigError, match="not reproducible across processes"):
        SubwordSampler(spm_bin / "bin" / "spm.model", d, nbest=-1)
