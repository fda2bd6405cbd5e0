"""The Postgres mode decides every transition in PostgreSQL first: retries, the
reaper's returns and dead letters, requeue and purge. After a Redis loss and a
reconcile a job's attempt never goes down, ``max_attempts`` holds, and nothing purged
comes back. Real redis-server and PostgreSQL processes."""

from __future__ import annotations

import pytest
from durable_support import client_of, push_clock, run
from pg_support import migrated, pg_scheduler, rows

from tickwheel.durable import JobState
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


async def _claim_all(sched, shard: int = 0, lease: float = 30.0):  # type: ignore[no-untyped-def]
    await sched.take(shard)
    return await sched.claim(shard, limit=1000, lease=lease)


async def _row(pg_url: str, ns: str, job_id: str) -> tuple[int, int, int] | None:
    """(state, attempt, due_ms) of a job's row, or None."""
    got = await rows(
        pg_url,
        "SELECT state, attempt, due_ms FROM tickwheel_jobs WHERE ns = $1 AND id = $2",
        ns,
        job_id,
    )
    return (int(got[0][0]), int(got[0][1]), int(got[0][2])) if got else None


def test_a_far_retry_restored_by_reconcile_keeps_its_nominal(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A retried occurrence whose run time is minutes ahead comes back from a reconcile
    at its run time with its own nominal due (schedule.lua used to send it to the far
    index, whose due is the nominal, and overwrite the nominal with the run time)."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.schedule("f", "t", b"x", delay=0, max_attempts=4)
            (job,) = (await _claim_all(s)).jobs
            assert await s.retry(job, "boom", delay=600) is JobState.DUE
            info = await s.get("f")
            assert info is not None and info.attempt == 2
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 1
            back = await s.get("f")
            assert back is not None and back.state is JobState.DUE
            assert (back.when_ms, back.nominal_ms, back.attempt) == (
                info.when_ms,
                job.nominal_ms,
                2,
            )
            await push_clock(s, 0, 601_000)
            (again,) = (await _claim_all(s)).jobs
            assert (again.nominal_ms, again.attempt) == (job.nominal_ms, 2)
            await s.ack(again)
            assert (await _row(pg_url, s.keys.namespace, "f")) == (1, 2, job.nominal_ms)

    run(main())
