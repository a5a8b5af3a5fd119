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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402

_SAMPLER = None


def _init(model, dict_path):
    global _SAMPLER
    import loader
    from loader.subword import SubwordSampler

    _SAMPLER = SubwordSampler(model, loader.Dictionary.load(dict_path), alpha=0.1, seed=1)


def _work(chunk):
    lines, start = chunk
    import numpy as np

    return len(_SAMPLER(lines, np.arange(start, start + len(lines)), epoch=1).lengths)


def main(argv=None) -> str:
    import numpy as np

    import loader
    from loader.subword import RawText, SubwordSampler

    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=40000)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    data = os.path.join(a.workdir, "subword")
    model, dict_path = os.path.join(data, "bin", "spm.model"), os.path.join(data, "bin", "dict.txt")
    if not os.path.exists(model):
        from loader.binarize import BinarizeOptions, binarize
        from loader.demo import build_corpus

        build_corpus(os.path.join(data, "raw"), scale=0.5)
        binarize(BinarizeOptions(input_dir=os.path.join(data, "raw"), output_dir=os.path.join(data, "bin"),
                                 train_spm=4000, progress=False), log=lambda m: None)
    text = RawText(os.path.join(data, "raw", "eng_Latn-deu_Latn.eng_Latn"))
    n = min(a.sentences, len(text))
    lines = text.lines(np.arange(n))
    sampler = SubwordSampler(model, loader.Dictionary.load(dict_path), alpha=0.1, seed=1)
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
    print(text_out)
    return text_out


if __name__ == "__main__":
    main()
