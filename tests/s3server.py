"""A real S3-compatible server on the loopback for tests (moto's server mode, a subprocess), and helpers to
upload a local folder to it. The server binds 127.0.0.1 only; the fixture stops it, and the host's fetcher
(started by the code under test) with it."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


S3RVER = "3.7.1"  # s3rver's version (npm), when a benchmark asks for a faster server than moto


def start_server(command: list, port: int, what: str, **popen) -> subprocess.Popen:
    """A test server's process, started and answering on 127.0.0.1:``port`` (an error naming ``what`` when it
    exits or does not answer within 60 s)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def on_fresh_fetcher(server, tmp_path, monkeypatch):
    """A fixture's body: ``server``'s environment and a cache folder of the test's own (so its own fetcher),
    stopped after (yields ``server``)."""
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    cache = tmp_path / "cache"
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(cache))
    monkeypatch.setenv("BABELFEED_FETCHER_IDLE", "30")
    from babelfeed.storage.remote import client as remote

    remote._folders.clear()
    remote._local.conn = None
    monkeypatch.setattr(remote, "_options", {})  # (a config's storage section, set by an earlier test's build)
    yield server
    stop_fetcher(str(cache))
    remote._folders.clear()


class S3Server:
    """``kind``: ``"moto"`` (moto's server: the tests' S3, every API babelfeed uses), or ``"s3rver"`` (a node
    server keeping objects on disk, ~4x less CPU a request than moto: what the benchmarks of remote data use
    beside moto, as the store's CPU shares the machine's two cores; installed from npm on first use)."""

    def __init__(self, kind: str = "moto"):
        self.port, self.kind = free_port(), kind
        if kind == "moto":
            command, self.folder = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)], None
        elif kind == "s3rver":
            import tempfile

            from npm_tools import npm_program

            self.folder = tempfile.mkdtemp(prefix="babelfeed-s3rver-")
            command = [npm_program("s3rver", S3RVER, "s3rver"), "-d", self.folder, "-a", "127.0.0.1", "-p",
                       str(self.port), "--silent"]
        else:
            raise ValueError(f"S3Server kind {kind!r}: moto or s3rver")
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")  # (s3rver's continuation tokens use a
        # cipher OpenSSL 3 keeps in its legacy provider: a listing past 1,000 keys is a 500 without it)
        self.proc = start_server(command, self.port, f"the test S3 server ({kind})", env=env)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def key(self) -> str:
        return "S3RVER" if self.kind == "s3rver" else "testing"  # (s3rver checks signatures with its own)

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.key,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def client(self):
        import boto3  # (fork-safe, unlike an obstore client in the test process)

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                            aws_secret_access_key=self.key, region_name="us-east-1")

    def upload(self, local: str, bucket: str, prefix: str) -> str:
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except (c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
            pass
        for folder, _, names in os.walk(local):
            for name in names:
                path = os.path.join(folder, name)
                key = f"{prefix}/{os.path.relpath(path, local)}".replace(os.sep, "/")
                with open(path, "rb") as f:
                    c.put_object(Bucket=bucket, Key=key, Body=f.read())
        return f"s3://{bucket}/{prefix}"

    def stop(self):
        stop_server(self.proc)
        if self.folder:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)


def stop_fetcher(cache: str) -> None:
    """Stop the host's fetcher of cache folder ``cache``, if one runs."""
    from babelfeed.storage.remote import client as remote

    path = remote.socket_path(os.path.abspath(cache))
    conn = remote._connect(path)
    if conn is None:
        if os.path.exists(path):
            os.unlink(path)  # (left by a fetcher a test killed)
        return
    from babelfeed.storage.remote.wire import receive, send

    send(conn, {"op": "ping"})
    pid = receive(conn)["pid"]
    conn.close()
    if getattr(remote._local, "conn", None) is not None:
        remote._local.conn.close()
    remote._local.conn = None
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + 10  # (it saves its counters as it exits: a folder removed before that comes back)
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # (started by this process: reaped)
                return
        except ChildProcessError:  # (another process's)
            try:
                os.kill(pid, 0)
            except OSError:
                return
        time.sleep(0.02)


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3, tmp_path, monkeypatch):
    """The AWS environment of the test server and a cache folder of the test's own (so its own fetcher)."""
    yield from on_fresh_fetcher(s3, tmp_path, monkeypatch)
