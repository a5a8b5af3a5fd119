"""babelfeed: a numpy data loader core for many-corpus sequence training.

The core imports numpy (and sentencepiece / ml_collections where needed) only; torch, jax, flax and grain
live in ``babelfeed.adapters``.
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
from .blending import IndexCache, blending_indices, document_splits, parse_data_path, parse_split
from .bins import LengthBinSampler
from .build import build_iterator, build_train_iterator, build_valid_iterator
from .config import load_config
from .corpus import CorpusFile, ShardedCorpus
from .dictionary import Dictionary, lang_token
from .iterator import LoaderIterator
from .lm import LMIterator
from .mixing import sampling_probabilities
from .batches import BatchIterator
from .packing import PackPlan, gpt_sample_index, pack, pack_pairs, pack_sentences
from .shapes import ShapePlan, plan_shapes
from .storage import IndexedDataset, IndexedDatasetBuilder, convert_index, dataset_exists, dtype_for_vocab

__version__ = "0.1.0"

__all__ = [
    "BatchIterator",
    "LoaderIterator",
    "build_iterator",
    "build_train_iterator",
    "build_valid_iterator",
    "load_config",
    "sampling_probabilities",
    "plan_shapes",
    "LMIterator",
    "LengthBinSampler",
    "pack",
    "pack_pairs",
    "pack_sentences",
    "gpt_sample_index",
    "PackPlan",
    "blending_indices",
    "parse_data_path",
    "parse_split",
    "document_splits",
    "IndexCache",
    "ShapePlan",
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
