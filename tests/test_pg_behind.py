"""The index write behind a single ``schedule`` (durable/postgres/_behind.py): the job is
committed when ``schedule`` returns, and its Redis entry is written after, batched with
the calls made meanwhile.

Checked here: the scheduler's own later calls see the job (read your writes); a cancel
or replace, from this process or another, racing the deferred write is never undone by
it; a Redis failure or loss between the row and the write leaves the job to the relay
and reconcile; concurrent producers' jobs all land, once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from durable_support import run
from pg_support import migrated, pg_scheduler, rows, table_counts

from tickwheel.durable import JobSpec, JobState, ScheduleStatus
from tickwheel.durable.model import RedisUnavailable
from tickwheel.durable.postgres import _behind
from tickwheel.durable.servers._redis import RedisServer


def _held_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the write behind until the test says so: (started, go_on)."""
    started, go_on = asyncio.Event(), asyncio.Event()
    write = _behind.write

    async def held(sched: Any, jobs: Any) -> None:
        started.set()
        await go_on.wait()
        await write(sched, jobs)

    monkeypatch.setattr(_behind, "write", held)
    return started, go_on


async def _payload(pg_url: str, ns: str, job_id: str) -> bytes | None:
    found = await rows(
        pg_url, "SELECT payload FROM tickwheel_jobs WHERE ns = $1 AND id = $2", ns, job_id
    )
    return bytes(found[0][0]) if found else None


def test_the_schedulers_own_calls_see_a_job_written_behind(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``schedule`` returns before Redis has the job; the same scheduler's get, inspect
    and claim wait for the write, so they see it as before."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=1) as other,
        ):
            started, go_on = _held_writes(monkeypatch)
            result = await s.schedule("a", "t", b"v", delay=0)
            assert result.status is ScheduleStatus.CREATED
            await asyncio.wait_for(started.wait(), 10)
            assert await _payload(pg_url, s.keys.namespace, "a") == b"v"  # committed
            assert await other.get("a") is None  # another process: a write later
            getting = asyncio.create_task(s.get("a"))
            await asyncio.sleep(0.1)
            assert not getting.done()  # waits for the write in flight
            go_on.set()
            info = await asyncio.wait_for(getting, 10)
            assert info is not None and info.state is JobState.DUE
            assert sum(i.due for i in await s.operator.inspect()) == 1
            await s.schedule("b", "t", b"w", delay=0)
            await s.take(0)
            batch = await s.claim(0, limit=10)  # no wait needed: the write comes first
            assert sorted(j.id for j in batch.jobs) == ["a", "b"]

    run(main())


