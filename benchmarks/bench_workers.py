"""Worker processes: the same batches gathered in-process, by 1 worker and by 2 workers.

Through the adapters as a training script uses them: torch's ``DataLoader(BatchDataset(config),
batch_size=None, num_workers=N)`` and grain's ``batch_dataset(config, num_workers=N)`` (``mp_prefetch``), for
a translation config (16k-token batches on 1.2M sentence pairs) and an LM config ([64, 2048] pack batches).
Each row consumes the same batches and reports batches/s after the workers have started; the ratio that
matters on this 2-core machine is 2 workers against 1 (the consuming process takes its share of the cores too).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mt_config(workdir: str):
    import babelfeed
    import many_data

    root = many_data.build(os.path.join(workdir, "many", "4"), 4)
    cfg = babelfeed.load_config(os.path.join(REPO, "configs", "nllb_like.py"))
    cfg.data.path = root
    cfg.mixing.temperature = 1.0
    cfg.batching.max_tokens = 16384
    cfg.filter.max_source_positions = cfg.filter.max_target_positions = 256
    return cfg


def lm_config(workdir: str, batches: int):
    import bench_lm
    import babelfeed

    root = bench_lm.build_data(os.path.join(workdir, "lm"))
    cfg = babelfeed.load_config(os.path.join(REPO, "configs", "lm_packing.py"))
    cfg.data_path = f"0.6 {root}/web 0.4 {root}/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 2048, 64, 64 * batches
    cfg.split, cfg.mode, cfg.cache_dir = "100,0,0", "pack", os.path.join(root, "cache")
    return cfg


def rate(batches, skip: int, count: int) -> float:
    """Batches/s over ``count`` batches after the first ``skip`` (worker start-up and first windows)."""
    it = iter(batches)
    for _ in range(skip):
        next(it)
    t = time.perf_counter()
    n = 0
    for _ in it:
        n += 1
        if n == count:
            break
    return n / (time.perf_counter() - t)


def torch_rate(cfg, workers: int, skip: int, count: int) -> float:
    import torch

    from babelfeed.adapters.torch import BatchDataset

    dl = torch.utils.data.DataLoader(BatchDataset(cfg), batch_size=None, num_workers=workers,
                                     multiprocessing_context="fork" if workers else None, prefetch_factor=4 if workers else None)
    return rate(dl, skip, count)


def grain_rate(cfg, workers: int, skip: int, count: int) -> float:
    from babelfeed.adapters import grain as grain_adapter

    return rate(grain_adapter.batch_dataset(cfg, num_workers=workers, per_worker_buffer_size=4), skip, count)


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    p.add_argument("--batches", type=int, default=600)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = []
    for name, cfg, count in (("translation, 16k tokens", mt_config(a.workdir), a.batches),
                             ("LM pack, [64, 2048]", lm_config(a.workdir, a.batches // 3 + 40), a.batches // 3)):
        for adapter, fn in (("torch DataLoader", torch_rate), ("grain", grain_rate)):
            r = {w: fn(cfg, w, 20, count) for w in (0, 1, 2)}
            rows.append([name, adapter, f"{r[0]:,.0f}", f"{r[1]:,.0f}", f"{r[2]:,.0f}", f"{r[2] / r[1]:.2f}x",
                         f"{r[2] / r[0]:.2f}x"])
    text = "\n".join(["# workers", table("batches/s through the adapters (2-core machine)", rows,
                                         ["batches", "adapter", "in-process", "1 worker", "2 workers",
                                          "2 vs 1 worker", "2 workers vs in-process"])])
    print(text)
    return text


if __name__ == "__main__":  # grain's workers re-import __main__
    main()
