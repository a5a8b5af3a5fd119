"""Language-model pretraining on Megatron-style data: blended datasets, document splits, packed rows.

    it = babelfeed.build_iterator(babelfeed.load_config("configs/lm_packing.py"), rank=r, world_size=w)
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 1
    c.data_path = "0.3 data/web 0.7 data/books"  # weights and .idx/.bin prefixes, Megatron's --data-path syntax
    c.blend = "weights"  # "weights": data_path's; "unimax": uniform over the datasets, each capped (max_upsample)
    c.max_upsample = 0.0  # no dataset served more than this many epochs of its tokens (0: no cap; unimax needs it)
    c.warn_upsample = 10.0  # babelfeed plan warns of a dataset served more than this many epochs of its tokens (0: off)
    c.split = "969,30,1"  # train/valid/test by documents
    c.split_name = "train"
    c.mode = "pack"  # "pack": whole documents in rows with segment ids; "concat": Megatron's GPT slicing;
    #                  "sentences": BERT-style
    c.seq_len = 2048
    c.global_batch = 512  # samples per step over all ranks
    c.num_samples = 512 * 10_000  # train_iters x global_batch
    c.vocab_size = 0  # the tokenizer's vocabulary: every token id must be below it (0: unchecked)
    c.verify = "full"  # every index checked once per file (remembered by a stamp); "quick": O(1) record checks, documents whole
    c.cache_dir = "build/cache"  # blend and sample indexes (.npy, keyed by a hash of their inputs)
    # data_path prefixes may be in an object store ("0.3 s3://bucket/web 0.7 s3://bucket/books"); what is empty
    # here comes from the environment (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_ALLOW_HTTP)
    c.storage = ml_collections.ConfigDict()
    c.storage.endpoint = ""
    c.storage.region = ""
    c.storage.profile = ""
    c.storage.allow_http = False
    return c
