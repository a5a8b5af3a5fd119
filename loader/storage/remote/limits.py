"""The fetcher's limits and paths: how far apart ranges are joined, how long a request may be, how many run at
once, when a file is fetched in blocks (each a ``BABELFEED_FETCH_*`` setting), the cache's size, and where a
folder's shadow lives.
"""

from __future__ import annotations

import hashlib
import os

from babelfeed.errors import UsageError


IDLE_SECONDS = float(os.environ.get("BABELFEED_FETCHER_IDLE", "300"))


# ranges closer than this are fetched as one request, and no request is longer than LARGEST_REQUEST (parallel
# requests beat one long one); BABELFEED_FETCH_GAP / BABELFEED_FETCH_LARGEST set them (bytes). 64 KiB: what a
# request costs in link time (20 ms over 64 connections at 200 MB/s, ~60 KB); at 16 KiB a first batch of 64k
# tokens over 4 directions was 2,900 requests of one row each (45x the bound, 7 s on s3rver), at 64 KiB 700
# requests, 3.6 s, and 1.11x the rows' bytes (benchmarks/bench_remote_training.py)
GAP = int(os.environ.get("BABELFEED_FETCH_GAP", 64 << 10))


LARGEST_REQUEST = int(os.environ.get("BABELFEED_FETCH_LARGEST", 8 << 20))


CONCURRENCY = int(os.environ.get("BABELFEED_FETCH_CONCURRENCY", 64))  # ranged requests in flight at once


RESERVED = CONCURRENCY // 8  # of them, kept for gathers waiting (hints never take the last ones)


DENSE = float(os.environ.get("BABELFEED_FETCH_DENSE", 0.85))  # a file read this much is fetched in whole blocks


# the gap bridged in a file other hosts read too (the rows between are theirs). By default GAP, as on one host: a
# request costs about GAP of link time, so a smaller gap is cheaper fetched than skipped. A host's rows are a random
# share of every file (the batches do not depend on the world size), so with rows of ~100 bytes its own rows alone
# (0) were 47,000 requests on 4 directions of 100k pairs and training waited 99% of the time, for 0.55x the bytes
# of one host; at GAP, 64 requests, 1.00x, 0.3% (benchmarks/bench_remote_training.py). 0 suits paying per byte
SPARSE_GAP = int(os.environ.get("BABELFEED_FETCH_SPARSE_GAP", GAP))


SPAN_HELD = 16 * GAP  # a block request spans bytes held (or in flight) shorter than this: two requests cost
# more (at 1,000 directions and a 16 KiB gap: the gap alone, 4,779 requests and 149 MB; 16 gaps, 3,856 and 217 MB)


SMALL_FILE = 64 << 20  # a non-.bin object up to this size is fetched whole into the shadow


# A dense file up to this size is fetched whole at its first need, a gather's too: at 1,000 directions a
# batch reads a row or two of each file, and its rows' requests were followed by the file's block anyway (two
# requests a file where one does, and the next batches waited on the second)
WHOLE_AT_ONCE = int(os.environ.get("BABELFEED_FETCH_WHOLE_AT_ONCE", 1 << 20))


BLOCK = 4096  # the file-system block: the cache counts, and gives back, whole blocks


def cache_limit(cache: str) -> int:
    """The bytes the shadows may hold: ``BABELFEED_FETCH_CACHE_MB``, else a quarter of the free space of the
    cache's file system (at most 64 GiB, at least 256 MiB)."""
    mb = os.environ.get("BABELFEED_FETCH_CACHE_MB")
    if mb:
        try:
            value = float(mb)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise UsageError(f"BABELFEED_FETCH_CACHE_MB={mb!r}: give the cache's size in MiB, a number above 0")
        return int(value * (1 << 20))
    try:
        st = os.statvfs(cache)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 4 << 30
    return int(min(max(free // 4, 256 << 20), 64 << 30))


def shadow_root(cache: str, url: str, endpoint: str = "") -> str:
    """The local folder that mirrors remote folder ``url`` (of the store at ``endpoint``, where not the
    default: two stores may hold buckets of one name)."""
    name = url.rstrip("/") + (f"\0{endpoint.rstrip('/')}" if endpoint else "")
    return os.path.join(cache, "objects", hashlib.blake2b(name.encode(), digest_size=10).hexdigest())


def running_socket(cache: str) -> str:
    """The socket of the fetcher serving cache folder ``cache``, as it wrote it in ``objects/fetcher.socket`` when
    it started ('' when none did)."""
    try:
        with open(os.path.join(cache, "objects", "fetcher.socket")) as f:
            return f.read().strip()
    except OSError:
        return ""


def _endpoint(options: dict | None, env: dict | None) -> str:
    env = os.environ if env is None else env
    return str((options or {}).get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
               or "")
