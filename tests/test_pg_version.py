"""A version per job row (migration 0012): the Redis entry carries the version of the
row it was written from, and a claimed entry older than its row is stale.

Checked here: a late index write (the write behind a single ``schedule``) that lands
after another process replaced the job, and after the replacement ran and was acked,
does not run the old payload; rows and entries written before 0012 (no version) are
claimed and acked as before.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from durable_support import run
from pg_support import migrated, migrated_to, pg_scheduler, rows
from test_pg_behind import _held_writes  # the same hold on the write behind

from tickwheel.durable.postgres._rows import redis_job
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import pack_record


def test_a_late_write_after_a_replacement_ran_does_not_run_the_old_version(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scheduler A commits x (old) and its Redis write is held back; B replaces x (new,
    another due), claims it, runs it and acks it; then A's write lands and puts the old
    entry in Redis. Its occurrence is not done (another nominal) and its row exists
    (done, at the replacement's version): the claim finds the entry older than the row
    and removes it unrun."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as a,
            pg_scheduler(private_redis.url, pg_url, a.keys.namespace, shards=1) as b,
        ):
            ns = a.keys.namespace
            now = int(time.time() * 1000)
            started, go_on = _held_writes(monkeypatch)
            await a.schedule("x", "t", b"old", at=now - 5000)
            await asyncio.wait_for(started.wait(), 10)
            await b.schedule("x", "t", b"new", at=now - 2000, replace=True)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.payload) for j in batch.jobs] == [("x", b"new")]
            assert await b.ack_many(batch.jobs) == [True]
            go_on.set()
            await a.pg.behind.settled()  # type: ignore[union-attr]
            found = await b.get("x")
            assert found is not None and found.payload == b"old"  # the late write landed
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1  # stale: removed unrun
            assert await b.get("x") is None
            (row,) = await rows(
                pg_url, "SELECT state, payload FROM tickwheel_jobs WHERE ns = $1", ns
            )
            assert (row[0], bytes(row[1])) == (1, b"new")  # the row as the ack left it

    run(main())


def test_a_stale_entry_of_a_pending_row_is_written_again_from_the_row(
    private_redis: RedisServer, pg_url: str
) -> None:
    """An entry older than a pending row (Redis lost the newer one, then an old write
    landed): the claim removes it unrun and the row is indexed again, so the current
    version runs, once."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = int(time.time() * 1000)
            await s.schedule("x", "t", b"old", at=now - 5000)
            (old,) = await rows(
                pg_url, "SELECT record, version FROM tickwheel_jobs WHERE ns = $1", ns
            )
            await s.schedule("x", "t", b"new", at=now - 2000, replace=True)
            # Redis holds the old version again, as a late write would leave it.
            await s.store.cancel(0, "x")
            late = redis_job("x", now - 5000, bytes(old[0]), int(old[1]))
            await s.store.schedule_many({0: [[late]]}, False)
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1
            await s.relay()
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.payload) for j in batch.jobs] == [("x", b"new")]
            assert await s.ack_many(batch.jobs) == [True]
            assert (await s.claim(0, limit=10)).jobs == []

    run(main())


