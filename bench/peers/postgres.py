"""The PostgreSQL job queues the Postgres mode is measured against: procrastinate, pgqueuer.

Each peer is one round of the Postgres mode's figures (bench/workloads/durable_ops.py's
:func:`~bench.workloads.durable_ops.mode_round`), on its own tables in the same
PostgreSQL, as microseconds per job under the same names (:data:`FIGURES`):

- procrastinate: ``defer_async`` per job, ``batch_defer_async`` of all the jobs, and
  ``fetch_job`` + ``finish_job`` (its worker's claim and ack, one job each: it has no
  batch claim);
- pgqueuer: ``enqueue`` of one job per call, ``enqueue`` of all the jobs in one call,
  and ``dequeue`` of 100 + ``log_jobs`` (its ack) per batch.

procrastinate is in the ``bench`` extra; pgqueuer is not (docs/postgres.md says how to
install it): :func:`installed` gives the peers importable here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

# The figures of a round, in microseconds per job (the Postgres mode's own round too).
FIGURES = ("schedule (us/job)", "schedule_many (us/job)", "claim+ack (us/job)")

Round = Callable[[str, int], Awaitable[dict[str, float]]]


async def pgqueuer_round(pg_url: str, jobs: int) -> dict[str, float]:
    """pgqueuer's counterparts of the Postgres mode's figures, on its own tables."""
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


async def procrastinate_round(pg_url: str, jobs: int) -> dict[str, float]:
    """procrastinate's counterparts of the Postgres mode's figures, on its own tables."""
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


ROUNDS: dict[str, Round] = {"procrastinate": procrastinate_round, "pgqueuer": pgqueuer_round}


def installed(names: Sequence[str]) -> dict[str, Round]:
    """The rounds of the peers in ``names`` (in that order) whose library imports here."""
    out: dict[str, Round] = {}
    for name in names:
        try:
            __import__(name)
        except ImportError:
            continue
        out[name] = ROUNDS[name]
    return out
