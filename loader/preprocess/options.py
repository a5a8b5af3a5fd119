"""The settings of ``babelfeed binarize``, checked before any work (SentencePiece training takes minutes).

Messages name the command-line flag, the value given and what is allowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from babelfeed.checks import at_least, is_int, one_of, positive
from babelfeed.errors import BinarizeError, UsageError

DEFAULT_COVERAGE = 0.9995  # SentencePiece's character_coverage when --character-coverage is not given

POLICIES = {
    "empty": ("drop", "keep", "error"),
    "overlong": ("drop", "truncate", "keep", "error"),
    "bad_utf8": ("drop", "replace", "error"),
}


@dataclass
class BinarizeOptions:
    input_dir: str | None  # a folder of inputs (None: only --input globs)
    output_dir: str
    spm_model: str | None = None  # an existing SentencePiece model
    train_spm: int | None = None  # or train one with this vocabulary size
    dict_path: str | None = None  # an existing fairseq dict.txt to map pieces through (default: spm order)
    shards: int = 1
    workers: int = 0  # 0: every core
    format: str | None = None  # None: fairseq for sentences, megatron for documents
    max_len: int = 1024  # tokens per sentence, </s> included
    empty: str = "drop"
    overlong: str = "drop"
    max_dropped: float = 0.05  # an input losing a larger share of its lines is warned about, loudly
    bad_utf8: str = "drop"
    chunk_lines: int = 20000
    spm_sample: int = 1_000_000  # sentences sampled to train SentencePiece
    spm_temperature: float = 5.0  # per-language share of that sample, p ~ n^(1/T)
    spm_model_type: str = "unigram"
    spm_character_coverage: float | None = None  # --character-coverage; None: SentencePiece's 0.9995
    seed: int = 1
    overwrite: bool = False
    progress: bool | None = None  # None: a bar when stderr is a terminal
    inputs: tuple = ()  # "KEY=GLOB" specs beside (or instead of) input_dir
    engine: str = "local"  # "local" or "ray"
    ray_address: str | None = None  # --ray-address: "auto", HOST:PORT, ray://...; None: a local Ray instance
    documents: bool = False  # JSONL / plain-text documents -> Megatron LM data
    json_keys: tuple = ("text",)
    split_sentences: bool = False
    append_eod: bool = True
    bad_record: str = "error"  # documents: a line that is no JSON object with the keys
    source_lang: str | None = None  # fairseq-preprocess's naming: {split}.{src} and {split}.{tgt} are a direction
    target_lang: str | None = None
    trainpref: str | None = None  # fairseq's path prefixes: PREFIX.{src}, PREFIX.{tgt} (comma-separated: valid1 ...)
    validpref: str | None = None
    testpref: str | None = None
    command: tuple = ()  # the command line that started the run (the CLI's), quoted in hints; changes no output

    @property
    def pair_langs(self) -> list[str] | None:
        return [self.source_lang, self.target_lang] if self.source_lang is not None else None

    @property
    def character_coverage(self) -> float:
        return DEFAULT_COVERAGE if self.spm_character_coverage is None else self.spm_character_coverage

    def validate(self) -> None:
        if self.format is None:
            self.format = "megatron" if self.documents else "fairseq"
        for name, allowed in POLICIES.items():
            one_of(f"--on-{name.replace('_', '-')}", getattr(self, name), allowed)
        one_of("--engine", self.engine, ("local", "ray"))
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("--ray-address is for --engine ray")
        prefs = self.trainpref or self.validpref or self.testpref
        if self.input_dir is not None and "://" not in str(self.output_dir) and \
                os.path.realpath(self.output_dir) == os.path.realpath(self.input_dir):
            raise UsageError(f"-o {self.output_dir} is the input folder: binarize writes dict.txt, spm.model and "
                             f"shard folders into its output, which would land among the raw text; give another "
                             f"output folder")
        if self.input_dir is None and not self.inputs and not prefs:
            raise UsageError("give an input folder, or --input KEY=GLOB, or --source-lang, --target-lang and "
                             "--trainpref PREFIX (fairseq-preprocess's naming)")
        if (self.source_lang is None) != (self.target_lang is None):
            raise UsageError("--source-lang and --target-lang go together: they name the two sides of a direction "
                             "(train.en and train.de with --source-lang en --target-lang de)")
        if prefs and self.source_lang is None:
            raise UsageError("--trainpref, --validpref and --testpref name the files PREFIX.{src} and PREFIX.{tgt}: "
                             "give --source-lang and --target-lang with them")
        if self.documents and self.source_lang is not None:
            raise UsageError("--source-lang, --target-lang and --trainpref/--validpref/--testpref are for parallel "
                             "sentences, not --documents")
        if self.spm_character_coverage is not None:
            if self.spm_model is not None:
                raise UsageError(f"--character-coverage {self.spm_character_coverage:g} is a setting of SentencePiece "
                                 f"training (--train-spm): the model given with --spm ({self.spm_model}) is trained "
                                 f"already; leave --character-coverage out, or train one here with --train-spm VOCAB")
            c = self.spm_character_coverage
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.98 <= c <= 1:
                raise UsageError(f"--character-coverage must be a share in [0.98, 1] of the sample's characters that "
                                 f"get pieces (1.0: all of them; SentencePiece refuses less than 0.98), got {c!r}")
        if isinstance(self.inputs, str) or isinstance(self.json_keys, str):
            raise UsageError("inputs and json_keys are lists of strings")
        if self.documents:
            if self.format != "megatron":
                raise UsageError("--documents writes Megatron's format (a document index); leave --format out or "
                                 "give --format megatron")
            if self.empty not in ("drop", "error"):
                raise UsageError(f"--on-empty {self.empty} is not for documents: an empty document is dropped "
                                 f"(drop) or an error (error)")
            if self.overlong != "drop" or self.max_len != 1024 or self.dict_path:
                raise UsageError("--on-overlong, --max-len and --dict are for sentences, not --documents")
            if not self.json_keys or len(set(self.json_keys)) != len(self.json_keys):
                raise UsageError(f"--json-keys must name distinct keys, got {list(self.json_keys)}")
            # each key names output files (shardNNN/{corpus}_{key}_document.bin): a plain name, never a path
            bad = [k for k in self.json_keys if not isinstance(k, str) or not k or k in (".", "..") or "/" in k
                   or "\\" in k or "\0" in k or os.sep in k or k.startswith(".")]
            if bad:
                raise UsageError(f"--json-keys {bad[0]!r} is not a plain key name: each key names output files "
                                 f"({{corpus}}_{{key}}_document.bin inside -o), so it may not hold '/', '\\', or "
                                 f"start with '.'")
            one_of("--on-bad-record", self.bad_record, ("drop", "error"))
        elif self.split_sentences or tuple(self.json_keys) != ("text",) or not self.append_eod or \
                self.bad_record != "error":
            raise UsageError("--split-sentences, --json-keys, --no-append-eod and --on-bad-record are for --documents")
        if (self.spm_model is None) == (self.train_spm is None):
            raise UsageError("give exactly one of spm_model (--spm) and train_spm (--train-spm VOCAB)")
        if self.train_spm is not None:
            at_least("--train-spm", self.train_spm, 1)
        at_least("--shards", self.shards, 1)
        at_least("--workers", self.workers, 0)
        if not is_int(self.max_len) or self.max_len < 2:
            raise UsageError(f"--max-len must be an integer >= 2 (one token and </s>), got {self.max_len!r}")
        one_of("--format", self.format, ("fairseq", "megatron"))
        if isinstance(self.max_dropped, bool) or not isinstance(self.max_dropped, (int, float)) \
                or not 0 <= self.max_dropped <= 1:
            raise UsageError(f"--max-dropped must be a share in [0, 1], got {self.max_dropped!r}")
        at_least("--chunk-lines", self.chunk_lines, 1)
        at_least("--spm-sample", self.spm_sample, 1)
        positive("spm_temperature", self.spm_temperature)
        if not is_int(self.seed):
            raise UsageError(f"--seed must be an integer, got {self.seed!r}")


def check_shards(inputs, shards: int) -> None:
    """Every train shard gets at least one line: more shards than a direction's lines would write empty
    shards, and epochs that read an empty shard (``data.shards="cycle"``) serve no batch at all."""
    empty = [inp for inp in inputs if inp.num_lines == 0]
    if empty:
        inp = empty[0]
        what = "document" if inp.documents else "line"
        raise BinarizeError(f"{inp.origin or inp.paths[0]}: {inp.split} {inp.key} holds no {what} (an empty input would "
                            f"write empty datasets); fill it or move it out of the inputs")
    if shards <= 1:
        return
    short = [inp for inp in inputs if inp.split.startswith("train") and inp.num_lines < shards]
    if short:
        inp = min(short, key=lambda i: i.num_lines)
        what = "document(s)" if inp.documents else "line(s)"
        raise BinarizeError(f"--shards {shards} is more than the {inp.num_lines:,} {what} of {inp.split} {inp.key} "
                            f"({inp.paths[0]}): a shard would be empty; give --shards {max(inp.num_lines, 1)} or fewer")
