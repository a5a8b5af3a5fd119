"""The language-model config's keys (configs/lm_packing.py), declared by the part that reads them: each a
:class:`~babelfeed.checks.Key` with the parser of its mini-language (Megatron's ``--data-path`` and ``--split``).
``babelfeed.config.spec`` puts them in the LM key table (with the seed and the storage keys); ``LMIterator.build``
checks its arguments with them, so the Python API and a config refuse the same values in the same words.
"""

from __future__ import annotations

import numpy as np

from babelfeed.checks import Key
from babelfeed.errors import ConfigError
from babelfeed.lm.blending import parse_data_path, parse_split
from babelfeed.lm.plan import MODES
from babelfeed.plan.mixing import capped_probabilities
from babelfeed.storage.indexed import VERIFY_MODES


def data_path(name: str, value) -> list[tuple[float, str]]:
    """Megatron's ``--data-path``: ``"0.3 PREFIX 0.7 PREFIX"`` (or prefixes alone, weight 1 each) -> the
    (weight, prefix) pairs; a prefix named twice is refused."""
    pairs = parse_data_path(value, name)
    prefixes = [p for _, p in pairs]
    twice = sorted({p for p in prefixes if prefixes.count(p) > 1})
    if twice:
        raise ConfigError(f"{name} names {twice[0]!r} twice: give each prefix once, with its whole weight")
    return pairs


def split(name: str, value) -> str:
    """Megatron's ``--split``: one to three shares (``"969,30,1"``), checked; the text is kept (it keys caches)."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be text such as '969,30,1', got {value!r}")
    parse_split(value)
    return value


def blend_weights(weights, sizes, num_samples: int, blend: str = "weights", max_upsample: float = 0.0) -> list:
    """The blend's weights: ``data_path``'s (``blend="weights"``) or uniform (``"unimax"``), with no dataset
    expected to serve more than ``max_upsample`` epochs of its data (``sizes``: its samples in one epoch, its
    tokens over ``seq_len``) in ``num_samples``; the excess goes to the others in proportion (UniMax for the uniform
    blend). A cap that cannot fill ``num_samples`` is refused, naming both."""
    if blend == "unimax":
        if not max_upsample > 0:
            raise ConfigError("blend='unimax' spreads the samples uniformly over the datasets, each capped at "
                              "max_upsample epochs of its tokens: set max_upsample (e.g. 4; UniMax's N)")
        weights = [1.0 if w > 0 else 0.0 for w in weights]
    if not max_upsample:
        return list(weights)
    sizes = np.asarray(sizes, np.float64)
    live = np.asarray(weights, np.float64) > 0
    most = float(sizes[live].sum() * max_upsample)
    if most < num_samples:
        epochs = f"{max_upsample:g} epoch" + ("" if max_upsample == 1 else "s")
        raise ConfigError(f"max_upsample={max_upsample:g} lets the datasets serve {int(most):,} samples at most "
                          f"({epochs} of each), fewer than num_samples={num_samples:,}: raise max_upsample or lower "
                          f"num_samples")
    return capped_probabilities(np.asarray(weights, np.float64), sizes, num_samples, max_upsample).tolist()


KEYS: tuple[Key, ...] = (
    Key("data_path", "str", "0.3 data/web 0.7 data/books", "weights and .idx/.bin prefixes (Megatron's --data-path)",
        nonempty=True, parse=data_path),
    Key("blend", "str", "weights", "'weights': data_path's weights; 'unimax': the budget spread uniformly over the "
        "datasets, each capped at max_upsample epochs (UniMax)", choices=("weights", "unimax")),
    Key("max_upsample", "float", 0.0, "no dataset served more than this many epochs of its tokens, the excess to the "
        "others (0: no cap; blend='unimax' needs it)", 0),
    Key("split", "str", "969,30,1", "train/valid/test shares, by documents ('969,30,1' or '969/30/1')",
        nonempty=True, parse=split),
    Key("split_name", "str", "train", "the split served", choices=("train", "valid", "test")),
    Key("mode", "str", "pack", "'pack': whole documents in rows with segment ids; 'concat': Megatron's GPT slicing; "
        "'sentences': BERT-style", choices=MODES),
    Key("seq_len", "int", 2048, "tokens per row", 1, 2**20),
    Key("global_batch", "int", 512, "samples per step over all ranks", 1, 2**24),
    Key("num_samples", "int", 512 * 10_000, "samples of the run (train_iters x global_batch)", 1, 2**33),
    Key("vocab_size", "int", 0, "the tokenizer's vocabulary: every token id must be below it (0: unchecked)", 0,
        2**32),
    Key("verify", "str", "full", "'full': every index checked once per file; 'quick': O(1) checks of the records, "
        "the document index whole",
        choices=VERIFY_MODES),
    Key("cache_dir", "str", "build/cache", "blend and sample indexes (.npy, keyed by a hash of their inputs)"),
    Key("warn_upsample", "float", 10.0, "babelfeed plan warns of every dataset served more than this many epochs of "
        "its tokens (0: off)", 0.0),
)

BY_PATH = {k.path: k for k in KEYS}
