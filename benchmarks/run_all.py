"""Run every benchmark, print the tables, and keep them in build/bench/results.md (`make bench`)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_binarize  # noqa: E402
import bench_blending  # noqa: E402
import bench_copies  # noqa: E402
import bench_edits  # noqa: E402
import bench_first_open  # noqa: E402
import bench_index_open  # noqa: E402
import bench_grain  # noqa: E402
import bench_lm  # noqa: E402
import bench_many_directions  # noqa: E402
import bench_noise  # noqa: E402
import bench_subword  # noqa: E402
import bench_pipeline  # noqa: E402
import bench_shapes  # noqa: E402
import bench_skip  # noqa: E402
import bench_storage  # noqa: E402
import bench_workers  # noqa: E402


def main() -> None:  # run under __main__ only: grain's worker processes re-import this module
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    a = p.parse_args()
    os.makedirs("build/bench", exist_ok=True)
    head = (f"babelfeed benchmarks, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}")
    print(head)
    parts = [head]
    parts.append(bench_storage.main(["--sentences", "200000", "--reads", "20000"] if a.quick else []))
    parts.append(bench_binarize.main(["--scale", "0.5"] if a.quick else []))
    parts.append(bench_pipeline.main(["--sentences", "200000", "--skip-billion"] if a.quick else []))
    parts.append(bench_first_open.main(["--directions", "100,1000", "--repeat", "1"] if a.quick else []))
    parts.append(bench_index_open.main(["--repeat", "3"] if a.quick else []))
    parts.append(bench_many_directions.main(["--directions", "4,1000", "--sentences", "200000", "--repeat", "1"]
                                            if a.quick else []))
    parts.append(bench_edits.main(["--sentences", "200000", "--repeat", "1"] if a.quick else []))
    parts.append(bench_lm.main(["--batches", "20"] if a.quick else []))
    parts.append(bench_workers.main(["--batches", "120"] if a.quick else []))
    parts.append(bench_shapes.main(["--samples", "100000"] if a.quick else []))
    parts.append(bench_grain.main(["--batches", "100", "--samples", "200000", "--repeats", "1"] if a.quick else []))
    parts.append(bench_noise.main(["--batches", "50"] if a.quick else []))
    parts.append(bench_subword.main(["--sentences", "4000"] if a.quick else []))
    parts.append(bench_skip.main(["--sentences", "200000", "--steps", "100", "--far", "1000"] if a.quick else []))
    parts.append(bench_blending.main(["--samples", "2000000", "--fallback-samples", "100000", "--repeat", "1"]
                                     if a.quick else []))
    parts.append(bench_copies.main(["--windows", "0", "--mixtures", "newcomer"] if a.quick else []))
    with open("build/bench/results.md", "w") as f:
        f.write("\n\n".join(parts) + "\n")
    print("\nwritten to build/bench/results.md")


if __name__ == "__main__":
    main()
