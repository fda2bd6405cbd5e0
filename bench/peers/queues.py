"""The Redis delayed-job libraries tickwheel's durable scheduler is measured against.

Each adapter wraps one Redis delayed-job library: arq, BullMQ's Python port (``bullmq``,
BullMQ's own Lua scripts), saq and streaq. Every job of every peer carries the same
arguments, ``(due_ms, pad)``: its due time in epoch milliseconds (the lateness probe reads
it) and a 32-character string (a str, not bytes, because saq serializes with JSON). The
job's key is the library's own job id.

What each adapter sets, and why (bench/README.md has the same list):

* arq: ``enqueue_job(_job_id=, _defer_until=)``, no batch call, so 100 calls in flight;
  ``Worker(max_jobs=100, poll_delay=0.05, keep_result=0)``: its poll is 0.5 s by default;
  results are not kept, as tickwheel keeps none. Kill row: ``job_timeout=1`` (arq
  re-runs a job only after its in-progress key expires, ``job_timeout + 10`` s).
* BullMQ: ``Queue.addBulk`` (one pipeline of its ``addDelayedJob`` script per job) for
  batches, ``Queue.add`` for singles, ``delay=`` in ms and ``jobId=``, ``removeOnComplete``;
  ``Worker(concurrency=100, drainDelay=1)``. Its worker blocks on a marker until the next
  delayed job is due, so it has no poll interval to set; ``drainDelay`` (its idle wait,
  5 s by default) is cut to 1 s for the stall bench/peers/bullmq_limiter.py explains.
  Kill row: ``lockDuration=3000``, ``stalledInterval=1000`` (30 s each by default) so a
  killed worker's jobs come back in seconds.
* saq: ``enqueue(key=, scheduled=)`` with ``scheduled`` an epoch in seconds (a float, for
  sub-second due times), no batch call, so 100 calls in flight (saq itself lets 20 run at
  once); ``retries=3`` (1 by default: a job swept after a crash would otherwise fail, not
  run again); ``ttl`` left at 600 s (with ``ttl=-1``, delete when finished, saq's sweep
  at worker start raced with jobs that had just finished and logged errors).
  ``Worker(concurrency=100)``. Its ``schedule`` timer, which moves due jobs to the queue,
  is left at its 1 s default, the smallest it accepts: the timer's value is also the TTL
  of a lock set with SETEX, which takes whole seconds, so saq promotes delayed jobs at
  most once a second. Kill row: ``timeout=3`` per job and a 1 s ``sweep`` timer (60 s by
  default) so a killed worker's jobs are swept and retried.
* streaq: ``Worker.enqueue_many`` (one pipeline) for batches, awaiting ``Task`` for
  singles, ``schedule=`` a datetime; task ``ttl=0`` (no result kept), ``max_tries=3``;
  ``Worker(concurrency=100)``. It moves due delayed tasks to its stream every 0.5 s
  (fixed). Kill row: ``idle_timeout=3`` (60 s by default), after which a killed worker's
  tasks are claimed again.

``python -m bench.peers kill-worker LIB REDIS_URL SINK_URL`` (bench/peers/__main__.py)
runs one library's worker with the kill row's task (it adds 1 to the job's field in the
sink hash ``effects`` of a second Redis, then sleeps 20 ms); the durable section of
``python -m bench`` starts it as a subprocess and kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis.asyncio

PAD = "x" * 32
IN_FLIGHT = 100  # calls at once for a library without a batch call
CONCURRENCY = 100  # jobs at once in each peer's worker
KILL_CONCURRENCY = 4  # jobs at once in the kill row's workers (saq sweeps them one by one)
EFFECTS = "effects"  # the sink hash: job key -> times its effect was applied

# A handler is given the job's key and due time (epoch ms).
Handler = Callable[[str, int], Awaitable[None]]
Job = tuple[str, int]  # (key, due_ms)


def now_ms() -> int:
    return int(time.time() * 1000)


class Peer:
    """One library: schedule jobs, run them in an in-process worker, say how it is set."""

    name: ClassVar[str]
    # Seconds after a worker's death before its claimed jobs may run again (kill row).
    redeliver_s: ClassVar[float]

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def schedule_many(self, jobs: Sequence[Job]) -> None:
        """Schedule ``jobs`` through the library's batch call, or calls in flight."""
        raise NotImplementedError

    async def schedule_one(self, key: str, due_ms: int) -> None:
        """One awaited schedule call."""
        raise NotImplementedError

    async def schedule_now(self, keys: Sequence[str]) -> None:
        """Jobs due at once, by the library's path for a job without a delay."""
        raise NotImplementedError

    def worker(
        self, handler: Handler, concurrency: int = CONCURRENCY, kill_row: bool = False
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Run the library's worker on this loop while the context is open."""
        raise NotImplementedError


async def _in_flight(calls: Sequence[Callable[[], Awaitable[Any]]]) -> None:
    for start in range(0, len(calls), IN_FLIGHT):
        await asyncio.gather(*(c() for c in calls[start : start + IN_FLIGHT]))


class _CallPeer(Peer):
    """A library with no batch call: one call per job, IN_FLIGHT of them at once."""

    def _enqueue(self, key: str, due_ms: int | None) -> Callable[[], Awaitable[Any]]:
        """The call that schedules one job (due now when ``due_ms`` is None)."""
        raise NotImplementedError

    async def schedule_many(self, jobs: Sequence[Job]) -> None:
        await _in_flight([self._enqueue(k, d) for k, d in jobs])

    async def schedule_one(self, key: str, due_ms: int) -> None:
        await self._enqueue(key, due_ms)()

    async def schedule_now(self, keys: Sequence[str]) -> None:
        await _in_flight([self._enqueue(k, None) for k in keys])


class ArqPeer(_CallPeer):
    name = "arq"
    redeliver_s = 11.0  # in-progress key: job_timeout (1 s in the kill row) + 10 s

    async def open(self) -> None:
        from arq.connections import RedisSettings, create_pool

        host, port = self.url.removeprefix("redis://").split("/")[0].split(":")
        self.settings = RedisSettings(host=host, port=int(port))
        self.pool = await create_pool(self.settings)

    async def close(self) -> None:
        await self.pool.aclose()

    def _enqueue(self, key: str, due_ms: int | None) -> Callable[[], Awaitable[Any]]:
        when = None if due_ms is None else datetime.fromtimestamp(due_ms / 1000, UTC)
        return lambda: self.pool.enqueue_job(
            "job", due_ms or now_ms(), PAD, _job_id=key, _defer_until=when
        )

    @contextlib.asynccontextmanager
    async def worker(
        self, handler: Handler, concurrency: int = CONCURRENCY, kill_row: bool = False
    ) -> AsyncIterator[None]:
        from arq.worker import Worker, func

        async def job(ctx: dict[str, Any], due_ms: int, pad: str) -> None:
            await handler(ctx["job_id"], due_ms)

        worker = Worker(
            functions=[func(job, name="job")],
            redis_settings=self.settings,
            poll_delay=0.05,
            max_jobs=concurrency,
            handle_signals=False,
            keep_result=0,
            job_timeout=1 if kill_row else 300,
        )
        task = asyncio.ensure_future(worker.async_run())
        try:
            yield
        finally:
            await asyncio.sleep(0.2)  # arq records each result after the job returned
            # arq's close() re-raises the CancelledError of a job task it cancels.
            with contextlib.suppress(asyncio.CancelledError):
                await worker.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class BullMQPeer(Peer):
    name = "bullmq"
    redeliver_s = 4.0  # lockDuration 3 s, stalled check every 1 s (kill row)

    async def open(self) -> None:
        from bullmq import Queue

        self.queue = Queue("bench", {"connection": self.url})

    async def close(self) -> None:
        await self.queue.close()

    @staticmethod
    def _opts(key: str, due_ms: int | None) -> dict[str, Any]:
        opts: dict[str, Any] = {"jobId": key, "removeOnComplete": True}
        if due_ms is not None:
            opts["delay"] = max(0, due_ms - now_ms())
        return opts

    async def schedule_many(self, jobs: Sequence[Job]) -> None:
        await self.queue.addBulk(
            [{"name": "job", "data": [d, PAD], "opts": self._opts(k, d)} for k, d in jobs]
        )

    async def schedule_one(self, key: str, due_ms: int) -> None:
        await self.queue.add("job", [due_ms, PAD], self._opts(key, due_ms))

    async def schedule_now(self, keys: Sequence[str]) -> None:
        t = now_ms()
        await self.queue.addBulk(
            [{"name": "job", "data": [t, PAD], "opts": self._opts(k, None)} for k in keys]
        )

    @contextlib.asynccontextmanager
    async def worker(
        self, handler: Handler, concurrency: int = CONCURRENCY, kill_row: bool = False
    ) -> AsyncIterator[None]:
        from bullmq import Worker

        async def job(j: Any, token: str) -> None:
            await handler(str(j.id), int(j.data[0]))

        opts: dict[str, Any] = {
            "connection": self.url,
            "concurrency": concurrency,
            # An idle wait of the default 5 s meets redis-py's 5 s socket timeout and
            # stalls the worker for minutes (bench/peers/bullmq_limiter.py says how); a
            # wait for a delayed job still ends at that job's due, so 1 s costs nothing.
            "drainDelay": 1,
            "autorun": False,
        }
        if kill_row:
            opts.update(lockDuration=3000, stalledInterval=1000)
        worker = Worker("bench", job, opts)
        # The port never reads the server's version on the worker's blocking connection,
        # so it assumes BZPOPMIN takes whole seconds and rounds each wait for the next
        # delayed job up to a second. BullMQ for Node asks when it connects: so do we.
        await worker.blockingRedisConnection.getRedisVersion()
        task = asyncio.ensure_future(worker.run())
        try:
            yield
        finally:
            await worker.close()
            await asyncio.gather(task, return_exceptions=True)


class SaqPeer(_CallPeer):
    name = "saq"
    # Kill row: a job running for more than its timeout (3 s) is swept (every 1 s), and
    # the sweep waits up to 5 s for each swept job to abort, one after the other.
    redeliver_s = 4.0 + 5.0 * KILL_CONCURRENCY

    async def open(self) -> None:
        from saq.queue.redis import RedisQueue

        # Each of the worker's jobs blocks a connection in BLMOVE: redis-py's pool
        # (100 by default) must hold them and the upkeep tasks.
        client = redis.asyncio.Redis.from_url(self.url, max_connections=2 * CONCURRENCY + 50)
        self.queue = RedisQueue(client, name="bench")

    async def close(self) -> None:
        await self.queue.disconnect()

    def _enqueue(self, key: str, due_ms: int | None) -> Callable[[], Awaitable[Any]]:
        scheduled = 0 if due_ms is None else due_ms / 1000
        due = now_ms() if due_ms is None else due_ms
        return lambda: self.queue.enqueue(
            "job",
            key=key,
            scheduled=scheduled,
            retries=3,
            timeout=3,
            due_ms=due,
            pad=PAD,
        )

    @contextlib.asynccontextmanager
    async def worker(
        self, handler: Handler, concurrency: int = CONCURRENCY, kill_row: bool = False
    ) -> AsyncIterator[None]:
        from saq import Worker

        async def job(ctx: dict[str, Any], *, due_ms: int, pad: str) -> None:
            await handler(ctx["job"].key, due_ms)

        timers: dict[str, int] = {"schedule": 1}
        if kill_row:
            timers["sweep"] = 1
        worker = Worker(
            self.queue,
            [("job", job)],
            concurrency=concurrency,
            timers=timers,  # type: ignore[arg-type]
        )
        worker.SIGNALS = []  # in-process: leave the bench's signal handling alone
        task = asyncio.ensure_future(worker.start())
        try:
            yield
        finally:
            await worker.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class StreaqPeer(Peer):
    name = "streaq"
    redeliver_s = 4.0  # idle_timeout 3 s (kill row)

    def _make(self, kill_row: bool = False, concurrency: int = CONCURRENCY) -> Any:
        from streaq import Worker

        w = Worker(
            redis_url=self.url,
            queue_name="bench",
            concurrency=concurrency,
            handle_signals=False,
            idle_timeout=3 if kill_row else 60,
        )
        self._handler: Handler | None = None

        @w.task(name="job", ttl=0, max_tries=3)
        async def job(due_ms: int, pad: str) -> None:
            assert self._handler is not None
            await self._handler(job.context.task_id, due_ms)

        return w, job

    async def open(self) -> None:
        self.producer, self.job = self._make()
        self._stack = contextlib.AsyncExitStack()
        await self._stack.enter_async_context(self.producer)

    async def close(self) -> None:
        await self._stack.aclose()

    def _task(self, key: str, due_ms: int | None) -> Any:
        t = self.job.enqueue(due_ms or now_ms(), PAD)
        t.id = key
        if due_ms is not None:
            t.start(schedule=datetime.fromtimestamp(due_ms / 1000, UTC))
        return t

    async def schedule_many(self, jobs: Sequence[Job]) -> None:
        await self.producer.enqueue_many([self._task(k, d) for k, d in jobs])

    async def schedule_one(self, key: str, due_ms: int) -> None:
        await self._task(key, due_ms)

    async def schedule_now(self, keys: Sequence[str]) -> None:
        await self.producer.enqueue_many([self._task(k, None) for k in keys])

    @contextlib.asynccontextmanager
    async def worker(
        self, handler: Handler, concurrency: int = CONCURRENCY, kill_row: bool = False
    ) -> AsyncIterator[None]:
        w, _ = self._make(kill_row, concurrency)
        self._handler = handler
        task = asyncio.ensure_future(w.run_async())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


PEERS: dict[str, type[Peer]] = {p.name: p for p in (ArqPeer, BullMQPeer, SaqPeer, StreaqPeer)}


def quiet() -> None:
    """The peers log every job at INFO: keep the bench's output to its progress bar. saq
    warns at every stop that its jobs' tasks (blocked in BLMOVE) had to be cancelled."""
    for name in ("arq", "bullmq", "streaq", "coredis"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("saq").setLevel(logging.ERROR)
