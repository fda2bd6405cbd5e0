"""asyncpg against psycopg 3 (async) on the two writes the Postgres mode makes per job.

    python -m bench.probes.pg_driver [--rounds N] [--n JOBS]

Starts a private PostgreSQL (durable/servers/_postgres.py), makes the two tables, and times on
each driver, alternating rounds so both see the same machine load:

- enqueue: one transaction that inserts a job row and an outbox row;
- ack: one transaction that inserts the done row and updates the job row;
- enqueue x100: one transaction with 100 jobs and 100 outbox rows (the batch path).

Prints the median per round (us per operation) and the ratio psycopg / asyncpg.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tickwheel.durable.servers._postgres import PostgresServer

DDL = """
CREATE TABLE jobs (id text PRIMARY KEY, task text NOT NULL, payload bytea NOT NULL,
                   due_ms bigint NOT NULL, state smallint NOT NULL DEFAULT 0);
CREATE TABLE outbox (seq bigserial PRIMARY KEY, id text NOT NULL, due_ms bigint NOT NULL);
CREATE TABLE done (id text NOT NULL, nominal_ms bigint NOT NULL, epoch bigint NOT NULL,
                   PRIMARY KEY (id, nominal_ms));
"""
INS_JOB = "INSERT INTO jobs (id, task, payload, due_ms) VALUES ({}) ON CONFLICT DO NOTHING"
INS_OUT = "INSERT INTO outbox (id, due_ms) VALUES ({})"
INS_DONE = "INSERT INTO done (id, nominal_ms, epoch) VALUES ({}) ON CONFLICT DO NOTHING"
UPD_JOB = "UPDATE jobs SET state = 1 WHERE id = {}"


def _sql(template: str, style: str, n: int) -> str:
    marks = [f"${i + 1}" for i in range(n)] if style == "$" else ["%s"] * n
    return template.format(", ".join(marks))


async def _asyncpg(url: str, n: int, tag: str) -> dict[str, float]:
    import asyncpg

    conn = await asyncpg.connect(url)
    ins_job, ins_out = _sql(INS_JOB, "$", 4), _sql(INS_OUT, "$", 2)
    ins_done, upd = _sql(INS_DONE, "$", 3), _sql(UPD_JOB, "$", 1)
    out: dict[str, float] = {}
    try:
        t = time.perf_counter()
        for i in range(n):
            async with conn.transaction():
                await conn.execute(ins_job, f"{tag}{i}", "t", b"x", i)
                await conn.execute(ins_out, f"{tag}{i}", i)
        out["enqueue"] = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for i in range(n):
            async with conn.transaction():
                await conn.execute(ins_done, f"{tag}{i}", i, 1)
                await conn.execute(upd, f"{tag}{i}")
        out["ack"] = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for b in range(n // 100):
            ids = [f"{tag}b{b}:{i}" for i in range(100)]
            async with conn.transaction():
                await conn.executemany(ins_job, [(j, "t", b"x", 1) for j in ids])
                await conn.executemany(ins_out, [(j, 1) for j in ids])
        out["enqueue x100"] = (time.perf_counter() - t) / max(n // 100, 1) / 100
    finally:
        await conn.close()
    return out


async def _psycopg(url: str, n: int, tag: str) -> dict[str, float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    ins_job, ins_out = _sql(INS_JOB, "%", 4), _sql(INS_OUT, "%", 2)
    ins_done, upd = _sql(INS_DONE, "%", 3), _sql(UPD_JOB, "%", 1)
    out: dict[str, float] = {}
    try:
        t = time.perf_counter()
        for i in range(n):
            async with conn.transaction():
                await conn.execute(ins_job, (f"{tag}{i}", "t", b"x", i))  # type: ignore[arg-type]
                await conn.execute(ins_out, (f"{tag}{i}", i))  # type: ignore[arg-type]
        out["enqueue"] = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for i in range(n):
            async with conn.transaction():
                await conn.execute(ins_done, (f"{tag}{i}", i, 1))  # type: ignore[arg-type]
                await conn.execute(upd, (f"{tag}{i}",))  # type: ignore[arg-type]
        out["ack"] = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for b in range(n // 100):
            ids = [f"{tag}b{b}:{i}" for i in range(100)]
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(ins_job, [(j, "t", b"x", 1) for j in ids])  # type: ignore[arg-type]
                await cur.executemany(ins_out, [(j, 1) for j in ids])  # type: ignore[arg-type]
        out["enqueue x100"] = (time.perf_counter() - t) / max(n // 100, 1) / 100
    finally:
        await conn.close()
    return out


async def _main(rounds: int, n: int) -> None:
    drivers: dict[str, Callable[[str, int, str], Awaitable[dict[str, float]]]] = {
        "asyncpg": _asyncpg,
        "psycopg": _psycopg,
    }
    with PostgresServer(fsync=True, extra_conf={"synchronous_commit": "on"}) as server:
        import asyncpg

        conn: Any = await asyncpg.connect(server.url)
        await conn.execute(DDL)
        await conn.close()
        results: dict[str, dict[str, list[float]]] = {d: {} for d in drivers}
        for r in range(rounds):
            for name, fn in drivers.items():
                for op, sec in (await fn(server.url, n, f"{name}{r}:")).items():
                    results[name].setdefault(op, []).append(sec * 1e6)
    for op in results["asyncpg"]:
        a = statistics.median(results["asyncpg"][op])
        p = statistics.median(results["psycopg"][op])
        print(f"{op:>14}: asyncpg {a:8.1f} us  psycopg {p:8.1f} us  psycopg/asyncpg {p / a:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(_main(args.rounds, args.n))


if __name__ == "__main__":
    main()
