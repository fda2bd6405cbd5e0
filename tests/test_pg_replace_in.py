"""``schedule(..., replace=True, conn=)``: a replace in the application's transaction
takes effect iff it commits (a relay applies it after the commit, Redis deciding as in
the asyncio mode's own replace), and a late relay never overtakes a later write of the
id (migration 0009's generations). asyncpg, async psycopg 3 and ``SyncScheduler`` over
sync psycopg 3; real redis-server and PostgreSQL processes."""

from __future__ import annotations

import asyncpg
import pytest
from durable_support import run
from pg_support import migrated, pg_scheduler, rows

from tickwheel.durable import JobState, ScheduleStatus, SyncScheduler
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

F = 4_000_000_000_000  # far ahead: these jobs stay due, never claimed
P = 946_684_800_000  # 2000-01-01: due at once


async def _row(pg_url: str, ns: str, job_id: str) -> tuple[int, int, bytes] | None:
    """(state, due_ms, payload) of a job's row, or None."""
    got = await rows(
        pg_url,
        "SELECT state, due_ms, payload FROM tickwheel_jobs WHERE ns = $1 AND id = $2",
        ns,
        job_id,
    )
    return (int(got[0][0]), int(got[0][1]), bytes(got[0][2])) if got else None


async def _waiting(pg_url: str, ns: str) -> list[str]:
    got = await rows(pg_url, "SELECT id FROM tickwheel_replacing WHERE ns = $1 ORDER BY id", ns)
    return [r[0] for r in got]


