"""pgqueuer's round of the Postgres mode's figures, importable and runnable on its own.

pgqueuer 1.x needs croniter>=5, and bullmq (in the ``bench`` extra) pins croniter 2.0.7,
so the two cannot share a venv. When pgqueuer 1.x does not import in the bench's own
venv, :func:`bench.peers.postgres.pgqueuer_round` makes a venv for it (``.venv-pgqueuer/``
at the repository root, once) and runs this file there by its path, which prints the
round's figures as JSON. It imports only asyncpg and pgqueuer, never tickwheel or bench.

    python bench/peers/_pgqueuer.py POSTGRES_URL JOBS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import asyncpg


async def round_(pg_url: str, jobs: int) -> dict[str, float]:
    """``enqueue`` of one job per call, ``enqueue`` of all the jobs in one call, then
    ``dequeue`` of 100 + ``log_jobs`` (its ack) per batch; microseconds per job."""
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


if __name__ == "__main__":
    print(json.dumps(asyncio.run(round_(sys.argv[1], int(sys.argv[2])))))
