"""SentencePiece sampling throughput: in-process and in 1 or 2 worker processes, against plain encoding.

Sentences/s for the demo corpus's English side with the demo's SentencePiece model (build it with `make demo`
or it is built here at scale 0.5).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402

_SAMPLER = None


def _init(model, dict_path):
    global _SAMPLER
    import babelfeed
    from babelfeed.sources.subword import SubwordSampler

    _SAMPLER = SubwordSampler(model, babelfeed.Dictionary.load(dict_path), alpha=0.1, seed=1)


def _work(chunk):
    lines, start = chunk
    import numpy as np

    return len(_SAMPLER(lines, np.arange(start, start + len(lines)), epoch=1).lengths)


def main(argv=None) -> str:
    import numpy as np

    import babelfeed
    from babelfeed.sources.subword import RawText, SubwordSampler

    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=40000)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args(argv)
    data = os.path.join(a.workdir, "subword")
    model, dict_path = os.path.join(data, "bin", "spm.model"), os.path.join(data, "bin", "dict.txt")
    if not os.path.exists(model):
        from babelfeed.preprocess.binarize import BinarizeOptions, binarize
        from babelfeed.tools.demo import build_corpus

        build_corpus(os.path.join(data, "raw"), scale=0.5)
        binarize(BinarizeOptions(input_dir=os.path.join(data, "raw"), output_dir=os.path.join(data, "bin"),
                                 train_spm=4000, progress=False), log=lambda m: None)
    text = RawText(os.path.join(data, "raw", "eng_Latn-deu_Latn.eng_Latn"))
    n = min(a.sentences, len(text))
    lines = text.lines(np.arange(n))
    sampler = SubwordSampler(model, babelfeed.Dictionary.load(dict_path), alpha=0.1, seed=1)
    rows = []
    t = time.perf_counter()
    sampler.deterministic(lines)
    base = n / (time.perf_counter() - t)
    rows.append(["plain encoding, this process (baseline)", f"{base:,.0f}", "1.00x"])
    t = time.perf_counter()
    sampler(lines, np.arange(n), epoch=1)
    rate = n / (time.perf_counter() - t)
    rows.append(["sampled (alpha 0.1), this process", f"{rate:,.0f}", f"{rate / base:.2f}x"])
    chunks = [(lines[i:i + 2000], i) for i in range(0, n, 2000)]
    for workers in (1, 2):
        with mp.get_context("spawn").Pool(workers, initializer=_init, initargs=(model, dict_path)) as pool:
            pool.map(_work, chunks[:workers])  # start-up outside the timing
            t = time.perf_counter()
            done = sum(pool.imap(_work, chunks))
            rate = done / (time.perf_counter() - t)
        rows.append([f"sampled, {workers} worker process(es)", f"{rate:,.0f}", f"{rate / base:.2f}x"])
    text_out = "# subword sampling" + table(f"sentences/s over {n:,} English demo sentences ({os.cpu_count()} cores)",
                                            rows, ["segmentation", "sentences/s", "vs plain"])
    text_out += pipeline(data, a.epochs)
    print(text_out)
    return text_out


def _tokens(batch) -> int:
    w = np.asarray(batch["weight"]) > 0
    return int(np.asarray(batch["net_input"]["src_lengths"])[w].sum()) + int(batch["ntokens"])


def _pipeline_config(data: str, raw: bool):
    import babelfeed
    from babelfeed.config.files import task

    cfg = babelfeed.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                          "nllb_like.py"))
    cfg.data.path = os.path.join(data, "bin")
    cfg.data.shards = "all"
    cfg.mixing.sampler = "concat"
    cfg.batching.max_tokens = 8192
    cfg.filter.max_source_positions = cfg.filter.max_target_positions = 512
    with cfg.unlocked():
        cfg.tasks.mt = task("eng_Latn-deu_Latn", text="../raw/{key}.{lang}" if raw else "", alpha=0.1, nbest=16)
    return cfg


def pipeline(data: str, epochs: int) -> str:
    """Real tokens/s of whole training batches: binarized data in this process (baseline), raw text with
    SentencePiece sampling in this process, and through a torch DataLoader with 1 and 2 worker processes."""
    import babelfeed

    rows = []

    def timed(make_batches, label, base=None):
        """Steady state: the clock starts at each epoch's first batch (process start-up and planning excluded)."""
        toks, secs = 0, 0.0
        for e in range(1, 1 + epochs):
            it = iter(make_batches(e))
            next(it)
            t = time.perf_counter()
            toks += sum(_tokens(b) for b in it)
            secs += time.perf_counter() - t
        rate = toks / secs
        rows.append([label, f"{rate / 1e6:.2f}M", f"{rate / (base or rate):.3f}x"])
        return rate

    def in_process(raw):
        cfg = _pipeline_config(data, raw)
        return lambda e: babelfeed.build_train_iterator(cfg, epoch=e)

    base = timed(in_process(False), "binarized, this process (baseline)")
    timed(in_process(True), "raw text + sampling, this process", base)
    try:
        import torch
        from babelfeed.adapters.torch import BatchDataset
    except ImportError:
        rows.append(["raw text + sampling, DataLoader workers", "torch not installed", "-"])
    else:
        for workers in (1, 2):
            cfg = _pipeline_config(data, True)

            def loaded(e, cfg=cfg, workers=workers):
                ds = BatchDataset(cfg, epoch=e, rank=0, world_size=1, num_workers=workers, tensors=False)
                return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                                   multiprocessing_context="spawn")
            timed(loaded, f"raw text + sampling, {workers} DataLoader worker(s)", base)
    return table(f"whole pipeline, eng_Latn-deu_Latn, {epochs} epoch(s), real tokens/s ({os.cpu_count()} cores)",
                 rows, ["batches from", "tokens/s", "vs baseline"])


if __name__ == "__main__":
    main()
