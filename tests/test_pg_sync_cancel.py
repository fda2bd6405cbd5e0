"""``SyncScheduler.cancel(job_id, conn=)``: the job is removed iff the application's
synchronous transaction commits (its row in it, Redis by a relay after the commit), as
the asyncio ``cancel(conn=)`` (tests/test_pg_truth.py). psycopg 3 and SQLAlchemy 2 here
(Django in tests/test_pg_drivers.py); real redis-server and PostgreSQL processes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import psycopg
import pytest
from durable_support import run, unique_ns
from pg_support import migrated, pg_scheduler, rows

from tickwheel.durable import JobState, Scheduler, SyncScheduler
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

F = 4_000_000_000_000  # far ahead: these jobs stay due, never claimed


async def _state(pg_url: str, ns: str, job_id: str) -> int | None:
    """The job row's state, or None without a row."""
    got = await rows(
        pg_url, "SELECT state FROM tickwheel_jobs WHERE ns = $1 AND id = $2", ns, job_id
    )
    return int(got[0][0]) if got else None


async def _marks(pg_url: str, ns: str) -> int:
    """Cancel marks (outbox rows with due -1) not yet relayed."""
    got = await rows(
        pg_url, "SELECT count(*) FROM tickwheel_outbox WHERE ns = $1 AND due_ms = -1", ns
    )
    return int(got[0][0])


@contextlib.asynccontextmanager
async def _pair(
    redis_url: str, pg_url: str, job_id: str, payload: bytes = b""
) -> AsyncIterator[tuple[Scheduler, SyncScheduler]]:
    """An asyncio Scheduler holding ``job_id`` (due far ahead, in both stores) and a
    SyncScheduler of its namespace."""
    await migrated(pg_url)
    async with pg_scheduler(redis_url, pg_url, shards=1) as s:
        assert s.pg is not None
        await s.schedule(job_id, "t", payload, at=F)
        await s.pg.relay_all(s)
        sync = SyncScheduler.from_url(redis_url, s.keys.namespace, shards=1, postgres_url=pg_url)
        try:
            yield s, sync
        finally:
            sync.close()


def test_sync_cancel_in_a_psycopg_transaction(private_redis: RedisServer, pg_url: str) -> None:
    """A rollback changes neither store; a commit removes the row at once, leaves Redis
    to the relay (the job still there before it), and the relay removes it; a second
    cancel of the id finds nothing."""

    async def main() -> None:
        async with _pair(private_redis.url, pg_url, "c") as (s, sync):
            ns = s.keys.namespace
            assert s.pg is not None
            with psycopg.connect(pg_url) as conn:
                with conn.transaction(force_rollback=True):
                    assert sync.cancel("c", conn=conn) is True
                    assert await _state(pg_url, ns, "c") == 0  # not committed yet
                assert await _state(pg_url, ns, "c") == 0
                assert await _marks(pg_url, ns) == 0 and await s.pg.relay_all(s) == 0
                info = await s.get("c")
                assert info is not None and info.state is JobState.DUE

                with conn.transaction():
                    conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
                    conn.execute("INSERT INTO orders VALUES ('c')")
                    assert sync.cancel("c", conn=conn) is True
                assert await _state(pg_url, ns, "c") is None
                assert await _marks(pg_url, ns) == 1
                assert await s.get("c") is not None  # Redis: the relay's, after the commit
                assert await s.pg.relay_all(s) == 1
                assert await s.get("c") is None
                assert await rows(pg_url, "SELECT id FROM orders WHERE id = 'c'")

                with conn.transaction():  # nothing left: False, and still a no-op
                    assert sync.cancel("c", conn=conn) is False
                assert await s.pg.relay_all(s) == 1
                assert await s.get("c") is None

    run(main())


def test_sync_cancel_supersedes_a_replacement_in_the_same_transaction(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A replace and then a cancel of the id in one application transaction: after the
    commit nothing of the id is left in either store, and the relay applies no stale
    replacement."""

    async def main() -> None:
        async with _pair(private_redis.url, pg_url, "r", b"old") as (s, sync):
            ns = s.keys.namespace
            assert s.pg is not None
            with psycopg.connect(pg_url) as conn, conn.transaction():
                sync.schedule("r", "t", b"new", at=F + 1, replace=True, conn=conn)
                assert sync.cancel("r", conn=conn) is True
            await s.pg.relay_all(s)
            assert await s.get("r") is None
            assert await _state(pg_url, ns, "r") is None
            left = await rows(pg_url, "SELECT id FROM tickwheel_replacing WHERE ns = $1", ns)
            assert left == []

    run(main())


def test_sync_cancel_in_a_sqlalchemy_session(private_redis: RedisServer, pg_url: str) -> None:
    """A SQLAlchemy Session's transaction: rolled back, the job stays; committed, it is
    gone from both stores once a relay ran."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))

    async def main() -> None:
        async with _pair(private_redis.url, pg_url, "q") as (s, sync):
            ns = s.keys.namespace
            assert s.pg is not None
            with Session(engine) as session:
                assert sync.cancel("q", conn=session) is True
                session.rollback()
            assert await _state(pg_url, ns, "q") == 0
            assert await s.pg.relay_all(s) == 0 and await s.get("q") is not None
            with Session(engine) as session, session.begin():
                assert sync.cancel("q", conn=session) is True
            assert await _state(pg_url, ns, "q") is None
            assert await s.pg.relay_all(s) == 1
            assert await s.get("q") is None

    try:
        run(main())
    finally:
        engine.dispose()


def test_sync_cancel_conn_bad_input_writes_nothing(private_redis: RedisServer, pg_url: str) -> None:
    """A ``conn`` without the Postgres mode, an asyncio connection, an object of no known
    driver, and a bad id: each a clear error, and the job is where it was."""

    async def main() -> None:
        async with _pair(private_redis.url, pg_url, "k") as (s, sync):
            ns = s.keys.namespace
            redis_only = SyncScheduler.from_url(private_redis.url, unique_ns(), shards=1)
            aconn = await asyncpg.connect(pg_url)
            try:
                with psycopg.connect(pg_url) as conn:
                    with pytest.raises(ValueError, match="conn needs the Postgres mode"):
                        redis_only.cancel("k", conn=conn)
                    with pytest.raises(ValueError, match="job_id"):
                        sync.cancel("", conn=conn)
                with pytest.raises(TypeError, match="conn"):
                    sync.cancel("k", conn=aconn)
                with pytest.raises(TypeError, match="conn"):
                    sync.cancel("k", conn=object())
                assert await _state(pg_url, ns, "k") == 0
                assert await _marks(pg_url, ns) == 0
                info = await s.get("k")
                assert info is not None and info.state is JobState.DUE
            finally:
                await aconn.close()
                redis_only.close()

    run(main())
