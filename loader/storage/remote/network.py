"""The fetcher's requests: one asyncio loop in a thread of its own and a fixed number of connections, each taking
the next :class:`Job` (a ranged request the server formed from what was asked for) and handing back what came."""

from __future__ import annotations

import threading
import traceback


class Job:
    """One ranged request: bytes ``[a, b)`` of a remote object, of which ``parts`` (sorted, disjoint) are kept
    (the rest is held or in flight already: fetched again because one request is cheaper than two)."""

    __slots__ = ("remote", "a", "b", "parts", "dues", "urgent")

    def __init__(self, remote, a: int, b: int, parts: list, dues: list, urgent: bool):
        self.remote, self.a, self.b, self.parts, self.dues, self.urgent = remote, a, b, parts, dues, urgent


class Network:
    """The fetcher's requests: one asyncio loop in a thread of its own and ``concurrency`` connections. Each free
    connection takes the next request from ``take()`` (the most urgent range asked for, joined with its
    neighbours), and hands what came back to ``landed(job, data, error)``."""

    def __init__(self, concurrency: int, take, landed):
        import asyncio  # the fetcher's event loop only (asyncio costs ~30 ms at import)

        self.asyncio = asyncio
        self.take, self.landed = take, landed
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.more = asyncio.Event()
            self.limit = asyncio.Semaphore(concurrency)
            for _ in range(concurrency):
                self.loop.create_task(self._worker())
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True, name="network").start()
        ready.wait()

    def wake(self) -> None:
        """There may be new work (ranges asked for, room in the cache)."""
        self.loop.call_soon_threadsafe(self.more.set)

    def start(self, coroutine):
        """Run ``coroutine`` on the loop: a future of its result (the small files of a folder, many at once, while
        the asking thread goes on)."""
        return self.asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def bounded(self, coroutine):
        async with self.limit:
            return await coroutine

    async def _worker(self):
        while True:
            try:
                job = self.take()
            except Exception:  # (a bug here must not stop the connection for good)
                traceback.print_exc()
                job = None
            if job is None:
                await self.more.wait()
                self.more.clear()
                continue
            data = error = None
            try:
                data = await job.remote.store.get_range_async(job.remote.key, job.a, job.b, job.remote.etag or None)
            except BaseException as e:  # (a waiting gather raises it; a hint's failure is retried by the gather)
                error = e
            try:
                self.landed(job, data, error)
            except Exception:
                traceback.print_exc()
            self.more.set()  # (room in the cache: the other connections look again)
