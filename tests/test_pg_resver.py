"""A reschedule takes a new row version (issue 39): a late index write of the job as it
was before the reschedule is older than the row, so the claim removes it unrun.

Before, a reschedule moved the Redis entry in place and kept its version: a late write
(the write behind a ``schedule``, a relay's, a reconcile's) of the job at its old due,
landing after the rescheduled run was acked, or after Redis lost the moved entry, had
the row's version and an occurrence PostgreSQL had not done, so it ran at the old due.
Real redis-server and PostgreSQL, started by the tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from dashboard_support import api_client, bearer
from durable_support import run
from pg_support import migrated, pg_scheduler, rows
from test_pg_behind import _held_writes  # the same hold on the write behind
from test_pg_version import _migrate_to

from tickwheel.durable import Scheduler, SyncScheduler
from tickwheel.durable.postgres._rows import redis_job
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import Store, pack_record

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

Reschedule = Callable[[Scheduler, str, int], Awaitable[bool]]


async def _async_reschedule(s: Scheduler, job_id: str, at: int) -> bool:
    return await s.reschedule(job_id, at=at)


def _sync_reschedule(redis_url: str, pg_url: str) -> Reschedule:
    """The same move through a SyncScheduler of the scheduler's namespace."""

    async def move(s: Scheduler, job_id: str, at: int) -> bool:
        sync = SyncScheduler.from_url(redis_url, s.keys.namespace, shards=1, postgres_url=pg_url)
        try:
            return sync.reschedule(job_id, at=at)
        finally:
            sync.close()

    return move


def _how(name: str, redis_url: str, pg_url: str) -> Reschedule:
    return _async_reschedule if name == "scheduler" else _sync_reschedule(redis_url, pg_url)


