"""babelfeed: a numpy data loader core for many-corpus sequence training.

The core imports numpy (and sentencepiece / ml_collections where needed) only; torch, jax, flax and grain
live in ``babelfeed.adapters``. The layers, bottom to top, are packages: ``storage``, ``sources``, ``plan``,
``gather``, ``iterators``, ``lm``, ``config``, then ``build`` and ``tools`` (``preprocess`` beside them); see
docs/concepts/architecture.md.
"""

__all__ = [
    "BabelfeedError",
    "UsageError",
    "UsageTypeError",
    "OutOfRange",
    "CallOrderError",
    "ConfigError",
    "ConfigTypeError",
    "UnknownConfigKey",
    "DataError",
    "TextInputError",
    "BinarizeError",
    "StateError",
    "StateMismatch",
    "HistoryError",
    "SkipError",
    "StoreError",
    "WorkerDied",
    "MissingExtraError",
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
    "DataChangedError",
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
    "Timed",
    "reduce_over_ranks",
    "SpikeGuard",
    "ExponentiatedGradient",
]

from babelfeed.errors import (BabelfeedError, BadMagicError, BinarizeError, CallOrderError, ConfigError,
                             ConfigTypeError, DataChangedError, DataError, FormatError, HistoryError,
                             InconsistentIndexError, MissingExtraError, OutOfRange, SideMismatchError, SkipError,
                             StateError, StateMismatch, StoreError, TextInputError, TruncatedFileError,
                             UnknownConfigKey, UnknownDtypeError, UnsupportedDtypeError, UnsupportedVersionError,
                             UsageError, UsageTypeError, WorkerDied)
from babelfeed.lm.blending import IndexCache, blending_indices, document_splits, parse_data_path, parse_split
from babelfeed.plan.bins import LengthBinSampler
from babelfeed.build import build_iterator, build_train_iterator, build_valid_iterator
from babelfeed.config.files import load_config
from babelfeed.sources.corpus import CorpusFile, ShardedCorpus
from babelfeed.sources.dictionary import Dictionary, lang_token
from babelfeed.iterators.protocol import LoaderIterator
from babelfeed.lm.iterator import LMIterator
from babelfeed.plan.mixing import sampling_probabilities
from babelfeed.iterators.translation import BatchIterator
from babelfeed.iterators.telemetry import Timed, reduce_over_ranks
from babelfeed.iterators.policy import ExponentiatedGradient, SpikeGuard
from babelfeed.plan.packing import PackPlan, gpt_sample_index, pack, pack_pairs, pack_sentences
from babelfeed.plan.shapes import ShapePlan, plan_shapes
from babelfeed.storage import IndexedDataset, IndexedDatasetBuilder, convert_index, dataset_exists, dtype_for_vocab

__version__ = "0.1.0"
