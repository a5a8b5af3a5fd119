"""Every config key babelfeed reads, once: its type, range or choices, default and a one-line doc.

Two tables, one per kind of config: :data:`TRANSLATION` (configs/nllb_like.py, and the ``train`` section of
configs/demo.py) and :data:`LM` (configs/lm_packing.py). From them:

* :func:`validate` checks a config's values (type, range, choices, format) before any work, naming the key with
  its path in the file (``train.batching.max_tokens must be an integer >= 1, got 0``);
* :func:`check_known_keys` refuses a key babelfeed does not know inside its sections, with the closest names;
* :func:`defaults` is the config the tables describe: a test holds configs/nllb_like.py and configs/lm_packing.py
  to it (same keys, types and defaults);
* :func:`markdown` writes docs/reference/config.md, the key reference (a test holds the file to it).

Settings that depend on each other (``max_tokens`` against the longest sample, packing against static shapes)
are checked by the part that uses them (``babelfeed.plan.options.PlanOptions.validate``).
"""

from __future__ import annotations

import contextlib
import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Callable

import ml_collections

from babelfeed.checks import COMPAT, DTYPES, LARGEST, LONGEST, METHODS, ON_TOO_LONG, SHARDS, VERIFY, integers, is_int
from babelfeed.errors import ConfigError, ConfigTypeError, UsageError
from babelfeed.plan import samplers


@dataclass(frozen=True)
class Key:
    """One config key. ``kind``: "int", "float", "bool", "str" or "str|int"; ``low``/``high``: the range of a
    number (``high`` excluded); ``choices``: the values allowed; ``nonempty``: a string that must say something;
    ``check``: a format check of its own (raises ConfigError naming the key)."""

    path: str
    kind: str
    default: object
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple | Callable | None = None  # (a callable: choices that a registry holds, asked when checked)
    nonempty: bool = False
    check: Callable | None = None

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def describe(self) -> str:
        """The values allowed, in words (the key reference's "allowed" column)."""
        if self.choices:
            return " \\| ".join(repr(c) for c in self.allowed())
        if self.kind in ("int", "float"):
            low = "" if self.low is None else f">= {self.low:g}" if self.kind == "int" or self.low else "> 0"
            high = "" if self.high is None else f"< {_power(self.high)}"
            return ", ".join(x for x in (low, high) if x) or "any"
        if self.kind == "bool":
            return "True \\| False"
        return "non-empty text" if self.nonempty else "text"

    def validate(self, value, name: str) -> None:
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False, got {value!r}")
            return
        if self.choices is not None:
            if value not in self.allowed():
                raise ConfigError(f"{name} must be one of {', '.join(map(repr, self.allowed()))}, got {value!r}")
            return
        if self.kind == "int":
            if not is_int(value) or (self.low is not None and value < self.low) or not value < (self.high or LARGEST):
                raise ConfigError(f"{name} must be an integer {self.describe()}, got {value!r}")
        elif self.kind == "float":
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (self.low is not None and not (value > self.low if self.low == 0 else value >= self.low)):
                hint = "; for a uniform mixture (the limit T -> inf) set mixing.method='uniform'" if (
                    name.endswith("temperature") and isinstance(value, float) and math.isinf(value)) else ""
                raise ConfigError(f"{name} must be a finite number {self.describe()}, got {value!r}{hint}")
        elif self.kind == "str":
            if not isinstance(value, str) or (self.nonempty and not value.strip()):
                raise ConfigError(f"{name} must be {'non-empty ' if self.nonempty else ''}text, got {value!r}")
        elif self.kind == "str|int":
            if not (isinstance(value, str) or is_int(value)):
                raise ConfigError(f"{name} must be text or an integer, got {value!r}")
        if self.check is not None:
            self.check(name, value)


def _power(x) -> str:
    p = int(math.log2(x)) if x > 0 else 0
    return f"2**{p}" if 2 ** p == x else f"{x:g}"


def _shapes(name: str, value) -> None:
    for item in [t.strip() for t in str(value).split(",") if t.strip()]:
        parts = item.split("x")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() and 0 < int(p) < LARGEST for p in parts):
            raise ConfigError(f"{name} must be widths such as '32,64,128' or 'SRCxTGT' pairs such as '32x48,64x80' "
                              f"(positive integers), got {value!r}")


