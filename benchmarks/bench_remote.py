"""Data in an object store against the same data on local disk, measured in one run on one machine.

A moto S3 server on the loopback (a subprocess), behind a proxy of the test suite's (tests/s3proxy.py) that adds a
fixed latency per request (default 20 ms) and caps bandwidth (default 200 MB/s). Prints:

1. the client library: CPU per ranged GET of obstore and boto3 (400 GETs of 500 bytes, no proxy), the reason
   the fetcher uses obstore;
2. the end-to-end iterator (real tokens/s) on local disk and on S3 through the proxy, with the bytes fetched
   against the bytes of the rows served, the requests, and the first batch's time, for 4 directions and for
   many directions (--many).

    python benchmarks/bench_remote.py [--latency-ms 20] [--many 200] [--pairs 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from common import table  # noqa: E402


def client_cpu(server) -> list:
    """CPU seconds per ranged GET, obstore and boto3, against the server directly (in a child: obstore's runtime
    must not live in this process, which forks the fetcher's workers later)."""
    import subprocess

    code = r"""
import os, sys, time
import numpy as np
os.environ.update(dict(a.split("=", 1) for a in sys.argv[1:]))
import boto3
c = boto3.client("s3")
data = np.random.default_rng(0).integers(0, 255, 8_000_000, dtype=np.uint8).tobytes()
c.create_bucket(Bucket="libs")
c.put_object(Bucket="libs", Key="x.bin", Body=data)
starts = np.sort(np.random.default_rng(1).integers(0, len(data) - 1000, 400)).tolist()
t = time.process_time()
for a in starts:
    assert c.get_object(Bucket="libs", Key="x.bin", Range=f"bytes={a}-{a + 499}")["Body"].read() == data[a:a + 500]
boto = (time.process_time() - t) / len(starts)
import obstore
from obstore.store import from_url
s = from_url("s3://libs", client_options={"allow_http": True})
t = time.process_time()
for a in starts:
    assert bytes(obstore.get_range(s, "x.bin", start=a, length=500)) == data[a:a + 500]
obs = (time.process_time() - t) / len(starts)
print(boto, obs)
"""
    out = subprocess.run([sys.executable, "-c", code, *[f"{k}={v}" for k, v in server.env().items()]],
                         capture_output=True, text=True, timeout=300)
    boto, obs = (float(x) for x in out.stdout.split())
    return [["boto3", f"{boto * 1e3:.2f} ms"], ["obstore", f"{obs * 1e3:.2f} ms ({boto / obs:.1f}x less)"]]


def run(cfg) -> tuple[float, float, int, int]:
    """(seconds of the first batch, seconds in all, real tokens, batches) of one epoch."""
    import babelfeed

    t0 = time.perf_counter()
    it = babelfeed.build_train_iterator(cfg)
    first = None
    tokens = batches = 0
    for b in it:
        if first is None:
            first = time.perf_counter() - t0
        w = np.asarray(b["weight"]) > 0
        tokens += int(np.asarray(b["net_input"]["src_lengths"])[w].sum() + (np.asarray(b["target"]) > 1).sum())
        batches += 1
    return first, time.perf_counter() - t0, tokens, batches


def main(argv=None) -> str:
    from s3proxy import FaultProxy
    from s3server import S3Server, stop_fetcher
    from synthetic import config_for, make_data_bin

    p = argparse.ArgumentParser()
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mb", type=float, default=200.0)
    p.add_argument("--pairs", type=int, default=20_000, help="pairs of the largest of 4 directions")
    p.add_argument("--many", type=int, default=200, help="directions of the many-corpora case")
    a = p.parse_args(argv)
    server = S3Server()
    os.environ.update(server.env())
    from babelfeed.storage import remote

    out = [table("Client CPU per ranged GET of 500 bytes (loopback S3, no proxy)", client_cpu(server),
                 ["library", "CPU per request"])]
    rows = []
    cases = {"4 directions": {"aaa-bbb": [a.pairs], "aaa-ccc": [a.pairs // 4], "aaa-ddd": [a.pairs // 16],
                              "bbb-ccc": [a.pairs // 64]}}
    langs = [f"l{i:02d}" for i in range(40)]
    many = [f"{langs[i % 40]}-{langs[(i * 7 + 1) % 40]}" for i in range(a.many)]
    cases[f"{a.many} directions"] = {d: [max(20, a.pairs // a.many)] for d in dict.fromkeys(many)}
    proxy = FaultProxy(server.port, latency=a.latency_ms / 1e3, bandwidth=a.bandwidth_mb * 1e6)
    try:
        for name, dirs in cases.items():
            with tempfile.TemporaryDirectory() as tmp:
                local = os.path.join(tmp, "data_bin")
                import synthetic

                saved = synthetic.LANGS
                synthetic.LANGS = sorted({x for d in dirs for x in d.split("-")})
                try:
                    make_data_bin(local, directions=dirs, valid=False)
                finally:
                    synthetic.LANGS = saved
                url = server.upload(local, "bench", name.replace(" ", "-"))
                kw = dict(data__shards="all", batching__max_tokens=4096)
                run(config_for(local, **kw))  # (page cache warm, imports done)
                f0, t0, tok0, n0 = run(config_for(local, **kw))
                os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
                os.environ["BABELFEED_CACHE_DIR"] = cache = os.path.join(tmp, "cache")
                remote._folders.clear()
                remote._local.conn = None
                try:
                    f1, t1, tok1, n1 = run(config_for(url, **kw))
                    st = remote.stats()
                finally:
                    stop_fetcher(cache)
                    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
                assert (tok0, n0) == (tok1, n1)
                rows_bytes = st["bytes_asked"]
                data = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs
                           if f.endswith(".bin"))
                rows.append([name, f"{tok0 / t0:,.0f}", f"{tok1 / t1:,.0f} ({t0 / t1:.3g}x)", f"{f1:.2f} s",
                             f"{st['bytes']:,} ({st['bytes'] / max(data, 1):.2f}x the .bin files)",
                             f"{st['requests']:,}", f"{st['latency_p50_ms']:.0f} / {st['latency_p99_ms']:.0f} ms",
                             f"{rows_bytes:,}"])
    finally:
        proxy.stop()
        server.stop()
    out.append(table(f"One epoch, local disk against S3 through a proxy adding {a.latency_ms:g} ms a request "
                     f"and capping {a.bandwidth_mb:g} MB/s (in-process iterator, lookahead 16 batches)", rows,
                     ["data", "local tokens/s", "S3 tokens/s", "S3 first batch", "bytes fetched", "requests",
                      "GET p50 / p99", "bytes the gathers asked for (rows, with repeats)"]))
    return "\n\n".join(out)


if __name__ == "__main__":
    print(main())
