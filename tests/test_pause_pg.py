"""The pause state in the Postgres mode (issue 34): PostgreSQL records it first, and
reconcile writes it back to Redis after a Redis loss, so the paused task's restored jobs
are parked, not run. Real redis-server and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.durable_support import client_of, run
from tests.pg_support import migrated, pg_scheduler, rows
from tickwheel.durable import JobSpec, RedisUnavailable, SyncScheduler
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis

_STATE = "SELECT task, since_ms FROM tickwheel_paused WHERE ns = $1 ORDER BY task"


async def _recorded(pg_url: str, ns: str) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in await rows(pg_url, _STATE, ns)}


def test_reconcile_after_flushall_restores_the_pause_and_its_jobs_park(
    private_redis: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=2) as s:
            ns = s.keys.namespace
            await s.pause("paused")
            await s.pause("paused")  # again: keeps its first time
            since = (await s.paused())["paused"]
            assert await _recorded(pg_url, ns) == {"paused": since}
            await s.schedule_many(
                [JobSpec(f"p{i}", "paused", delay=0) for i in range(20)]
                + [JobSpec(f"o{i}", "other", delay=0) for i in range(10)]
            )
            await s.pause("gone")
            assert await s.resume("gone") == 0  # resumed: no row left
            await client_of(s).flushall()
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=2) as s:
            assert await s.paused() == {}  # Redis lost it
            result = await s.reconcile()
            assert (result.paused, result.restored) == (1, 30)
            assert await s.paused() == {"paused": since}
            claimed: list[str] = []
            parked = 0
            for shard in range(2):
                await s.take(shard)
                batch = await s.claim(shard, limit=100)
                claimed += [j.task for j in batch.jobs]
                parked += batch.parked
                await s.ack_many(batch.jobs)
            assert (claimed, parked) == (["other"] * 10, 20)
            assert (await s.reconcile()).restored == 0  # parked jobs are in Redis
            assert await s.resume("paused") == 20
            assert await _recorded(pg_url, ns) == {} and await s.paused() == {}
            again = 0
            for shard in range(2):
                batch = await s.claim(shard, limit=100)
                assert {j.task for j in batch.jobs} <= {"paused"}
                again += len(batch.jobs)
                await s.ack_many(batch.jobs)
            assert again == 20

    run(main())


def test_a_namespace_pause_is_restored_and_a_failed_redis_write_records_nothing(
    pg_url: str,
) -> None:
    async def main(server: RedisServer) -> None:
        await migrated(pg_url)
        async with pg_scheduler(server.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.pause()
            await client_of(s).flushall()
            assert (await s.reconcile()).paused == 1
            assert list(await s.paused()) == [None]
            server.kill()
            with pytest.raises(RedisUnavailable):
                await s.pause("t")  # Redis failed inside the transaction: rolled back
            assert list(await _recorded(pg_url, ns)) == [""]

    with RedisServer() as server:
        run(main(server))


def test_the_sync_scheduler_records_pauses_in_postgres(
    redis_server: RedisServer, pg_url: str
) -> None:
    async def setup() -> str:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            await s.open()
            return s.keys.namespace

    ns = run(setup())
    sync = SyncScheduler.from_url(redis_server.url, ns, shards=1, postgres_url=pg_url)
    try:
        sync.pause("t")
        since = sync.paused()["t"]
        assert run(_recorded(pg_url, ns)) == {"t": since}
        assert sync.resume("t") == 0
        assert run(_recorded(pg_url, ns)) == {} and sync.paused() == {}
    finally:
        sync.close()