def test_a_cancel_right_after_schedule_is_never_overtaken(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel of the same scheduler right after ``schedule`` (write not yet made, or
    in flight) waits for it, then removes the job from both stores: nothing comes back."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            for k in range(20):  # not yet started: cancelled in the same step
                await s.schedule(f"n{k}", "t", b"v", delay=0)
                assert await s.cancel(f"n{k}") is True
            started, go_on = _held_writes(monkeypatch)
            await s.schedule("x", "t", b"v", delay=0)
            await asyncio.wait_for(started.wait(), 10)  # in flight
            cancelling = asyncio.create_task(s.cancel("x"))
            await asyncio.sleep(0.1)
            go_on.set()
            assert await asyncio.wait_for(cancelling, 10) is True
            for job_id in ["x", *(f"n{k}" for k in range(20))]:
                assert await s.get(job_id) is None
                assert await _payload(pg_url, ns, job_id) is None
            await s.take(0)
            batch = await s.claim(0, limit=100)
            assert batch.jobs == [] and batch.dropped == 0  # not even a stale entry
            assert (await table_counts(pg_url))["tickwheel_outbox"] == 0

    run(main())


def test_a_cancel_from_another_process_racing_the_write_is_never_undone(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another scheduler cancels the job between the commit and the deferred write: the
    late write is the synchronous write's race (a window of one call then), and the job
    still never runs: the claim finds no row and removes it unrun."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=1) as other,
        ):
            started, go_on = _held_writes(monkeypatch)
            await s.schedule("x", "t", b"v", delay=0)
            await asyncio.wait_for(started.wait(), 10)
            assert await other.cancel("x") is True
            assert await _payload(pg_url, s.keys.namespace, "x") is None
            go_on.set()
            await s.pg.behind.settled()  # type: ignore[union-attr]
            await other.take(0)
            batch = await other.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1  # removed unrun
            assert await other.get("x") is None
            assert (await other.reconcile()).pending == 0

    run(main())


def test_a_replace_from_another_process_racing_the_write_wins(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another scheduler replaces the job before the deferred write lands: the write
    (``replace`` off) keeps what Redis has, so the replacement is what runs."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=1) as other,
        ):
            started, go_on = _held_writes(monkeypatch)
            await s.schedule("x", "t", b"old", delay=0)
            await asyncio.wait_for(started.wait(), 10)
            replaced = await other.schedule("x", "t", b"new", delay=0, replace=True)
            assert replaced.status in (ScheduleStatus.CREATED, ScheduleStatus.REPLACED)
            go_on.set()
            await s.pg.behind.settled()  # type: ignore[union-attr]
            assert await _payload(pg_url, s.keys.namespace, "x") == b"new"
            await other.take(0)
            batch = await other.claim(0, limit=10)
            assert [(j.id, j.payload) for j in batch.jobs] == [("x", b"new")]
            await other.ack_many(batch.jobs)
            assert await other.get("x") is None

    run(main())


def test_a_failed_write_behind_is_left_to_the_relay(
    private_redis: RedisServer,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis fails between the commit and the deferred write: ``schedule`` had
    returned CREATED (the job is committed), the outbox row stays, and the relay
    writes the job."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.open()

            async def down(sched: Any, jobs: Any) -> None:
                raise RedisUnavailable("redis down (test)")

            monkeypatch.setattr(_behind, "write", down)
            result = await s.schedule("x", "t", b"v", delay=0)
            assert result.status is ScheduleStatus.CREATED
            await s.pg.behind.settled()  # type: ignore[union-attr]
            assert "1 committed job(s) left to the relay" in caplog.text
            monkeypatch.undo()
            assert await s.get("x") is None
            assert (await table_counts(pg_url))["tickwheel_outbox"] == 1
            assert await s.relay() == 1
            info = await s.get("x")
            assert info is not None and info.state is JobState.DUE
            assert (await table_counts(pg_url))["tickwheel_outbox"] == 0

    run(main())


def test_a_redis_loss_between_the_row_and_the_write_is_reconciled(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis loses everything while the write is still to come: the committed row is
    the truth, and a reconcile (or the late write itself) puts the job back, once."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.open()
            started, go_on = _held_writes(monkeypatch)
            await s.schedule("x", "t", b"v", delay=0)
            await asyncio.wait_for(started.wait(), 10)
            await s.store.client.flushall()  # type: ignore[attr-defined]
            go_on.set()
            await s.pg.behind.settled()  # type: ignore[union-attr]
            result = await s.reconcile()
            assert result.pending == 1
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.payload) for j in batch.jobs] == [("x", b"v")]
            await s.ack_many(batch.jobs)
            assert (await table_counts(pg_url))["tickwheel_outbox"] == 0

    run(main())


def test_concurrent_producers_jobs_all_land_once(private_redis: RedisServer, pg_url: str) -> None:
    """Many schedules in flight at once share the writes behind them; every job is in
    Redis once, every outbox row gone, and each runs once."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=2) as s:
            ids = [f"c{k}" for k in range(200)]
            results = await asyncio.gather(*(s.schedule(i, "t", b"v", delay=0) for i in ids))
            assert {r.status for r in results} == {ScheduleStatus.CREATED}
            assert sum(i.due for i in await s.operator.inspect()) == len(ids)
            ran: list[str] = []
            for shard in range(2):
                await s.take(shard)
                batch = await s.claim(shard, limit=1000)
                ran += [j.id for j in batch.jobs]
                await s.ack_many(batch.jobs)
            assert sorted(ran) == sorted(ids)
        for _ in range(100):  # the last outbox deletes run after the calls
            if not (await table_counts(pg_url))["tickwheel_outbox"]:
                break
            await asyncio.sleep(0.05)
        assert (await table_counts(pg_url))["tickwheel_outbox"] == 0

    run(main())


def test_schedule_many_is_written_before_it_returns(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's Redis calls are one per shard already: it is written before the call
    returns, not behind it."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            pg_scheduler(private_redis.url, pg_url, s.keys.namespace, shards=1) as other,
        ):
            await s.schedule_many([JobSpec(f"m{k}", "t", b"v") for k in range(5)])
            assert not s.pg.behind.busy  # type: ignore[union-attr]
            for k in range(5):
                assert await other.get(f"m{k}") is not None

    run(main())
