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


class S3Server:
    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError("the test S3 server did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def client(self):
        import boto3  # (fork-safe, unlike an obstore client in the test process)

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def upload(self, local: str, bucket: str, prefix: str) -> str:
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        for folder, _, names in os.walk(local):
            for name in names:
                path = os.path.join(folder, name)
                key = f"{prefix}/{os.path.relpath(path, local)}".replace(os.sep, "/")
                with open(path, "rb") as f:
                    c.put_object(Bucket=bucket, Key=key, Body=f.read())
        return f"s3://{bucket}/{prefix}"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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
    remote._local.conn = None
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass


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
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    cache = tmp_path / "cache"
    monkeypatch.setenv("BABELFEED_CACHE_DIR", str(cache))
    monkeypatch.setenv("BABELFEED_FETCHER_IDLE", "30")
    from babelfeed.storage.remote import client as remote

    remote._folders.clear()
    remote._local.conn = None
    yield s3
    stop_fetcher(str(cache))
    remote._folders.clear()
