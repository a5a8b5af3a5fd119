"""Load ml-collections config files (a Python file with ``get_config()``)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from importlib import resources

import ml_collections

from babelfeed.config.spec import task_values
from babelfeed.errors import ConfigError, ConfigTypeError, UnknownConfigKey


def shipped_configs() -> dict[str, str]:
    """The configs that come with babelfeed (``babelfeed.configs``): name -> file."""
    root = resources.files("babelfeed.configs")
    return {p.name[:-3]: str(p) for p in root.iterdir() if p.name.endswith(".py") and not p.name.startswith("_")}


def config_path(name_or_path) -> str:
    """The file of a config: ``name_or_path`` itself where it exists, else the shipped config it names
    (``nllb_like``, ``nllb_like.py`` or ``configs/nllb_like.py``, so the README's commands work outside the
    checkout too)."""
    path = os.fspath(name_or_path)
    if os.path.exists(path):
        return path
    shipped = shipped_configs()
    head, tail = os.path.split(path)
    stem = tail[:-3] if tail.endswith(".py") else tail
    if head.rstrip("/") in ("", "configs") and stem in shipped:  # not ./name.py: that names a file here
        return shipped[stem]
    raise FileNotFoundError(2, f"config file not found, and not the name of a shipped config "
                               f"({', '.join(sorted(shipped))})", path)


def load_config(path) -> ml_collections.ConfigDict:
    """Import a config file (or a shipped config by name: ``load_config("nllb_like")``) and return its
    ``get_config()``, locked so a misspelt key raises instead of being added."""
    path = config_path(path)
    spec = importlib.util.spec_from_file_location(f"babelfeed_config_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: not a Python config file (a .py file defining get_config())")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: say where it failed, in one line
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ConfigError(f"{path}{where}: running the config file failed: {type(e).__name__}: {e}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: a config file must define get_config()")
    try:
        config = module.get_config()
    except Exception as e:  # the user's get_config(): theirs to fix, named as such (the CLI's --debug shows where)
        raise ConfigError(f"{path}: its get_config() raised {type(e).__name__}: {e}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"{path}: get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict")
    _speak_babelfeed(config, "")
    config.lock()
    return config


class Config(ml_collections.ConfigDict):
    """The ConfigDict ``load_config`` returns: the same object, whose assignments are refused in babelfeed's words
    (the key's path, the type it takes, its value now) rather than ml_collections' (``4.5 is of original type
    <class 'float'> and cannot be casted to type <class 'int'>``)."""

    def __setitem__(self, key, value):
        try:
            super().__setitem__(key, value)
        except TypeError as e:
            if "cannot be casted" not in str(e):
                raise
            name = self.__dict__.get("_babelfeed_path", "") + str(key)
            current = self._fields[key]
            current = current.get() if isinstance(current, ml_collections.FieldReference) else current
            raise ConfigTypeError(_wrong_type(name, current, value, repr(value))) from None
        except KeyError:
            if key in self._fields or not self.is_locked:
                raise
            name = self.__dict__.get("_babelfeed_path", "") + str(key)
            raise UnknownConfigKey(f"unknown config key {name!r}{_closest(str(key), list(self._fields), 'it')} (the "
                                   f"config is locked, so a misspelt key is refused rather than added; "
                                   f"config.unlock() adds keys of your own)") from None

    def __setstate__(self, state):  # unpickled (a DataLoader worker's copy): the key paths again, from the root
        super().__setstate__(state)
        _speak_babelfeed(self, "")

    def __setattr__(self, attribute, value):
        if attribute.startswith("_babelfeed"):
            object.__setattr__(self, attribute, value)
            return
        try:
            self._ensure_mutability(attribute)
        except KeyError as e:
            raise AttributeError(e) from None
        self[attribute] = value  # UnknownConfigKey is an AttributeError too


def _wrong_type(name: str, current, value, shown: str) -> str:
    """The refusal of ``value`` (given as ``shown``) for the key ``name`` holding ``current``, with the value to
    write where the given one converts to the key's type exactly (``4096.0`` or ``"4096"`` for an integer)."""
    hint = ""
    if isinstance(value, (str, float)) and isinstance(current, (int, float)) and not isinstance(current, bool):
        try:
            converted = type(current)(value)
            hint = f": write {converted!r}" if converted == float(value) else ""
        except ValueError:
            pass
    return f"config key {name!r} takes {_kind_of(current)} (now {current!r}); {shown} is {_kind_of(value)}{hint}"


def _closest(key: str, known: list, where: str) -> str:
    """``; did you mean ...?`` with the known names closest to a misspelt ``key``, else all of ``where``'s."""
    near = difflib.get_close_matches(key, known, n=3)
    if near:
        return f"; did you mean {', '.join(near)}?"
    return f"; {where} has: {', '.join(sorted(known))}" if known else f"; {where} has no keys yet"


def _speak_babelfeed(config: ml_collections.ConfigDict, path: str) -> None:
    """Make every ConfigDict of the tree a :class:`Config` (same fields, same object), knowing its key path."""
    if type(config) is ml_collections.ConfigDict:
        object.__setattr__(config, "__class__", Config)
    if isinstance(config, Config):
        object.__setattr__(config, "_babelfeed_path", path)
    for key, value in config._fields.items():
        if isinstance(value, ml_collections.ConfigDict) and not isinstance(value, ml_collections.FrozenConfigDict):
            _speak_babelfeed(value, f"{path}{key}.")


def translation_section(config: ml_collections.ConfigDict, path: str = "the config"):
    """``(section, where)``: the translation pipeline of a config file and its key path in it. That is the config
    itself for configs/nllb_like.py, its ``train`` section for configs/demo.py (which also holds the corpus,
    binarize and model settings of the demo). A language-model config raises ValueError."""
    if "data_path" in config:
        raise ConfigError(f"{path} is a language-model config (data_path, seq_len, ...); this command takes a "
                          f"translation config such as configs/nllb_like.py")
    if "data" not in config and isinstance(config.get("train"), ml_collections.ConfigDict):
        return config.train, "train"
    return config, ""


def _parse_value(text: str, current):
    """A command-line value in the type of the field it replaces (the same rules as ml_collections.config_flags:
    Python literals, bare strings for string fields, true/false for booleans)."""
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigTypeError(f"{text!r} is not a boolean")
    if isinstance(current, str):
        return text
    if isinstance(current, float) and text.strip().lower() in ("inf", "+inf", "-inf", "nan", "infinity"):
        return float(text)  # (a number the range check then names)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _kind_of(value) -> str:
    if isinstance(value, bool):
        return "True or False"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "text"
    return f"a {type(value).__name__}"


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> ml_collections.ConfigDict:
    """Apply ``["mixing.temperature=2", ...]`` (or ``--config.mixing.temperature=2``) to a locked config.

    An unknown key or a value of the wrong type raises ValueError naming the key (with the closest known
    names for a misspelling).
    """
    for item in overrides or []:
        text = item[len("--config."):] if item.startswith("--config.") else item
        key, sep, raw = text.partition("=")
        if not sep:
            raise ConfigError(f"config override {item!r} must look like key.path=value")
        node = config
        parts = key.split(".")
        for depth, part in enumerate(parts):
            known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            if part not in known:
                where = ".".join(parts[:depth]) or "the config"
                raise ConfigError(f"unknown config key {key!r}: no {part!r} in {where}{_closest(part, known, where)}")
            if depth < len(parts) - 1:
                node = node[part]
        last = parts[-1]
        current = node[last]
        try:
            value = _parse_value(raw, current)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config key {key!r} takes {_kind_of(current)} (now {current!r}); {e}") from None
        try:
            node[last] = value
        except (TypeError, ValueError):  # ml_collections' own wording names its internals: say it plainly
            raise ConfigError(_wrong_type(key, current, value, repr(raw))) from None
    return config


def split_config_args(argv):
    """Separate config overrides from the other arguments of a command line: ``--config.x.y=value``, or absl's
    ``--config.x.y value`` (the next argument is the value, as absl's config_flags take it). Returns the other
    arguments and the overrides, each as ``--config.x.y=value``."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config.") and "=" not in arg:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):  # (a flag is not a value: absl takes it as one)
                raise ConfigError(f"{arg} needs a value: {arg}=VALUE or {arg} VALUE")
            overrides.append(f"{arg}={argv[i + 1]}")
            i += 2
            continue
        (overrides if arg.startswith("--config.") else rest).append(arg)
        i += 1
    return rest, overrides


def task(corpora: str, weight: float = 1.0, transforms: str = "", source_prefix: str = "inherit",
         target_prefix: str = "inherit", kind: str = "translation", text: str = "", spm_model: str = "",
         alpha: float = 0.1, nbest: int = 16) -> ml_collections.ConfigDict:
    """One entry of a config's ``tasks`` section: corpora that get the same treatment.

    ``corpora``: comma-separated directions or monolingual languages (``"all"``: every direction). Two tasks may
    name the same corpus: the files are shared, not copied. ``weight``: the task's share of the mixture (split
    among its corpora by ``mixing.temperature``; a ``mixing.schedule`` overrides it). ``transforms``: source
    noise, e.g. ``"span_mask:ratio=0.3,mask_id=<unk>"``. ``source_prefix``/``target_prefix``: prefix templates
    (``"__bt__ __{src}__"``), ``"inherit"`` takes ``data.source_prefix``/``data.target_prefix``. ``kind``:
    ``"translation"`` or ``"denoise"`` (monolingual corpora, noised source and clean target; needs transforms).
    ``text``: read raw text instead of the data_bin, from this path template (relative to ``data.path``; fields
    ``{split} {key} {src} {tgt} {lang}``, ``{lang}`` being the side's language), segmented at gather time with
    SentencePiece (``spm_model``, default ``DATA/spm.model``): a segmentation drawn among the ``nbest`` best
    with probability ~ ``P^alpha``, anew each time a sentence is used (subword regularisation). Validation reads the same template with the best segmentation.
    """
    given = locals()
    return ml_collections.ConfigDict(dict(task_values(given, f"task({corpora!r})")))

