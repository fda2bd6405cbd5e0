"""Section 4 of ``python -m bench``: the source document's worked example, scaled down.

The source document (docs/design.md, "The source document") sizes 50M jobs a day over 16
shards, with an evening peak near 2,900 due jobs a second, and reckons that one owner
claiming LIMIT 500 every 100 ms gives a shard some 5,000 jobs/s of capacity. Here:

* peak: 16 shards, ``example_pending`` jobs pending (most due in a day), of which
  ``rate`` per second fall due for ``seconds``; one :class:`Worker` (poll 100 ms,
  LIMIT 500, lookahead 1 s) owns all 16 shards and runs a no-op task that records
  ``time.time()`` minus the due time. Reported: lateness percentiles, the worker's CPU
  and Redis's CPU per job (this process is the worker: its CPU over the peak minute).
* capacity: one shard with ``example_capacity_jobs`` jobs due now; a tight loop of
  ``claim(limit=500)`` (lease only: the document's claim script), and one of claim +
  ``ack_many``; jobs/s next to the document's 5,000/s.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio

from bench.runner.harness import Checks, Figure, Plan, Progress, percentiles
from bench.workloads.durable_lateness import evening_peak
from bench.workloads.durable_ops import drain
from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisServer

SECTION = "example"
SHARDS = 16
LIMIT = 500  # the document's claim LIMIT (the peak's: durable_lateness.PEAK_LIMIT)
DOC_CAPACITY = 5_000  # jobs/s per shard, the document's reckoning
DOC_PEAK = 2_900  # jobs due per second at the evening peak
FAR = 86_400
CHUNK = 1000


def steps(plan: Plan) -> int:
    return 2 + plan.repeats


async def _redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _peak(url: str, plan: Plan, checks: Checks, progress: Progress) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    sched = Scheduler(client, "reminders", shards=SHARDS, check=False)
    await sched.open()
    n_peak = int(plan.example_rate * plan.example_seconds)
    n_far = plan.example_pending - n_peak
    t = time.perf_counter()
    for start in range(0, n_far, CHUNK * 10):
        await sched.schedule_many(
            JobSpec(f"far:{i}", "remind", delay=FAR + i % 3600)
            for i in range(start, min(n_far, start + CHUNK * 10))
        )
    fill_s = time.perf_counter() - t
    progress.show(f"example: peak {plan.example_rate:,}/s for {plan.example_seconds:g} s")
    peak = await evening_peak(
        sched, plan.example_rate, plan.example_seconds, lambda: _redis_cpu(client)
    )
    late, seen = peak.late, peak.seen
    checks.expect(len(seen) == n_peak, f"example: every peak job ran ({len(seen)}/{n_peak})")
    checks.expect(min(late) >= 0, f"example: no job ran early (min {min(late):.2f} ms)")
    await client.aclose()
    return {
        "pending": plan.example_pending,
        "peak_jobs": n_peak,
        "fill_s": fill_s,
        "lateness_ms": percentiles(late),
        "runs": len(late),
        "duplicates": len(late) - len(seen),
        "worker_cpu_us_per_job": peak.worker_cpu_s / n_peak * 1e6,
        "redis_cpu_us_per_job": (peak.closed - peak.opened) / n_peak * 1e6,
        "stats": peak.stats.as_dict(),
    }


async def _capacity(url: str, jobs: int, ack: bool) -> float:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    s = Scheduler(client, "cap", shards=1, check=False)
    await s.take(0)
    for start in range(0, jobs, CHUNK):
        await s.schedule_many(
            JobSpec(f"j{i}", "remind") for i in range(start, min(jobs, start + CHUNK))
        )
    claimed, elapsed = await drain(s, 0, LIMIT, ack=ack)
    await client.aclose()
    if claimed != jobs:
        raise RuntimeError(f"capacity: claimed {claimed} of {jobs} due jobs")
    return claimed / elapsed


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    figures: list[Figure] = []
    raw: dict[str, Any] = {}
    try:
        with RedisServer() as server:
            progress.step(f"example: {plan.example_pending:,} pending in {SHARDS} shards")
            peak = loop.run_until_complete(_peak(server.url, plan, checks, progress))
            raw["peak"] = peak
            progress.step("example: saturated claim loop, one shard, LIMIT 500")
            doc = ("the document's 5,000/s", "jobs/s", "higher")
            claim_only = Figure(SECTION, "claim capacity per shard (claim only)", *doc)
            claim_ack = Figure(SECTION, "claim capacity per shard (claim + ack_many)", *doc)
            for r in range(plan.repeats):
                progress.step(f"example: capacity repeat {r + 1}/{plan.repeats}")
                for fig, ack in ((claim_only, False), (claim_ack, True)):
                    rate = loop.run_until_complete(
                        _capacity(server.url, plan.example_capacity_jobs, ack)
                    )
                    fig.add(rate, DOC_CAPACITY)
            figures += [claim_only, claim_ack]
            sustained = Figure(SECTION, "peak jobs run / due", "offered", "jobs", "higher")
            sustained.add(peak["runs"] - peak["duplicates"], peak["peak_jobs"])
            figures.append(sustained)
    finally:
        loop.close()
    return {"figures": figures, "raw": raw}
