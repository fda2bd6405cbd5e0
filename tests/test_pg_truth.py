"""The Postgres mode decides every transition in PostgreSQL first: retries, the
reaper's returns and dead letters, requeue and purge. After a Redis loss and a
reconcile a job's attempt never goes down, ``max_attempts`` holds, and nothing purged
comes back. Real redis-server and PostgreSQL processes."""

from __future__ import annotations

import asyncpg
import pytest
from durable_support import client_of, push_clock, run
from pg_support import migrated, pg_scheduler, rows

from tickwheel.durable import Fenced, JobState
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


def test_failed_attempts_survive_a_redis_loss(private_redis: RedisServer, pg_url: str) -> None:
    """A job that failed twice, then FLUSHALL and a reconcile: its third run is its last
    (attempt 3 of 3), and its failure dead-letters it in PostgreSQL for good."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("p", "t", b"", delay=0, max_attempts=3)
            runs = 0
            for attempt in (1, 2):
                (job,) = (await _claim_all(s)).jobs
                runs += 1
                assert job.attempt == attempt
                assert await s.retry(job, "boom", delay=0) is JobState.DUE
                row = await _row(pg_url, ns, "p")
                assert row is not None and row[:2] == (0, attempt + 1)
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 1
            (job,) = (await _claim_all(s)).jobs
            runs += 1
            assert job.attempt == 3
            assert await s.retry(job, "boom", delay=0) is JobState.DEAD
            assert runs == 3
            assert (await _row(pg_url, ns, "p")) == (2, 3, job.nominal_ms)
            await client_of(s).flushall()
            assert (await s.reconcile()).pending == 0
            await push_clock(s, 0, 60_000)
            assert not (await _claim_all(s)).jobs

    run(main())


def test_reaped_attempts_survive_a_redis_loss(private_redis: RedisServer, pg_url: str) -> None:
    """A job whose worker was killed twice (its started lease expired, the reaper
    returned it): the attempts are in PostgreSQL before Redis, so after FLUSHALL and a
    reconcile it runs as attempt 3 of 3, and a third expiry dead-letters it in
    PostgreSQL. It ran three times in all."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("k", "t", b"", delay=0, max_attempts=3)
            for attempt in (1, 2):
                (job,) = (await _claim_all(s, lease=1.0)).jobs
                assert job.attempt == attempt
                await push_clock(s, 0, 2_000)  # the worker died: its lease runs out
                result = await s.reap(0)
                assert result.requeued == ["k"]
                row = await _row(pg_url, ns, "k")
                assert row is not None and row[:2] == (0, attempt + 1)
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 1
            await push_clock(s, 0, 5_000)  # Redis lost the pushed clock: catch up
            (job,) = (await _claim_all(s, lease=1.0)).jobs
            assert job.attempt == 3
            await push_clock(s, 0, 2_000)
            assert (await s.reap(0)).dead == ["k"]
            assert (await _row(pg_url, ns, "k")) == (2, 3, job.nominal_ms)
            await client_of(s).flushall()
            assert (await s.reconcile()).pending == 0

    run(main())


