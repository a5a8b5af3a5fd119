"""Tokens/s of the training pipeline with the full noise pipeline on, against the plain pipeline, same run.

The collate benchmark's data_bin (400k pairs, max_tokens 16384); noise on every source: token drop, local
reorder, insertion, SwitchOut replacement and BART infilling.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import collate_bin_config, table  # noqa: E402

FULL = ("token_drop:rate=0.1;local_reorder:k=3;insert_tokens:rate=0.05,low=4,high=32000;"
        "token_replace:rate=0.05,low=4,high=32000;span_mask:ratio=0.3,mask_id=3")


def main(argv=None) -> str:
    import babelfeed

    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    rows, base = [], None
    for label, noise in (("plain pipeline (baseline)", ""), ("token drop only", "token_drop:rate=0.1"),
                         ("full noise: drop, reorder, insert, replace, infill", FULL)):
        cfg = collate_bin_config(a.workdir)
        cfg.data.noise = noise
        it = babelfeed.build_train_iterator(cfg)
        len(it)  # plan first: time the gather, collate and noise only
        n = tokens = 0
        t = time.perf_counter()
        for batch in it:
            tokens += int(batch["net_input"]["src_lengths"].sum()) + batch["ntokens"]
            n += 1
            if n >= a.batches:
                break
        rate = tokens / (time.perf_counter() - t)
        base = base or rate
        rows.append([label, f"{rate / 1e6:.1f} M", f"{rate / base:.2f}x"])
    text = "# noise" + table(f"real tokens/s over {a.batches} batches of max_tokens 16384, one core", rows,
                             ["pipeline", "tokens/s", "vs plain"])
    print(text)
    return text


if __name__ == "__main__":
    main()
