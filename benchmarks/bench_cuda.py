"""Host -> GPU throughput of the torch adapter against a plain ``tensor.cuda()`` loop (needs a CUDA device).

Same batches for both (the collate benchmark's data_bin, max_tokens 16384): GB/s moved to the device, and
batches/s while a simulated step (a matmul of ``--work`` milliseconds) runs on the default stream, which the
adapter's side-stream copies overlap and the plain loop's copies do not. Without CUDA it says so and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import collate_bin_config, table  # noqa: E402


def main(argv=None) -> str:
    import torch

    if not torch.cuda.is_available():
        text = "# cuda: no CUDA device here; run on a GPU machine (the torch adapter's CPU path is tested instead)"
        print(text)
        return text
    import babelfeed
    from babelfeed.adapters.torch import TorchBatches

    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    cfg = collate_bin_config(a.workdir)
    host = []
    for b in babelfeed.build_train_iterator(cfg):
        host.append(b)
        if len(host) >= a.batches:
            break
    nbytes = sum(x.nbytes for b in host for x in (b["net_input"]["src_tokens"], b["target"],
                                                       b["net_input"]["prev_output_tokens"]))

    def plain():
        for b in host:
            for x in (b["net_input"]["src_tokens"], b["target"], b["net_input"]["prev_output_tokens"]):
                torch.from_numpy(x).cuda()
        torch.cuda.synchronize()

    def adapter():
        for _ in TorchBatches(iter(host), device="cuda", prefetch=4):
            pass
        torch.cuda.synchronize()

    rows = []
    for name, fn in (("plain tensor.cuda() loop (baseline)", plain), ("TorchBatches (pinned, side stream)", adapter)):
        fn()
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        rows.append([name, f"{nbytes / dt / 1e9:.2f} GB/s", f"{len(host) / dt:,.0f}"])
    text = "# cuda" + table(f"host -> {torch.cuda.get_device_name()} ({len(host)} batches, {nbytes / 1e6:.0f} MB)",
                            rows, ["copy", "throughput", "batches/s"])
    print(text)
    return text


if __name__ == "__main__":
    main()
