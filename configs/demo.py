"""Settings of `make demo` (`babelfeed demo --config configs/demo.py`)."""

import ml_collections


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
    return c
