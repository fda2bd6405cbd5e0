"""The Postgres mode beside the Redis-only mode, in the same run, and reconcile's cost.

    python -m bench.probes.pg_mode [--rounds N] [--jobs N] [--pending N]

Starts a private redis-server and PostgreSQL (fsync on, synchronous_commit on) and
times, alternating the modes each round so both see the same load:

- schedule: one ``schedule()`` call per job (each its own commit in Postgres mode);
- schedule_many: one call of ``--jobs`` jobs;
- claim + ack: claims of 100 due jobs and one ``ack_many`` per claim;

(bench/workloads/durable_ops.py's ``mode_round``) and, beside them in the same rounds on
the same PostgreSQL, the peers of bench/peers/postgres.py (each when it is installed):
pgqueuer and procrastinate, the same three figures each;

then reconcile of ``--pending`` pending rows into an empty Redis (every job written
back) and again (every job there already). Prints medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import asyncpg

from bench.peers.postgres import installed
from bench.workloads.durable_ops import mode_round
from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.postgres import migrate
from tickwheel.durable.postgres._rows import encode_pg_job
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url


async def _reconcile(redis_url: str, pg_url: str, pending: int) -> dict[str, float]:
    client = client_from_url(redis_url)
    sched = Scheduler(client, "brec", shards=16, check=False, postgres_url=pg_url)
    try:
        await sched.open()
        job = encode_pg_job(JobSpec("x", "t", b"payload", at=946_684_800_000), 0, 1 << 16)
        conn: Any = await asyncpg.connect(pg_url)
        try:
            await conn.execute(
                """
                INSERT INTO tickwheel_jobs (ns, id, shard, task, payload, json_payload,
                    max_attempts, due_ms, record)
                SELECT 'brec', 'r' || g, 0, 't', 'payload', false, 5,
                    4102444800000 + g, $1
                FROM generate_series(1, $2) AS g
                """,
                job.record,
                pending,
            )
            await conn.execute("VACUUM ANALYZE tickwheel_jobs")
            size = await conn.fetchrow(
                """SELECT pg_relation_size('tickwheel_jobs') AS heap,
                          pg_relation_size('tickwheel_jobs_pkey') AS pkey,
                          pg_relation_size('tickwheel_jobs_pending_due') AS pending"""
            )
        finally:
            await conn.close()
        # Every row on shard 0 of 16 here (the id hash is not what is measured).
        first = await sched.reconcile()
        again = await sched.reconcile()
    finally:
        await sched.close()
        await client.aclose()
    per_m = 1_000_000 / pending
    return {
        "reconcile, empty Redis (s per 1M pending)": first.seconds * per_m,
        "reconcile, Redis current (s per 1M pending)": again.seconds * per_m,
        "restored": float(first.restored),
        "heap bytes/row": size["heap"] / pending,
        "pkey bytes/row": size["pkey"] / pending,
        "pending index bytes/row": size["pending"] / pending,
    }


async def _main(rounds: int, jobs: int, pending: int) -> None:
    with (
        RedisServer() as redis_server,
        PostgresServer(extra_conf={"synchronous_commit": "on"}) as pg,
    ):
        conn: Any = await asyncpg.connect(pg.url)
        await migrate(conn)
        await conn.close()
        results: dict[str, dict[str, list[float]]] = {"redis": {}, "postgres": {}}
        peers = installed(("pgqueuer", "procrastinate"))
        for name in ("pgqueuer", "procrastinate"):
            if name in peers:
                results[name] = {}
            else:
                print(f"{name} is not installed: no figures of it")
        for r in range(rounds):
            for mode, url in (("redis", None), ("postgres", pg.url)):
                for name, value in (
                    await mode_round(redis_server.url, url, f"{mode}{r}", jobs)
                ).items():
                    results[mode].setdefault(name, []).append(value)
            for peer, fn in peers.items():
                for name, value in (await fn(pg.url, jobs)).items():
                    results[peer].setdefault(name, []).append(value)
        for name in results["redis"]:
            a = statistics.median(results["redis"][name])
            p = statistics.median(results["postgres"][name])
            line = f"{name:>24}: redis-only {a:8.1f}  postgres {p:8.1f}  ratio {p / a:5.2f}"
            for peer in peers:
                g = statistics.median(results[peer][name])
                line += f"  {peer} {g:8.1f} ({g / p:5.2f}x postgres)"
            print(line)
        for name, value in (await _reconcile(redis_server.url, pg.url, pending)).items():
            print(f"{name:>44}: {value:10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(_main(args.rounds, args.jobs, args.pending))


if __name__ == "__main__":
    main()
