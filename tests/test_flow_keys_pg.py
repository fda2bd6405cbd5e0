"""The flow key in the Postgres mode (issue 35): it rides in the stored record, so a
reconcile after a Redis loss brings it back, also for a retried occurrence. Real
redis-server and PostgreSQL processes."""

from __future__ import annotations

import pytest
from durable_support import client_of, run
from pg_support import migrated, pg_scheduler

from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_the_key_survives_a_redis_loss(private_redis: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.schedule("fresh", "t", b"", key="merchant:1")
            await s.schedule("tried", "t", b"", key="merchant:2", max_attempts=3)
            await s.take(0)
            jobs = {j.id: j for j in (await s.claim(0, limit=10, lease=30.0)).jobs}
            assert jobs["tried"].key == "merchant:2"
            await s.retry(jobs["tried"], "boom", delay=0)
            await s.release([jobs["fresh"]])
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 2
            for job_id, key in (("fresh", "merchant:1"), ("tried", "merchant:2")):
                info = await s.get(job_id)
                assert info is not None and info.key == key, (job_id, info)
            await s.take(0)
            again = {j.id: j for j in (await s.claim(0, limit=10, lease=30.0)).jobs}
            assert again["tried"].key == "merchant:2" and again["tried"].attempt == 2
            assert again["fresh"].key == "merchant:1"

    run(main())
