"""What the Postgres mode sends per job: statements to PostgreSQL, calls to Redis, and
this process's CPU, for schedule, schedule_many and claim + ack.

    python -m bench.probes.pg_messages [--jobs N]

Starts a private redis-server and PostgreSQL (fsync and ``synchronous_commit`` on, with
``pg_stat_statements`` loaded) and runs the three figures of bench/workloads/durable_ops.py's
``mode_round`` one at a time, in the Postgres mode, each after a reset of both servers'
counters:

- PostgreSQL round trips per job: ``pg_stat_statements`` calls (asyncpg sends one
  message per statement; the pool's reset after a release is one message of four
  statements, counted once);
- Redis calls per job: ``INFO commandstats`` of EVALSHA and EVAL (the store sends one
  script per call on these paths; the commands a script runs inside are not counted);
- CPU per job of this process (``time.process_time``): on a loaded machine a round trip
  costs far more CPU (its send and wake-up) than the code around it.

The counts do not depend on the machine's load, unlike the wall times of
``python -m bench --only postgres``; the CPU is a median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.workloads.durable_ops import claim_ack_rounds
from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.postgres import migrate
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SHARDS = 4
_SCRIPTED = ("evalsha", "eval", "evalsha_ro", "eval_ro")
# The pool's reset is one message of four statements: RESET ALL is counted, these not.
_WITH_RESET = ["SELECT pg_advisory_unlock_all()", "CLOSE ALL", "UNLISTEN *"]


async def _redis_calls(client: Any) -> int:
    """Scripts Redis ran since its last CONFIG RESETSTAT: tickwheel's store sends a
    script per call on these paths (the commands a script runs inside are not counted)."""
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.split("_", 1)[1] in _SCRIPTED)


async def _measure(
    conn: Any, client: Any, jobs: int, body: Callable[[], Awaitable[None]]
) -> tuple[float, float, float]:
    await conn.execute("SELECT pg_stat_statements_reset()")
    await client.execute_command("CONFIG", "RESETSTAT")
    t = time.process_time()
    await body()
    cpu = (time.process_time() - t) / jobs * 1e6
    await asyncio.sleep(0.2)  # the outbox deletes that run after the calls
    calls = await conn.fetchval(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
        " WHERE query NOT LIKE '%pg_stat_statements%' AND query <> ALL ($1::text[])",
        _WITH_RESET,
    )
    return int(calls) / jobs, await _redis_calls(client) / jobs, cpu


async def _round(pg_url: str, redis_url: str, tag: str, jobs: int) -> dict[str, tuple]:
    conn: Any = await asyncpg.connect(pg_url)
    client = client_from_url(redis_url)
    sched = Scheduler(client, f"m{tag}", shards=SHARDS, check=False, postgres_url=pg_url)
    out: dict[str, tuple] = {}
    try:
        await sched.open()
        for shard in range(SHARDS):
            await sched.take(shard)
        await sched.schedule("warm", "t", b"payload", delay=3600)  # the pool, the scripts

        async def single() -> None:
            for i in range(jobs):
                await sched.schedule(f"s{i}", "t", b"payload", delay=0)

        async def many() -> None:
            await sched.schedule_many([JobSpec(f"m{i}", "t", b"payload") for i in range(jobs)])

        async def claim_ack() -> None:
            await claim_ack_rounds(sched, SHARDS, 2 * jobs)

        out["schedule"] = await _measure(conn, client, jobs, single)
        out["schedule_many"] = await _measure(conn, client, jobs, many)
        out["claim+ack (100)"] = await _measure(conn, client, 2 * jobs, claim_ack)
    finally:
        await sched.close()
        await client.aclose()
        await conn.close()
    return out


async def _main(jobs: int, rounds: int) -> None:
    conf = {"synchronous_commit": "on", "shared_preload_libraries": "pg_stat_statements"}
    with RedisServer() as redis_server, PostgresServer(extra_conf=conf) as pg:
        conn: Any = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        finally:
            await conn.close()
        got: dict[str, list[tuple]] = {}
        for r in range(rounds):
            for name, value in (await _round(pg.url, redis_server.url, str(r), jobs)).items():
                got.setdefault(name, []).append(value)
    head = ("figure", "PG round trips/job", "Redis calls/job", "CPU us/job")
    print(f"{head[0]:18s} {head[1]:>18s} {head[2]:>16s} {head[3]:>11s}")
    for name, values in got.items():
        pg_calls = statistics.median(v[0] for v in values)
        redis_calls = statistics.median(v[1] for v in values)
        cpu = statistics.median(v[2] for v in values)
        print(f"{name:18s} {pg_calls:18.3f} {redis_calls:16.3f} {cpu:11.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.jobs, args.rounds))


if __name__ == "__main__":
    main()
