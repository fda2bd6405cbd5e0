"""What a reschedule costs in the Postgres mode: PostgreSQL statements, Redis calls,
this process's CPU, the wall time and PostgreSQL's execution time, per reschedule.

    python -m bench.probes.pg_reschedule [--jobs N] [--rounds R] [--durable-dir DIR]

Starts a private redis-server and PostgreSQL (fsync and ``synchronous_commit`` on, with
``pg_stat_statements`` loaded), schedules ``--jobs`` jobs far ahead, then moves each
once with ``at=`` (an absolute time: the done check is one more statement) and once
with ``delay=`` (the dashboard's "run now" is ``delay=0``), counting as
``bench.probes.pg_messages`` does. ``--durable-dir``: another checkout's ``durable/``
(``bench/probes/_checkout.py``), for a before/after; run the two in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

FAR = 4_000_000_000_000


async def _measure(conn: Any, client: Any, n: int, body: Any) -> tuple[float, ...]:
    await conn.execute("SELECT pg_stat_statements_reset()")
    await client.execute_command("CONFIG", "RESETSTAT")
    t, w = time.process_time(), time.perf_counter()
    await body()
    cpu, wall = (time.process_time() - t) / n * 1e6, (time.perf_counter() - w) / n * 1e6
    calls, server = await conn.fetchrow(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0)"
        " FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'"
    )
    stats = await client.info("commandstats")
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_eval"))
    return int(calls) / n, scripts / n, cpu, wall, float(server) / n * 1e3


async def _round(pg_url: str, redis_url: str, tag: str, n: int) -> dict[str, tuple[float, ...]]:
    import asyncpg

    from tickwheel.durable import JobSpec, Scheduler
    from tickwheel.durable.store._connect import client_from_url

    conn: Any = await asyncpg.connect(pg_url)
    client = client_from_url(redis_url)
    sched = Scheduler(client, f"r{tag}", shards=4, check=False, postgres_url=pg_url)
    out: dict[str, tuple[float, ...]] = {}
    try:
        await sched.open()
        await sched.schedule_many([JobSpec(f"j{i}", "t", b"payload", at=FAR) for i in range(n)])
        await sched.reschedule("j0", at=FAR + 1)  # the pool, the scripts

        async def at() -> None:
            for i in range(n):
                assert await sched.reschedule(f"j{i}", at=FAR + 10 + i)

        async def delay() -> None:
            for i in range(n):
                assert await sched.reschedule(f"j{i}", delay=3600)

        out["reschedule at="] = await _measure(conn, client, n, at)
        out["reschedule delay="] = await _measure(conn, client, n, delay)
    finally:
        await sched.close()
        await client.aclose()
        await conn.close()
    return out


async def _main(n: int, rounds: int) -> None:
    import asyncpg

    from tickwheel.durable.postgres import migrate
    from tickwheel.durable.servers._postgres import PostgresServer
    from tickwheel.durable.servers._redis import RedisServer

    conf = {"synchronous_commit": "on", "shared_preload_libraries": "pg_stat_statements"}
    with RedisServer() as redis_server, PostgresServer(extra_conf=conf) as pg:
        conn: Any = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        finally:
            await conn.close()
        got: dict[str, list[tuple[float, ...]]] = {}
        for r in range(rounds):
            for name, value in (await _round(pg.url, redis_server.url, str(r), n)).items():
                got.setdefault(name, []).append(value)
    head = ("figure", "PG statements", "Redis calls", "CPU us", "wall us", "PG exec us")
    print(f"{head[0]:18s} {head[1]:>14s} {head[2]:>12s}", *(f"{h:>10s}" for h in head[3:]))
    for name, values in got.items():
        med = [statistics.median(v[k] for v in values) for k in range(5)]
        print(f"{name:18s} {med[0]:14.2f} {med[1]:12.2f}", *(f"{m:10.1f}" for m in med[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durable-dir", default=None)
    args = parser.parse_args()
    if args.durable_dir:
        from bench.probes._checkout import load_durable

        load_durable(args.durable_dir)
    asyncio.run(_main(args.jobs, args.rounds))


if __name__ == "__main__":
    main()