async def _row(pg_url: str, ns: str, job_id: str) -> tuple[int, int, int]:
    """The row's (state, due_ms, version)."""
    (row,) = await rows(
        pg_url,
        "SELECT state, due_ms, version FROM tickwheel_jobs WHERE ns = $1 AND id = $2",
        ns,
        job_id,
    )
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize("how", ["scheduler", "sync"])
def test_a_late_write_after_a_rescheduled_run_does_not_run_the_old_occurrence(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Scheduler A commits x (due at T_old) and its write behind is held; B's relay
    indexes x from the outbox; B reschedules x to T_new, claims it, runs and acks it.
    Then A's write lands: x is back in Redis at T_old. The claim removes it unrun
    (its version is below the row's, which the reschedule raised); on the main before
    this it ran a second time, as the occurrence T_old, which PostgreSQL has not done."""
    move = _how(how, private_redis.url, pg_url)

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as a,
            pg_scheduler(private_redis.url, pg_url, a.keys.namespace, shards=1) as b,
        ):
            ns = a.keys.namespace
            now = int(time.time() * 1000)
            old, new = now - 5000, now - 2000
            started, go_on = _held_writes(monkeypatch)
            await a.schedule("x", "t", b"v", at=old)
            await asyncio.wait_for(started.wait(), 10)
            first = (await _row(pg_url, ns, "x"))[2]
            assert await b.relay() >= 1  # the outbox row: x indexed at T_old
            assert await move(b, "x", new)
            state, due, version = await _row(pg_url, ns, "x")
            assert (state, due) == (0, new) and version > first  # a new version
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.nominal_ms, j.version) for j in batch.jobs] == [("x", new, version)]
            assert await b.ack_many(batch.jobs) == [True]
            go_on.set()
            await a.pg.behind.settled()  # type: ignore[union-attr]
            found = await b.get("x")
            assert found is not None and found.nominal_ms == old  # the late write landed
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.nominal_ms) for j in batch.jobs] == []  # never ran at T_old
            assert batch.dropped == 1
            assert await b.get("x") is None
            assert await _row(pg_url, ns, "x") == (1, new, version)
            done = await rows(
                pg_url, "SELECT nominal_ms FROM tickwheel_done WHERE ns = $1 AND id = 'x'", ns
            )
            assert [int(r[0]) for r in done] == [new]  # one run, the rescheduled one

    run(main())


def test_a_relays_late_write_after_a_rescheduled_run_does_not_run_the_old_occurrence(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The late writer is a relay: it read x's outbox row (live, at T_old) and its
    Redis write is held; meanwhile the producer's own write indexes x, B reschedules x
    to T_new, runs and acks it. The relay's write then lands at T_old and the claim
    removes it unrun."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as a,
            pg_scheduler(private_redis.url, pg_url, a.keys.namespace, shards=1) as b,
            pg_scheduler(private_redis.url, pg_url, a.keys.namespace, shards=1) as r,
        ):
            ns = a.keys.namespace
            now = int(time.time() * 1000)
            old, new = now - 5000, now - 2000
            behind, go_behind = _held_writes(monkeypatch)
            await a.schedule("x", "t", b"v", at=old)
            await asyncio.wait_for(behind.wait(), 10)
            relaying, go_relay = asyncio.Event(), asyncio.Event()
            write = Store.schedule

            async def held(store: Store, *args: Any) -> Any:
                if store is r.store:  # the relay's scheduler only
                    relaying.set()
                    await go_relay.wait()
                return await write(store, *args)

            monkeypatch.setattr(Store, "schedule", held)
            relay = asyncio.create_task(r.relay())
            await asyncio.wait_for(relaying.wait(), 10)  # x read from the outbox, held
            go_behind.set()
            await a.pg.behind.settled()  # type: ignore[union-attr]
            assert await b.reschedule("x", at=new)
            version = (await _row(pg_url, ns, "x"))[2]
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.nominal_ms, j.version) for j in batch.jobs] == [("x", new, version)]
            assert await b.ack_many(batch.jobs) == [True]
            go_relay.set()
            assert await asyncio.wait_for(relay, 10) == 1
            found = await b.get("x")
            assert found is not None and found.nominal_ms == old  # the relay's write landed
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1
            assert await b.get("x") is None
            assert await _row(pg_url, ns, "x") == (1, new, version)

    run(main())


@pytest.mark.parametrize("how", ["scheduler", "sync"])
def test_a_late_write_of_a_rescheduled_pending_job_is_replaced_by_the_row(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """x is indexed, rescheduled to T_new, and Redis then loses its entry; a late write
    of x at T_old lands before any reconcile. The claim finds the entry older than the
    pending row: removed unrun, and the relays write the row back at T_new, which runs
    once. (Before: x ran as T_old, and its ack left the row pending at T_new, for a
    reconcile to run it again.)"""
    move = _how(how, private_redis.url, pg_url)

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as a,
            pg_scheduler(private_redis.url, pg_url, a.keys.namespace, shards=1) as b,
        ):
            ns = a.keys.namespace
            now = int(time.time() * 1000)
            old, new = now - 5000, now - 2000
            started, go_on = _held_writes(monkeypatch)
            await a.schedule("x", "t", b"v", at=old)
            await asyncio.wait_for(started.wait(), 10)
            assert await b.relay() >= 1
            assert await move(b, "x", new)
            version = (await _row(pg_url, ns, "x"))[2]
            await b.store.cancel(0, "x")  # Redis lost the moved entry
            go_on.set()
            await a.pg.behind.settled()  # type: ignore[union-attr]
            found = await b.get("x")
            assert found is not None and found.nominal_ms == old  # the late write landed
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1  # stale: removed unrun
            await b.relay()
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.nominal_ms, j.version) for j in batch.jobs] == [("x", new, version)]
            assert await b.ack_many(batch.jobs) == [True]
            assert (await b.claim(0, limit=10)).jobs == []
            assert await _row(pg_url, ns, "x") == (1, new, version)

    run(main())


def test_the_dashboards_run_now_takes_a_new_version(
    private_redis: RedisServer, pg_url: str
) -> None:
    """The dashboard's "run now" (a reschedule with no delay) on a Postgres-mode
    namespace: the row and the moved entry get the same new version, and the job runs
    once at its new occurrence."""
    far = 4_000_000_000_000

    async def scheduled() -> tuple[str, int]:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.schedule("x", "t", b"v", at=far)
            await s.relay()
            return s.keys.namespace, (await _row(pg_url, s.keys.namespace, "x"))[2]

    ns, first = run(scheduled())
    with api_client(private_redis.url, ns, postgres_url=pg_url) as client:
        r = client.post("/api/job/run-now", json={"id": "x"}, headers=bearer())
        assert r.status_code == 200, r.text

    async def runs() -> None:
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            state, due, version = await _row(pg_url, ns, "x")
            assert state == 0 and due < far and version > first
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.nominal_ms, j.version) for j in batch.jobs] == [("x", due, version)]
            assert await s.ack_many(batch.jobs) == [True]
            assert await _row(pg_url, ns, "x") == (1, due, version)

    run(runs())


@pytest.mark.parametrize("how", ["scheduler", "sync"])
def test_a_job_written_before_0012_is_rescheduled_at_a_new_version(
    private_redis: RedisServer, pg_url: str, how: str
) -> None:
    """A row written at schema 0010 (version 0) and its entry as the previous release
    wrote it (no version), then the migration: a reschedule gives both a version, and
    the job runs once at its new occurrence (no migration of its own: the new version
    is set by the library's statements, the functions are 0012's)."""
    move = _how(how, private_redis.url, pg_url)

    async def main() -> None:
        await _migrate_to(pg_url, 10)
        now = int(time.time() * 1000)
        record = pack_record([b"t", b"v"])
        ns = f"legacy-{how}"
        await rows(
            pg_url,
            "SELECT * FROM tickwheel_put(false, $1, 'x', 0, 't', 'v', false, 5, 0, $2,"
            " 0::smallint, '', 0::smallint, 0, 0, $3)",
            ns,
            now + 60_000,
            record,
        )
        await migrated(pg_url)
        assert (await _row(pg_url, ns, "x"))[2] == 0
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            await s.store.schedule_many({0: [[redis_job("x", now + 60_000, record)]]}, False)
            await rows(pg_url, "DELETE FROM tickwheel_outbox WHERE ns = $1", ns)  # indexed
            assert await move(s, "x", now - 1000)
            state, due, version = await _row(pg_url, ns, "x")
            assert (state, due) == (0, now - 1000) and version > 0
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.nominal_ms, j.version) for j in batch.jobs] == [("x", due, version)]
            assert await s.ack_many(batch.jobs) == [True]
            assert (await s.claim(0, limit=10)).jobs == []
            assert await _row(pg_url, ns, "x") == (1, due, version)

    run(main())
