"""The cost of per-key flow limits (issue 35), in one run on one private redis-server:

    python -m bench.probes.flow_limits [--jobs 5000] [--keys 500] [--rounds 5]

- **claim+run+ack**: ``--jobs`` due jobs over ``--keys`` flow keys, run by one
  :class:`Worker` on a no-op ``async def`` task without limits, then the same task with
  ``concurrency=4`` (per key: a permit taken and released per job, rarely a wait), each
  row of each round in a fresh process, the rows in a rotating order. Figures: the
  median jobs/s of each row, and the ratio of the medians (target: limits at least
  50 % of the unlimited rate).
- **release latency**: one key with ``concurrency=1`` and 300 jobs due at once: the
  time from a run's end (its handler returned) to the next run's start, p50 and p99
  (target: p99 at most 5 ms). The waiters are made due by the release and claimed by
  the releasing worker's next claim round, started at once.
- **memory**: Redis ``used_memory`` per job of 20,000 jobs pending (due in a minute,
  the near index) against 20,000 jobs waiting for one key's permit (each a due job at
  its recheck time, an entry in the key's waiters and one in its shard's waits).
- **BullMQ's global limiter**, when ``bullmq`` is installed (the ``bench`` extra): 40
  jobs under ``limiter={max: 10, duration: 1000}`` against tickwheel's ``rate=(10,
  1.0)`` on one key: the most starts in any 1 s window and the time to run them. BullMQ's
  limiter is per queue: it cannot limit per key (its groups are BullMQ Pro's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import subprocess
import sys
import time
from typing import Any

FAST = {"lookahead": 0.0, "poll_interval": 0.01, "limit": 1000}


def _registry(limited: bool, record: list[tuple[float, float]] | None = None) -> Any:
    from tickwheel.durable import TaskContext, TaskRegistry

    reg = TaskRegistry()
    if record is None:

        async def noop(ctx: TaskContext) -> None:
            return None

        reg.task(name="noop", concurrency=4 if limited else None)(noop)
        return reg

    async def timed(ctx: TaskContext) -> None:
        start = time.perf_counter()
        record.append((start, time.perf_counter()))

    reg.task(name="noop", concurrency=1)(timed)
    return reg


async def _throughput(url: str, jobs: int, keys: int, limited: bool) -> float:
    from tickwheel.durable import JobSpec, Scheduler, Worker
    from tickwheel.durable.store._connect import client_from_url

    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        specs = [JobSpec(f"j{i}", "noop", key=f"k{i % keys}") for i in range(jobs)]
        for i in range(0, jobs, 5000):
            await sched.schedule_many(specs[i : i + 5000])
        worker = Worker(sched, _registry(limited), **FAST)
        gc.collect()
        start = time.perf_counter()
        task = asyncio.ensure_future(worker.run())
        while worker.loader is None or worker.loader.stats.succeeded < jobs:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        took = time.perf_counter() - start
        worker.stop()
        await task
        return jobs / took
    finally:
        await client.aclose()


async def _latency(url: str, jobs: int = 300) -> list[float]:
    from tickwheel.durable import JobSpec, Scheduler, Worker
    from tickwheel.durable.store._connect import client_from_url

    client = client_from_url(url)
    record: list[tuple[float, float]] = []
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=1, check=False)
        await sched.open()
        await sched.schedule_many([JobSpec(f"j{i}", "noop", key="one") for i in range(jobs)])
        worker = Worker(sched, _registry(True, record), **FAST)
        task = asyncio.ensure_future(worker.run())
        deadline = time.monotonic() + 120
        while len(record) < jobs and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        worker.stop()
        await task
    finally:
        await client.aclose()
    record.sort()
    return [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(record)]


async def _memory(url: str, n: int = 20_000) -> tuple[float, float]:
    from tickwheel.durable import JobSpec, Limits, Scheduler
    from tickwheel.durable.store import PERMIT_WAIT
    from tickwheel.durable.store._connect import client_from_url

    client = client_from_url(url)
    try:
        await client.execute_command("FLUSHALL", "SYNC")
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        base = int((await client.info("memory"))["used_memory"])
        # Due in a minute: the near index (a due ZSET entry and a record), as a waiting
        # job is (due at its recheck time).
        specs = [JobSpec(f"p{i}", "noop", delay=60) for i in range(n)]
        for i in range(0, n, 5000):
            await sched.schedule_many(specs[i : i + 5000])
        pending = (int((await client.info("memory"))["used_memory"]) - base) / n
        await client.execute_command("FLUSHALL", "SYNC")
        sched = Scheduler(client, "bench2", shards=4, check=False)
        await sched.open()
        base = int((await client.info("memory"))["used_memory"])
        lim = Limits(concurrency=1)
        specs = [JobSpec(f"w{i}", "noop", key="one") for i in range(n)]
        for i in range(0, n, 5000):
            await sched.schedule_many(specs[i : i + 5000])
        calls = sched.store.limits
        for shard in range(4):
            await sched.take(shard)
            while True:
                batch = await sched.claim(shard, limit=1000, lease=600.0)
                if not batch.jobs:
                    break
                for job in batch.jobs:
                    code, _ = await calls.acquire(job, lim, 600_000)
                    if code == PERMIT_WAIT:
                        await calls.wait(job, 600_000, permit=True)
        waiting = (int((await client.info("memory"))["used_memory"]) - base) / n
        return pending, waiting
    finally:
        await client.aclose()


async def _rate_tickwheel(url: str, n: int = 40) -> tuple[int, float]:
    from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
    from tickwheel.durable.store._connect import client_from_url

    starts: list[float] = []
    reg = TaskRegistry()

    @reg.task(name="rated", rate=(10, 1.0))
    async def rated(ctx: TaskContext) -> None:
        starts.append(time.time() * 1000)

    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        t0 = time.time() * 1000
        await sched.schedule_many([JobSpec(f"r{i}", "rated", key="ep") for i in range(n)])
        worker = Worker(sched, reg, **FAST)
        task = asyncio.ensure_future(worker.run())
        while len(starts) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        worker.stop()
        await task
        return _most_in_window(starts, 1000), (max(starts) - t0) / 1000
    finally:
        await client.aclose()


async def _rate_bullmq(url: str, n: int = 40) -> tuple[int, float, int]:
    from bullmq import Queue, Worker  # type: ignore[import-not-found, import-untyped]

    starts: list[float] = []

    async def job(j: Any, token: str) -> None:
        starts.append(time.time() * 1000)

    queue = Queue("limited", {"connection": url})
    t0 = time.time() * 1000
    await queue.addBulk([{"name": "job", "data": {}, "opts": {}} for _ in range(n)])
    worker = Worker(
        "limited",
        job,
        {"connection": url, "limiter": {"max": 10, "duration": 1000}, "autorun": False},
    )
    task = asyncio.ensure_future(worker.run())
    deadline = time.monotonic() + 60
    while len(starts) < n and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await worker.close()
    await asyncio.gather(task, return_exceptions=True)
    await queue.close()
    return _most_in_window(starts, 1000), (max(starts) - t0) / 1000, len(starts)


def _most_in_window(starts: list[float], window_ms: float) -> int:
    starts = sorted(starts)
    most, j = 0, 0
    for i, s in enumerate(starts):
        while starts[j] < s - window_ms:
            j += 1
        most = max(most, i - j + 1)
    return most


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a throughput row here
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        rate = asyncio.run(_throughput(args.url, args.jobs, args.keys, args.one == "on"))
        print(rate)
        return
    from tickwheel.durable.servers import RedisServer

    server = RedisServer().start()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        names = list(rates)
        for r in range(args.rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                argv = [sys.executable, "-m", "bench.probes.flow_limits", "--one", name]
                argv += ["--url", server.url, "--jobs", str(args.jobs), "--keys", str(args.keys)]
                out = subprocess.run(argv, capture_output=True, text=True, check=True)
                rates[name].append(float(out.stdout.split()[-1]))
        gaps = asyncio.run(_latency(server.url))
        pending, waiting = asyncio.run(_memory(server.url))
        tw_rate = asyncio.run(_rate_tickwheel(server.url))
        try:
            bull: tuple[int, float, int] | None = asyncio.run(_rate_bullmq(server.url))
        except ImportError:
            bull = None
    finally:
        server.stop()
    med = {name: statistics.median(v) for name, v in rates.items()}
    paired = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    print(f"claim+run+ack of {args.jobs} due jobs over {args.keys} keys, {args.rounds} rounds")
    for name, values in rates.items():
        print(f"  limits {name:3s} median {med[name]:8.0f} jobs/s  (min {min(values):.0f}"
              f" max {max(values):.0f})")  # fmt: skip
    print(f"  on / off: {med['on'] / med['off']:.3f} (median of the rounds' ratios"
          f" {statistics.median(paired):.3f})")  # fmt: skip
    print(f"release latency, one key, concurrency=1, {len(gaps) + 1} jobs:"
          f" p50 {_pct(gaps, 0.5):.2f} ms  p99 {_pct(gaps, 0.99):.2f} ms"
          f"  max {max(gaps):.2f} ms")  # fmt: skip
    print(f"Redis memory per job: pending {pending:.0f} B, waiting for a permit {waiting:.0f} B"
          f" ({waiting / pending:.2f}x)")  # fmt: skip
    print(f"rate (10 per 1 s), 40 jobs at once: tickwheel per key: most in a 1 s window"
          f" {tw_rate[0]}, done in {tw_rate[1]:.2f} s")  # fmt: skip
    if bull is None:
        print("  bullmq: not installed (the bench extra)")
    else:
        print(f"  bullmq limiter (per queue, no key): {bull[2]} of 40 ran within 60 s, most"
              f" in a 1 s window {bull[0]}, the last at {bull[1]:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
