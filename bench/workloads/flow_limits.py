"""The per-key flow limits' measurements (issue 35), written once for ``python -m bench``
(bench/runner/limits.py) and ``python -m bench.probes.flow_limits``.

Each takes the URL of a private redis-server, flushes it, and drives the public API
only (``Scheduler``, ``Worker``, ``registry.task(concurrency=, rate=)``,
``Scheduler.key_state``), so the figures keep meaning the same thing while the limits'
internals change:

- :func:`throughput`: ``jobs`` due jobs over ``keys`` flow keys, claimed, run (a no-op)
  and acked by one :class:`Worker`, with the task limited (``concurrency=4``) or not.
- :func:`release_gaps`: one key with ``concurrency=1`` and ``jobs`` due at once: the
  time from a run's end (its handler returned) to the next run's start.
- :func:`memory_per_job`: Redis memory per job of ``n`` jobs pending (due in a minute,
  the near index) against the same ``n`` jobs over ``keys`` flow keys waiting for
  their key's permit (the first of each key runs and holds it; a worker has tried and
  parked the others). Counted with ``MEMORY USAGE`` (``SAMPLES 0``: exact) over every
  key of the namespace, not ``used_memory``, whose Lua heap swings by some 40 B a job
  with what ran before.
- :func:`rate_runs`: ``n`` jobs of one key due at once under ``rate=(10, 1.0)``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.store._connect import client_from_url

# The worker's settings for every measurement: claim as soon as due, poll often.
FAST: dict[str, Any] = {"lookahead": 0.0, "poll_interval": 0.01, "limit": 1000}
CONCURRENCY = 4  # the throughput run's per-key limit
RATE = (10, 1.0)  # the rate run's limit: n starts per window of seconds
CHUNK = 5000  # schedule_many batch
TIMEOUT = 120.0  # s before a run that has not finished is given up (a check fails)


async def _until(done: Callable[[], bool], within: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def _with_worker(
    url: str,
    registry: TaskRegistry,
    specs: list[JobSpec],
    body: Callable[[Scheduler, Worker], Awaitable[Any]],
    shards: int = 4,
) -> Any:
    """Flush, schedule ``specs``, run ``body`` beside a running worker, stop it."""
    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=shards, check=False)
        await sched.open()
        await _schedule(sched, specs)
        worker = Worker(sched, registry, **FAST)
        gc.collect()
        task = asyncio.ensure_future(worker.run())
        try:
            return await body(sched, worker)
        finally:
            worker.stop()
            await task
    finally:
        await client.aclose()


async def throughput(url: str, jobs: int, keys: int, limited: bool) -> float:
    """Jobs per second of claim + run + ack, from the worker's start to the last ack.

    Raises:
        TimeoutError: if the jobs did not all run within :data:`TIMEOUT`.
    """
    reg = TaskRegistry()

    @reg.task(name="noop", concurrency=CONCURRENCY if limited else None)
    async def noop(ctx: TaskContext) -> None:
        return None

    specs = [JobSpec(f"j{i}", "noop", key=f"k{i % keys}") for i in range(jobs)]

    async def body(sched: Scheduler, worker: Worker) -> float:
        start = time.perf_counter()

        def done() -> bool:
            return worker.loader is not None and worker.loader.stats.succeeded >= jobs

        if not await _until(done):
            raise TimeoutError(f"{jobs} jobs did not run within {TIMEOUT} s")
        return jobs / (time.perf_counter() - start)

    return float(await _with_worker(url, reg, specs, body))


async def release_gaps(url: str, jobs: int) -> list[float]:
    """Per consecutive pair of runs of one key at ``concurrency=1``: the ms from the
    first's end to the second's start (``jobs - 1`` gaps; fewer if some did not run)."""
    record: list[tuple[float, float]] = []
    reg = TaskRegistry()

    @reg.task(name="one", concurrency=1)
    async def one(ctx: TaskContext) -> None:
        start = time.perf_counter()
        record.append((start, time.perf_counter()))

    specs = [JobSpec(f"j{i}", "one", key="one") for i in range(jobs)]

    async def body(sched: Scheduler, worker: Worker) -> None:
        await _until(lambda: len(record) >= jobs)

    await _with_worker(url, reg, specs, body, shards=1)
    record.sort()
    return [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(record)]


async def _namespace_bytes(client: Any, namespace: str) -> int:
    """``MEMORY USAGE ... SAMPLES 0`` summed over the keys of ``namespace`` (its shards'
    and its flow keys', all tagged ``{<namespace>...``), less the claims' replies (kept
    for a lease, not the jobs')."""
    total = 0
    async for name in client.scan_iter(match=f"{{{namespace}*", count=1000):
        if b":claim:" not in name:
            total += int(await client.memory_usage(name, samples=0) or 0)
    return total


async def memory_per_job(url: str, n: int, keys: int = 1) -> tuple[float, float]:
    """Redis bytes per job: (pending, waiting for a permit), the same ``n`` jobs over
    ``keys`` flow keys (``concurrency=1``: ``keys`` of them run, the rest wait; the
    waiting figure is the namespace's growth over the waiting jobs, the runners'
    permits and leases included).

    Raises:
        TimeoutError: if the jobs were not all waiting within :data:`TIMEOUT`.
    """
    release = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="hold", concurrency=1)
    async def hold(ctx: TaskContext) -> None:
        await release.wait()

    def specs(**kw: Any) -> list[JobSpec]:
        return [JobSpec(f"w{i}", "hold", key=f"k{i % keys}", **kw) for i in range(n)]

    client = client_from_url(url)
    try:
        await client.execute_command("FLUSHALL", "SYNC")
        sched = Scheduler(client, "pending", shards=4, check=False)
        await sched.open()
        base = await _namespace_bytes(client, "pending")
        await _schedule(sched, specs(delay=60))
        pending = (await _namespace_bytes(client, "pending") - base) / n
        await client.execute_command("FLUSHALL", "SYNC")
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        # A slot for each key's runner, so that every job reaches its key's gate.
        worker = Worker(sched, reg, **{**FAST, "max_running": max(keys, 100) + 100})
        task = asyncio.ensure_future(worker.run())
        try:
            await asyncio.sleep(0.3)  # the worker settles (its limits, ownership, stats)
            base = await _namespace_bytes(client, "bench")  # the worker's own keys
            await _schedule(sched, specs())
            deadline = time.monotonic() + TIMEOUT
            while sum(i.waiting for i in await sched.inspect()) < n - keys:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n - keys} jobs were not waiting within {TIMEOUT} s")
                await asyncio.sleep(0.05)
            waiting = (await _namespace_bytes(client, "bench") - base) / (n - keys)
        finally:
            release.set()
            worker.stop()
            await task
        return pending, waiting
    finally:
        await client.aclose()


