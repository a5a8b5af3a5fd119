"""``babelfeed binarize --documents``: JSONL or plain-text documents -> Megatron-LM ``.bin``/``.idx``.

What is written follows Megatron-LM's ``tools/preprocess_data.py``:

* each JSON key asked for (``--json-keys``, default ``text``) gets its own dataset,
  ``shardNNN/{corpus}_{key}_document`` (``_sentence`` with ``--split-sentences``);
* a document is one sequence, or one sequence per sentence with ``--split-sentences``; sentences that encode
  to no token are left out, as Megatron leaves them out; ``end_document()`` closes every document, so the
  ``.idx`` document index holds its boundaries;
* the end-of-document token (SentencePiece's ``</s>``) is appended to the last sequence of every document
  (Megatron's ``--append-eod``; ``--no-append-eod`` leaves it out);
* token ids are the SentencePiece ids themselves (no fairseq dictionary), in uint16 below 65,500 symbols and
  int32 above, as Megatron's ``DType.optimal_dtype`` picks.

Differences, on purpose: sentences are the lines of a document's text (Megatron splits with NLTK's punkt, a
model we do not ship; split your text into lines first if you want punkt's sentences), and a bad record
(not JSON, not an object, a key missing or not a string) and an empty document follow a policy: dropped and
counted, or an error naming the file and line. Megatron stops at the first bad line and writes an empty
document for an empty text.
"""

from __future__ import annotations

import json

import numpy as np

from babelfeed.errors import BinarizeError
from babelfeed.preprocess.chunks import encode_chunk
from babelfeed.storage.dtypes import dtype_for_vocab


def document_settings(sp, model_path: str, opts) -> dict:
    eod = int(sp.eos_id())
    if opts.append_eod and eod < 0:
        raise BinarizeError(f"{model_path}: the SentencePiece model has no </s> (eos_id -1), so no end-of-document "
                            f"token; train one with </s> or give --no-append-eod")
    vocab = int(sp.get_piece_size())
    return {"eod": eod, "append_eod": bool(opts.append_eod), "split_sentences": bool(opts.split_sentences),
            "json_keys": list(opts.json_keys), "empty": opts.empty, "bad_utf8": opts.bad_utf8,
            "bad_record": opts.bad_record, "dtype": dtype_for_vocab(vocab, "megatron").name, "format": "megatron",
            "vocab_size": vocab}


def _decode(raw: bytes, policy: str, where: str) -> tuple[str | None, bool]:
    """(text, was_bad): None when the record is dropped. A NUL byte is bad too: no text holds one (a binary or
    mis-encoded file; SentencePiece would make it <unk>), so it follows the same policy (replace: U+FFFD)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if policy == "error":
            raise BinarizeError(f"{where} is not valid UTF-8 (policy --on-bad-utf8=error)") from None
        if policy == "drop":
            return None, True
        return raw.decode("utf-8", errors="replace").replace("\0", "\ufffd"), True
    if "\0" in text:
        kept = _nul([text], policy, where)
        return (None if kept is None else kept[0]), True
    return text, False


def _nul(texts: list[str], policy: str, where: str) -> list[str] | None:
    """Texts holding a NUL character, by the UTF-8 policy: an error, dropped (None), or each NUL as U+FFFD."""
    if policy == "error":
        raise BinarizeError(f"{where} holds a NUL byte, which no text does: a binary or mis-encoded file "
                            f"(policy --on-bad-utf8=error)")
    return None if policy == "drop" else [t.replace("\0", "\ufffd") for t in texts]


_JSON_TYPES = {"dict": "an object", "list": "an array", "int": "a number", "float": "a number", "bool": "a boolean",
               "NoneType": "null"}


def _fields(text: str, keys: list[str]) -> tuple[list[str] | None, str]:
    """The texts of ``keys`` in one JSON line, or (None, what is wrong)."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        return None, f"is not JSON ({e})"
    if not isinstance(obj, dict):
        return None, f"is {_JSON_TYPES.get(type(obj).__name__, 'a string')} in JSON, not an object"
    out = []
    for k in keys:
        if k not in obj:
            return None, f"has no key {k!r} (keys: {', '.join(list(obj)[:8])})"
        if not isinstance(obj[k], str):
            return None, f"holds {_JSON_TYPES.get(type(obj[k]).__name__, 'no string')} under {k!r}, not a string"
        out.append(obj[k])
    return out, ""


def _unicode(texts: list[str], policy: str, where: str) -> tuple[list[str] | None, bool]:
    """Texts a JSON escape left with a lone surrogate (``"\\udc80"``: no Unicode character) follow the UTF-8
    policy: an error, dropped (None), or the surrogate replaced by U+FFFD."""
    if any("\0" in t for t in texts):  # a JSON \u0000 escape: a NUL, as in a raw line
        texts = _nul(texts, policy, where)
        if texts is None:
            return None, True
        return _unicode(texts, policy, where)[0], True
    try:
        for t in texts:
            t.encode("utf-8")
        return texts, False
    except UnicodeEncodeError:
        pass
    if policy == "error":
        raise BinarizeError(f"{where} holds a lone surrogate escape (\\ud800-\\udfff alone is no Unicode "
                            f"character; policy --on-bad-utf8=error)")
    if policy == "drop":
        return None, True
    return [t.encode("utf-16", "surrogatepass").decode("utf-16", "replace") for t in texts], True


