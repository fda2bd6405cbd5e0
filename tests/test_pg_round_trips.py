"""The Postgres mode's own transaction, with fewer round trips: the outbox row of a job
the producer indexed is deleted by its next schedule's statement, and a connection the
library used for its own statements goes back to the pool without the reset query.

What must not change with them: a relay's rows are never waited on by a producer, and a
connection handed to the caller (``PgStore.transaction``) is still reset in full.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from durable_support import run
from pg_support import migrated, pg_scheduler, table_counts

from tickwheel.durable import JobSpec, ScheduleStatus
from tickwheel.durable.postgres._rows import encode_pg_job
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_next_schedule_deletes_the_outbox_row_of_the_one_before(
    redis_server: RedisServer, pg_url: str
) -> None:
    """Awaited schedules leave no outbox row behind; a row whose job is indexed is
    deleted by the next schedule's statement; a relay holding a row (FOR UPDATE) makes
    no producer wait, and keeps it."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            assert s.pg is not None
            for k in range(3):
                got = await s.schedule(f"j{k}", "t", b"x", delay=60)
                assert got.status is ScheduleStatus.CREATED
                assert await s.get(f"j{k}") is not None  # indexed before it returned
            assert await _outbox_empties(pg_url, within=10.0)

            # A row left for deletion (no delete task started): the next schedule's own
            # statement deletes it, before that schedule returns.
            (h0,) = await s.pg.store.schedule([encode_pg_job(JobSpec("h0", "t"), 0, 1 << 16)])
            s.pg.store._to_forget.append(h0[2])
            await s.schedule("h1", "t", b"x", delay=60)
            assert "h0" not in await _outbox(pg_url)

            # k0 written as a relay would find it: committed, its row not yet deleted.
            (k0,) = await s.pg.store.schedule([encode_pg_job(JobSpec("k0", "t"), 0, 1 << 16)])
            relay = await asyncpg.connect(pg_url)
            try:
                async with relay.transaction():  # as a relay holds the rows it writes
                    await relay.execute("SELECT 1 FROM tickwheel_outbox FOR UPDATE")
                    s.pg.store._to_forget.append(k0[2])  # for the next statement to delete
                    # k0's row is held: k1's statement skips it instead of waiting.
                    got = await asyncio.wait_for(s.schedule("k1", "t", b"x", delay=60), 5)
                    assert got.status is ScheduleStatus.CREATED
            finally:
                await relay.close()
            assert "k0" in await _outbox(pg_url)  # left to the relay, which deletes it
            assert (await table_counts(pg_url))["tickwheel_jobs"] == 7

    run(main())


def test_a_caller_transaction_connection_is_still_reset(
    redis_server: RedisServer, pg_url: str
) -> None:
    """With one pooled connection: the library's own calls leave nothing on it, and a
    session setting made through ``PgStore.transaction()`` is gone before the next use."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            assert s.pg is not None
            store = s.pg.store
            store.pool_size = 1  # before the pool opens: every call on the same connection
            await s.schedule("a", "t", b"x", delay=60)
            async with store.transaction() as conn:
                await conn.execute("SET application_name = 'leaky'")  # session-level
                await conn.execute("SELECT pg_advisory_lock(42)")  # a session lock
            async with store.transaction() as conn:
                assert await conn.fetchval("SELECT current_setting('application_name')") != (
                    "leaky"
                )
                held = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND pid = pg_backend_pid()"
                )
                assert held == 0
            await s.schedule("b", "t", b"x", delay=60)
            assert await s.get("b") is not None

    run(main())


async def _outbox(pg_url: str) -> list[str]:
    conn = await asyncpg.connect(pg_url)
    try:
        return [r[0] for r in await conn.fetch("SELECT id FROM tickwheel_outbox ORDER BY seq")]
    finally:
        await conn.close()


async def _outbox_empties(pg_url: str, within: float) -> bool:
    deadline = asyncio.get_running_loop().time() + within
    while (await table_counts(pg_url))["tickwheel_outbox"]:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True
