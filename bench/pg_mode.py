"""The Postgres mode beside the Redis-only mode, in the same run, and reconcile's cost.

    python -m bench.pg_mode [--rounds N] [--jobs N] [--pending N]

Starts a private redis-server and PostgreSQL (fsync on, synchronous_commit on) and
times, alternating the modes each round so both see the same load:

- schedule: one ``schedule()`` call per job (each its own commit in Postgres mode);
- schedule_many: one call of ``--jobs`` jobs;
- claim + ack: claims of 100 due jobs and one ``ack_many`` per claim;

and, beside them in the same rounds on the same PostgreSQL, the peers (each when it is
installed): pgqueuer, ``enqueue`` of one job per call, ``enqueue`` of ``--jobs`` jobs in
one call, and ``dequeue`` of 100 + ``log_jobs`` (its ack) per batch; procrastinate,
``defer_async`` per job, ``batch_defer_async`` of ``--jobs``, and ``fetch_job`` +
``finish_job`` (its worker's claim and ack, one job each: it has no batch claim);

then reconcile of ``--pending`` pending rows into an empty Redis (every job written
back) and again (every job there already). Prints medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.postgres import migrate
from tickwheel.durable.postgres._store import encode_pg_job
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SHARDS = 4


async def _round(redis_url: str, pg_url: str | None, tag: str, jobs: int) -> dict[str, float]:
    client = client_from_url(redis_url)
    sched = Scheduler(client, f"b{tag}", shards=SHARDS, check=False, postgres_url=pg_url)
    out: dict[str, float] = {}
    try:
        await sched.open()
        t = time.perf_counter()
        for i in range(jobs):
            await sched.schedule(f"s{i}", "t", b"payload", delay=0)
        out["schedule (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        t = time.perf_counter()
        await sched.schedule_many([JobSpec(f"m{i}", "t", b"payload") for i in range(jobs)])
        out["schedule_many (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        for shard in range(SHARDS):
            await sched.take(shard)
        done = 0
        t = time.perf_counter()
        while done < 2 * jobs:
            got = 0
            for shard in range(SHARDS):
                batch = await sched.claim(shard, limit=100)
                if batch.jobs:
                    await sched.ack_many(batch.jobs)
                    got += len(batch.jobs)
            if not got:
                break
            done += got
        out["claim+ack (us/job)"] = (time.perf_counter() - t) / max(done, 1) * 1e6
    finally:
        await sched.close()
        await client.aclose()
    return out


async def _pgqueuer_round(pg_url: str, jobs: int) -> dict[str, float]:
    """pgqueuer's counterparts of :func:`_round`'s figures, on its own tables."""
    import uuid
    from datetime import timedelta

    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import EntrypointExecutionParameter, Queries

    conn: Any = await asyncpg.connect(pg_url)
    out: dict[str, float] = {}
    try:
        q = Queries(AsyncpgDriver(conn))
        if await conn.fetchval("SELECT to_regclass('pgqueuer')") is None:
            await q.install()
        t = time.perf_counter()
        for _ in range(jobs):
            await q.enqueue("t", b"payload", 0)
        out["schedule (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        t = time.perf_counter()
        await q.enqueue(["t"] * jobs, [b"payload"] * jobs, [0] * jobs)
        out["schedule_many (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        manager, done = uuid.uuid4(), 0
        entry = {"t": EntrypointExecutionParameter(0)}
        t = time.perf_counter()
        while batch := await q.dequeue(100, entry, manager, None, timedelta(seconds=30)):  # type: ignore[arg-type]
            await q.log_jobs([(j, "successful", None) for j in batch])
            done += len(batch)
        out["claim+ack (us/job)"] = (time.perf_counter() - t) / max(done, 1) * 1e6
    finally:
        await conn.close()
    return out


async def _procrastinate_round(pg_url: str, jobs: int) -> dict[str, float]:
    """procrastinate's counterparts of :func:`_round`'s figures, on its own tables."""
    import procrastinate
    from procrastinate import jobs as pjobs

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url))

    @app.task(name="t")
    async def task(p: str) -> None:
        del p

    out: dict[str, float] = {}
    async with app.open_async():
        conn: Any = await asyncpg.connect(pg_url)
        try:
            if await conn.fetchval("SELECT to_regclass('procrastinate_jobs')") is None:
                await app.schema_manager.apply_schema_async()
        finally:
            await conn.close()
        t = time.perf_counter()
        for _ in range(jobs):
            await task.defer_async(p="payload")
        out["schedule (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        t = time.perf_counter()
        await task.batch_defer_async(*[{"p": "payload"}] * jobs)
        out["schedule_many (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        worker = await app.job_manager.register_worker()
        done = 0
        t = time.perf_counter()
        while (job := await app.job_manager.fetch_job(None, worker)) is not None:
            await app.job_manager.finish_job(job, pjobs.Status.SUCCEEDED, False)
            done += 1
        out["claim+ack (us/job)"] = (time.perf_counter() - t) / max(done, 1) * 1e6
        await app.job_manager.unregister_worker(worker)
    return out


async def _reconcile(redis_url: str, pg_url: str, pending: int) -> dict[str, float]:
    client = client_from_url(redis_url)
    sched = Scheduler(client, "brec", shards=16, check=False, postgres_url=pg_url)
    try:
        await sched.open()
        job = encode_pg_job(JobSpec("x", "t", b"payload", at=1), 0, 1 << 16)
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
        peers = {}
        for name, fn in (("pgqueuer", _pgqueuer_round), ("procrastinate", _procrastinate_round)):
            try:
                __import__(name)
            except ImportError:
                print(f"{name} is not installed: no figures of it")
            else:
                peers[name] = fn
                results[name] = {}
        for r in range(rounds):
            for mode, url in (("redis", None), ("postgres", pg.url)):
                for name, value in (
                    await _round(redis_server.url, url, f"{mode}{r}", jobs)
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
