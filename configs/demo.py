"""Settings of `make demo` (`babelfeed demo --config configs/demo.py`)."""

import importlib.util
import os

import ml_collections


def _nllb_like() -> ml_collections.ConfigDict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nllb_like.py")
    spec = importlib.util.spec_from_file_location("babelfeed_nllb_like", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.workdir = "build/demo"
    c.seed = 1234

    c.corpus = ml_collections.ConfigDict()
    c.corpus.scale = 1.0  # 1.0: 30,000 / 8,000 / 2,000 / 250 train pairs out of English

    c.binarize = ml_collections.ConfigDict()
    c.binarize.train_spm = 4000  # SentencePiece vocabulary
    c.binarize.shards = 2
    c.binarize.max_len = 256  # tokens per sentence, </s> included
    c.binarize.format = "fairseq"
    c.binarize.workers = 0  # 0: every core

    # The training pipeline streamed over one epoch: configs/nllb_like.py with demo-sized limits.
    c.train = _nllb_like()
    c.train.data.path = os.path.join(c.workdir, "data_bin")
    c.train.batching.max_tokens = 4096
    c.train.filter.max_source_positions = 128  # the longest demo sentences are filtered out and counted
    c.train.filter.max_target_positions = 128
    c.train.filter.on_too_long_valid = "skip"

    # The model `make demo` trains (examples/flax_train.py) on the same pipeline with static shapes.
    c.model = ml_collections.ConfigDict()
    c.model.d_model = 128
    c.model.heads = 4
    c.model.layers = 2
    c.model.ff = 512
    c.model.max_len = 256
    c.model.learning_rate = 2e-3
    c.model.steps = 300
    c.model.max_tokens = 2048  # smaller batches for the CPU
    c.model.num_shapes = 4
    return c
