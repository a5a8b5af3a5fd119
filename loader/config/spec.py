"""Every config key babelfeed reads, once: its type, range or choices, default, one-line doc and the parser of
its mini-language; and a config parsed once with them.

Two tables, one per kind of config: :data:`TRANSLATION` (configs/nllb_like.py, and the ``train`` section of
configs/demo.py; the planner's keys are declared by ``babelfeed.plan.options``, which checks a PlanOptions built in
Python by the same keys) and :data:`LM` (configs/lm_packing.py); :data:`TASK` holds the keys of one ``tasks``
entry. From them:

* :func:`parse` checks a whole config before any work (every key known, every value of its type, range and
  format, the rules between keys) and returns :class:`Settings`, each key's parsed value, frozen: what
  ``babelfeed.build`` builds from. Errors name the key with its path in the file
  (``train.batching.max_tokens must be an integer >= 1, got 0``);
* :func:`check_known_keys` refuses a key babelfeed does not know inside its sections, with the closest names;
* :func:`defaults` is the config the tables describe: a test holds configs/nllb_like.py and configs/lm_packing.py
  to it (same keys, types and defaults);
* :func:`markdown` writes docs/reference/config.md, the key reference (a test holds the file to it).

Rules between keys live in two places, by what they need: between the planner's settings in
``PlanOptions.validate`` (so a PlanOptions made in Python keeps them too; :func:`parse` runs them before any data is
opened), and between the rest of a config (tasks, schedules, packing of raw text) in :func:`_rules` here. Rules
that need the data (a direction the schedule names, noise on packed sources) are checked when the data is opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Mapping

import ml_collections

from babelfeed.checks import LONGEST, Key, names
from babelfeed.errors import ConfigError, ConfigTypeError, UnknownConfigKey, UsageError
from babelfeed.lm.options import KEYS as LM_KEYS
from babelfeed.plan.options import BATCHING, COMPAT_KEY, FILTER, MIXING, SEED, PlanOptions
from babelfeed.storage.indexed import VERIFY_MODES

SHARDS = ("cycle", "all")
DTYPES = ("int32", "int64")


def prefix_overrides(name: str, value) -> dict:
    """``"en-de:source=__bt__ __{src}__;en-fr:target=..."`` -> ``{"en-de": {"source": "__bt__ __{src}__"}, ...}``."""
    if isinstance(value, dict):
        return value
    out: dict = {}
    for item in [v for v in str(value or "").split(";") if v.strip()]:
        head, sep, tokens = item.partition("=")
        key, _, side = head.strip().rpartition(":")
        if not sep or side not in ("source", "target") or not key.strip():
            raise ConfigError(f"{name} entry {item!r} must be 'direction:source=tokens' or 'direction:target=tokens'")
        if side in out.get(key.strip(), {}):
            raise ConfigError(f"{name} gives {key.strip()}'s {side} prefix twice")
        out.setdefault(key.strip(), {})[side] = tokens.strip()
    return out


def directions(name: str, value) -> str | tuple[str, ...]:
    """``"all"`` or the directions (or languages) of a comma-separated list."""
    return "all" if str(value).strip() == "all" else corpora(name, value)


def corpora(name: str, value) -> tuple[str, ...]:
    """Directions or languages, comma-separated: each a name without spaces or other separators, one '-' at
    most."""
    out = names(name, value)
    for item in out:
        if any(c.isspace() or c in ";|:=" for c in item) or item.count("-") > 1 or item.startswith("-") or \
                item.endswith("-"):
            raise ConfigError(f"{name}: {item!r} is not a direction ('SRC-TGT', e.g. 'eng_Latn-deu_Latn') or a "
                              f"language; several are separated by commas")
    return out


def by_task(name: str, value) -> dict:
    """``"task=spec|task=spec"`` -> ``{"task": "spec", ...}`` (each spec is parsed against the dictionary)."""
    if isinstance(value, dict):
        return value
    out = {}
    for item in [p for p in str(value or "").split("|") if p.strip()]:
        task, sep, spec = item.partition("=")
        if not sep or not task.strip():
            raise ConfigError(f"{name} entry {item!r} must look like 'task=transform:params;...'")
        if task.strip() in out:
            raise ConfigError(f"{name} gives {task.strip()!r} transforms twice")
        out[task.strip()] = spec
    return out


def _at_most_one(name: str, value) -> float:
    if not value <= 1:
        raise ConfigError(f"{name} must be in (0, 1], got {value!r}")
    return value


# An object store's settings (data.path = "s3://bucket/data_bin"); each empty one is taken from the environment
# as every S3 tool takes it (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_ALLOW_HTTP)
STORAGE: tuple = (
    Key("storage.endpoint", "str", "", "object store endpoint URL ('': AWS_ENDPOINT_URL, else the store's own)"),
    Key("storage.region", "str", "", "the bucket's region ('': AWS_REGION / AWS_DEFAULT_REGION)"),
    Key("storage.profile", "str", "", "an AWS profile of ~/.aws/config ('': AWS_PROFILE; needs boto3)"),
    Key("storage.allow_http", "bool", False, "plain-http endpoints (a store on the LAN or the loopback); "
        "AWS_ALLOW_HTTP=true does the same"),
)


TRANSLATION: tuple[Key, ...] = (
    SEED,
    COMPAT_KEY,
    Key("data.path", "str", "build/demo/data_bin", "a data_bin folder (shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx})",
        nonempty=True),
    Key("data.train_split", "str", "train", "the split trained on", nonempty=True),
    Key("data.valid_split", "str", "valid", "the split validated on", nonempty=True),
    Key("data.directions", "str", "all", "'all' or a comma-separated list such as 'eng_Latn-deu_Latn,eng_Latn-fra_Latn'",
        parse=directions),
    Key("data.monolingual", "str", "", "monolingual languages to add as (x, x) pairs, comma-separated",
        parse=corpora),
    Key("data.shards", "str", "cycle", "'cycle': epoch e reads shard (e-1) % k of each direction; 'all': every shard",
        choices=SHARDS),
    Key("data.source_prefix", "str", "__{src}__", "tokens put before every source (NLLB: the source language token)"),
    Key("data.target_prefix", "str", "__{tgt}__", "tokens put before every target"),
    Key("data.prefix_overrides", "str", "", "'direction:side=tokens;...', e.g. 'eng_Latn-deu_Latn:source=__bt__ __{src}__'",
        parse=prefix_overrides),
    Key("data.verify", "str", "full", "'full': every pointer checked once per file (a stamp remembers); 'quick': O(1)",
        choices=VERIFY_MODES),
    Key("data.noise", "str", "", "source noise for every train task, e.g. 'token_drop:rate=0.1;local_reorder:k=3'"),
    Key("data.noise_by_task", "str", "", "per task: 'eng_Latn=span_mask:ratio=0.3,mask_id=<unk>|...'",
        parse=by_task),
    Key("data.cache_dir", "str", "", "computed indexes (raw-text line offsets, lengths); '': DATA/.babelfeed-cache"),
    Key("data.length_cache_mb", "int", 512, "in-memory copies of sentence lengths for fast planning (0: off)", 0),
    *(dataclasses.replace(k, path=f"data.{k.path}") for k in STORAGE),
    *FILTER,
    *MIXING,
    *BATCHING,
    Key("collate.left_pad_source", "bool", True, "sources padded on the left (fairseq's default)"),
    Key("collate.left_pad_target", "bool", False, "targets padded on the left"),
    Key("collate.pad_to_multiple", "int", 1, "every padded length a multiple of it", 1, LONGEST + 1),
    Key("collate.dtype", "str", "int64", "the token arrays' dtype", choices=DTYPES),
)

TASK_KINDS = ("translation", "denoise")

# The keys of one tasks entry: babelfeed.config.task's arguments, in its order (a test holds the two together).
TASK: tuple[Key, ...] = (
    Key("corpora", "str", "", "comma-separated directions or monolingual languages ('all': every direction)",
        nonempty=True),
    Key("weight", "float", 1.0, "the task's share of the mixture", 0),
    Key("transforms", "str", "", "source noise, e.g. 'span_mask:ratio=0.3,mask_id=<unk>'"),
    Key("source_prefix", "str", "inherit", "prefix template; 'inherit' takes data.source_prefix"),
    Key("target_prefix", "str", "inherit", "prefix template; 'inherit' takes data.target_prefix"),
    Key("kind", "str", "translation", "'denoise': monolingual corpora, noised source and clean target",
        choices=TASK_KINDS),
    Key("text", "str", "", "read raw text from this path template (relative to data.path)"),
    Key("spm_model", "str", "", "raw text: the SentencePiece model ('': DATA/spm.model)"),
    Key("alpha", "float", 0.1, "raw text: a segmentation drawn with probability ~ P^alpha", above=0,
        parse=_at_most_one),
    Key("nbest", "int", 16, "raw text: among the nbest best segmentations", 2, 1025),
)
TASK_KEYS = tuple(k.path for k in TASK)

# Sections of a translation config whose entries are the user's own (tasks.NAME = babelfeed.config.task(...)).
OPEN_SECTIONS = {"tasks": "tasks group corpora that get the same treatment: tasks.NAME = babelfeed.config.task(...)"}

LM: tuple[Key, ...] = (SEED, *LM_KEYS, *STORAGE)

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


class Settings(Mapping):
    """A config parsed: ``settings["mixing.weights"]`` or ``settings.mixing.weights`` is the key's parsed value
    (``(("en-de", 0.5), ...)``); ``settings.tasks`` the tasks section, each entry a Settings of :data:`TASK`'s
    keys. Frozen: build from it, never change it."""

    __slots__ = ("_values", "_where")

    def __init__(self, values: dict, where: str = ""):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_where", where)

    @property
    def where(self) -> str:
        """The path of these settings in the config file (``"train."`` for configs/demo.py's pipeline)."""
        return self._where

    def __getitem__(self, path: str):
        return self._values[path]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        inner = {k[len(name) + 1:]: v for k, v in self._values.items() if k.startswith(name + ".")}
        if not inner:
            raise UnknownConfigKey(f"{self._where}{name} is not a babelfeed config key or section")
        return Settings(inner, f"{self._where}{name}.")

    def __setattr__(self, name, value):
        raise AttributeError(f"Settings are frozen: change the config and parse it again ({name})")

    def __repr__(self) -> str:
        return f"Settings({self._values!r})"


def _values(config, table, where: str) -> dict:
    """Every key of ``table`` in ``config``, checked and parsed. A key the config leaves out is given its default
    (docs/reference/config.md), inside a section the config has (a missing section says the config is of another
    kind: its keys are left out)."""
    prefix = f"{where}." if where else ""
    out = {}
    for key in table:
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
        out[key.path] = key.value(node[last], prefix + key.path)
    return out


def task_values(entry: Mapping, name: str) -> Settings:
    """One ``tasks`` entry checked by :data:`TASK`'s keys (``name``: how to name it, ``tasks.NAME``), each key it
    leaves out at its default."""
    return Settings({k.path: k.value(entry[k.path], f"{name}.{k.path}") if k.path in entry else k.default
                     for k in TASK}, f"{name}.")


def parse(config, kind: str = "translation", where: str = "") -> Settings:
    """``config`` checked once, before any work, and parsed: every key known (a typo is refused with the closest
    names), every section present, every value of its type, range and format, and the rules between keys.
    ``where``: the path of ``config`` inside the file's config (``"train"`` for configs/demo.py)."""
    table = keys(kind)
    check_known_keys(config, where, kind)
    prefix = f"{where}." if where else ""
    if kind == "translation":
        sections = sorted({k.path.split(".")[0] for k in TRANSLATION if "." in k.path})
        missing = [s for s in sections if s not in config]
        if missing:
            raise ConfigError(f"{where or 'the config'} is not a translation config: it has no "
                              f"{', '.join(prefix + s for s in missing)} section (see configs/nllb_like.py)")
    values = _values(config, table, where)
    if kind == "translation":
        tasks = config.get("tasks") or {}
        values["tasks"] = {name: task_values(entry, f"{prefix}tasks.{name}") for name, entry in tasks.items()}
    settings = Settings(values, prefix)
    if kind == "translation":
        _rules(settings, prefix)
    return settings


def validate(config, kind: str = "translation", where: str = "") -> None:
    """Every key of ``config`` that the ``kind`` table names, checked (ConfigError naming ``where.key``); keys the
    config leaves out are set to their defaults."""
    _values(config, keys(kind), where)


def _rules(s: Settings, prefix: str) -> None:
    """The rules between a translation config's keys that the planner does not hold (PlanOptions.validate holds
    its own)."""
    # the planner's own rules, now, before any data is opened (PlanOptions holds them for every caller)
    PlanOptions.from_settings(s).validate()
    if s["mixing.schedule.boundaries"] and not s["mixing.schedule.weights"]:
        raise ConfigError(f"{prefix}mixing.schedule.boundaries is set but {prefix}mixing.schedule.weights is empty")
    if not s.tasks:
        return
    if s["mixing.method"] != "temperature":
        raise ConfigError(f"with a tasks section, task weights (or mixing.schedule) set the mix and "
                          f"mixing.temperature splits a task among its corpora; {prefix}mixing.method must stay "
                          f"'temperature', got {s['mixing.method']!r}")
    if s["data.noise"].strip() or s["data.noise_by_task"] or s["data.prefix_overrides"]:
        raise ConfigError(f"with a tasks section, give transforms and prefixes per task (tasks.NAME.transforms, "
                          f".source_prefix), not {prefix}data.noise / data.noise_by_task / data.prefix_overrides")
    for name, t in s.tasks.items():
        where = f"{prefix}tasks.{name}"
        if "/" in name or not name.strip() or any(c.isspace() for c in name):
            raise ConfigError(f"task name {name!r} must be a word: not empty, no spaces, no '/'")
        if t.text.strip() and t.corpora.strip() == "all":
            raise ConfigError(f"{where} reads raw text: name its corpora (directions or languages), not 'all'")
        if not names(where, t.corpora):
            raise ConfigError(f"{where}.corpora names no corpus")
        if t.text.strip() and s["batching.pack"]:
            raise ConfigError(f"{where} reads raw text, whose lengths are known only when sampled: it cannot be "
                              f"packed ({prefix}batching.pack)")
        if t.kind == "denoise" and not t.transforms.strip():
            raise ConfigError(f"{where} is a denoising task but has no transforms")


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


def markdown() -> str:
    """docs/reference/config.md: the key reference, written from the tables."""
    lines = ["# Config keys", "",
             "Written from `loader/config/spec.py` and the keys it gathers (`make docs` writes this page); a test "
             "holds this page, `configs/nllb_like.py` and `configs/lm_packing.py` to it. Every key is checked "
             "before any work: a wrong type, a value out of range or a key babelfeed does not know is refused, "
             "naming the key.", ""]
    for kind, title, source in (("translation", "Translation (`configs/nllb_like.py`; `configs/demo.py`'s `train`)",
                                 "build_train_iterator"),
                                ("lm", "Language modelling (`configs/lm_packing.py`)", "build_iterator")):
        lines += [f"## {title}", "", f"Read by `babelfeed.{source}(config)`.", "",
                  "| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        lines += [_row(key) for key in keys(kind)]
        if kind == "translation":
            for name, doc in OPEN_SECTIONS.items():
                lines.append(f"| `{name}.*` | section | empty | your task names | {doc} |")
            lines += ["", "### One task (`tasks.NAME = babelfeed.config.task(...)`)", "",
                      "| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
            lines += [_row(key) for key in TASK]
        lines.append("")
    return "\n".join(lines)



def _row(key: Key) -> str:
    doc = key.doc.replace("<", "&lt;").replace("|", chr(92) + "|")  # </s> and <unk> are text, not HTML
    return (f"| `{key.path}` | {key.kind.replace('|', ' or ')} | `{key.default!r}` | "
            f"{key.describe().replace('<', '&lt;')} | {doc} |")
