"""A late index write after a Redis loss never brings back an older attempt (issue 39).

A late index write (the write behind a ``schedule``, a relay's write, held long) is
``schedule.lua`` with ``replace`` off: it only creates an entry Redis does not have. A
retry, a reaper return or a dead letter keeps the row's version, so after a Redis loss
such a write used to bring the job back as first written, attempt 1 at its nominal due:
a retried job ran again at once at attempt 1, a dead one ran and its ack was accepted.
The claim check (migration 0013) now names as stale an entry whose row is not pending,
or is at a higher attempt of the same occurrence, or at a later occurrence: removed
unrun, and a pending row is written again from its own state (attempt, run time).
Real redis-server and PostgreSQL, started by the tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from durable_support import client_of, push_clock, run
from pg_support import migrated, pg_scheduler, rows
from test_pg_behind import _held_writes  # the same hold on the write behind
from test_pg_keyed import _entries_read, _filled

from tickwheel.durable import JobState, Scheduler
from tickwheel.durable.postgres import _writes
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


async def _row(pg_url: str, ns: str, job_id: str) -> tuple[int, int, int, int]:
    """The row's (state, attempt, due_ms, run_ms)."""
    (row,) = await rows(
        pg_url,
        "SELECT state, attempt, due_ms, run_ms FROM tickwheel_jobs WHERE ns = $1 AND id = $2",
        ns,
        job_id,
    )
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


async def _done(pg_url: str, ns: str, job_id: str) -> list[int]:
    found = await rows(
        pg_url,
        "SELECT nominal_ms FROM tickwheel_done WHERE ns = $1 AND id = $2 ORDER BY 1",
        ns,
        job_id,
    )
    return [int(r[0]) for r in found]


@asynccontextmanager
async def _late_write(
    redis_url: str,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    at_ms: int = -1000,
    **kwargs: object,
) -> AsyncIterator[tuple[Scheduler, Scheduler, asyncio.Event]]:
    """Scheduler A commits job x (due ``at_ms`` from now: a second ago) and its write
    behind is held; B's relay indexes x from the outbox. Yields (A, B, go_on): set
    go_on to let A's write land (then await ``A.pg.behind.settled()``)."""
    await migrated(pg_url)
    async with (
        pg_scheduler(redis_url, pg_url, shards=1) as a,
        pg_scheduler(redis_url, pg_url, a.keys.namespace, shards=1) as b,
    ):
        started, go_on = _held_writes(monkeypatch)
        at = int(time.time() * 1000) + at_ms
        await a.schedule("x", "t", b"v", at=at, **kwargs)  # type: ignore[arg-type]
        await asyncio.wait_for(started.wait(), 10)
        assert await b.relay() >= 1  # x indexed from its outbox row
        yield a, b, go_on


async def _lose_redis_then_land(a: Scheduler, b: Scheduler, go_on: asyncio.Event) -> None:
    """FLUSHALL, then A's held write lands (x as first written: attempt 1, at its
    nominal due), then a reconcile (which keeps an entry Redis has)."""
    await client_of(b).flushall()
    go_on.set()
    await a.pg.behind.settled()  # type: ignore[union-attr]
    found = await b.get("x")
    assert found is not None and found.attempt == 1  # the late write landed
    await b.reconcile()


