"""babelfeed: a numpy data loader core for many-corpus sequence training.

The core imports numpy (and sentencepiece / ml_collections where needed) only; torch, jax, flax and grain
live in ``babelfeed.adapters``. The layers, bottom to top, are packages: ``storage``, ``sources``, ``plan``,
``gather``, ``iterators``, ``lm``, ``config``, then ``build`` and ``tools`` (``preprocess`` beside them); see
docs/concepts/architecture.md.
"""

import importlib

from babelfeed import _compat

# Modules that moved into the layer packages (babelfeed.batches is babelfeed.iterators.translation, ...): their
# old names still import, as the same module objects (a monkeypatch through either name is seen by both).
MOVED = {
    "batches": "iterators.translation",
    "batching": "plan.batching",
    "binarize": "preprocess.binarize",
    "binarize_options": "preprocess.options",
    "bins": "plan.bins",
    "blending": "lm.blending",
    "collate": "gather.collate",
    "corpus": "sources.corpus",
    "cutting": "plan.cutting",
    "demo": "tools.demo",
    "dictionary": "sources.dictionary",
    "documents": "preprocess.documents",
    "edits": "run.edits",
    "engines": "preprocess.engines",
    "hf": "gather.hf",
    "iterator": "iterators.protocol",
    "ledger": "iterators.ledger",
    "lm_plan": "lm.plan",
    "mixing": "plan.mixing",
    "packing": "plan.packing",
    "plan_kernel": "_native.plan_kernel",
    "plan_options": "plan.options",
    "plan_report": "tools.plan_report",
    "plan_stream": "plan.stream",
    "plots": "tools.plots",
    "policy": "iterators.policy",
    "position": "iterators.position",
    "prefetch": "iterators.prefetch",
    "preview": "tools.preview",
    "rawtext": "preprocess.rawtext",
    "replay": "iterators.replay",
    "reports": "iterators.reports",
    "rows": "sources.rows",
    "samples": "plan.samples",
    "schedule": "plan.schedule",
    "shape_boxes": "plan.shape_boxes",
    "shapes": "plan.shapes",
    "state": "iterators.state",
    "stats": "tools.stats",
    "subword": "sources.subword",
    "textio": "preprocess.textio",
    "transfer": "gather.transfer",
    'transforms': 'gather.transforms'
}


_compat.install(MOVED)


def __getattr__(name: str):
    """``babelfeed.<old module name>`` as an attribute (``babelfeed.rows.LengthCache``), imported when asked."""
    if name in MOVED:
        return importlib.import_module(f"babelfeed.{name}")
    raise AttributeError(f"module 'babelfeed' has no attribute {name!r}")

__all__ = [
    "BabelfeedError",
    "ConfigError",
    "StateError",
    "StateMismatch",
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
]

from babelfeed.errors import (BabelfeedError, ConfigError, BadMagicError, DataChangedError, FormatError, InconsistentIndexError, SideMismatchError, TruncatedFileError,
    UnknownDtypeError, UnsupportedDtypeError, UnsupportedVersionError)
from babelfeed.lm.blending import IndexCache, blending_indices, document_splits, parse_data_path, parse_split
from babelfeed.plan.bins import LengthBinSampler
from babelfeed.build import build_iterator, build_train_iterator, build_valid_iterator
from babelfeed.config.files import load_config
from babelfeed.sources.corpus import CorpusFile, ShardedCorpus
from babelfeed.sources.dictionary import Dictionary, lang_token
from babelfeed.iterators.protocol import LoaderIterator, StateMismatch
from babelfeed.iterators.state import StateError
from babelfeed.lm.iterator import LMIterator
from babelfeed.plan.mixing import sampling_probabilities
from babelfeed.iterators.translation import BatchIterator
from babelfeed.iterators.telemetry import Timed
from babelfeed.plan.packing import PackPlan, gpt_sample_index, pack, pack_pairs, pack_sentences
from babelfeed.plan.shapes import ShapePlan, plan_shapes
from babelfeed.storage import IndexedDataset, IndexedDatasetBuilder, convert_index, dataset_exists, dtype_for_vocab

__version__ = "0.1.0"