def test_a_reap_killed_after_postgres_keeps_the_attempt(
    private_redis: RedisServer, pg_url: str
) -> None:
    """The reaper records its return in PostgreSQL, then dies before reap.lua: Redis
    still holds the expired lease; after a Redis loss the job comes back at the attempt
    PostgreSQL recorded, never lower."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("r", "t", b"", delay=0, max_attempts=5)
            (job,) = (await _claim_all(s, lease=1.0)).jobs
            await push_clock(s, 0, 2_000)
            epoch = s.ownership.epoch(0)
            now, plan = await s.store.reap_look(0, epoch, 100)
            assert plan == [("r", job.nominal_ms, 2, 1)]
            hook = s.ownership.before_reap
            assert hook is not None
            await hook(0, epoch, now, plan)  # ... and the reaper dies here
            assert (await s.get("r")).state is JobState.LEASED  # type: ignore[union-attr]
            row = await _row(pg_url, ns, "r")
            assert row is not None and row[:2] == (0, 2)
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 1
            await push_clock(s, 0, 3_000)  # Redis lost the pushed clock: catch up
            (again,) = (await _claim_all(s)).jobs
            assert (again.attempt, again.nominal_ms) == (2, job.nominal_ms)

    run(main())


def test_requeue_and_purge_killed_between_the_stores(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A requeue and a purge whose process dies after PostgreSQL and before Redis (the
    PostgreSQL half run alone): PostgreSQL decides. The requeue repeated finishes it in
    Redis; a purged job is never requeued (PostgreSQL says it is gone), the purge
    repeated removes it from Redis, and it does not come back after a Redis loss."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            for job_id in ("q", "g", "z"):
                await s.schedule(job_id, "t", b"", delay=0, max_attempts=1)
            for job in (await _claim_all(s)).jobs:
                assert await s.retry(job, "boom") is JobState.DEAD
            assert s.pg is not None
            # Killed between the stores: PostgreSQL changed, Redis not yet.
            assert await s.pg.store.undead(["q"], purge=False) == (["q"], ["q"])
            assert await s.pg.store.undead(["g"], purge=True) == (["g"], ["g"])
            assert (await s.get("q")).state is JobState.DEAD  # type: ignore[union-attr]
            assert (await s.get("g")).state is JobState.DEAD  # type: ignore[union-attr]
            assert (await _row(pg_url, ns, "q")) is not None
            assert (await _row(pg_url, ns, "g")) is None
            # PostgreSQL decides: g is gone, so it is never requeued; z is dead there.
            assert await s.requeue_dead(["g"]) == []
            assert (await s.get("g")).state is JobState.DEAD  # type: ignore[union-attr]
            assert await s.requeue_dead(["q"]) == ["q"]  # the repeat finishes it
            assert (await s.get("q")).state is JobState.DUE  # type: ignore[union-attr]
            assert await s.purge_dead(["q"]) == []  # pending in PostgreSQL: not dead
            assert await s.purge_dead(["g"]) == ["g"]
            assert await s.get("g") is None
            assert sorted(await s.purge_all_dead(0)) == ["z"]
            assert await s.get("z") is None and await _row(pg_url, ns, "z") is None
            await client_of(s).flushall()
            result = await s.reconcile()
            assert (result.pending, result.restored) == (1, 1)  # q only
            assert await s.get("g") is None and await s.get("z") is None

    run(main())


def test_cancel_in_the_applications_transaction(private_redis: RedisServer, pg_url: str) -> None:
    """``cancel(conn=)``: a rollback changes neither store; a commit removes the row at
    once and the Redis entry through the relay, and the job never runs."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            assert s.pg is not None
            await s.schedule("c", "t", b"", delay=0)
            await s.pg.relay_all(s)  # the producer's own outbox row, if still there
            conn = await asyncpg.connect(pg_url)
            try:
                tx = conn.transaction()
                await tx.start()
                assert await s.cancel("c", conn=conn) is True
                await tx.rollback()
                assert await _row(pg_url, ns, "c") is not None
                assert await s.pg.relay_all(s) == 0  # the mark rolled back too
                assert (await s.get("c")).state is JobState.DUE  # type: ignore[union-attr]

                async with conn.transaction():
                    assert await s.cancel("c", conn=conn) is True
                    assert (await s.get("c")).state is JobState.DUE  # type: ignore[union-attr]
                assert await _row(pg_url, ns, "c") is None
                assert await s.pg.relay_all(s) == 1
                assert await s.get("c") is None
                assert not (await _claim_all(s)).jobs
                async with conn.transaction():  # an id with no job: False, a no-op
                    assert await s.cancel("c", conn=conn) is False
                assert await s.pg.relay_all(s) == 1
            finally:
                await conn.close()

    run(main())