def _pack(name: str, value) -> None:
    if str(value).strip():
        parts = str(value).strip().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"{name} must be 'SRCxTGT' such as '256x256' (positive integers), got {value!r}")


def _virtual(name: str, value) -> None:
    text = str(value)
    if text not in ("fairseq", "sum") and not (text.strip().isdigit() and int(text) > 0):
        raise ConfigError(f"{name} must be 'fairseq', 'sum' or a positive integer, got {value!r}")


def _weights(name: str, value) -> None:
    if isinstance(value, str):
        for item in [t.strip() for t in value.split(",") if t.strip()]:
            key, _, w = item.rpartition(":")
            try:
                ok = bool(key) and float(w) >= 0 and math.isfinite(float(w))
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"{name} entry {item!r} must be 'direction:weight' with a weight >= 0")


# An object store's settings (data.path = "s3://bucket/data_bin"); each empty one is taken from the environment
# as every S3 tool takes it (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_ALLOW_HTTP)
STORAGE: tuple = (
    Key("storage.endpoint", "str", "", "object store endpoint URL ('': AWS_ENDPOINT_URL, else the store's own)"),
    Key("storage.region", "str", "", "the bucket's region ('': AWS_REGION / AWS_DEFAULT_REGION)"),
    Key("storage.profile", "str", "", "an AWS profile of ~/.aws/config ('': AWS_PROFILE; needs boto3)"),
    Key("storage.allow_http", "bool", False, "plain-http endpoints (a store on the LAN or the loopback); "
        "AWS_ALLOW_HTTP=true does the same"),
)

SEED = Key("seed", "int", 1, "every draw, order and shuffle derives from it (fairseq mode: its --seed)", 0, 2**32)