async def _migrate_to(url: str, version: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await migrated_to(conn, version)
    finally:
        await conn.close()


def test_jobs_written_before_0012_are_claimed_and_acked(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A database at 0010 with jobs (rows and outbox rows written by tickwheel_put, one
    of them in Redis as the previous release wrote it, without a version), then the
    migration: the job in Redis and the one the relay writes from its row both run
    once and are acked in PostgreSQL."""

    async def main() -> None:
        await _migrate_to(pg_url, 10)
        now = int(time.time() * 1000)
        records = {}
        conn = await asyncpg.connect(pg_url)
        ns = "legacy-ns"
        try:
            for job_id in ("in-redis", "in-outbox"):
                records[job_id] = pack_record([b"t", job_id.encode()])
                await conn.fetch(
                    "SELECT * FROM tickwheel_put(false, $1, $2, 0, 't', $3, false, 5, 0,"
                    " $4, 0::smallint, '', 0::smallint, 0, 0, $5)",
                    ns,
                    job_id,
                    job_id.encode(),
                    now - 1000,
                    records[job_id],
                )
        finally:
            await conn.close()
        await migrated(pg_url)
        versions = await rows(pg_url, "SELECT version FROM tickwheel_jobs WHERE ns = $1", ns)
        assert [int(v[0]) for v in versions] == [0, 0]
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            legacy = redis_job("in-redis", now - 1000, records["in-redis"])
            await s.store.schedule_many({0: [[legacy]]}, False)
            await s.relay()
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert sorted((j.id, j.payload) for j in batch.jobs) == [
                ("in-outbox", b"in-outbox"),
                ("in-redis", b"in-redis"),
            ]
            assert await s.ack_many(batch.jobs) == [True, True]
            states = await rows(pg_url, "SELECT state FROM tickwheel_jobs WHERE ns = $1", ns)
            assert [int(r[0]) for r in states] == [1, 1]
            assert (await s.claim(0, limit=10)).jobs == []

    run(main())


@pytest.mark.parametrize("batch", [False, True], ids=["schedule_one", "schedule"])
def test_a_replace_keeps_an_entry_of_a_higher_version(
    private_redis: RedisServer, pg_url: str, batch: bool
) -> None:
    """schedule.lua with replace on keeps an entry written from a newer row version (an
    older write never overwrites it) and overwrites one of a lower version; a record
    without a version (a writer of the previous release) is not compared."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            due = int(time.time() * 1000) + 60_000

            async def put(payload: bytes, version: int) -> tuple[str, int]:
                job = redis_job("x", due, pack_record([b"t", payload]), version)
                other = redis_job("y", due, pack_record([b"t"]), version)
                # One job goes to schedule_one.lua, a batch to schedule.lua.
                results = await s.store.schedule(0, [job, other] if batch else [job], True)
                return results[0].status.name, results[0].when_ms

            async def payload() -> Any:
                found = await s.get("x")
                return found.payload if found is not None else None

            assert await put(b"v5", 5) == ("CREATED", due)
            assert await put(b"v3", 3) == ("KEPT", due)
            assert await payload() == b"v5"
            assert (await put(b"v7", 7))[0] == "REPLACED"
            assert await payload() == b"v7"
            assert (await put(b"none", 0))[0] == "REPLACED"  # a writer without versions
            assert await payload() == b"none"

    run(main())


def test_a_claimed_job_carries_its_rows_version_through_park_and_retry(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A one-shot job with a timeout and a priority (claim.lua's versioned row): the
    claimed job has its row's version, timeout and payload; parked by a pause and
    resumed, then retried, it keeps them, and its ack completes the row."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("x", "t", b"v", delay=0, timeout=7, priority=3)
            await s.schedule("plain", "u", b"w", delay=0)
            found = await rows(
                pg_url, "SELECT id, version FROM tickwheel_jobs WHERE ns = $1 ORDER BY id", ns
            )
            versions = {r[0]: int(r[1]) for r in found}
            assert all(v > 0 for v in versions.values())
            await s.take(0)
            await s.pause("t")
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.version) for j in batch.jobs] == [("plain", versions["plain"])]
            assert await s.ack_many(batch.jobs) == [True]
            await s.resume("t")
            (job,) = (await s.claim(0, limit=10)).jobs
            assert (job.id, job.payload, job.timeout_ms) == ("x", b"v", 7000)
            assert job.version == versions["x"]
            info = await s.get("x")
            assert info is not None and info.priority == 3
            await s.retry(job, "boom", delay=0)
            (again,) = (await s.claim(0, limit=10)).jobs
            assert (again.attempt, again.version, again.timeout_ms) == (2, versions["x"], 7000)
            assert await s.ack_many([again]) == [True]
            (row,) = await rows(
                pg_url, "SELECT state FROM tickwheel_jobs WHERE ns = $1 AND id = 'x'", ns
            )
            assert row[0] == 1

    run(main())
