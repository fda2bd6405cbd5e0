"""Firing lateness of durable jobs, tickwheel's loader beside arq's deferred jobs.

Jobs fall due at a steady rate (``--rates``, jobs/s) for ``--seconds``; each records
``time.time()`` when it runs, minus its due time (both on this host's wall clock, which
Redis's ``TIME`` also reads). Both sides get the jobs in well before the first is due,
use one private redis-server, and run in one process on one event loop, one after the
other, in the same run.

* tickwheel: ``Scheduler.schedule_many`` with absolute due times; one :class:`Loader`
  (lookahead 0.5 s, poll 50 ms) places claimed jobs in the wheel at Redis's due time.
* arq: ``enqueue_job(..., _defer_until=...)``; one ``Worker`` with ``poll_delay`` 50 ms
  (its default is 0.5 s) and ``max_jobs`` 100.

    .venv/bin/python bench/spill_vs_arq.py --rates 1000,10000 --seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

import redis.asyncio
from arq.connections import RedisSettings, create_pool
from arq.worker import Worker, func

from bench._harness import lateness_probe
from tickwheel.durable import JobSpec, Loader, Scheduler, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.wheel import TimingWheel

# Seconds of lead per job enqueued, plus a fixed second: arq enqueues one job per call
# (about 0.3 ms each here), and no job may be due before all are in.
LEAD_PER_JOB = 0.0006
POLL = 0.05


def _pcts(late: list[float]) -> str:
    late = sorted(late)
    p = {q: late[min(len(late) - 1, int(len(late) * q))] for q in (0.5, 0.99)}
    return (
        f"p50 {p[0.5]:7.1f} ms  p99 {p[0.99]:7.1f} ms  max {late[-1]:7.1f} ms  "
        f"min {late[0]:6.1f} ms"
    )


async def _tickwheel(
    url: str, rate: int, seconds: float, flush: bool = True, prefix: str = "j"
) -> list[float]:
    """Lateness (ms) of ``rate * seconds`` jobs in namespace ``bench`` (one shard), ids
    ``prefix`` + a number; with ``flush=False`` whatever is pending there stays (the far
    jobs of ``python -m bench``)."""
    client = redis.asyncio.Redis.from_url(url)
    if flush:
        await client.flushall()
    n = int(rate * seconds)
    reg = TaskRegistry()
    late, _, done = lateness_probe(reg, "probe", n)

    sched = Scheduler(client, "bench", shards=1, check=False)
    await sched.take(0)
    start_ms = int(time.time() * 1000 + (1 + n * LEAD_PER_JOB) * 1000)
    for i in range(0, n, 1000):
        await sched.schedule_many(
            JobSpec(f"{prefix}{k}", "probe", at=start_ms + k * 1000 // rate)
            for k in range(i, min(n, i + 1000))
        )
    loader = Loader(sched, reg, TimingWheel(), lookahead=0.5, poll_interval=POLL, limit=1000)
    task = asyncio.ensure_future(loader.run())
    await done.wait()
    loader.stop_claiming()
    await task
    await loader.drain(1.0)  # the last acks
    await sched.close()  # gives the shard back for the next run in this Redis
    await client.aclose()
    return late


async def _arq(server: RedisServer, rate: int, seconds: float, flush: bool = True) -> list[float]:
    """As :func:`_tickwheel`, through arq's default queue."""
    settings = RedisSettings(host="127.0.0.1", port=server.port)
    pool = await create_pool(settings)
    if flush:
        await pool.flushall()
    n = int(rate * seconds)
    late: list[float] = []
    done = asyncio.Event()

    async def probe(ctx: dict[str, Any], due_ms: int) -> None:
        late.append(time.time() * 1000 - due_ms)
        if len(late) == n:
            done.set()

    start_ms = int(time.time() * 1000 + (1 + n * LEAD_PER_JOB) * 1000)
    for k in range(n):
        due_ms = start_ms + k * 1000 // rate
        await pool.enqueue_job(
            "probe", due_ms, _defer_until=datetime.fromtimestamp(due_ms / 1000, UTC)
        )
    worker = Worker(
        functions=[func(probe, name="probe")],
        redis_settings=settings,
        poll_delay=POLL,
        max_jobs=100,
        handle_signals=False,
    )
    task = asyncio.ensure_future(worker.async_run())
    await done.wait()
    await asyncio.sleep(0.5)  # arq records each result after the job returned
    # arq's close() cancels job tasks still finishing and re-raises their CancelledError.
    with contextlib.suppress(asyncio.CancelledError):
        await worker.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await pool.aclose()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rates", default="1000,10000", help="jobs per second, comma list")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    logging.getLogger("arq").setLevel(logging.WARNING)
    with RedisServer() as server:
        loop = asyncio.new_event_loop()
        try:
            for rate in (int(r) for r in args.rates.split(",")):
                ours = loop.run_until_complete(_tickwheel(server.url, rate, args.seconds))
                theirs = loop.run_until_complete(_arq(server, rate, args.seconds))
                print(f"{rate:>6} jobs/s  tickwheel  {_pcts(ours)}", flush=True)
                print(f"{rate:>6} jobs/s  arq        {_pcts(theirs)}", flush=True)
        finally:
            loop.close()


if __name__ == "__main__":
    main()