TRANSLATION: tuple[Key, ...] = (
    SEED,
    Key("compat", "str", "none", "'fairseq': the same batches as fairseq's translation_multi_simple_epoch",
        choices=COMPAT),
    Key("data.path", "str", "build/demo/data_bin", "a data_bin folder (shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx})",
        nonempty=True),
    Key("data.train_split", "str", "train", "the split trained on", nonempty=True),
    Key("data.valid_split", "str", "valid", "the split validated on", nonempty=True),
    Key("data.directions", "str", "all", "'all' or a comma-separated list such as 'eng_Latn-deu_Latn,eng_Latn-fra_Latn'"),
    Key("data.monolingual", "str", "", "monolingual languages to add as (x, x) pairs, comma-separated"),
    Key("data.shards", "str", "cycle", "'cycle': epoch e reads shard (e-1) % k of each direction; 'all': every shard",
        choices=SHARDS),
    Key("data.source_prefix", "str", "__{src}__", "tokens put before every source (NLLB: the source language token)"),
    Key("data.target_prefix", "str", "__{tgt}__", "tokens put before every target"),
    Key("data.prefix_overrides", "str", "", "'direction:side=tokens;...', e.g. 'eng_Latn-deu_Latn:source=__bt__ __{src}__'"),
    Key("data.verify", "str", "full", "'full': every pointer checked once per file (a stamp remembers); 'quick': O(1)",
        choices=VERIFY),
    Key("data.noise", "str", "", "source noise for every train task, e.g. 'token_drop:rate=0.1;local_reorder:k=3'"),
    Key("data.noise_by_task", "str", "", "per task: 'eng_Latn=span_mask:ratio=0.3,mask_id=<unk>|...'"),
    Key("data.cache_dir", "str", "", "computed indexes (raw-text line offsets, lengths); '': DATA/.babelfeed-cache"),
    Key("data.length_cache_mb", "int", 512, "in-memory copies of sentence lengths for fast planning (0: off)", 0),
    *(Key(f"data.{k.path}", k.kind, k.default, k.doc, k.low, k.high, k.choices) for k in STORAGE),
    Key("filter.max_source_positions", "int", 1024, "longest source kept, prefixes and </s> included", 1, LONGEST + 1),
    Key("filter.max_target_positions", "int", 1024, "longest target kept", 1, LONGEST + 1),
    Key("filter.on_too_long", "str", "skip", "train: 'skip' (counted, reported) or 'raise'", choices=ON_TOO_LONG),
    Key("filter.on_too_long_valid", "str", "raise", "validation: 'raise' (it must see every sample) or 'skip'",
        choices=ON_TOO_LONG),
    Key("mixing.method", "str", "temperature", "how corpora are weighted", choices=METHODS),
    Key("mixing.temperature", "float", 5.0, "p_i ~ n_i^(1/T)", 0),
    Key("mixing.weights", "str", "", "method='weights': 'eng_Latn-deu_Latn:0.5,eng_Latn-fra_Latn:0.3,...'",
        check=_weights),
    Key("mixing.sampler", "str", "auto", "'auto' ('stream' with a changing schedule, else 'stratified'), "
        "'stratified' (per-epoch draw), 'stream' (every corpus cycles its own data), 'fairseq', 'concat'",
        choices=lambda: ("auto", *samplers.names())),
    Key("mixing.virtual_size", "str|int", "fairseq", "epoch size: 'fairseq' (largest corpus x max_scale_up), 'sum' "
        "or an integer", check=_virtual),
    Key("mixing.max_scale_up", "float", 1.5, "virtual_size='fairseq': the cap on the largest corpus's scale", 0),
    Key("mixing.probabilities_from", "str", "total", "corpus sizes over all shards ('total') or the epoch's ('shard')",
        choices=("total", "shard")),
    Key("mixing.schedule.boundaries", "str", "", "optimizer updates where the weights change, e.g. '40000,80000'",
        check=integers),
    Key("mixing.schedule.weights", "str", "", "n + 1 weight lists 'task:w,task:w | task:w,task:w | ...'"),
    Key("mixing.schedule.mode", "str", "step", "'step' switches at each boundary, 'linear' interpolates",
        choices=("step", "linear")),
    Key("batching.max_tokens", "int", 4096, "B * max(len) of the longer side, per batch", 1),
    Key("batching.max_sentences", "int", 0, "sentences per batch at most (0: no limit)", 0),
    Key("batching.required_batch_size_multiple", "int", 8, "every batch size a multiple of it", 1),
    Key("batching.accumulation", "int", 1, "forward passes per optimizer update on each rank (for the schedule)", 1),
    Key("batching.window", "int", 1_000_000, "samples planned at once (memory bound); 0: the whole epoch", 0),
    Key("batching.num_shapes", "int", 0, "> 0: every batch takes one of this many static shapes, chosen from the data",
        0),
    Key("batching.shapes", "str", "", "or explicit widths '32x32,64x64,128x128' (source x target)", check=_shapes),
    Key("batching.pack", "str", "", "'256x256': pack pairs side by side into rows of this shape", check=_pack),
    Key("batching.spread_copies", "bool", True, "copies of one sample (an up-sampled corpus) go to different "
        "batches; False: the length order puts them side by side, as fairseq does"),
    Key("batching.balance_block", "int", 16, "batches of similar cost shuffled together (rank balance)", 1),
    Key("batching.fairseq_drop_last", "bool", False, "compat='fairseq': drop a last batch off the multiple"),
    Key("collate.left_pad_source", "bool", True, "sources padded on the left (fairseq's default)"),
    Key("collate.left_pad_target", "bool", False, "targets padded on the left"),
    Key("collate.pad_to_multiple", "int", 1, "every padded length a multiple of it", 1),
    Key("collate.dtype", "str", "int64", "the token arrays' dtype", choices=DTYPES),
)

# The keys of one tasks entry (babelfeed.config.task's arguments; a test holds the two together).
TASK_KEYS = ("corpora", "weight", "transforms", "source_prefix", "target_prefix", "kind", "text", "spm_model", "alpha",
             "nbest")

# Sections of a translation config whose entries are the user's own (tasks.NAME = babelfeed.config.task(...)).
OPEN_SECTIONS = {"tasks": "tasks group corpora that get the same treatment: tasks.NAME = babelfeed.config.task(...)"}

