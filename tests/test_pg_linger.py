"""The write behind single schedules waits for the scheduler's schedule statements in
flight (durable/postgres/_behind.py, ``LINGER``): awaited schedules one after another
share their Redis calls; a write with no statement in flight goes at once; the
scheduler's own reads never wait for the linger.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from durable_support import run
from pg_support import migrated, pg_scheduler

from tickwheel.durable import JobState, ScheduleStatus
from tickwheel.durable.postgres import _behind, _writes
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _counted_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the writes behind (jobs per write)."""
    sizes: list[int] = []
    write = _behind.write

    async def counted(sched: Any, jobs: Any) -> None:
        sizes.append(len(jobs))
        await write(sched, jobs)

    monkeypatch.setattr(_behind, "write", counted)
    return sizes


def test_awaited_schedules_share_their_redis_writes(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 schedules awaited one after another: each write waits for the next statement
    in flight, so the jobs go in a few writes (before: one write per job); every job is
    in Redis once, and the last is written without waiting once nothing is in flight."""

    async def main() -> None:
        await migrated(pg_url)
        monkeypatch.setattr(_behind, "LINGER", 30.0, raising=False)  # statements bound it
        sizes = _counted_writes(monkeypatch)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=2) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=2) as other,
        ):
            ids = [f"j{k}" for k in range(20)]
            for job_id in ids:
                result = await s.schedule(job_id, "t", b"v", delay=0)
                assert result.status is ScheduleStatus.CREATED
            for _ in range(200):  # no settled(): nothing in flight, so no linger
                if all([await other.get(i) is not None for i in ids]):
                    break
                await asyncio.sleep(0.05)
            assert all([await other.get(i) is not None for i in ids])
            assert sum(sizes) == len(ids)
            assert len(sizes) <= 3, sizes
            assert not s.pg.behind.busy  # type: ignore[union-attr]

    run(main())


def test_a_lingering_write_never_delays_the_schedulers_own_reads(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's write waits while another schedule's statement is held in flight: another
    process does not see it yet; the scheduler's own get does not wait for the linger
    (it writes at once); the held job is written once its statement commits."""

    async def main() -> None:
        await migrated(pg_url)
        monkeypatch.setattr(_behind, "LINGER", 30.0, raising=False)
        go_on = asyncio.Event()
        schedule = _writes.schedule

        async def held(conn: Any, ns: str, jobs: Any, *args: Any) -> Any:
            if jobs[0].id == "b":
                await go_on.wait()
            return await schedule(conn, ns, jobs, *args)

        monkeypatch.setattr(_writes, "schedule", held)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=1) as other,
        ):
            await s.open()
            b = asyncio.create_task(s.schedule("b", "t", b"v", delay=0))
            await asyncio.sleep(0.1)  # b's statement is in flight
            assert (await s.schedule("a", "t", b"v", delay=0)).status is ScheduleStatus.CREATED
            await asyncio.sleep(0.2)
            assert await other.get("a") is None  # lingering for b's statement
            info = await asyncio.wait_for(s.get("a"), 5)  # cuts the linger short
            assert info is not None and info.state is JobState.DUE
            assert await other.get("a") is not None
            go_on.set()
            assert (await asyncio.wait_for(b, 10)).status is ScheduleStatus.CREATED
            await asyncio.wait_for(s.pg.behind.settled(), 5)  # type: ignore[union-attr]
            assert await other.get("b") is not None

    run(main())