def test_a_cancel_mark_waits_for_the_id(private_redis: RedisServer, pg_url: str) -> None:
    """A relay never waits on a transaction that holds the id: its cancel mark stays
    for a later round, which removes the job from Redis. A claim before the relay
    removes a cancelled job unrun."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            assert s.pg is not None
            await s.schedule("a", "t", b"", delay=0)
            await s.schedule("b", "t", b"", delay=0)
            await s.pg.relay_all(s)  # the producer's own outbox rows, if still there
            app = await asyncpg.connect(pg_url)
            other = await asyncpg.connect(pg_url)
            try:
                async with app.transaction():
                    await s.cancel("a", conn=app)
                    await s.cancel("b", conn=app)
                # Another transaction holds a's id: a's mark is kept, b's is done.
                tx = other.transaction()
                await tx.start()
                await other.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || 'a', 0))",
                    s.keys.namespace,
                )
                assert await s.pg.relay_all(s) == 1
                assert await s.get("b") is None and await s.get("a") is not None
                await tx.rollback()
                assert await s.pg.relay_all(s) == 1
                assert await s.get("a") is None
                await s.schedule("z", "t", b"", delay=0)
                async with app.transaction():
                    await s.cancel("z", conn=app)
                batch = await _claim_all(s)  # before any relay: removed unrun
                assert not batch.jobs and await s.get("z") is None
            finally:
                await app.close()
                await other.close()

    run(main())


def test_cancel_in_a_psycopg_transaction(private_redis: RedisServer, pg_url: str) -> None:
    """``cancel(conn=)`` through an async psycopg 3 connection (``_drivers.py``): a
    rollback keeps the job, a commit removes it from both stores."""
    import psycopg

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            assert s.pg is not None
            await s.schedule("p", "t", b"", delay=0)
            await s.pg.relay_all(s)
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                async with conn.transaction(force_rollback=True):
                    assert await s.cancel("p", conn=conn) is True
                assert await _row(pg_url, s.keys.namespace, "p") is not None
                async with conn.transaction():
                    assert await s.cancel("p", conn=conn) is True
            assert await _row(pg_url, s.keys.namespace, "p") is None
            assert await s.pg.relay_all(s) == 1
            assert await s.get("p") is None

    run(main())


def test_a_requeue_writes_back_a_dead_letter_redis_lost(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A dead letter that Redis lost (FLUSHALL: reconcile does not bring dead rows back)
    is requeued by PostgreSQL, and the relay writes it back to Redis due."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            assert s.pg is not None
            await s.schedule("l", "t", b"", delay=0, max_attempts=1)
            (job,) = (await _claim_all(s)).jobs
            assert await s.retry(job, "boom") is JobState.DEAD
            await client_of(s).flushall()
            assert (await s.reconcile()).pending == 0
            assert await s.get("l") is None
            assert await s.requeue_dead(["l"]) == ["l"]  # decided in PostgreSQL
            await s.pg.relay_all(s)
            back = await s.get("l")
            assert back is not None and back.state is JobState.DUE and back.attempt == 1
            (again,) = (await _claim_all(s)).jobs
            await s.ack(again)
            assert (await _row(pg_url, s.keys.namespace, "l"))[:2] == (1, 1)  # type: ignore[index]

    run(main())


def test_a_pre_start_return_costs_no_attempt_in_either_store(
    private_redis: RedisServer, pg_url: str
) -> None:
    """The pre-start lease keeps its behaviour: its first return is at the same attempt
    and writes nothing to PostgreSQL; a second one in a row is charged, in PostgreSQL
    first."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("u", "t", b"", delay=0, max_attempts=5)
            for attempt in (1, 2):
                await s.take(0)
                (job,) = (await s.claim(0, lease=1.0, prestart=True)).jobs
                assert job.attempt == 1
                await push_clock(s, 0, 2_000)
                assert (await s.reap(0)).requeued == ["u"]
                row = await _row(pg_url, ns, "u")
                assert row is not None and row[1] == attempt
            info = await s.get("u")
            assert info is not None and info.attempt == 2

    run(main())


def test_a_missed_run_move_is_decided_in_postgresql_first(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A claim that moves a recurring job past its missed runs writes the move to
    PostgreSQL before Redis: a PostgreSQL that refuses it (it holds a higher epoch for
    the shard: Redis lost it) leaves Redis at the occurrence it had, not moved ahead of
    the row (the old order moved Redis, then lost the row's move); the Redis epoch is
    lifted above PostgreSQL's, so the next owner's claim goes through."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("r", "t", b"", every=1, missed="skip")
            first = await _row(pg_url, ns, "r")
            assert first is not None
            await s.take(0)
            await push_clock(s, 0, 10_500)  # ten runs missed
            await rows(
                pg_url,
                "INSERT INTO tickwheel_shard_epochs (ns, shard, epoch) VALUES ($1, 0, 1000)"
                " ON CONFLICT (ns, shard) DO UPDATE SET epoch = 1000",
                ns,
            )
            with pytest.raises(Fenced):
                await s.claim(0, limit=10, lease=1)
            info = await s.get("r")
            assert info is not None and info.nominal_ms == first[2]  # not moved in Redis
            assert await _row(pg_url, ns, "r") == first
            epoch = await s.take(0)
            assert epoch > 1000
            await push_clock(s, 0, 2_000)  # the refused claim's lease runs out
            await s.reap(0)
            (job,) = (await s.claim(0, limit=10, lease=30)).jobs
            # The reaper returned the occurrence it had (a retry of it, not a missed
            # run): both stores agree on it.
            row = await _row(pg_url, ns, "r")
            assert row is not None and row[2] == job.nominal_ms == first[2]

    run(main())
