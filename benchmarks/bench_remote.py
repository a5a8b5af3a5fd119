"""Data in an object store against the same data on local disk, measured in one run on one machine.

A moto S3 server on the loopback (a subprocess), behind a proxy of the test suite's (tests/s3proxy.py, in a
process of its own) that adds a fixed latency per request (default 20 ms) and caps the link at a bandwidth
shared by every connection (default 200 MB/s). Prints:

1. the client library: CPU per ranged GET of obstore and boto3 (400 GETs of 500 bytes, no proxy), the reason
   the fetcher uses obstore;
2. one epoch of the in-process iterator (real tokens/s) on local disk and on S3 through the proxy, for 4
   directions at two sizes and for many directions: bytes fetched against the bytes of the rows the batches
   read (with repeats), requests against a lower bound (the same request size and gap applied to every row of
   the epoch at once), the first batch, the cache, and the CPU seconds of each process;
3. Megatron-style fetching on the same server and proxy: a block per miss (one block held per file, no
   prefetch), its 256 MiB block scaled to the data (1/64 of the largest .bin, as 256 MiB is of a 16 GiB file),
   measured on the epoch's first batches;
4. two hosts (rank 0 and 1 of 2, each with a cache and fetcher of its own): each one's bytes against one host's.

    python benchmarks/bench_remote.py [--latency-ms 20] [--bandwidth-mb 200] [--sizes 300000,1200000] [--many 1000]

The machine's two cores run the server, the proxy, the fetcher and the iterator together: the server's CPU
(moto copies the whole object for each ranged GET) is reported beside the throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
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


def cpu_of(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class Rows:
    """The byte ranges of the batches' rows, as the prefetcher pins them (each batch in exactly one group)."""

    def __init__(self):
        self.bytes = 0
        self.files: dict = {}

    def __enter__(self):
        from babelfeed.storage.remote import client as remote

        self.remote, self.saved = remote, remote.ensure_many

        def spy(files, group=False, **kw):
            if group:
                for f in files:
                    self.bytes += int((np.asarray(f[2]) - np.asarray(f[1])).sum())
                    self.files.setdefault(os.path.abspath(f[0]), []).append((np.asarray(f[1]), np.asarray(f[2])))
            return self.saved(files, group, **kw)

        remote.ensure_many = spy
        return self

    def __exit__(self, *exc):
        self.remote.ensure_many = self.saved

    def lower_bound(self) -> int:
        """Requests to fetch every row of the epoch at once, with the fetcher's request size and gap."""
        from babelfeed.storage.remote.ranges import merged, requests_for

        n = 0
        for parts in self.files.values():
            a, b = merged(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            n += len(requests_for(list(zip(a.tolist(), b.tolist()))))
        return n


@contextlib.contextmanager
def on_store(server, endpoint: str, cache: str):
    """Reading from ``endpoint`` (the proxy) with a fresh fetcher on cache folder ``cache``, the rows the batches
    read recorded: yields a dict that, on leaving, holds ``telemetry`` (``remote.telemetry()``), ``rows``
    (:class:`Rows`) and ``cpu`` (seconds of this process, the fetcher and the store meanwhile); the fetcher is
    stopped and the cache removed after."""
    import shutil

    from babelfeed.storage.remote import client as remote
    from s3server import stop_fetcher

    shutil.rmtree(cache, ignore_errors=True)  # (cold: a folder left by another run holds its counters and shadows)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ["BABELFEED_CACHE_DIR"] = cache
    remote._folders.clear()
    remote._local.conn = None
    remote._waited.update(seconds=0.0, calls=0)
    server_cpu, me = cpu_of(server.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    got: dict = {}
    try:
        with Rows() as seen:
            yield got
        got["telemetry"], got["rows"] = remote.telemetry(), seen
        fetcher_cpu = cpu_of(int(remote.request({"op": "ping"})["pid"]))
    finally:
        stop_fetcher(cache)
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        shutil.rmtree(cache, ignore_errors=True)
    me2 = resource.getrusage(resource.RUSAGE_SELF)
    got["cpu"] = {"loader": me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime, "fetcher": fetcher_cpu,
                  "server": cpu_of(server.proc.pid) - server_cpu}


def epoch(cfg, limit: int | None = None, rank: int = 0, world: int = 1) -> tuple:
    """(first batch s, all s, real tokens, batches) of one epoch (or its first ``limit`` batches)."""
    import babelfeed

    t0 = time.perf_counter()
    it = babelfeed.build_train_iterator(cfg, rank=rank, world_size=world)
    first = None
    tokens = batches = 0
    for b in it:
        if first is None:
            first = time.perf_counter() - t0
        w = np.asarray(b["weight"]) > 0
        tokens += int(np.asarray(b["net_input"]["src_lengths"])[w].sum() + (np.asarray(b["target"]) > 1).sum())
        batches += 1
        if limit and batches >= limit:
            break
    return first, time.perf_counter() - t0, tokens, batches


def megatron_style(cfg, server, endpoint: str, bucket: str, prefix: str, local: str, block: int, batches: int):
    """A block per miss, one block held per file, no prefetch (Megatron-core's S3 reader): the epoch's first
    ``batches`` batches' rows read through boto3 from the proxy. Returns (seconds fetching, bytes, requests)."""
    import boto3

    import babelfeed
    from babelfeed.storage import spaces as spaces_mod

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=server.key, aws_secret_access_key=server.key,
                          region_name="us-east-1")
    it = babelfeed.build_train_iterator(cfg)
    sp = it.collater.sources.spaces
    sp._remote = True
    saved = spaces_mod.TokenSpaces._shadow
    spaces_mod.TokenSpaces._shadow = lambda self, ds: True  # (the local copy's ranges, as if it were remote)
    held: dict = {}
    got = nbytes = requests = 0
    spent = 0.0
    try:
        for k in range(batches):
            files, n = it._fetch_rows(range(k, k + 1), 0)
            if not n:
                break
            for path, a, b, *_ in files:
                key = f"{prefix}/{os.path.relpath(path, local)}"
                size = os.path.getsize(path)
                for x, y in zip(np.asarray(a).tolist(), np.asarray(b).tolist()):
                    while x < y:
                        blk = x // block
                        if held.get(path) != blk:
                            lo, hi = blk * block, min((blk + 1) * block, size)
                            t = time.perf_counter()
                            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={lo}-{hi - 1}")["Body"].read()
                            spent += time.perf_counter() - t
                            nbytes += len(body)
                            requests += 1
                            held[path] = blk
                        x = min(y, (blk + 1) * block)
            got += 1
    finally:
        spaces_mod.TokenSpaces._shadow = saved
    return spent, nbytes, requests, got


def main(argv=None) -> str:
    from s3proxy import ProxyProcess
    from s3server import S3Server
    from synthetic import config_for

    import many_data

    p = argparse.ArgumentParser()
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mb", type=float, default=200.0)
    p.add_argument("--sizes", default="100000,1200000", help="sentence pairs of the 4-direction cases (two hosts: the first)")
    p.add_argument("--many", type=int, default=1000, help="directions of the many-corpora case (its pairs: the "
                                                          "largest size)")
    p.add_argument("--megatron-batches", type=int, default=10)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "babelfeed-bench-remote"))
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",")]
    server = S3Server()
    os.environ.update(server.env())

    out = [table("Client CPU per ranged GET of 500 bytes (loopback S3, no proxy)", client_cpu(server),
                 ["library", "CPU per request"])]
    cases = [(f"4 directions, {n:,} pairs", 4, n, 8) for n in sizes]
    if a.many:
        cases.append((f"{a.many:,} directions, {sizes[-1]:,} pairs", a.many, sizes[-1], 1))
    proxy = ProxyProcess(server.port, latency=a.latency_ms / 1e3, bandwidth=a.bandwidth_mb * 1e6)
    rows, mega, hosts = [], [], []
    kw = dict(data__shards="all", batching__max_tokens=4096)
    try:
        for ci, (name, k, n, shards) in enumerate(cases):
            local = many_data.build(os.path.join(a.workdir, f"{k}-{n}-{shards}"), k, total=n, shards=shards,
                                    log=lambda *x: None)
            prefix = f"c{ci}"
            url = server.upload(local, "bench", prefix)
            epoch(config_for(local, **kw))  # (page cache warm, imports done)
            f0, t0, tok0, n0 = epoch(config_for(local, **kw))

            def on_s3(cfg, tag, rank=0, world=1):
                with on_store(server, proxy.endpoint, os.path.join(a.workdir, "cache", tag)) as got:
                    got["result"] = epoch(cfg, rank=rank, world=world)
                return got["result"], got["telemetry"], got["rows"], got["cpu"]

            (f1, t1, tok1, n1), st, seen, cpu = on_s3(config_for(url, **kw), f"c{ci}")
            assert (tok0, n0) == (tok1, n1), "the S3 epoch differs from the local one"
            bound = seen.lower_bound()
            rows.append([name, f"{tok0 / t0:,.0f}", f"{tok1 / t1:,.0f} ({t0 / t1:.2f}x)", f"{f1:.2f} s",
                         f"{st['fetch/bytes'] / max(seen.bytes, 1):.2f}x of {seen.bytes / 1e6:,.0f} MB",
                         f"{st['fetch/requests']:,} ({st['fetch/requests'] / max(bound, 1):.2f}x of {bound:,})",
                         f"{st['fetch/wait_seconds']:.1f} s",
                         f"{st['fetch/bytes_held'] / 1e6:,.0f} / {st['fetch/cache_limit'] / 1e6:,.0f} MB",
                         " / ".join(f"{v:.0f}" for v in cpu.values())])
            data = max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs
                       if f.endswith(".bin"))
            block = max(64 << 10, data // 64 // 4096 * 4096)
            spent, mb, mr, got = megatron_style(config_for(local, **kw), server, proxy.endpoint, "bench", prefix,
                                                local, block, a.megatron_batches)
            _, tl, tokl, _ = epoch(config_for(local, **kw), limit=got)
            theirs = tokl / (tl + spent)
            mega.append([name, f"{block >> 10:,} KiB", str(got), f"{mb / 1e6:,.1f} MB", f"{mr:,}",
                         f"{theirs:,.0f} ({theirs / (tok1 / t1):.3f}x ours)"])
            if ci == 0:  # two hosts, each a cache and a fetcher of its own
                one = st["fetch/bytes"]
                cells = [name]
                for rank in (0, 1):
                    _, sth, seenh, _ = on_s3(config_for(url, **kw), f"h{rank}", rank, 2)
                    cells.append(f"{sth['fetch/bytes'] / one:.2f}x ({sth['fetch/bytes'] / max(seenh.bytes, 1):.2f}x "
                                 f"its rows, {sth['fetch/requests']:,} requests)")
                hosts.append(cells)
    finally:
        proxy.stop()
        server.stop()
    out.append(table(f"One epoch, local disk against S3 through a proxy adding {a.latency_ms:g} ms a request on a "
                     f"{a.bandwidth_mb:g} MB/s link (in-process iterator, max_tokens 4096)", rows,
                     ["data", "local tokens/s", "S3 tokens/s", "S3 first batch", "bytes fetched / rows read",
                      "requests / lower bound", "waited on data", "cache held / limit",
                      "CPU s: loader / fetcher / server"]))
    out.append(table("Megatron-style on the same server and proxy: a block per miss, no prefetch (first batches "
                     "of the epoch)", mega, ["data", "block", "batches", "bytes", "requests", "tokens/s"]))
    out.append(table("Two hosts (ranks 0 and 1 of 2), each with its own cache: bytes fetched against one host's",
                     hosts, ["data", "rank 0", "rank 1"]))
    return "\n\n".join(out)


if __name__ == "__main__":
    print(main())