async def _schedule(sched: Scheduler, specs: list[JobSpec]) -> None:
    for i in range(0, len(specs), CHUNK):
        await sched.schedule_many(specs[i : i + CHUNK])


async def rate_runs(url: str, n: int) -> tuple[float, list[tuple[float, float]]]:
    """``n`` jobs of one key due at once under ``rate=RATE``: the epoch ms just before
    they were scheduled, and per run (due ms as claimed, handler start ms), sorted by
    start. The grant of a run's start lies between the two (both Redis's clock here:
    one host).

    Raises:
        TimeoutError: if the jobs did not all run within :data:`TIMEOUT`.
    """
    runs: list[tuple[float, float]] = []
    reg = TaskRegistry()

    @reg.task(name="rated", rate=RATE)
    async def rated(ctx: TaskContext) -> None:
        start = time.time() * 1000
        due = ctx.job.due_ms if ctx.job is not None else start
        runs.append((float(due), start))

    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        worker = Worker(sched, reg, **FAST)
        task = asyncio.ensure_future(worker.run())
        try:
            await asyncio.sleep(0.3)  # the worker settles (its limits written)
            t0 = time.time() * 1000
            await sched.schedule_many([JobSpec(f"r{i}", "rated", key="ep") for i in range(n)])
            if not await _until(lambda: len(runs) >= n):
                raise TimeoutError(f"{n} rated jobs did not run within {TIMEOUT} s")
        finally:
            worker.stop()
            await task
    finally:
        await client.aclose()
    return t0, sorted(runs, key=lambda r: r[1])


def most_in_window(starts: list[float], window_ms: float) -> int:
    """The most of ``starts`` in any closed window of ``window_ms``."""
    starts = sorted(starts)
    most, j = 0, 0
    for i, s in enumerate(starts):
        while starts[j] < s - window_ms:
            j += 1
        most = max(most, i - j + 1)
    return most


def most_surely_in_window(runs: list[tuple[float, float]], window_ms: float) -> int:
    """The most runs whose grants are surely in one closed window of ``window_ms``:
    each run's grant lies in [earliest, latest] (its due as claimed, its handler's
    start), and a set of runs is surely in one window when its latest latest minus its
    earliest earliest is at most ``window_ms``. O(n^2); sound whatever the handlers'
    lag: a count above the limit is a real breach."""
    most = 0
    for lo, _ in runs:
        inside = sum(1 for a, b in runs if a >= lo and b <= lo + window_ms)
        most = max(most, inside)
    return most
