"""Section 5 of ``python -m bench``: the Postgres mode beside a Postgres job queue, and
its firing lateness.

One private redis-server and one PostgreSQL (fsync and ``synchronous_commit`` on: a
commit waits for its WAL flush) for the section. Each repeat runs
bench/workloads/durable_ops.py's round in the Postgres mode, in the Redis-only mode (not
a figure: the cost of the source of truth, kept in the raw results) and, on the same
PostgreSQL, procrastinate's and pgqueuer's counterparts, from bench/peers/postgres.py
(pgqueuer in a venv of its own that the first full run makes, as it cannot share the
``bench`` extra; ``--quick`` runs it only when that venv is there already or pgqueuer 1.x
imports here, so CI does not build it):

- schedule: one awaited call per job, each its own commit;
- schedule_many: one call of ``pg_jobs`` jobs;
- claim + ack: claims of 100 due jobs and one ack per claim (procrastinate has no batch
  claim: one job each).

Then the firing lateness, in the Postgres mode and in the Redis-only mode on the same
servers: jobs due at a steady 1,000 jobs/s for 10 s (the issue's rate) and at 5,000
jobs/s for 4 s (the issue's end-to-end target for one worker process; ``--quick``: a
tenth of each), in 4 shards, scheduled ahead with ``schedule_many``, run by one
:class:`Worker` (lookahead 0.5 s, poll 50 ms) whose task records ``time.time()`` minus
the due time. Also the end-to-end rate: jobs over the time from the first due time to
the last run. Checked: every job runs once and none early.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg

from bench.peers.postgres import FIGURES, installed, pgqueuer_ready
from bench.runner.harness import Checks, Figure, Plan, Progress, percentiles, run_async_section
from bench.workloads.durable_lateness import lateness_probe
from bench.workloads.durable_ops import mode_round
from tickwheel.durable import JobSpec, Scheduler, TaskRegistry, Worker
from tickwheel.durable.postgres import migrate
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SECTION = "postgres"
SHARDS = 4
# The lateness runs: (jobs/s, seconds of the full form). 1,000/s is issue 13's figure,
# 5,000/s its end-to-end target for one worker process.
LATENESS_RUNS = ((1_000, 10.0), (5_000, 4.0))
LEAD = 2.0  # s between the scheduling and the first due time
FINISH_TIMEOUT = 30.0


def steps(plan: Plan) -> int:
    return plan.repeats + len(LATENESS_RUNS)


def _jobs(plan: Plan) -> int:
    return 200 if plan.quick else 1_000


async def _lateness(
    redis_url: str, pg_url: str | None, ns: str, rate: int, seconds: float
) -> dict[str, Any]:
    client = client_from_url(redis_url)
    sched = Scheduler(client, ns, shards=SHARDS, check=False, postgres_url=pg_url)
    n = max(1, int(rate * seconds))
    try:
        await sched.open()
        start_ms = await sched.store.now(0) + int(LEAD * 1000)
        specs = [JobSpec(f"l{k}", "probe", at=start_ms + k * 1000 // rate) for k in range(n)]
        for i in range(0, n, 1000):
            await sched.schedule_many(specs[i : i + 1000])
        reg = TaskRegistry()
        late, seen, all_ran = lateness_probe(reg, "probe", n)
        worker = Worker(sched, reg, lookahead=0.5, poll_interval=0.05)
        running = asyncio.ensure_future(worker.run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_ran.wait(), LEAD + seconds + FINISH_TIMEOUT)
        last_ms = time.time() * 1000  # the last run, once all_ran was set
        await asyncio.sleep(0.5)  # a late duplicate, if any, shows up
        worker.stop()
        await running
    finally:
        await sched.close()
        await client.aclose()
    span_s = max(last_ms - start_ms, 1.0) / 1000
    return {
        "mode": "postgres" if pg_url else "redis",
        "rate": rate,
        "jobs": n,
        "end_to_end": len(seen) / span_s,
        "ran": len(seen),
        "duplicates": len(late) - len(seen),
        "early": sum(1 for x in late if x < 0),
        "lateness_ms": percentiles(late) if late else {},
    }


async def _section(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    jobs = _jobs(plan)
    rounds: dict[str, dict[str, list[float]]] = {"redis": {}, "postgres": {}}
    peers = installed(("procrastinate", "pgqueuer"))
    if plan.quick and not pgqueuer_ready():
        peers.pop("pgqueuer", None)
    for name in peers:
        rounds[name] = {}
    with (
        RedisServer() as redis_server,
        PostgresServer(extra_conf={"synchronous_commit": "on"}) as pg,
    ):
        conn: Any = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        for r in range(plan.repeats):
            progress.step(f"postgres: repeat {r + 1}/{plan.repeats}, {jobs} jobs per figure")
            for mode, url in (("postgres", pg.url), ("redis", None)):
                got = await mode_round(redis_server.url, url, f"{mode}{r}", jobs)
                for name, value in got.items():
                    rounds[mode].setdefault(name, []).append(value)
            for peer, fn in peers.items():
                for name, value in (await fn(pg.url, jobs)).items():
                    rounds[peer].setdefault(name, []).append(value)
        lateness = []
        for rate, seconds in LATENESS_RUNS:
            progress.step(f"postgres: lateness at {rate:,} jobs/s, both modes")
            for mode, url in (("postgres", pg.url), ("redis", None)):
                lateness.append(
                    await _lateness(
                        redis_server.url,
                        url,
                        f"blate-{mode}-{rate}",
                        rate,
                        seconds / 10 if plan.quick else seconds,
                    )
                )
    for late in lateness:
        what = f"postgres: the {late['mode']} mode at {late['rate']:,}/s"
        checks.expect(late["ran"] == late["jobs"], f"{what} ran {late['ran']} of {late['jobs']}")
        checks.expect(late["duplicates"] == 0, f"{what}: {late['duplicates']} duplicate runs")
        checks.expect(late["early"] == 0, f"{what}: {late['early']} jobs ran early")
    figures = []
    for peer in peers:
        for name in FIGURES:
            fig = Figure(SECTION, f"Postgres mode {name.split(' (')[0]}", peer, "us/job", "lower")
            for ours, theirs in zip(rounds["postgres"][name], rounds[peer][name], strict=True):
                fig.add(ours, theirs)
            figures.append(fig)
    return {"figures": figures, "raw": {"rounds": rounds, "lateness": lateness, "jobs": jobs}}


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    return run_async_section(_section, plan, progress, checks)