LM: tuple[Key, ...] = (
    SEED,
    Key("data_path", "str", "0.3 data/web 0.7 data/books", "weights and .idx/.bin prefixes (Megatron's --data-path)",
        nonempty=True),
    Key("split", "str", "969,30,1", "train/valid/test shares, by documents", nonempty=True),
    Key("split_name", "str", "train", "the split served", choices=("train", "valid", "test")),
    Key("mode", "str", "pack", "'pack': whole documents in rows with segment ids; 'concat': Megatron's GPT slicing; "
        "'sentences': BERT-style", choices=("concat", "pack", "sentences")),
    Key("seq_len", "int", 2048, "tokens per row", 1),
    Key("global_batch", "int", 512, "samples per step over all ranks", 1),
    Key("num_samples", "int", 512 * 10_000, "samples of the run (train_iters x global_batch)", 1),
    Key("vocab_size", "int", 0, "the tokenizer's vocabulary: every token id must be below it (0: unchecked)", 0),
    Key("verify", "str", "full", "'full': every index checked once per file; 'quick': O(1) checks only",
        choices=VERIFY),
    Key("cache_dir", "str", "build/cache", "blend and sample indexes (.npy, keyed by a hash of their inputs)"),
    *STORAGE,
)

TABLES = {"translation": TRANSLATION, "lm": LM}


def keys(kind: str) -> tuple[Key, ...]:
    if kind not in TABLES:
        raise UsageError(f"kind must be one of {sorted(TABLES)}, got {kind!r}")
    return TABLES[kind]


def defaults(kind: str) -> ml_collections.ConfigDict:
    """The config the table describes: every key at its default (and, for translation, an empty ``tasks``)."""
    out = ml_collections.ConfigDict()
    for key in keys(kind):
        *parents, last = key.path.split(".")
        node = out
        for p in parents:
            if p not in node:
                node[p] = ml_collections.ConfigDict()
            node = node[p]
        node[last] = key.default
    if kind == "translation":
        out.tasks = ml_collections.ConfigDict()
    return out


def validate(config, kind: str = "translation", where: str = "") -> None:
    """Every key of ``config`` that the ``kind`` table names, checked (ConfigError naming ``where.key``). A key
    the config leaves out is given its default (docs/reference/config.md), inside a section the config has (a missing
    section says the config is of another kind). ``where``: the path of ``config`` inside the file's config."""
    prefix = f"{where}." if where else ""
    for key in keys(kind):
        *parents, last = key.path.split(".")
        node = config
        for p in parents:
            if not hasattr(node, "keys") or p not in node:
                if p == "schedule" and parents[0] == "mixing":  # (an optional subsection: made with its keys)
                    with node.unlocked():
                        node[p] = ml_collections.ConfigDict()
                    node = node[p]
                    continue
                node = None
                break
            node = node[p]
        if node is None:
            continue
        if last not in node:
            with node.unlocked() if hasattr(node, "unlocked") else contextlib.nullcontext():
                node[last] = key.default
        key.validate(node[last], prefix + key.path)


def _tree(kind: str) -> dict:
    tree: dict = {}
    for key in keys(kind):
        node = tree
        *parents, last = key.path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = key
    if kind == "translation":
        tree.update({name: {} for name in OPEN_SECTIONS})
    return tree


