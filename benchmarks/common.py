"""Shared helpers for the benchmarks: timing, RSS in a fresh process, result tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def best_of(fn, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls (the least disturbed by this shared machine)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_child(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"benchmark child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


RSS_SNIPPET = """
def rss_mb(field="VmRSS"):
    # VmRSS = RssAnon (memory the process allocated) + RssFile (mapped page-cache pages, reclaimable).
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
"""


def table(title: str, rows: list[list], heads: list[str]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([f"\n## {title}", line(heads), line(["-" * w for w in widths])] + [line(r) for r in cells])


def age_for_stamps() -> None:
    """Wait until files written a moment ago can be stamped (``stamps.RACY_SECONDS``): a file modified more
    recently is checked in full at every open and never stamped, so a benchmark that times opens right after
    writing its data timed the checks."""
    from babelfeed.storage.stamps import RACY_SECONDS

    time.sleep(RACY_SECONDS + 0.1)


def collate_bin_config(workdir: str, max_tokens: int = 16384):
    """configs/nllb_like.py pointed at the collate benchmark's data_bin (built on first use)."""
    import babelfeed

    root = os.path.join(workdir, "collate_data")
    if not os.path.exists(os.path.join(root, "dict.txt")):
        import bench_pipeline

        bench_pipeline.bench_collate(workdir)
    cfg = babelfeed.load_config(os.path.join(REPO, "configs", "nllb_like.py"))
    cfg.data.path = root
    cfg.batching.max_tokens = max_tokens
    cfg.filter.max_source_positions = cfg.filter.max_target_positions = 300
    return cfg
