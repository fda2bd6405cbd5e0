"""Transactional enqueue per driver, and the sync producer against the async one.

    python -m bench.probes.drivers [--rounds N] [--n JOBS]

Starts a private PostgreSQL and Redis (durable/servers/), migrates, and times, in
alternating rounds so every row sees the same machine load:

- transactional enqueue: one application transaction holding one ``schedule(...,
  conn=)`` (the job row and its outbox row), committed; through asyncpg (the baseline),
  psycopg 3 async, psycopg 3 sync (``SyncScheduler``) and SQLAlchemy 2 sync over
  psycopg (``engine.begin()``);
- the enqueue statement alone: N ``schedule(..., conn=)`` in one transaction rolled
  back (no commit, so no flush: what the driver path itself costs);
- single schedule, Redis only: ``Scheduler.schedule`` (the baseline) against
  ``SyncScheduler.schedule``, one job per call.

Prints the median per round (us per job) and the ratio to the baseline (above 1: slower).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tickwheel.durable import Scheduler, SyncScheduler
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

Round = Callable[[int], Awaitable[float]]  # jobs -> seconds


async def _pg_rows(redis_url: str, pg_url: str, statements_only: bool) -> dict[str, Round]:
    import asyncpg
    import psycopg
    import sqlalchemy as sa

    from tickwheel.durable.postgres import migrate

    conn = await asyncpg.connect(pg_url)
    if not statements_only:
        await migrate(conn)
    ns = f"b{uuid.uuid4().hex[:8]}"
    sched = Scheduler(client_from_url(redis_url), ns, postgres_url=pg_url, check=False)
    sync = SyncScheduler.from_url(redis_url, ns, postgres_url=pg_url)
    aconn = await psycopg.AsyncConnection.connect(pg_url)
    sconn = psycopg.connect(pg_url)
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    await sched.schedule("warm", "t", b"x", delay=60)

    async def with_asyncpg(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            async with conn.transaction():
                await sched.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=conn)
        return time.perf_counter() - t

    async def with_psycopg_async(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            async with aconn.transaction():
                await sched.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=aconn)
        return time.perf_counter() - t

    async def with_psycopg_sync(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            with sconn.transaction():
                sync.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=sconn)
        return time.perf_counter() - t

    async def with_sqlalchemy(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            with engine.begin() as c:
                sync.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=c)
        return time.perf_counter() - t

    class Rollback(Exception):
        pass

    async def in_one_tx_asyncpg(n: int) -> float:
        t = time.perf_counter()
        with contextlib.suppress(Rollback):
            async with conn.transaction():
                for _ in range(n):
                    await sched.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=conn)
                raise Rollback
        return time.perf_counter() - t

    async def in_one_tx_psycopg_async(n: int) -> float:
        t = time.perf_counter()
        with contextlib.suppress(Rollback):
            async with aconn.transaction():
                for _ in range(n):
                    await sched.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=aconn)
                raise Rollback
        return time.perf_counter() - t

    async def in_one_tx_psycopg_sync(n: int) -> float:
        t = time.perf_counter()
        with contextlib.suppress(Rollback), sconn.transaction():
            for _ in range(n):
                sync.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=sconn)
            raise Rollback
        return time.perf_counter() - t

    async def in_one_tx_sqlalchemy(n: int) -> float:
        t = time.perf_counter()
        with contextlib.suppress(Rollback), engine.begin() as c:
            for _ in range(n):
                sync.schedule(uuid.uuid4().hex, "t", b"x", delay=60, conn=c)
            raise Rollback
        return time.perf_counter() - t

    if statements_only:
        return {
            "statement asyncpg": in_one_tx_asyncpg,
            "statement psycopg async": in_one_tx_psycopg_async,
            "statement psycopg sync": in_one_tx_psycopg_sync,
            "statement sqlalchemy sync": in_one_tx_sqlalchemy,
        }
    return {
        "enqueue asyncpg": with_asyncpg,
        "enqueue psycopg async": with_psycopg_async,
        "enqueue psycopg sync": with_psycopg_sync,
        "enqueue sqlalchemy sync": with_sqlalchemy,
    }


async def _redis_rows(redis_url: str) -> dict[str, Round]:
    ns = f"b{uuid.uuid4().hex[:8]}"
    sched = Scheduler(client_from_url(redis_url), ns, check=False)
    sync = SyncScheduler.from_url(redis_url, ns)
    await sched.schedule("warm", "t", b"x", delay=60)
    sync.schedule("warm2", "t", b"x", delay=60)

    async def run_async(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            await sched.schedule(uuid.uuid4().hex, "t", b"x", delay=60)
        return time.perf_counter() - t

    async def run_sync(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            sync.schedule(uuid.uuid4().hex, "t", b"x", delay=60)
        return time.perf_counter() - t

    return {"schedule async": run_async, "schedule sync": run_sync}


async def _measure(rows: dict[str, Round], rounds: int, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():  # alternating: each round runs every row
            out[name].append(await fn(n) / n * 1e6)
    return out


def _report(title: str, results: dict[str, list[float]]) -> None:
    names = list(results)
    base = statistics.median(results[names[0]])
    print(f"\n{title} (median us/job; ratio to {names[0]}, per-round min-max)")
    for name in names:
        med = statistics.median(results[name])
        ratios = [r / b for r, b in zip(results[name], results[names[0]], strict=True)]
        print(
            f"  {name:26s} {med:9.1f} us  {med / base:5.2f}x  ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args(argv)
    with RedisServer() as redis_server, PostgresServer() as pg:

        async def go() -> tuple[dict[str, Any], dict[str, Any]]:
            pg_rows = await _pg_rows(redis_server.url, pg.url, False)
            statement_rows = await _pg_rows(redis_server.url, pg.url, True)
            redis_rows = await _redis_rows(redis_server.url)
            return (
                await _measure(pg_rows, args.rounds, args.n),
                await _measure(statement_rows, args.rounds, args.n),
                await _measure(redis_rows, args.rounds, args.n * 4),
            )

        pg_results, statement_results, redis_results = asyncio.run(go())
    _report("Transactional enqueue, one job per committed transaction", pg_results)
    _report("The enqueue statement alone, N in one transaction (rolled back)", statement_results)
    _report("Single schedule, Redis only", redis_results)


if __name__ == "__main__":
    main()
