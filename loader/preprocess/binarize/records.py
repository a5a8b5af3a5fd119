"""What a binarize run leaves to resume from: a record per finished shard with the fingerprint of its inputs
and settings, the lock on the output folder, and the sweep of partial files."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time

from babelfeed.errors import BinarizeError
from babelfeed.preprocess.binarize.jobs import ShardJob
from babelfeed.preprocess.stats import Stats
from babelfeed.storage.indexed import IndexedDataset, dataset_exists


STATE_DIR = ".binarize"


_VERSION = 1


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _identity(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def _fingerprint(job: ShardJob, common: dict) -> str:
    payload = {"version": _VERSION, "job": [job.split, job.key, job.shard, list(job.line_range)],
               "files": sorted({tuple(_identity(p)) for p in job.files}), **common}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _record_path(output_dir: str, job: ShardJob) -> str:
    return os.path.join(output_dir, STATE_DIR, f"{job.name}.shard{job.shard:03d}.json")


def _is_done(output_dir: str, job: ShardJob, fingerprint: str) -> Stats | None:
    try:
        with open(_record_path(output_dir, job)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if rec.get("fingerprint") != fingerprint:
        return None
    stats = Stats(**rec["stats"])
    for lang in job.langs:
        prefix = job.out_prefix(output_dir, lang)
        if not dataset_exists(prefix):
            return None
        try:
            ds = IndexedDataset(prefix, verify="quick")
            if (len(ds.doc_idx) - 1 if job.documents else len(ds)) != (stats.kept if job.documents else stats.sequences):
                return None
        except (ValueError, OSError):
            return None
    return stats


def _existing_outputs(output_dir: str) -> set[str]:
    found = set()
    for name in os.listdir(output_dir):
        sub = os.path.join(output_dir, name)
        if name.startswith("shard") and os.path.isdir(sub):
            for f in os.listdir(sub):
                if f.endswith(".idx"):
                    found.add(os.path.join(sub, f[:-4]))
    return found


def _sweep_partials(out: str) -> int:
    """Remove the temporaries (``*.partial``) of writers that died (a killed worker cannot remove its own); run
    when no writer of this job is left. Returns how many were removed."""
    removed = 0
    for d in [out, os.path.join(out, STATE_DIR)] + [os.path.join(out, n) for n in os.listdir(out) if n.startswith("shard")]:
        if os.path.isdir(d):
            for n in os.listdir(d):
                if n.endswith(".partial"):
                    try:
                        os.unlink(os.path.join(d, n))
                        removed += 1
                    except FileNotFoundError:
                        pass
    return removed


def _lock_output(out: str) -> int:
    """An exclusive lock on the output folder for this run (two runs into one folder broke each other's work
    files): a second run is refused, naming the first (its pid, host and start)."""
    path = os.path.join(out, STATE_DIR, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
        raise BinarizeError(f"{out}: another binarize is writing into it ({holder}): wait for it to end, or write "
                            f"to another -o folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
              .encode(), 0)
    return fd
