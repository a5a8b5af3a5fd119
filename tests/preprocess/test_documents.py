"""binarize --documents: JSONL and plain-text documents -> Megatron-LM .bin/.idx, checked against Megatron's own
files and against an independent reading of its layout and of preprocess_data.py's rules."""

import gzip
import hashlib
import json
import os
import struct

import numpy as np
import pytest
import sentencepiece as spm

from babelfeed.preprocess.binarize import BinarizeOptions, binarize, format_report
from babelfeed.lm.iterator import LMIterator
from babelfeed.errors import BinarizeError, UsageError
from babelfeed.storage.builder import IndexedDatasetBuilder

WORDS = "the cat sat on a mat and dog ran far away under blue sky with green hat".split()


def sentence(rng):
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(2, 10)))) + "."


def make_docs(root, rng, n=300):
    """A gzipped JSONL corpus (an empty text and blank lines inside texts among them) and a folder of plain-text
    documents; returns the texts, in order, per corpus."""
    os.makedirs(root / "books")
    web = []
    for i in range(n):
        lines = [sentence(rng) for _ in range(int(rng.integers(1, 5)))]
        if i % 37 == 5:
            lines.insert(1, "")  # a blank line inside a text
        web.append("\n".join(lines) if i % 50 != 7 else "   ")  # an empty document
    with gzip.open(root / "web.jsonl.gz", "wt", encoding="utf-8") as f:
        for i, t in enumerate(web):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    books = []
    for k in range(2):
        with open(root / "books" / f"part{k}.txt", "w") as f:
            f.write("\n\n")
            for _ in range(60):
                doc = [sentence(rng) for _ in range(int(rng.integers(1, 6)))]
                books.append("\n".join(doc))
                f.write("\n".join(doc) + "\n" + "\n" * int(rng.integers(1, 3)))
    return {"web": web, "books": books}


def read_megatron(prefix):
    """The .idx/.bin read from the layout alone (MMIDIDX, version, dtype code, N, D, int32 sizes, int64 pointers,
    int64 document index), not with babelfeed's reader."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", idx[9:17])[0] == 1
    code = idx[17]
    dtype = {8: np.uint16, 4: np.int32}[code]
    n, d = struct.unpack("<QQ", idx[18:34])
    sizes = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    doc_idx = np.frombuffer(idx, np.int64, d, 34 + 12 * n)
    assert len(idx) == 34 + 12 * n + 8 * d
    data = open(prefix + ".bin", "rb").read()
    seqs = [np.frombuffer(data, dtype, s, p).tolist() for s, p in zip(sizes, pointers)]
    return seqs, doc_idx.tolist(), np.dtype(dtype)


def expected(texts, sp, split_sentences, append_eod=True):
    """preprocess_data.py's rules: sentences of a document (here its non-blank lines), each tokenized, empty ones
    left out, the end-of-document id appended to the last; a document left with nothing is dropped (our policy)."""
    seqs, doc_idx = [], [0]
    for t in texts:
        parts = [s for s in t.split("\n") if s.strip()] if split_sentences else ([t] if t.strip() else [])
        ids = [x for x in sp.encode(parts, out_type=int) if x]
        if not ids:
            continue
        if append_eod:
            ids[-1] = ids[-1] + [sp.eos_id()]
        seqs.extend(ids)
        doc_idx.append(len(seqs))
    return seqs, doc_idx


def opts(raw, out, **kw):
    base = dict(input_dir=str(raw), output_dir=str(out), train_spm=80, shards=1, workers=1, documents=True,
                chunk_lines=40, progress=False)
    base.update(kw)
    return BinarizeOptions(**base)


@pytest.mark.parametrize("split_sentences,shards,workers", [(False, 1, 1), (True, 3, 2), (False, 2, 2)])
def test_documents_follow_megatron_preprocessing(tmp_path, split_sentences, shards, workers):
    texts = make_docs(tmp_path / "raw", np.random.default_rng(0))
    out = tmp_path / "out"
    report = binarize(opts(tmp_path / "raw", out, split_sentences=split_sentences, shards=shards, workers=workers),
                      log=lambda m: None)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    level = "sentence" if split_sentences else "document"
    for corpus, docs in texts.items():
        seqs, doc_idx = [], [0]
        for s in range(shards):
            got, idx, dtype = read_megatron(str(out / f"shard{s:03d}" / f"{corpus}_text_{level}"))
            assert dtype == np.uint16 and idx[0] == 0 and idx[-1] == len(got)
            doc_idx.extend(i + len(seqs) for i in idx[1:])
            seqs.extend(got)
        want_seqs, want_idx = expected(docs, sp, split_sentences)
        assert len(seqs) == len(want_seqs) and seqs == want_seqs
        assert doc_idx == want_idx
    entry = {e["key"]: e for e in report["inputs"]}
    assert entry["web"]["empty"] == 6 and entry["web"]["kept"] == 294 and entry["books"]["kept"] == 120
    text = format_report(report)
    assert "294" in text and "Megatron --data-path" in text


def test_builder_documents_are_megatron_bytes(tmp_path, fixtures_dir):
    """add_documents writes, for the same documents, the bytes megatron-core's IndexedDatasetBuilder wrote."""
    expected_all = json.load(open(fixtures_dir / "expected.json"))["datasets"]
    for name in ("megatron/uint16_docs", "megatron/int32_docs"):
        e = expected_all[name]
        lengths = np.array(e["sequence_lengths"])
        per_doc = np.diff(e["document_indices"])
        assert (per_doc > 0).all()
        prefix = str(tmp_path / name.replace("/", "_"))
        b = IndexedDatasetBuilder(prefix, np.dtype(e["dtype"]), format="megatron")
        b.add_documents(np.concatenate([np.array(s, dtype=np.int64) for s in e["sequences"]]), lengths, per_doc)
        b.finalize()
        for ext in (".bin", ".idx"):
            got = hashlib.sha256(open(prefix + ext, "rb").read()).hexdigest()
            assert got == e["files"][name + ext]["sha256"], (name, ext)


