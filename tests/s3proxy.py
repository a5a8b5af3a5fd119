"""A small HTTP proxy on the loopback in front of the test S3 server, for faults and latency: a fixed delay per
request, a bandwidth cap, 503 answers at a chosen rate, and bodies cut short. Plain Python (threads), started
and stopped by the test; it forwards to 127.0.0.1 only."""

import http.client
import http.server
import random
import socketserver
import threading
import time


class FaultProxy:
    def __init__(self, upstream_port: int, latency: float = 0.0, fail_rate: float = 0.0, cut_rate: float = 0.0,
                 bandwidth: float = 0.0, seed: int = 0, cut_first: int = 0):
        self.upstream_port = upstream_port
        self.latency, self.fail_rate, self.cut_rate, self.bandwidth = latency, fail_rate, cut_rate, bandwidth
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "failed": 0, "cut": 0, "bytes": 0}
        self.cut_first = cut_first  # each object's first cut_first GETs cut short (whatever their range)
        self.seen: dict = {}
        self.refuse: dict = {}  # GETs of a path containing a key answered with its HTTP status (404, 403), set live
        self.link_free = 0.0  # when the capped link is free again
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _upstream(self, headers: dict, body):
                """The store's answer, on this client connection's own connection to the store (kept open, as a
                real store's front end keeps its own: a new one per request cost the store more CPU than the
                request did, which the benchmarks counted against the loader's wall time)."""
                for attempt in (0, 1):
                    conn = getattr(self, "up", None)
                    if conn is None:
                        conn = self.up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                    try:
                        conn.request(self.command, self.path, body=body, headers=headers)
                        resp = conn.getresponse()
                        data = resp.read()
                    except (http.client.HTTPException, OSError):
                        conn.close()
                        self.up = None
                        if attempt:
                            raise
                        continue
                    if resp.will_close:
                        conn.close()
                        self.up = None
                    return resp, data

            def finish(self):
                super().finish()
                if getattr(self, "up", None) is not None:
                    self.up.close()

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.counts["requests"] += 1
                    fail = proxy.rng.random() < proxy.fail_rate
                    cut = proxy.rng.random() < proxy.cut_rate and self.command == "GET"
                    if proxy.cut_first and self.command == "GET" and "list-type" not in self.path:
                        k = self.path
                        proxy.seen[k] = proxy.seen.get(k, 0) + 1
                        cut = proxy.seen[k] <= proxy.cut_first
                if proxy.latency:
                    time.sleep(proxy.latency)
                refused = [code for part, code in list(proxy.refuse.items()) if part in self.path]
                if refused and self.command == "GET" and "list-type" not in self.path:
                    msg = f"<Error><Code>{'NoSuchKey' if refused[0] == 404 else 'AccessDenied'}</Code></Error>".encode()
                    self.send_response(refused[0])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fail:
                    with proxy.lock:
                        proxy.counts["failed"] += 1
                    msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                headers["Host"] = f"127.0.0.1:{proxy.upstream_port}"
                resp, data = self._upstream(headers, body)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if cut and len(data) > 1:
                    with proxy.lock:
                        proxy.counts["cut"] += 1
                    self.wfile.write(data[: len(data) // 2])  # promised more: the connection closes early
                    self.close_connection = True
                    return
                if proxy.bandwidth:  # one link of that bandwidth for every connection: bodies take turns
                    with proxy.lock:
                        start = max(time.monotonic(), proxy.link_free)
                        proxy.link_free = start + len(data) / proxy.bandwidth
                    time.sleep(max(0.0, start + len(data) / proxy.bandwidth - time.monotonic()))
                self.wfile.write(data)
                with proxy.lock:
                    proxy.counts["bytes"] += len(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class ProxyProcess:
    """A :class:`FaultProxy` in a process of its own (benchmarks: its threads must not share the measured
    process's interpreter lock). Latency and a bandwidth cap only."""

    def __init__(self, upstream_port: int, latency: float = 0.0, bandwidth: float = 0.0):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, __file__, str(upstream_port), str(latency), str(bandwidth)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


if __name__ == "__main__":
    import sys

    p = FaultProxy(int(sys.argv[1]), latency=float(sys.argv[2]), bandwidth=float(sys.argv[3]))
    print(p.port, flush=True)
    threading.Event().wait()