def test_a_late_write_after_a_redis_loss_does_not_undo_a_retry(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x fails its first run and is retried to attempt 2 with a 60 s backoff; Redis
    loses everything and the late write lands. The claim removes that entry unrun (it
    ran at once as attempt 1 before), the relays write x back from its row (attempt 2,
    at its run time), and it runs as attempt 2 once the backoff is over."""

    async def main() -> None:
        async with _late_write(private_redis.url, pg_url, monkeypatch, max_attempts=3) as (
            a,
            b,
            go_on,
        ):
            ns = b.keys.namespace
            await b.take(0)
            (job,) = (await b.claim(0, limit=10)).jobs
            assert job.attempt == 1
            assert await b.retry(job, "boom", delay=60) is JobState.DUE
            state, attempt, due, run_ms = await _row(pg_url, ns, "x")
            assert (state, attempt, due) == (0, 2, job.nominal_ms) and run_ms > due
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert [(j.id, j.attempt) for j in batch.jobs] == []  # not attempt 1 again
            assert batch.dropped == 1
            assert await b.relay() == 1  # the row, written from its state
            back = await b.get("x")
            assert back is not None and back.state is JobState.DUE
            assert (back.attempt, back.when_ms, back.nominal_ms) == (2, run_ms, job.nominal_ms)
            assert (await b.claim(0, limit=10)).jobs == []  # the backoff holds
            await push_clock(b, 0, 61_000)
            (again,) = (await b.claim(0, limit=10)).jobs
            assert (again.attempt, again.nominal_ms) == (2, job.nominal_ms)
            assert await b.ack_many([again]) == [True]
            assert (await _row(pg_url, ns, "x"))[:3] == (1, 2, job.nominal_ms)
            assert await _done(pg_url, ns, "x") == [job.nominal_ms]

    run(main())


@pytest.mark.parametrize("how", ["last attempt", "final"])
def test_a_late_write_after_a_redis_loss_does_not_bring_back_a_dead_job(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """x dies (its last attempt failed, or a retry with final=True): its row is dead.
    Redis loses everything (reconcile does not bring dead rows back) and the late write
    lands: the claim removes it unrun. Before, it ran and its ack was accepted, a run
    past max_attempts."""
    most = 1 if how == "last attempt" else 3

    async def main() -> None:
        async with _late_write(private_redis.url, pg_url, monkeypatch, max_attempts=most) as (
            a,
            b,
            go_on,
        ):
            ns = b.keys.namespace
            await b.take(0)
            (job,) = (await b.claim(0, limit=10)).jobs
            final = how == "final"
            assert await b.retry(job, "boom", final=final) is JobState.DEAD
            assert (await _row(pg_url, ns, "x"))[:3] == (2, 1, job.nominal_ms)
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1  # never a second run
            assert await b.get("x") is None
            assert await b.relay() == 0  # a dead row is not written back
            assert (await _row(pg_url, ns, "x"))[:3] == (2, 1, job.nominal_ms)
            assert await _done(pg_url, ns, "x") == []

    run(main())


def test_a_late_write_after_a_redis_loss_does_not_undo_a_reaper_return(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x's worker dies twice (its started lease expires and the reaper returns it, the
    second time dead at attempt 2 of 2). Redis loses everything and the late write lands:
    it is removed unrun. In all x ran twice, max_attempts."""

    async def main() -> None:
        async with _late_write(private_redis.url, pg_url, monkeypatch, max_attempts=2) as (
            a,
            b,
            go_on,
        ):
            ns = b.keys.namespace
            await b.take(0)
            (job,) = (await b.claim(0, limit=10, lease=1.0)).jobs
            await push_clock(b, 0, 2_000)
            assert (await b.reap(0)).requeued == ["x"]
            assert (await _row(pg_url, ns, "x"))[:2] == (0, 2)
            (job,) = (await b.claim(0, limit=10, lease=1.0)).jobs
            assert job.attempt == 2
            await push_clock(b, 0, 2_000)
            assert (await b.reap(0)).dead == ["x"]
            assert (await _row(pg_url, ns, "x"))[:2] == (2, 2)
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1
            assert await b.get("x") is None

    run(main())


def test_a_late_write_after_a_reaper_return_is_written_back_at_its_attempt(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x's worker dies once (the reaper returns it as attempt 2 of 3); Redis loses
    everything and the late write lands. The claim removes it unrun, the relays write
    the row back as attempt 2, and that runs: x's third run would be its last."""

    async def main() -> None:
        async with _late_write(private_redis.url, pg_url, monkeypatch, max_attempts=3) as (
            a,
            b,
            go_on,
        ):
            ns = b.keys.namespace
            await b.take(0)
            (job,) = (await b.claim(0, limit=10, lease=1.0)).jobs
            await push_clock(b, 0, 2_000)
            assert (await b.reap(0)).requeued == ["x"]
            assert (await _row(pg_url, ns, "x"))[:2] == (0, 2)
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1
            assert await b.relay() == 1
            back = await b.get("x")
            assert back is not None and (back.attempt, back.nominal_ms) == (2, job.nominal_ms)
            await push_clock(b, 0, 5_000)  # Redis lost the pushed clock: catch up
            (again,) = (await b.claim(0, limit=10)).jobs
            assert (again.attempt, again.nominal_ms) == (2, job.nominal_ms)
            assert await b.ack_many([again]) == [True]
            assert (await _row(pg_url, ns, "x"))[:3] == (1, 2, job.nominal_ms)

    run(main())


def test_a_late_write_after_a_redis_loss_does_not_undo_a_recurring_jobs_retry(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recurring job's occurrence is retried to attempt 2 with a 30 s backoff; Redis
    loses everything and the late write (attempt 1 of that occurrence) lands. It is
    removed unrun; the relays write the row back as the retried occurrence (its
    recurrence kept), which runs as attempt 2 and moves the row to the next occurrence."""

    async def main() -> None:
        async with _late_write(
            private_redis.url, pg_url, monkeypatch, max_attempts=3, every=60
        ) as (a, b, go_on):
            ns = b.keys.namespace
            await b.take(0)
            (job,) = (await b.claim(0, limit=10)).jobs
            assert job.attempt == 1 and job.recurrence is not None
            assert await b.retry(job, "boom", delay=30) is JobState.DUE
            run_ms = (await _row(pg_url, ns, "x"))[3]
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            batch = await b.claim(0, limit=10)
            assert batch.jobs == [] and batch.dropped == 1
            assert await b.relay() == 1
            back = await b.get("x")
            assert back is not None and (back.attempt, back.when_ms) == (2, run_ms)
            await push_clock(b, 0, 31_000)
            (again,) = (await b.claim(0, limit=10)).jobs
            assert (again.attempt, again.nominal_ms) == (2, job.nominal_ms)
            assert again.recurrence is not None
            assert await b.ack_many([again]) == [True]
            assert (await _row(pg_url, ns, "x"))[:3] == (0, 1, job.nominal_ms + 60_000)
            assert await _done(pg_url, ns, "x") == [job.nominal_ms]

    run(main())


def test_the_claim_check_reads_one_key_per_id_and_keeps_what_is_not_behind(
    pg_url: str,
) -> None:
    """The seven-argument check on a namespace of 4,000 rows never analyzed reads about
    one index entry per id (test_pg_keyed's bound), and names as stale exactly the
    entries behind their row: a dead row, a higher attempt, a later occurrence, an
    older version. Entries at their row's state, or ahead of it (a higher attempt, a
    later occurrence, a newer version: Redis ahead), and done occurrences are not."""

    async def main() -> None:
        await migrated(pg_url)
        conn = await asyncpg.connect(pg_url)
        ns = "check-" + str(time.time_ns())
        try:
            filled = await _filled(conn, ns)
            pending, done = filled[1:100:2], filled[0:100:2]
            ids = [i for i, _ in pending]
            # Five rows moved on: dead, retried to attempt 3, at a later occurrence.
            await conn.execute(
                "UPDATE tickwheel_jobs SET state = 2 WHERE ns = $1 AND id = $2", ns, ids[0]
            )
            await conn.execute(
                "UPDATE tickwheel_jobs SET attempt = 3, run_ms = due_ms + 1"
                " WHERE ns = $1 AND id = ANY($2::text[])",
                ns,
                ids[1:3],
            )
            await conn.execute(
                "UPDATE tickwheel_jobs SET due_ms = due_ms + 60000 WHERE ns = $1 AND id = $2",
                ns,
                ids[3],
            )
            vers = {
                r[0]: int(r[1])
                for r in await conn.fetch(
                    "SELECT id, version FROM tickwheel_jobs WHERE ns = $1", ns
                )
            }
            nominals = [d for _, d in pending]
            versions = [vers[i] for i in ids]
            attempts = [1] * len(ids)
            attempts[2] = 3  # at its row's attempt
            attempts[4] = 2  # ahead of its row (attempt 1)
            versions[5] -= 1  # older than its row
            versions[6] += 1  # newer than its row: Redis ahead
            nominals[7] += 1  # a later occurrence than its row's: Redis ahead
            versions[8] = 0  # no version (a writer of the previous release): compared
            all_ids = ids + [i for i, _ in done]
            cols = (versions + [vers[i] for i, _ in done], attempts + [1] * len(done))
            all_noms = nominals + [d for _, d in done]

            async def check(c: Any) -> None:
                found_done, gone = await _writes.claim_check(
                    c, ns, 0, 1, ids=all_ids, nominals=all_noms, cols=cols
                )
                assert found_done == set(range(len(ids), len(all_ids)))
                assert gone == {0, 1, 3, 5}

            assert await _entries_read(conn, "tickwheel_jobs_pkey", check) <= 4 * len(all_ids)

            async def previous(c: Any) -> None:  # a worker of the previous release
                six = await _writes.claim_check(
                    c, ns, 0, 1, ids=all_ids, nominals=all_noms, cols=cols[:1]
                )
                five = await _writes.claim_check(c, ns, 0, 1, ids=all_ids, nominals=all_noms)
                assert six[1] == {5} and five[1] == set()  # versions only (0012), none (0006)
                assert six[0] == five[0] == set(range(len(ids), len(all_ids)))

            await _entries_read(conn, "tickwheel_jobs_pkey", previous)
        finally:
            await conn.close()

    run(main())


def test_a_late_write_after_a_redis_loss_does_not_run_a_skipped_occurrence(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recurring job (every 60 s, missed runs skipped) first due 150 s ago: its first
    claim runs it as its latest occurrence (the row moves there first) and skips the two
    before. Redis loses everything and the late write (the first occurrence) lands: its
    claim runs nothing (the same plan, an occurrence done), and neither skipped
    occurrence ever runs; the next one runs once."""

    async def main() -> None:
        async with _late_write(
            private_redis.url, pg_url, monkeypatch, -150_000, every=60, missed="skip"
        ) as (a, b, go_on):
            ns = b.keys.namespace
            first = (await _row(pg_url, ns, "x"))[2]
            await b.take(0)
            (job,) = (await b.claim(0, limit=10)).jobs
            assert job.nominal_ms == first + 120_000
            assert await b.ack_many([job]) == [True]
            nxt = first + 180_000
            assert (await _row(pg_url, ns, "x"))[:3] == (0, 1, nxt)
            await _lose_redis_then_land(a, b, go_on)
            await b.take(0)
            assert (await b.claim(0, limit=10)).jobs == []  # nothing runs again
            assert (await _row(pg_url, ns, "x"))[:3] == (0, 1, nxt)
            await push_clock(b, 0, nxt - await b.store.now(0) + 100)
            (job,) = (await b.claim(0, limit=10)).jobs
            assert job.nominal_ms == nxt
            assert await b.ack_many([job]) == [True]
            assert await _done(pg_url, ns, "x") == [first + 120_000, nxt]

    run(main())