def document_texts(record, fmt: str, keys: list[str]) -> list[str]:
    """The texts of one record, for SentencePiece's training sample (bad records give none)."""
    if fmt == "text":
        return ["\n".join(ln.decode("utf-8", errors="replace") for ln in record[1])]
    texts, _ = _fields(record.decode("utf-8", errors="replace"), keys) if record.strip() else (None, "")
    if texts:
        texts, _ = _unicode(texts, "replace", "")
    return texts or []


def encode_documents(chunk, work_dir: str, sp, cfg) -> tuple:
    """Encode one chunk of documents into work files, one dataset per JSON key."""
    keys = cfg["json_keys"]

    def block(blocks, where, builders, stats):
        (path, first), = where
        docs = _parse(blocks[0], first, path, keys, cfg, stats)
        _write(docs, builders, keys, sp, cfg, stats, path)

    return encode_chunk(chunk, work_dir, keys, "megatron", cfg, block, exact=False)


def _parse(records, first: int, path: str, keys, cfg, stats) -> list[tuple[str, list[str]]]:
    """(where, texts per key) for every record kept; counts what is dropped."""
    docs = []
    for i, rec in enumerate(records):
        stats.lines += 1
        if isinstance(rec, tuple):  # a plain-text document: (first line, lines)
            where = f"{path}: document at line {rec[0] + 1}"
            parts = []
            bad = False
            for ln in rec[1]:
                text, was_bad = _decode(ln, cfg["bad_utf8"], where)
                bad |= was_bad
                if text is None:
                    parts = None
                    break
                parts.append(text)
            if parts is None:
                stats.bad_utf8 += 1
                continue
            stats.replaced_utf8 += bad
            texts = ["\n".join(parts)]
        else:
            where = f"{path}: line {first + i + 1}"
            if not rec.strip():
                texts = [""] * len(keys)
            else:
                text, was_bad = _decode(rec, cfg["bad_utf8"], where)
                if text is None:
                    stats.bad_utf8 += 1
                    continue
                stats.replaced_utf8 += was_bad
                texts, problem = _fields(text, keys)
                if texts is None:
                    if cfg["bad_record"] == "error":
                        raise BinarizeError(f"{where} {problem} (policy --on-bad-record=error; --on-bad-record=drop "
                                            f"drops and counts such lines)")
                    stats.bad_record += 1
                    continue
                texts, was_bad = _unicode(texts, cfg["bad_utf8"], where)
                if texts is None:
                    stats.bad_utf8 += 1
                    continue
                stats.replaced_utf8 += was_bad
        docs.append((where, texts))
    return docs


def _write(docs, builders, keys, sp, cfg, stats, path) -> None:
    split = cfg["split_sentences"]
    # every sentence of every document and key, encoded in one call per key
    per_key = []
    for k in range(len(keys)):
        sentences, owner = [], []
        for d, (_, texts) in enumerate(docs):
            parts = [s for s in texts[k].split("\n") if s.strip()] if split else ([texts[k]] if texts[k].strip() else [])
            sentences.extend(parts)
            owner.extend([d] * len(parts))
        ids = sp.encode(sentences, out_type=int, num_threads=1) if sentences else []
        per_key.append((ids, np.asarray(owner, dtype=np.int64)))
    # a document is kept when every key holds at least one sentence with tokens
    has = np.ones(len(docs), dtype=bool)
    for ids, owner in per_key:
        nonempty = np.fromiter((len(x) > 0 for x in ids), dtype=bool, count=len(ids))
        has &= np.bincount(owner[nonempty], minlength=len(docs)) > 0 if len(docs) else has
    if not has.all():
        if cfg["empty"] == "error":
            where = docs[int(np.flatnonzero(~has)[0])][0]
            raise BinarizeError(f"{where} is an empty document (no text under {', '.join(keys)}; policy "
                                f"--on-empty=error)")
        stats.empty += int((~has).sum())
    stats.kept += int(has.sum())
    for k, ((ids, owner), builder) in enumerate(zip(per_key, builders)):
        seqs = [(d, x) for d, x in zip(owner.tolist(), ids) if x and has[d]]
        lengths = np.fromiter((len(x) for _, x in seqs), dtype=np.int64, count=len(seqs))
        tokens = np.fromiter((t for _, x in seqs for t in x), dtype=np.int64, count=int(lengths.sum()))
        per_doc = np.bincount(np.fromiter((d for d, _ in seqs), dtype=np.int64, count=len(seqs)),
                              minlength=len(docs))[has]
        if cfg["append_eod"] and len(seqs):
            last = np.cumsum(per_doc) - 1  # the last sequence of each document
            ends = np.cumsum(lengths)
            tokens = np.insert(tokens, ends[last], cfg["eod"])
            lengths[last] += 1
        builder.add_documents(tokens, lengths, per_doc)
        if k == 0:
            stats.sequences += len(seqs)
        stats.tokens[keys[k]] = stats.tokens.get(keys[k], 0) + int(lengths.sum())
