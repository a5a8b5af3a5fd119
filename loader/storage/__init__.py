"""Token storage: fairseq/Megatron ``.idx``/``.bin`` readers and writers."""

from .builder import FORMATS, IndexedDatasetBuilder, convert_index
from .dtypes import code_for, dtype_for_vocab
from .indexed import IndexedDataset, dataset_exists, data_path, index_path

__all__ = [
    "FORMATS",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "code_for",
    "convert_index",
    "data_path",
    "dataset_exists",
    "dtype_for_vocab",
    "index_path",
]