def check_known_keys(config, where: str = "", kind: str = "translation") -> None:
    """Refuse a key that babelfeed does not know inside its own sections (``batching.max_token`` for
    ``max_tokens``), naming the closest keys, as ``--set`` does: a typo in a config file must not leave the
    default in force silently. ``kind``: "translation" (``tasks`` entries are yours to name) or "lm". A top-level
    key of your own (``model``, ``optimizer``) is fine unless it is one letter away from one of babelfeed's."""
    prefix = f"{where}." if where else ""

    def walk(node, known: dict, path: str):
        for key in list(node.keys()):
            if key in known:
                sub = known[key]
                if isinstance(sub, dict) and not isinstance(node[key], (ml_collections.ConfigDict, dict)):
                    raise ConfigTypeError(f"{prefix}{path}{key} is a section of keys ({', '.join(sorted(sub)[:6])}"
                                          f"{', ...' if len(sub) > 6 else ''}), got {str(node[key])[:100]!r}: set "
                                          f"its keys ({prefix}{path}{key}.KEY = ...), not the section")
                if isinstance(sub, dict) and sub:
                    walk(node[key], sub, f"{path}{key}.")
                continue
            near = difflib.get_close_matches(key, list(known), n=3, cutoff=0.8 if path == "" else 0.6)
            if path == "" and not near:
                continue  # a section of the user's own
            hint = f"; did you mean {', '.join(f'{prefix}{path}{n}' for n in near)}?" if near else \
                f"; {prefix}{path.rstrip('.')} has: {', '.join(sorted(known))}"
            raise ConfigError(f"{prefix}{path}{key} is not a babelfeed config key{hint} (a key set by mistake "
                              f"would leave the default in force)")

    walk(config, _tree(kind), "")
    if kind == "translation" and "tasks" in config and config.tasks:
        for name, entry in config.tasks.items():  # each entry's keys are babelfeed's: a typo is refused too
            if not isinstance(entry, (ml_collections.ConfigDict, dict)):
                raise ConfigError(f"{prefix}tasks.{name} must be babelfeed.config.task(corpora=...), got {entry!r}")
            for key, value in entry.items():
                want = {"weight": (int, float), "alpha": (int, float), "nbest": (int,)}.get(key, (str,))
                if key in TASK_KEYS and (isinstance(value, bool) or not isinstance(value, want)):
                    what = "a number" if float in want else "an integer" if int in want else "a string"
                    raise ConfigTypeError(f"{prefix}tasks.{name}.{key} must be {what}, got {value!r} (as "
                                          f"babelfeed.config.task({key}=...) takes it)")
            for key in entry.keys():
                if key not in TASK_KEYS:
                    near = difflib.get_close_matches(key, TASK_KEYS, n=3, cutoff=0.6)
                    hint = f"did you mean {', '.join(f'{prefix}tasks.{name}.{n}' for n in near)}?" if near else \
                        f"a task has: {', '.join(TASK_KEYS)}"
                    raise ConfigError(f"{prefix}tasks.{name}.{key} is not a task key; {hint} (a key set by mistake "
                                      f"would leave the default in force)")
            if "corpora" not in entry:
                raise ConfigError(f"{prefix}tasks.{name} names no corpora: tasks.{name} = "
                                  f"babelfeed.config.task(corpora=\"en-de,en-fr\", ...)")


def check_translation_config(config, where: str = "") -> None:
    """A translation config (configs/nllb_like.py; ``where``: its path inside the file's config, ``"train"`` for
    configs/demo.py): every section present and every value valid."""
    prefix = f"{where}." if where else ""
    sections = sorted({k.path.split(".")[0] for k in TRANSLATION if "." in k.path})
    missing = [s for s in sections if s not in config]
    if missing:
        raise ConfigError(f"{where or 'the config'} is not a translation config: it has no "
                          f"{', '.join(prefix + s for s in missing)} section (see configs/nllb_like.py)")
    validate(config, "translation", where)
    weights, method = config.mixing.get("weights", ""), config.mixing.get("method", "temperature")
    if (str(weights).strip() if isinstance(weights, str) else weights) and method != "weights":
        raise ConfigError(f"{prefix}mixing.weights is set but {prefix}mixing.method is {method!r}, which ignores it: "
                          f"set {prefix}mixing.method='weights' to use the weights, or leave them empty")


def markdown() -> str:
    """docs/reference/config.md: the key reference, written from the tables."""
    lines = ["# Config keys", "",
             "Written from `babelfeed/config/spec.py` (`make docs` writes this page); a test "
             "holds this page, `configs/nllb_like.py` and `configs/lm_packing.py` to it. Every key is checked "
             "before any work: a wrong type, a value out of range or a key babelfeed does not know is refused, "
             "naming the key.", ""]
    for kind, title, source in (("translation", "Translation (`configs/nllb_like.py`; `configs/demo.py`'s `train`)",
                                 "build_train_iterator"),
                                ("lm", "Language modelling (`configs/lm_packing.py`)", "build_iterator")):
        lines += [f"## {title}", "", f"Read by `babelfeed.{source}(config)`.", "",
                  "| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for key in keys(kind):
            doc = key.doc.replace("<", "&lt;").replace("|", chr(92) + "|")  # </s> and <unk> are text, not HTML
            lines.append(f"| `{key.path}` | {key.kind.replace('|', ' or ')} | `{key.default!r}` | "
                         f"{key.describe().replace('<', '&lt;')} | {doc} |")
        if kind == "translation":
            for name, doc in OPEN_SECTIONS.items():
                lines.append(f"| `{name}.*` | section | empty | your task names | {doc} |")
        lines.append("")
    return "\n".join(lines)