def test_replace_in_an_asyncpg_transaction_is_applied_iff_it_commits(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A rollback leaves the old job in both stores; a commit replaces it in both once a
    relay ran, at the due the transaction decided; a new id is created the same way;
    a done occurrence is DONE with nothing written."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            assert s.pg is not None
            await s.schedule("r", "t", b"old", at=F + 1_000)
            await s.pg.relay_all(s)
            conn = await asyncpg.connect(pg_url)
            try:
                tx = conn.transaction()
                await tx.start()
                res = await s.schedule("r", "t", b"new", at=F + 2_000, replace=True, conn=conn)
                assert (res.status, res.when_ms) == (ScheduleStatus.REPLACED, F + 2_000)
                await tx.rollback()
                assert await s.pg.relay_all(s) == 0
                assert await _waiting(pg_url, ns) == []
                assert await _row(pg_url, ns, "r") == (0, F + 1_000, b"old")
                info = await s.get("r")
                assert info is not None and (info.payload, info.when_ms) == (b"old", F + 1_000)

                async with conn.transaction():
                    await s.schedule("r", "t", b"new", at=F + 2_000, replace=True, conn=conn)
                    await s.schedule("n", "t", b"fresh", at=F + 3_000, replace=True, conn=conn)
                assert await _waiting(pg_url, ns) == ["n", "r"]
                assert await s.pg.relay_all(s) == 2
                assert await _waiting(pg_url, ns) == []
                assert await _row(pg_url, ns, "r") == (0, F + 2_000, b"new")
                assert await _row(pg_url, ns, "n") == (0, F + 3_000, b"fresh")
                info = await s.get("r")
                assert info is not None and (info.payload, info.when_ms) == (b"new", F + 2_000)
                assert info.state is JobState.DUE
                fresh = await s.get("n")
                assert fresh is not None and fresh.payload == b"fresh"

                # An occurrence PostgreSQL has done: DONE, nothing written.
                await s.schedule("d", "t", b"", at=P + 5)
                await s.pg.relay_all(s)
                await s.take(0)
                (job,) = (await s.claim(0, limit=10, lease=30)).jobs
                await s.ack(job)
                async with conn.transaction():
                    res = await s.schedule("d", "t", b"x", at=P + 5, replace=True, conn=conn)
                assert res.status is ScheduleStatus.DONE
                assert await _waiting(pg_url, ns) == []
            finally:
                await conn.close()

    run(main())


def test_replace_in_a_psycopg_transaction(private_redis: RedisServer, pg_url: str) -> None:
    """The async psycopg 3 driver, and SyncScheduler over sync psycopg 3 (with ``conn=``
    and with a transaction of its own): rollback nothing, commit both stores."""
    import psycopg

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            assert s.pg is not None
            await s.schedule("p", "t", b"old", at=F + 1_000)
            await s.pg.relay_all(s)
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                async with conn.transaction(force_rollback=True):
                    await s.schedule("p", "t", b"new", at=F + 2, replace=True, conn=conn)
                assert await s.pg.relay_all(s) == 0
                async with conn.transaction():
                    await s.schedule("p", "t", b"new", at=F + 2, replace=True, conn=conn)
            assert await s.pg.relay_all(s) == 1
            assert await _row(pg_url, ns, "p") == (0, F + 2, b"new")

            sync = SyncScheduler.from_url(private_redis.url, ns, shards=1, postgres_url=pg_url)
            try:
                with psycopg.connect(pg_url) as sconn:
                    with sconn.transaction(force_rollback=True):
                        res = sync.schedule("p", "t", b"s1", at=F + 3, replace=True, conn=sconn)
                        assert res.status is ScheduleStatus.REPLACED
                    assert await s.pg.relay_all(s) == 0
                    with sconn.transaction():
                        sync.schedule("p", "t", b"s1", at=F + 3, replace=True, conn=sconn)
                assert await s.pg.relay_all(s) == 1
                info = await s.get("p")
                assert info is not None and (info.payload, info.when_ms) == (b"s1", F + 3)
                res = sync.schedule("p", "t", b"s2", at=F + 4, replace=True)  # its own tx
                assert res.status is ScheduleStatus.REPLACED
                assert await s.pg.relay_all(s) == 1
                assert await _row(pg_url, ns, "p") == (0, F + 4, b"s2")
                info = await s.get("p")
                assert info is not None and (info.payload, info.when_ms) == (b"s2", F + 4)
                # The sync cancel supersedes a waiting replacement; its reschedule moves it.
                assert sync.schedule("q", "t", b"", at=F + 5, replace=True).status is (
                    ScheduleStatus.CREATED
                )
                sync.schedule("q2", "t", b"", at=F + 5, replace=True)
                assert await _waiting(pg_url, ns) == ["q", "q2"]
                assert sync.cancel("q") is True  # its replacement: the job to be
                assert sync.reschedule("q2", at=F + 9) is True
                assert await _waiting(pg_url, ns) == ["q2"]
                assert await s.pg.relay_all(s) == 1
                assert await s.get("q") is None
                moved = await s.get("q2")
                assert moved is not None and moved.when_ms == F + 9
            finally:
                sync.close()

    run(main())


def test_a_later_write_wins_over_a_replacement_not_yet_relayed(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A committed replacement not yet applied is superseded by every later write of
    the id: a cancel (own, and ``conn=``), a replace of its own, a later replacement
    (the last committed wins); a reschedule moves it. The relay that comes after
    applies nothing stale."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            assert s.pg is not None
            for i in ("a", "b", "c", "d", "e"):
                await s.schedule(i, "t", b"old", at=F + 1_000)
            await s.pg.relay_all(s)
            conn = await asyncpg.connect(pg_url)
            try:
                async with conn.transaction():
                    for i in ("a", "b", "c", "d", "e"):
                        await s.schedule(i, "t", b"rep", at=F + 2_000, replace=True, conn=conn)
                assert await s.cancel("a") is True  # a cancel of its own
                async with conn.transaction():  # cancel(conn=)
                    assert await s.cancel("b", conn=conn) is True
                # A replace of its own: the replacement is superseded.
                await s.schedule("c", "t", b"own", at=F + 3_000, replace=True)
                async with conn.transaction():  # a later replacement: the last wins
                    await s.schedule("d", "t", b"last", at=F + 4_000, replace=True, conn=conn)
                assert await s.reschedule("e", at=F + 5_000) is True  # moves the replacement
                assert await _waiting(pg_url, ns) == ["d", "e"]
                await s.pg.relay_all(s)
                assert await _waiting(pg_url, ns) == []
            finally:
                await conn.close()
            assert await s.get("a") is None and await _row(pg_url, ns, "a") is None
            assert await s.get("b") is None and await _row(pg_url, ns, "b") is None
            for i, payload, due in (
                ("c", b"own", F + 3_000),
                ("d", b"last", F + 4_000),
                ("e", b"rep", F + 5_000),
            ):
                info = await s.get(i)
                assert info is not None and (info.payload, info.when_ms) == (payload, due)
                assert await _row(pg_url, ns, i) == (0, due, payload)

    run(main())


def test_a_relay_never_applies_under_a_held_id_and_a_leased_job_waits(
    private_redis: RedisServer, pg_url: str
) -> None:
    """Relay order: a replacement whose id another transaction holds (a replace or
    cancel committing) is kept for a later round, not waited for; one whose job is
    leased (running) is kept, and applied once the run ended (acked: the replacement
    is a new job; its occurrence done meanwhile: dropped)."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            assert s.pg is not None
            await s.schedule("h", "t", b"old", at=F + 1_000)
            await s.schedule("l", "t", b"old", at=P + 5)
            await s.schedule("m", "t", b"old", at=P + 6)
            await s.pg.relay_all(s)
            await s.take(0)
            leased = {j.id: j for j in (await s.claim(0, limit=10, lease=30)).jobs}
            assert set(leased) == {"l", "m"}
            conn = await asyncpg.connect(pg_url)
            other = await asyncpg.connect(pg_url)
            try:
                async with conn.transaction():
                    await s.schedule("h", "t", b"new", at=F + 2_000, replace=True, conn=conn)
                    await s.schedule("l", "t", b"next", at=F + 7_000, replace=True, conn=conn)
                    await s.schedule("m", "t", b"same", at=P + 6, replace=True, conn=conn)
                tx = other.transaction()
                await tx.start()
                await other.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || 'h', 0))", ns
                )
                assert await s.pg.relay_all(s) == 0  # h held; l and m leased (BUSY)
                await tx.rollback()
                assert await s.pg.relay_all(s) == 1  # h
                info = await s.get("h")
                assert info is not None and info.payload == b"new"
                assert (await s.get("l")).state is JobState.LEASED  # type: ignore[union-attr]
                await s.ack(leased["l"])
                await s.ack(leased["m"])
                assert await s.pg.relay_all(s) == 2
                assert await _waiting(pg_url, ns) == []
                info = await s.get("l")  # the run ended: the replacement is the job now
                assert info is not None and (info.payload, info.when_ms) == (b"next", F + 7_000)
                assert await _row(pg_url, ns, "l") == (0, F + 7_000, b"next")
                # m's replacement named the occurrence that was run: DONE, dropped.
                assert await _row(pg_url, ns, "m") == (1, P + 6, b"old")
            finally:
                await conn.close()
                await other.close()

    run(main())
