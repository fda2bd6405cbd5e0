"""Section 3 of ``python -m bench``: durable jobs against arq, with N jobs pending.

One private redis-server for the section; each repeat measures tickwheel (namespace
``bench``, one shard: arq also keeps one sorted set) then arq, flushing in between:

1. bulk schedule: N far jobs (due in a day). tickwheel: ``schedule_many`` by 1000; arq
   has no batch call, so 100 ``enqueue_job`` calls in flight at once (its fastest path).
2. Redis ``used_memory`` per pending job after step 1.
3. single schedule: sequential awaited calls, one job each (``schedule`` /
   ``enqueue_job``), with the N jobs pending.
4. drain: D jobs due now, run by a worker until all ran (claim + run a no-op + ack):
   a :class:`Loader` (max 32 tasks, LIMIT 1000) against arq's ``Worker`` (max_jobs 100,
   poll 50 ms).
5. firing lateness of jobs due at a steady rate, bench/spill_vs_arq.py's runs, with the
   N jobs still pending.

saq (also asyncio + Redis, installable here) is not a peer yet: its worker did not run
scheduled jobs in a first try within this issue's time (see bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.asyncio

from bench import spill_vs_arq as sv
from bench._harness import Checks, Figure, Plan, Progress, percentiles
from tickwheel.durable import JobSpec, Loader, Scheduler, TaskContext, TaskRegistry
from tickwheel.durable._server import RedisServer
from tickwheel.wheel import TimingWheel

SECTION = "durable"
FAR = 86_400  # s: the pending jobs are never due during a run
CHUNK = 1000  # schedule_many batch
IN_FLIGHT = 100  # arq enqueue_job calls at once in the bulk fill
PAYLOAD = b"x" * 32
DRAIN_TIMEOUT = 120.0  # s before a drain that has not finished counts as jobs lost


def steps(plan: Plan) -> int:
    return plan.repeats * 2


async def _used_memory(client: Any) -> int:
    return int((await client.info("memory"))["used_memory"])


async def _tickwheel(url: str, plan: Plan, checks: Checks) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    out: dict[str, Any] = {}
    s = Scheduler(client, "bench", shards=1, check=False)
    await s.take(0)
    mem0 = await _used_memory(client)
    t = time.perf_counter()
    for start in range(0, plan.durable_pending, CHUNK):
        await s.schedule_many(
            JobSpec(f"far:{i}", "noop", PAYLOAD, delay=FAR)
            for i in range(start, min(plan.durable_pending, start + CHUNK))
        )
    out["bulk_per_s"] = plan.durable_pending / (time.perf_counter() - t)
    out["bytes_per_job"] = (await _used_memory(client) - mem0) / plan.durable_pending
    t = time.perf_counter()
    for i in range(plan.durable_singles):
        await s.schedule(f"one:{i}", "noop", PAYLOAD, delay=FAR)
    out["single_per_s"] = plan.durable_singles / (time.perf_counter() - t)

    ran: list[int] = []
    all_ran = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="noop")
    def noop(ctx: TaskContext) -> None:
        ran.append(1)
        if len(ran) == plan.durable_drain:
            all_ran.set()

    await s.schedule_many(JobSpec(f"due:{i}", "noop", PAYLOAD) for i in range(plan.durable_drain))
    loader = Loader(s, reg, TimingWheel(), lookahead=0.0, limit=1000, poll_interval=0.05)
    t = time.perf_counter()
    task = asyncio.ensure_future(loader.run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_ran.wait(), DRAIN_TIMEOUT)
    out["drain_per_s"] = len(ran) / (time.perf_counter() - t)
    loader.stop_claiming()
    await task
    await loader.drain(1.0)  # the last acks
    checks.expect(
        loader.stats.succeeded == plan.durable_drain == len(ran),
        f"durable: tickwheel ran every due job once ({len(ran)}/{plan.durable_drain})",
    )
    await s.close()  # gives the shard back: spill_vs_arq's run takes it next
    await client.aclose()
    late = await asyncio.wait_for(
        sv._tickwheel(url, plan.durable_rate, plan.durable_seconds, flush=False),
        plan.durable_seconds + DRAIN_TIMEOUT,
    )
    n = int(plan.durable_rate * plan.durable_seconds)
    checks.expect(len(late) == n, f"durable: tickwheel fired every job ({len(late)}/{n})")
    checks.expect(min(late) >= 0, f"durable: no tickwheel job early (min {min(late):.2f} ms)")
    out["lateness_ms"] = percentiles(late)
    return out


async def _arq(server: RedisServer, plan: Plan, checks: Checks) -> dict[str, Any]:
    from arq.connections import RedisSettings, create_pool
    from arq.worker import Worker, func

    settings = RedisSettings(host="127.0.0.1", port=server.port)
    pool = await create_pool(settings)
    await pool.flushall()
    out: dict[str, Any] = {}
    mem0 = await _used_memory(pool)
    t = time.perf_counter()
    for start in range(0, plan.durable_pending, IN_FLIGHT):
        await asyncio.gather(
            *(
                pool.enqueue_job("noop", PAYLOAD, _job_id=f"far:{i}", _defer_by=FAR)
                for i in range(start, min(plan.durable_pending, start + IN_FLIGHT))
            )
        )
    out["bulk_per_s"] = plan.durable_pending / (time.perf_counter() - t)
    out["bytes_per_job"] = (await _used_memory(pool) - mem0) / plan.durable_pending
    t = time.perf_counter()
    for i in range(plan.durable_singles):
        await pool.enqueue_job("noop", PAYLOAD, _job_id=f"one:{i}", _defer_by=FAR)
    out["single_per_s"] = plan.durable_singles / (time.perf_counter() - t)

    ran: list[int] = []
    all_ran = asyncio.Event()

    async def noop(ctx: dict[str, Any], payload: bytes) -> None:
        ran.append(1)
        if len(ran) == plan.durable_drain:
            all_ran.set()

    for start in range(0, plan.durable_drain, IN_FLIGHT):
        await asyncio.gather(
            *(
                pool.enqueue_job("noop", PAYLOAD, _job_id=f"due:{i}")
                for i in range(start, min(plan.durable_drain, start + IN_FLIGHT))
            )
        )
    worker = Worker(
        functions=[func(noop, name="noop")],
        redis_settings=settings,
        poll_delay=sv.POLL,
        max_jobs=100,
        handle_signals=False,
        keep_result=0,
    )
    t = time.perf_counter()
    task = asyncio.ensure_future(worker.async_run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_ran.wait(), DRAIN_TIMEOUT)
    out["drain_per_s"] = len(ran) / (time.perf_counter() - t)
    await asyncio.sleep(0.5)  # arq records each result after the job returned
    # arq's close() re-raises the CancelledError of a job task it cancels.
    with contextlib.suppress(asyncio.CancelledError):
        await worker.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    checks.expect(len(ran) >= plan.durable_drain, "durable: arq ran every due job")
    await pool.aclose()
    late = await asyncio.wait_for(
        sv._arq(server, plan.durable_rate, plan.durable_seconds, flush=False),
        plan.durable_seconds + plan.durable_rate * plan.durable_seconds * 0.01 + DRAIN_TIMEOUT,
    )
    out["lateness_ms"] = percentiles(late)
    return out


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    logging.getLogger("arq").setLevel(logging.WARNING)
    rows: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    try:
        with RedisServer() as server:
            for r in range(plan.repeats):
                progress.step(f"durable: tickwheel, {plan.durable_pending:,} pending, {r + 1}")
                ours = loop.run_until_complete(_tickwheel(server.url, plan, checks))
                progress.step(f"durable: arq, {plan.durable_pending:,} pending, {r + 1}")
                theirs = loop.run_until_complete(_arq(server, plan, checks))
                rows.append({"tickwheel": ours, "arq": theirs})
    finally:
        loop.close()
    n = f"{plan.durable_pending:,} pending"
    specs = [
        ("bulk_per_s", f"bulk schedule, {n}", "jobs/s", "higher"),
        ("single_per_s", f"single schedule, {n}", "jobs/s", "higher"),
        ("drain_per_s", f"claim+run+ack of due jobs, {n}", "jobs/s", "higher"),
        ("bytes_per_job", "Redis memory per pending job", "B", "lower"),
    ]
    figures = []
    for key, name, unit, better in specs:
        fig = Figure(SECTION, name, "arq", unit, better)
        for row in rows:
            fig.add(row["tickwheel"][key], row["arq"][key])
        figures.append(fig)
    for q in ("p50", "p99", "max"):
        fig = Figure(
            SECTION, f"firing lateness {q} at {plan.durable_rate:,} jobs/s", "arq", "ms", "lower"
        )
        for row in rows:
            fig.add(row["tickwheel"]["lateness_ms"][q], row["arq"]["lateness_ms"][q])
        figures.append(fig)
    return {"figures": figures, "raw": {"runs": rows}}
