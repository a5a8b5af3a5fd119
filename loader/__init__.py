"""babelfeed: a numpy data loader core for many-corpus sequence training.

The core imports numpy (and sentencepiece / ml_collections where needed) only; torch, jax, flax and grain
live in ``loader.adapters``.
"""

from .errors import (
    BadMagicError,
    FormatError,
    InconsistentIndexError,
    SideMismatchError,
    TruncatedFileError,
    UnknownDtypeError,
    UnsupportedDtypeError,
    UnsupportedVersionError,
)
from .corpus import CorpusFile, ShardedCorpus
from .dictionary import Dictionary, lang_token
from .storage import IndexedDataset, IndexedDatasetBuilder, convert_index, dataset_exists, dtype_for_vocab

__version__ = "0.1.0"

__all__ = [
    "CorpusFile",
    "Dictionary",
    "ShardedCorpus",
    "lang_token",
    "BadMagicError",
    "FormatError",
    "InconsistentIndexError",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "SideMismatchError",
    "TruncatedFileError",
    "UnknownDtypeError",
    "UnsupportedDtypeError",
    "UnsupportedVersionError",
    "convert_index",
    "dataset_exists",
    "dtype_for_vocab",
]
