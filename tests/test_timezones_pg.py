"""Zoned cron series in the Postgres mode: the zone survives a Redis loss (FLUSHALL) and a
reconcile, for the next occurrence PostgreSQL holds and for a retried one. Real
redis-server and PostgreSQL processes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from durable_support import client_of, run
from pg_support import migrated, pg_scheduler, rows

from tickwheel.durable import JobState, Recurrence
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

EXPR = "0,30 1-3 * * *"  # fixed-time: 02:00 and 02:30 fall in Paris' 2030-03-31 gap
ZONE = "Europe/Paris"


def z(*a: int) -> int:
    """A UTC instant in ms."""
    return round(datetime(*a, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def test_the_zone_survives_a_redis_loss_and_a_reconcile(
    private_redis: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            clock = s.keys.shard(0).clock
            await client_of(s).set(clock, z(2030, 3, 31, 0, 30))
            await s.schedule("z", "t", at=z(2030, 3, 31, 0, 30), cron=EXPR, tz=ZONE)
            (stored,) = await rows(pg_url, "SELECT rspec FROM tickwheel_jobs WHERE id = 'z'")
            assert stored[0] == f"TZ={ZONE} {EXPR}"
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert [j.nominal_ms for j in batch.jobs] == [z(2030, 3, 31, 0, 30)]  # 01:30+01
            await s.ack(batch.jobs[0])
            await client_of(s).flushall()
        # A fresh process after the loss: everything it knows comes from PostgreSQL.
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            clock = s.keys.shard(0).clock
            result = await s.reconcile()
            assert (result.pending, result.restored) == (1, 1)
            info = await s.get("z")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == ZONE and info.recurrence.cron == EXPR
            # The next occurrence is the gap's one run, 03:00+02 (01:00Z), not 02:00 UTC.
            assert info.when_ms == z(2030, 3, 31, 1)
            await client_of(s).set(clock, z(2030, 3, 31, 1))
            await s.take(0)
            batch = await s.claim(0, limit=10)
            (job,) = batch.jobs
            assert job.nominal_ms == z(2030, 3, 31, 1)
            assert job.recurrence is not None and job.recurrence.tz == ZONE
            assert job.next_due_ms == z(2030, 3, 31, 1, 30)  # 03:30+02
            # A retried occurrence is rebuilt from the row's columns: its zone too.
            assert await s.retry(job, "boom") is JobState.DUE
            await client_of(s).flushall()
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            clock = s.keys.shard(0).clock
            # The shard's time is that of the retry (a retry restored more than two far
            # slots ahead of now would go to the far index, which keys on its run time).
            await client_of(s).set(clock, z(2030, 3, 31, 1))
            result = await s.reconcile()
            assert result.restored == 1
            info = await s.get("z")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == ZONE
            assert info.nominal_ms == z(2030, 3, 31, 1)
            await client_of(s).set(clock, z(2030, 3, 31, 1, 10))
            await s.take(0)
            batch = await s.claim(0, limit=10)
            (job,) = batch.jobs
            assert (job.nominal_ms, job.attempt) == (z(2030, 3, 31, 1), 2)
            await s.ack(job)
            info = await s.get("z")
            assert info is not None and info.when_ms == z(2030, 3, 31, 1, 30)
            # The next occurrence after Paris' 03:30+02 follows Paris: 01:00+02 the next day.
            rec = Recurrence.cron_expr(EXPR, tz=ZONE)
            assert rec.next_after(z(2030, 3, 31, 1, 30), 0) == z(2030, 3, 31, 23)

    run(main())


def test_a_jittered_zoned_series_keeps_both_through_a_redis_loss(
    private_redis: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await client_of(s).set(s.keys.shard(0).clock, z(2030, 3, 31, 0, 30))
            await s.schedule("j", "t", at=z(2030, 3, 31, 1), cron=EXPR, tz=ZONE, jitter=90)
            (stored,) = await rows(pg_url, "SELECT rspec FROM tickwheel_jobs WHERE id = 'j'")
            assert stored[0] == f"J=90000 TZ={ZONE} {EXPR}"
            # In Redis before the loss: a get waits for the index written behind schedule
            # (a raw FLUSHALL does not, and a write landing after it would be restored 0).
            assert await s.get("j") is not None
            await client_of(s).flushall()
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            await client_of(s).set(s.keys.shard(0).clock, z(2030, 3, 31, 0, 30))
            assert (await s.reconcile()).restored == 1
            info = await s.get("j")
            assert info is not None and info.recurrence is not None
            assert (info.recurrence.tz, info.recurrence.jitter_ms) == (ZONE, 90_000)
            assert info.nominal_ms == z(2030, 3, 31, 1)

    run(main())
