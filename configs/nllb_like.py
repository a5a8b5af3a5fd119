"""An NLLB-style multilingual training setup: every direction of a data_bin, temperature 5, shard cycling.

    it = babelfeed.build_train_iterator(babelfeed.load_config("configs/nllb_like.py"), rank=0, world_size=8)
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 1  # every draw, order and shuffle derives from it (fairseq mode: its --seed)
    c.compat = "none"  # "fairseq": the batches of fairseq's translation_multi_simple_epoch (docs/concepts/pipeline.md)

    c.data = ml_collections.ConfigDict()
    c.data.path = "build/demo/data_bin"  # a data_bin (shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx})
    c.data.train_split = "train"
    c.data.valid_split = "valid"
    c.data.directions = "all"  # "all" or a comma-separated list such as "eng_Latn-deu_Latn,eng_Latn-fra_Latn"
    c.data.monolingual = ""  # monolingual languages to add as (x, x) pairs, comma-separated
    c.data.shards = "cycle"  # "cycle": epoch e reads shard (e-1) % k of each direction (Open-NLLB); "all"
    c.data.source_prefix = "__{src}__"  # tokens put before every source (NLLB: the source language token)
    c.data.target_prefix = "__{tgt}__"  # and before every target
    c.data.prefix_overrides = ""  # "direction:side=tokens;..." e.g. "eng_Latn-deu_Latn:source=__bt__ __{src}__"
    c.data.verify = "full"  # every pointer checked once per file (remembered by a stamp); "quick": O(1) only
    c.data.noise = ""  # source noise for every train task, e.g. "token_drop:rate=0.1;local_reorder:k=3"
    c.data.noise_by_task = ""  # per task: "eng_Latn=span_mask:ratio=0.3,mask_id=<unk>|eng_Latn-deu_Latn=..."
    c.data.cache_dir = ""  # computed indexes (raw-text line offsets, lengths); "": DATA/.babelfeed-cache
    c.data.length_cache_mb = 512  # in-memory copies of sentence lengths for fast planning (0: off)
    # data.path may be an object store's folder ("s3://bucket/data_bin", gs://, az://); what is empty here comes
    # from the environment as for every S3 tool (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_ALLOW_HTTP)
    c.data.storage = ml_collections.ConfigDict()
    c.data.storage.endpoint = ""  # e.g. "http://minio.lan:9000"
    c.data.storage.region = ""
    c.data.storage.profile = ""  # a profile of ~/.aws/config (needs boto3)
    c.data.storage.allow_http = False  # plain-http endpoints (a store on the LAN or the loopback)

    c.filter = ml_collections.ConfigDict()
    c.filter.max_source_positions = 1024  # prefixes and </s> included
    c.filter.max_target_positions = 1024
    c.filter.on_too_long = "skip"  # train: "skip" (counted, reported) or "raise"
    c.filter.on_too_long_valid = "raise"  # validation must see every sample

    c.mixing = ml_collections.ConfigDict()
    c.mixing.method = "temperature"  # "temperature" | "uniform" | "weights" | "unimax" (uniform, capped)
    c.mixing.temperature = 5.0  # p_i ~ n_i^(1/T)
    # no corpus served more than this many times its size in an epoch, the excess shared by the others (0: no cap;
    # "unimax" needs it: UniMax's N, epochs per corpus)
    c.mixing.max_upsample = 0.0
    c.mixing.warn_upsample = 10.0  # a warning names every direction served more than this many times its data
    c.mixing.weights = ""  # method="weights": "eng_Latn-deu_Latn:0.5,eng_Latn-fra_Latn:0.3,..."
    # "auto": "stream" with a changing schedule, else "stratified" | "stratified" (per-epoch draw) | "stream"
    # (every corpus cycles its own data, positions kept across epochs) | "fairseq" (its exact draw) | "concat"
    c.mixing.sampler = "auto"
    c.mixing.virtual_size = "fairseq"  # "fairseq" (largest corpus keeps its size, cap 1.5x) | "sum" | "<int>"
    c.mixing.max_scale_up = 1.5
    c.mixing.probabilities_from = "total"  # sizes over all shards ("total") or the epoch's shard ("shard");
    # compat="fairseq" with cycled shards: fairseq's estimate (an unread shard counts as the largest read so far)
    # Per-task weights that change during training (OpenNMT-py's mixing_weight_schedule). Boundaries count
    # optimizer updates (batching.accumulation and the number of ranks are accounted for); n boundaries take
    # n + 1 weight lists "task:w,task:w | task:w,task:w | ...", each naming every task (without a tasks
    # section, every direction is a task of its own). mode "step" switches at each boundary, "linear"
    # interpolates between them (weights are set per planning window).
    c.mixing.schedule = ml_collections.ConfigDict()
    c.mixing.schedule.boundaries = ""  # e.g. "40000,80000"
    c.mixing.schedule.weights = ""  # e.g. "mt:1,denoise:0.5 | mt:1,denoise:0.2 | mt:1,denoise:0"
    c.mixing.schedule.mode = "step"  # "step" | "linear"

    # Tasks group corpora that get the same treatment (prefix, transforms, weight); empty: every direction and
    # monolingual language above is a task of its own. Entries are babelfeed.config.task(...) (see its docstring):
    #   c.tasks.mt = task(corpora="eng_Latn-deu_Latn,eng_Latn-fra_Latn", weight=1.0)
    #   c.tasks.bt = task(corpora="eng_Latn-deu_Latn", weight=0.3, source_prefix="__bt__ __{src}__")
    #   c.tasks.dae = task(corpora="swh_Latn", kind="denoise", transforms="span_mask:ratio=0.3,mask_id=<unk>")
    c.tasks = ml_collections.ConfigDict()

    c.batching = ml_collections.ConfigDict()
    c.batching.max_tokens = 4096  # B * max(len) of the longer side, per batch
    c.batching.max_sentences = 0  # 0: no limit
    c.batching.required_batch_size_multiple = 8
    c.batching.accumulation = 1  # forward passes per optimizer update on each rank (for the mixing schedule)
    c.batching.window = 1_000_000  # samples planned at once (memory bound); 0: the whole epoch
    c.batching.num_shapes = 0  # > 0: every batch takes one of this many static shapes (XLA), chosen from the data
    c.batching.shapes = ""  # or explicit widths "32x32,64x64,128x128" (source x target); batch sizes from max_tokens
    c.batching.pack = ""  # "256x256": pack pairs side by side into rows of this shape (one static shape)
    c.batching.spread_copies = True  # copies of one sample (an up-sampled corpus) go to different batches
    c.batching.max_repeats = 0.04  # dynamic batches: ~rows left beside a copy where parting costs most padding
    c.batching.balance_block = 16  # batches of similar cost shuffled together (rank balance; use >= ranks)
    c.batching.fairseq_drop_last = False  # compat="fairseq": drop a last batch off the multiple (fairseq main)

    c.collate = ml_collections.ConfigDict()
    c.collate.left_pad_source = True
    c.collate.left_pad_target = False
    c.collate.pad_to_multiple = 1
    c.collate.dtype = "int64"
    return c
