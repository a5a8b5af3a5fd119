"""binarize throughput: sentences/s per core, against a per-sentence loop measured in the same run.

The baseline is what a straightforward binarizer does (fairseq's Binarizer works this way): for every line,
encode it with SentencePiece, look every piece up in the dictionary, append EOS, and add_item it. Ours
encodes chunks of lines in one call per chunk and maps ids through a lookup table with numpy, in worker
processes. Both start from the same raw demo corpus and the same SentencePiece model.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402


def baseline(raw_dir: str, out_dir: str, model: str) -> tuple[int, float]:
    import sentencepiece as spm

    import babelfeed
    from babelfeed.preprocess.rawtext import discover

    sp = spm.SentencePieceProcessor(model_file=model)
    d = babelfeed.Dictionary()
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            d.add_symbol(sp.id_to_piece(i))
    os.makedirs(out_dir, exist_ok=True)
    inputs, _ = discover(raw_dir)
    n = 0
    t = time.perf_counter()
    for inp in inputs:
        for lang, path in zip(inp.langs, inp.paths):
            b = babelfeed.IndexedDatasetBuilder(os.path.join(out_dir, f"{inp.split}.{inp.key}.{lang}"), np.uint16,
                                             format="fairseq")
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    pieces = sp.encode(line.rstrip("\n"), out_type=str)
                    b.add_item([d.index(p) for p in pieces] + [d.eos()])
                    n += 1
            b.finalize()
    return n, time.perf_counter() - t


def ours(raw_dir: str, out_dir: str, model: str, workers: int) -> tuple[int, float, float]:
    from babelfeed.preprocess.binarize import BinarizeOptions, binarize

    shutil.rmtree(out_dir, ignore_errors=True)
    t = time.perf_counter()
    report = binarize(BinarizeOptions(input_dir=raw_dir, output_dir=out_dir, spm_model=model, workers=workers,
                                      shards=1, progress=False, max_len=100000), log=lambda m: None)
    elapsed = time.perf_counter() - t
    sentences = sum(e["lines"] * (2 if "-" in e["key"] else 1) for e in report["inputs"])  # both sides count
    return sentences, elapsed, report["seconds"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=10.0, help="demo corpus scale (1.0 = 43.8k lines)")
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    from babelfeed.preprocess.binarize import BinarizeOptions, binarize
    from babelfeed.tools.demo import build_corpus

    raw = os.path.join(a.workdir, f"raw-{a.scale}")
    build_corpus(raw, scale=a.scale)
    model_dir = os.path.join(a.workdir, f"spm-{a.scale}")
    model = os.path.join(model_dir, "spm.model")
    if not os.path.exists(model):
        binarize(BinarizeOptions(input_dir=raw, output_dir=model_dir, train_spm=4000, progress=False,
                                 max_len=100000), log=lambda m: None)
    n_base, t_base = baseline(raw, os.path.join(a.workdir, "bz-baseline"), model)
    rows = [["per-sentence loop, 1 process (baseline)", f"{n_base:,}", f"{t_base:.2f} s", f"{n_base / t_base:,.0f}",
             f"{n_base / t_base:,.0f}", "1.0x"]]
    cores = os.cpu_count() or 1
    for workers in sorted({1, cores}):
        n, t, _ = ours(raw, os.path.join(a.workdir, f"bz-ours-{workers}"), model, workers)
        rows.append([f"babelfeed binarize, {workers} worker(s)", f"{n:,}", f"{t:.2f} s", f"{n / t:,.0f}",
                     f"{n / t / workers:,.0f}", f"{(n / t) / (n_base / t_base):.1f}x"])
    text = f"# binarize: demo corpus at scale {a.scale} (SentencePiece unigram 4000, {cores} cores)" + table(
        "sentences/s (wall time, includes pool start-up, merge and fsync)", rows,
        ["binarizer", "sentences", "time", "sentences/s", "per core", "vs baseline"])
    print(text)
    return text


if __name__ == "__main__":
    main()
