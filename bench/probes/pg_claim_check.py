"""What the claim check costs (migration 0013 against 0012), and claim + ack per job.

    python -m bench.probes.pg_claim_check check [--rows N] [--ids N] [--pairs N]
    python -m bench.probes.pg_claim_check claim-ack [--jobs N] [--rounds R]
        [--durable-dir DIR]

Starts a private PostgreSQL (fsync and ``synchronous_commit`` on, ``pg_stat_statements``
loaded) and, for ``claim-ack``, a private redis-server.

- ``check``: a namespace of ``--rows`` pending rows (never analyzed, as a new install),
  then ``--pairs`` pairs of calls on ``--ids`` random ids of it: the six-argument
  ``tickwheel_claim_check`` (0012: versions; what the worker called before 0013) and the
  seven-argument one (0013: versions and attempts, the row's state compared), in turns
  (which one goes first alternates). Prints the median client wall time per call of
  each, the median of the pairs' ratios, and PostgreSQL's mean execution time per call
  (``pg_stat_statements``).
- ``claim-ack``: ``--jobs`` due jobs in the Postgres mode (one ``schedule_many``), then
  claims of 100 with one ``ack_many`` each until none is left; per job: wall time, this
  process's CPU, PostgreSQL's execution time (and the claim check's part of it).
  ``--durable-dir``: another checkout's
  ``durable/`` (``bench/probes/_checkout.py``); run the two in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

_CONF = {"synchronous_commit": "on", "shared_preload_libraries": "pg_stat_statements"}
_SIX = "SELECT pos, gone FROM tickwheel_claim_check($1, 0, 1, $2, $3, $4)"
_SEVEN = "SELECT pos, gone FROM tickwheel_claim_check($1, 0, 1, $2, $3, $4, $5)"
_EXEC = (
    "SELECT query, calls, total_exec_time FROM pg_stat_statements"
    " WHERE query LIKE 'SELECT pos, gone FROM tickwheel_claim_check%'"
)


async def _filled(conn: Any, ns: str, rows: int) -> list[tuple[str, int, int]]:
    """``rows`` pending jobs due in an hour: (id, due, version)."""
    from tickwheel.durable import JobSpec
    from tickwheel.durable.postgres import _writes
    from tickwheel.durable.postgres._rows import encode_pg_job

    for start in range(0, rows, 1000):
        jobs = [
            encode_pg_job(JobSpec(f"j{k:07}", "t", b"payload", delay=3600), 0, 1 << 16)
            for k in range(start, min(rows, start + 1000))
        ]
        await _writes.schedule(conn, ns, jobs, False)
    found = await conn.fetch("SELECT id, due_ms, version FROM tickwheel_jobs WHERE ns = $1", ns)
    return [(r[0], int(r[1]), int(r[2])) for r in found]


async def _check(rows: int, ids: int, pairs: int) -> None:
    import asyncpg

    from tickwheel.durable.postgres import migrate
    from tickwheel.durable.servers._postgres import PostgresServer

    with PostgresServer(extra_conf=_CONF) as pg:
        conn: Any = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            ns = "probe"
            pending = await _filled(conn, ns, rows)
            await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 1)", ns)
            pick = random.Random(7)
            times: dict[str, list[float]] = {"six": [], "seven": []}
            ratios = []

            async def call(name: str, batch: list[tuple[str, int, int]]) -> float:
                args = [ns, [b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch]]
                sql = _SIX if name == "six" else _SEVEN
                if name == "seven":
                    args.append([1] * len(batch))
                t = time.perf_counter()
                got = await conn.fetch(sql, *args)
                spent = time.perf_counter() - t
                assert not got, got  # pending rows at their own state: nothing done or gone
                return spent

            for _ in range(20):  # plans cached, pages in memory
                batch = pick.sample(pending, ids)
                await call("six", batch)
                await call("seven", batch)
            await conn.execute("SELECT pg_stat_statements_reset()")
            for k in range(pairs):
                batch = pick.sample(pending, ids)
                order = ("six", "seven") if k % 2 == 0 else ("seven", "six")
                spent = {name: await call(name, batch) for name in order}
                for name, s in spent.items():
                    times[name].append(s * 1e6)
                ratios.append(spent["seven"] / spent["six"])
            server = {
                ("seven" if "$5" in r[0] else "six"): float(r[2]) / int(r[1]) * 1e3
                for r in await conn.fetch(_EXEC)
            }
        finally:
            await conn.close()
    print(f"claim check of {ids} pending ids over {rows} rows, {pairs} alternated pairs")
    for name, label in (("six", "0012 (six args)"), ("seven", "0013 (seven args)")):
        wall = statistics.median(times[name])
        print(f"  {label:18s} wall {wall:8.1f} us/call   PG exec {server[name]:8.1f} us/call")
    lo, hi = min(ratios), max(ratios)
    print(f"  seven / six: median of pairs {statistics.median(ratios):.3f} ({lo:.2f}-{hi:.2f})")


async def _claim_ack(jobs: int, rounds: int) -> None:
    import asyncpg

    from bench.workloads.durable_ops import claim_ack_rounds
    from tickwheel.durable import JobSpec, Scheduler
    from tickwheel.durable.postgres import migrate
    from tickwheel.durable.servers._postgres import PostgresServer
    from tickwheel.durable.servers._redis import RedisServer
    from tickwheel.durable.store._connect import client_from_url

    with RedisServer() as redis_server, PostgresServer(extra_conf=_CONF) as pg:
        conn: Any = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            got: list[tuple[float, ...]] = []
            for r in range(rounds + 1):  # the first round warms up, not counted
                client = client_from_url(redis_server.url)
                sched = Scheduler(client, f"c{r}", shards=1, check=False, postgres_url=pg.url)
                try:
                    await sched.open()
                    specs = [JobSpec(f"j{k}", "t", b"payload") for k in range(jobs)]
                    await sched.schedule_many(specs)
                    await sched.take(0)
                    await conn.execute("SELECT pg_stat_statements_reset()")
                    cpu, wall = time.process_time(), time.perf_counter()
                    assert await claim_ack_rounds(sched, 1) == jobs
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                    stats = await conn.fetch(
                        "SELECT query, total_exec_time FROM pg_stat_statements"
                        " WHERE query NOT LIKE '%pg_stat_statements%'"
                    )
                    server = sum(float(q[1]) for q in stats)
                    check = sum(float(q[1]) for q in stats if "claim_check" in q[0])
                    if r:
                        per = (wall, cpu, server / 1e3, check / 1e3)
                        got.append(tuple(v / jobs * 1e6 for v in per))
                finally:
                    await sched.close()
                    await client.aclose()
        finally:
            await conn.close()
    med = [statistics.median(g[k] for g in got) for k in range(4)]
    print(f"claim (100) + ack of {jobs} jobs, {rounds} rounds, medians per job:")
    print(
        f"  wall {med[0]:.1f} us   CPU {med[1]:.1f} us   PG exec {med[2]:.1f} us"
        f" (of which the claim check {med[3]:.2f} us)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("what", choices=("check", "claim-ack"))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--ids", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durable-dir", default=None)
    args = parser.parse_args()
    if args.durable_dir:
        from bench.probes._checkout import load_durable

        load_durable(args.durable_dir)
    if args.what == "check":
        asyncio.run(_check(args.rows, args.ids, args.pairs))
    else:
        asyncio.run(_claim_ack(args.jobs, args.rounds))


if __name__ == "__main__":
    main()