def test_documents_feed_the_lm_iterator(tmp_path):
    make_docs(tmp_path / "raw", np.random.default_rng(1))
    out = tmp_path / "out"
    report = binarize(opts(tmp_path / "raw", out, shards=2), log=lambda m: None)
    data_path = report["documents"]["data_path"]["text"]
    assert len(data_path.split()) == 8  # weight and prefix for 2 corpora x 2 shards
    it = LMIterator.build(data_path, seq_len=32, global_batch=4, num_samples=40, vocab_size=report["vocab_size"])
    batches = list(it)
    assert len(batches) == 10
    eod = report["documents"]["eod"]
    assert sum(int((b["tokens"] == eod).sum()) for b in batches) > 0


def test_bad_records_are_an_error_naming_the_line_or_dropped_and_counted(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    lines = [json.dumps({"text": "the cat sat"}), "{not json", json.dumps(["a list"]), json.dumps({"body": "x"}),
             json.dumps({"text": 5}), "", json.dumps({"text": "a dog ran"})]
    (raw / "c.jsonl").write_text("\n".join(lines) + "\n")
    (raw / "d.jsonl").write_bytes(b'{"text": "caf\xe9"}\n{"text": "ok then"}\n')
    with pytest.raises(BinarizeError, match=r"c\.jsonl: line 2 is not JSON"):
        binarize(opts(raw, tmp_path / "o1", train_spm=30), log=lambda m: None)
    report = binarize(opts(raw, tmp_path / "o2", train_spm=30, bad_record="drop"), log=lambda m: None)
    c = next(e for e in report["inputs"] if e["key"] == "c")
    assert (c["lines"], c["kept"], c["bad_record"], c["empty"]) == (7, 2, 4, 1)
    d = next(e for e in report["inputs"] if e["key"] == "d")
    assert (d["kept"], d["bad_utf8"]) == (1, 1)
    with pytest.raises(BinarizeError, match=r"d\.jsonl: line 1 is not valid UTF-8"):
        binarize(opts(raw, tmp_path / "o3", train_spm=30, bad_record="drop", bad_utf8="error"), log=lambda m: None)
    with pytest.raises(BinarizeError, match=r"c\.jsonl: line 6 is an empty document"):
        binarize(opts(raw, tmp_path / "o4", train_spm=30, bad_record="drop", empty="error"), log=lambda m: None)
    with pytest.raises(UsageError, match="--documents writes Megatron's format"):
        binarize(opts(raw, tmp_path / "o5", format="fairseq"), log=lambda m: None)


def test_several_json_keys_write_a_dataset_each_and_a_resume_skips_them(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    rng = np.random.default_rng(2)
    rows = [{"title": sentence(rng), "text": "\n".join(sentence(rng) for _ in range(3))} for _ in range(50)]
    (raw / "wiki.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    binarize(opts(raw, out, json_keys=("text", "title"), split_sentences=True), log=lambda m: None)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for key in ("text", "title"):
        seqs, idx, _ = read_megatron(str(out / "shard000" / f"wiki_{key}_sentence"))
        assert (seqs, idx) == expected([r[key] for r in rows], sp, True)
    logs = []
    binarize(opts(raw, out, json_keys=("text", "title"), split_sentences=True, spm_model=str(out / "spm.model"),
                  train_spm=None), log=logs.append)
    assert any("1 of 1 shard(s) already finalized" in m for m in logs), logs


def test_escaped_lone_surrogates_follow_the_utf8_policy_and_paths_are_absolute(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    (raw / "a.jsonl").write_text('{"text": "the cat sat"}\n{"text": "a dog \\udc80 ran"}\n{"text": "blue sky"}\n')
    with pytest.raises(BinarizeError, match=r"a\.jsonl: line 2 holds a lone surrogate"):
        binarize(opts(raw, tmp_path / "o1", train_spm=30, bad_utf8="error"), log=lambda m: None)
    report = binarize(opts(raw, tmp_path / "o2", train_spm=30), log=lambda m: None)
    assert (report["inputs"][0]["kept"], report["inputs"][0]["bad_utf8"]) == (2, 1)
    report = binarize(opts(raw, tmp_path / "o3", train_spm=30, bad_utf8="replace"), log=lambda m: None)
    assert (report["inputs"][0]["kept"], report["inputs"][0]["replaced_utf8"]) == (3, 1)
    monkeypatch.chdir(tmp_path)
    report = binarize(opts("raw", "o4", train_spm=30), log=lambda m: None)
    weight, prefix = report["documents"]["data_path"]["text"].split()
    assert os.path.isabs(prefix) and prefix == str(tmp_path / "o4" / "shard000" / "a_text_document")
    (raw / "b.txt").write_text("\n\n  \n")
    with pytest.raises(BinarizeError, match=r"b\.txt: train b holds no document"):
        binarize(opts(raw, tmp_path / "o5", train_spm=30), log=lambda m: None)


@pytest.mark.parametrize("name, content", [
    ("a.jsonl", b'{"text": "the cat sat"}\n{"text": "a dog \\u0000 ran"}\n{"text": "blue sky"}\n'),  # an escape
    ("a.txt", b"the cat sat\n\na dog \x00 ran\n\nblue sky\n"),  # a raw NUL in a plain-text document
])
def test_a_nul_follows_the_utf8_policy_in_documents(tmp_path, name, content):
    """Issue 39 item 4: a NUL inside a document was kept and encoded as <unk>, counted as one more <unk>. No text
    holds one (a binary or mis-encoded file): it is a bad record under --on-bad-utf8, named and counted."""
    raw = tmp_path / "raw"
    os.makedirs(raw)
    (raw / name).write_bytes(content)
    with pytest.raises(BinarizeError, match=r"a\.(jsonl|txt): (line|document at line) 3? ?.*holds a NUL byte"):
        binarize(opts(raw, tmp_path / "o1", train_spm=30, bad_utf8="error"), log=lambda m: None)
    report = binarize(opts(raw, tmp_path / "o2", train_spm=30), log=lambda m: None)
    assert (report["inputs"][0]["kept"], report["inputs"][0]["bad_utf8"]) == (2, 1)
    report = binarize(opts(raw, tmp_path / "o3", train_spm=30, bad_utf8="replace"), log=lambda m: None)
    assert (report["inputs"][0]["kept"], report["inputs"][0]["replaced_utf8"]) == (3, 1)


@pytest.mark.parametrize("key", ["../../../../x", "a/b", "..", ".hidden", ""])
def test_a_json_key_that_is_not_a_plain_name_is_refused_before_any_work(tmp_path, key):
    """--json-keys '../../../../x' wrote files outside -o, 'a/b' made nested folders (issue 23 item 8): a key names
    output files, so it is a plain name."""
    with pytest.raises(UsageError, match="--json-keys .* is not a plain key name|--json-keys must name"):
        binarize(opts(tmp_path / "raw", tmp_path / "out", json_keys=(key,)), log=lambda m: None)
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "x").exists()


def test_a_json_key_no_record_has_is_named_when_training_sentencepiece(tmp_path):
    """--json-keys body with --train-spm gave 'SentencePiece training failed: INTERNAL ... sentences_.empty()';
    with --spm the encoding named the key (found by a review)."""
    os.makedirs(tmp_path / "raw")
    with open(tmp_path / "raw" / "web.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"document {i} about cats"}) + "\n")
    with pytest.raises(BinarizeError, match=r"no text to train SentencePiece on: .*web\.jsonl: line 1 has no key "
                                            r"'body' \(keys: text\); --json-keys body"):
        binarize(opts(tmp_path / "raw", tmp_path / "out", json_keys=("body",)), log=lambda m: None)
