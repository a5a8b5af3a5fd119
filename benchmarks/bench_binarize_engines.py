"""binarize on Ray against the local engine: the same job, the same bytes, sentences/s on this machine.

The demo corpus at ``--scale`` (23 = about 1M lines, counting each line of each side once), plain and gzipped
(one folder of 8 files per direction), binarized with ``--engine local`` (worker processes) and ``--engine ray``
(a local Ray instance of the same CPUs, started once before the runs: a cluster is up before a job is sent to
it, so its start is shown apart). Runs alternate and the medians are reported. The benchmark checks that both
engines wrote the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import table  # noqa: E402


def digest(out: str) -> str:
    h = hashlib.sha256()
    for d, _, names in sorted(os.walk(out)):
        if ".binarize" in d:
            continue
        for n in sorted(names):
            if n.endswith((".bin", ".idx")):
                h.update(n.encode() + open(os.path.join(d, n), "rb").read())
    return h.hexdigest()


def gzipped_folders(raw: str, dest: str, files: int = 8) -> str:
    """Each direction as a folder of ``files`` gzipped parts (monolingual and other splits as they are)."""
    if os.path.isdir(dest):
        return dest
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in sorted(os.listdir(raw)):
        path = os.path.join(raw, name)
        parts = name.split(".")
        if len(parts) == 2 and "-" in parts[0]:  # {src}-{tgt}.{lang}
            lines = open(path, "rb").read().split(b"\n")[:-1]
            os.makedirs(os.path.join(tmp, parts[0]), exist_ok=True)
            step = -(-len(lines) // files)
            for k in range(files):
                chunk = b"".join(ln + b"\n" for ln in lines[k * step:(k + 1) * step])
                with open(os.path.join(tmp, parts[0], f"part-{k:02d}.{parts[1]}.gz"), "wb") as f:
                    f.write(gzip.compress(chunk, compresslevel=6))
        else:
            shutil.copy(path, os.path.join(tmp, name))
    os.rename(tmp, dest)
    return dest


def run(raw: str, out: str, model: str, engine: str, workers: int) -> tuple[float, float, int, str]:
    from babelfeed.preprocess.binarize import BinarizeOptions, binarize

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    report = binarize(BinarizeOptions(input_dir=raw, output_dir=out, spm_model=model, workers=workers, shards=4,
                                      progress=False, max_len=100000, engine=engine), log=lambda m: None)
    elapsed = time.perf_counter() - t
    lines = sum(e["lines"] * (2 if "-" in e["key"] else 1) for e in report["inputs"])
    return elapsed, report["encode_seconds"], lines, digest(out)


def main(argv=None) -> str:
    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=23.0, help="demo corpus scale (23: about 1M lines)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default=os.path.join("build", "bench"))
    a = p.parse_args(argv)
    import logging

    import ray

    from babelfeed.preprocess.binarize import BinarizeOptions, binarize
    from babelfeed.tools.demo import build_corpus

    cores = os.cpu_count() or 1
    raw = os.path.join(a.workdir, f"raw-{a.scale}")
    build_corpus(raw, scale=a.scale)
    model_dir = os.path.join(a.workdir, f"spm-{a.scale}")
    model = os.path.join(model_dir, "spm.model")
    if not os.path.exists(model):
        binarize(BinarizeOptions(input_dir=raw, output_dir=model_dir, train_spm=4000, progress=False,
                                 max_len=100000), log=lambda m: None)
    gz = gzipped_folders(raw, os.path.join(a.workdir, f"raw-{a.scale}-gz"))
    t = time.perf_counter()
    ray.init(num_cpus=cores, object_store_memory=256 << 20, include_dashboard=False, logging_level=logging.WARNING)
    ray_start = time.perf_counter() - t
    rows, digests = [], {}
    try:
        for label, src in (("plain files", raw), ("gzip, 8 files a direction", gz)):
            times: dict[str, list] = {"local": [], "ray": []}
            for _ in range(a.repeat):
                for engine in ("local", "ray"):
                    elapsed, encode, lines, d = run(src, os.path.join(a.workdir, f"bz-{engine}"), model, engine, cores)
                    times[engine].append((elapsed, encode))
                    digests.setdefault(label, set()).add(d)
            base = statistics.median(e for e, _ in times["local"])
            for engine in ("local", "ray"):
                med = statistics.median(e for e, _ in times[engine])
                enc = statistics.median(x for _, x in times[engine])
                rows.append([label, engine, f"{lines:,}", f"{med:.2f} s", f"{lines / med:,.0f}", f"{enc:.2f} s",
                             f"{(med / base - 1) * 100:+.1f}%"])
    finally:
        ray.shutdown()
    same = all(len(v) == 1 for v in digests.values())
    text = (f"# binarize engines: demo corpus at scale {a.scale}, {cores} CPUs, medians of {a.repeat}" + table(
        "whole binarize call (count, encode, merge; the Ray instance already up)", rows,
        ["input", "engine", "lines", "time", "lines/s", "encode phase", "Ray overhead"])
        + f"\nRay instance start (once, before the runs): {ray_start:.1f} s. Same bytes from both engines: {same}\n")
    if not same:
        raise SystemExit(text + "\nthe engines wrote different bytes")
    print(text)
    return text


if __name__ == "__main__":
    main()
