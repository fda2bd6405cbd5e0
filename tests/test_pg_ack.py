"""``tickwheel_ack`` as set statements (migration 0011): the same codes and rows as
0003's loop, an ack that waits for a row acts on the row's last version, and rows
written before the migration are acked (and stay acked after a Redis loss). Real
redis-server and PostgreSQL processes."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from durable_support import client_of, push_clock, run
from pg_support import migrated_to, pg_scheduler, rows

from tickwheel.durable import JobSpec, Recurrence
from tickwheel.durable.postgres import _writes, migrate, migrations
from tickwheel.durable.postgres._rows import encode_pg_job
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

_ACK = "SELECT tickwheel_ack($1, 0, $2, $3, $4, $5, $6)"
_ROW = "SELECT state, attempt, due_ms, epoch FROM tickwheel_jobs WHERE ns = $1 AND id = $2"
_PUT = """INSERT INTO tickwheel_jobs (ns, id, shard, task, payload, json_payload,
    max_attempts, due_ms, rkind, rspec, record)
    VALUES ($1, $2, 0, 't', '\\x00', false, 3, $3, $4, $5, '\\x00')"""


async def _row(conn: Any, ns: str, job_id: str) -> tuple[int, ...] | None:
    got = await conn.fetchrow(_ROW, ns, job_id)
    return None if got is None else tuple(int(v) for v in got)


async def _done(conn: Any, ns: str) -> set[tuple[str, int, int, int]]:
    got = await conn.fetch(
        "SELECT id, nominal_ms, epoch, attempt FROM tickwheel_done WHERE ns = $1", ns
    )
    return {(r[0], int(r[1]), int(r[2]), int(r[3])) for r in got}


async def _ack(conn: Any, ns: str, epoch: int, refs: list[tuple[str, int, int, int]]) -> list[int]:
    """``tickwheel_ack`` of (id, attempt, nominal, next) refs."""
    got = await conn.fetchval(
        _ACK,
        ns,
        epoch,
        [r[0] for r in refs],
        [r[1] for r in refs],
        [r[2] for r in refs],
        [r[3] for r in refs],
    )
    return [int(v) for v in got]


def test_codes_and_rows_per_job(pg_url: str) -> None:
    """One batch with each outcome: acked (1), acked and moved on (2), done already (3),
    acked while the row is at another occurrence or has none (4). Then the same batch
    again (all 3), a batch naming an id twice (0003's loop: the second occurrence sees
    the first one's move), an empty batch, and a stale epoch (nothing written)."""

    async def main() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await migrated_to(conn, 99)
            ns = "n"
            await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 7)", ns)
            await conn.execute(_PUT, ns, "a", 1000, 0, "")
            await conn.execute(_PUT, ns, "b", 2000, 1, "1000")
            await conn.execute(_PUT, ns, "c", 1000, 0, "")
            await conn.execute(
                "INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt)"
                " VALUES ($1, 'c', 1000, 3, 1)",
                ns,
            )
            await conn.execute(_PUT, ns, "d", 5000, 0, "")
            batch = [("a", 2, 1000, 0), ("b", 1, 2000, 3000), ("c", 1, 1000, 0)]
            batch += [("d", 1, 4000, 0), ("e", 1, 1000, 0)]
            assert await _ack(conn, ns, 7, batch) == [1, 2, 3, 4, 4]
            assert await _row(conn, ns, "a") == (1, 2, 1000, 7)
            assert await _row(conn, ns, "b") == (0, 1, 3000, 7)
            assert await _row(conn, ns, "c") == (0, 1, 1000, 0)
            assert await _row(conn, ns, "d") == (0, 1, 5000, 0)
            assert await _row(conn, ns, "e") is None
            assert await _done(conn, ns) == {
                ("a", 1000, 7, 2),
                ("b", 2000, 7, 1),
                ("c", 1000, 3, 1),
                ("d", 4000, 7, 1),
                ("e", 1000, 7, 1),
            }
            assert await _ack(conn, ns, 7, batch) == [3, 3, 3, 3, 3]
            twice = [("b", 1, 3000, 4000), ("b", 1, 4000, 5000), ("d", 1, 5000, 0)]
            assert await _ack(conn, ns, 7, twice) == [2, 2, 1]
            assert await _row(conn, ns, "b") == (0, 1, 5000, 7)
            assert await _row(conn, ns, "d") == (1, 1, 5000, 7)
            assert await _ack(conn, ns, 7, []) == []
            before = await _done(conn, ns)
            with pytest.raises(asyncpg.PostgresError) as info:
                await _ack(conn, ns, 6, [("f", 1, 1000, 0)])
            assert info.value.sqlstate == "TWFEN"
            assert await _done(conn, ns) == before
        finally:
            await conn.close()

    run(main())


@pytest.mark.parametrize("moved", [False, True])
def test_an_ack_that_waits_for_the_row_acts_on_its_last_version(pg_url: str, moved: bool) -> None:
    """Another transaction holds the job's row (as a retry's or a reaper's write does,
    under the id's shared advisory lock) and commits a new version while the ack waits
    for it. The ack then completes that version (its attempt 2 written over), or, if the
    new version moved to another occurrence, leaves it as it is (4): it never acts on
    the version it first saw, and never leaves a current row pending beside its done
    row."""

    async def main() -> None:
        conn = await asyncpg.connect(pg_url)
        other = await asyncpg.connect(pg_url)
        try:
            await migrated_to(conn, 99)
            ns = "w"
            await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 1)", ns)
            await conn.execute(_PUT, ns, "a", 1000, 0, "")
            await conn.execute(_PUT, ns, "z", 1000, 0, "")
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            tr = other.transaction()
            await tr.start()
            due = 9000 if moved else 1000
            await other.execute(
                "UPDATE tickwheel_jobs SET attempt = 2, due_ms = $3 WHERE ns = $1 AND id = $2",
                ns,
                "z",
                due,
            )
            acking = asyncio.ensure_future(
                _ack(conn, ns, 1, [("a", 1, 1000, 0), ("z", 3, 1000, 0)])
            )
            for _ in range(500):  # until the ack waits for the row's lock
                waiting = await other.fetchval(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
                )
                if waiting == "Lock":
                    break
                await asyncio.sleep(0.01)
            assert waiting == "Lock" and not acking.done()
            await tr.commit()
            assert await asyncio.wait_for(acking, 10) == [1, 4 if moved else 1]
            assert await _row(conn, ns, "a") == (1, 1, 1000, 1)
            if moved:
                assert await _row(conn, ns, "z") == (0, 2, 9000, 0)
            else:
                assert await _row(conn, ns, "z") == (1, 3, 1000, 1)
            assert {d[:2] for d in await _done(conn, ns)} == {("a", 1000), ("z", 1000)}
        finally:
            await other.close()
            await conn.close()

    run(main())


def test_rows_written_before_0011_are_acked(private_redis: RedisServer, pg_url: str) -> None:
    """A database at 0010 with jobs in it (one acked there already by 0003's function):
    migrated to 0011, its pending jobs are restored, run and acked by the new function,
    the recurring one moves on, and after a Redis loss and a reconcile nothing acked
    comes back."""

    async def main() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await migrated_to(conn, 10)
            assert await conn.fetchval("SELECT max(version) FROM tickwheel_schema_version") == 10
            async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
                ns = s.keys.namespace
                specs = [JobSpec(f"o{k}", "t", b"p", delay=0) for k in range(5)]
                specs.append(JobSpec("r", "t", b"p", delay=0, recurrence=Recurrence.interval(60)))
                got = await _writes.schedule(
                    conn, ns, [encode_pg_job(j, 0, 1 << 16) for j in specs], False
                )
                assert [g[0] for g in got] == [1] * 6
                due = {j.id: g[1] for j, g in zip(specs, got, strict=True)}
                await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 0)", ns)
                assert await _ack(conn, ns, 0, [("o0", 1, due["o0"], 0)]) == [1]
                assert await migrate(conn) == [m.version for m in migrations() if m.version > 10]
                assert (await s.reconcile()).restored == 5
                await s.take(0)
                batch = await s.claim(0, limit=100)
                assert sorted(j.id for j in batch.jobs) == ["o1", "o2", "o3", "o4", "r"]
                await s.ack_many(batch.jobs)
                epoch = await conn.fetchval(
                    "SELECT epoch FROM tickwheel_shard_epochs WHERE ns = $1 AND shard = 0", ns
                )
                assert epoch > 0
                for k in range(1, 5):
                    assert await _row(conn, ns, f"o{k}") == (1, 1, due[f"o{k}"], epoch)
                assert await _row(conn, ns, "r") == (0, 1, due["r"] + 60_000, epoch)
                done = {d[:2] for d in await _done(conn, ns)}
                assert done == {(i, due[i]) for i in due}
                await client_of(s).flushall()
                assert (await s.reconcile()).restored == 1  # the recurring job's next one
                await push_clock(s, 0, 10_000)
                await s.take(0)
                assert not (await s.claim(0, limit=100)).jobs
        finally:
            await conn.close()

    run(main())


def test_a_large_batch_is_one_set(pg_url: str) -> None:
    """1,000 ids in one call (the worker's largest batch): every code right, and the
    job rows read by key, not by a scan of the namespace per id (index entries read, as
    tests/test_pg_keyed.py counts them)."""

    async def main() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await migrated_to(conn, 99)
            ns = "big"
            await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 1)", ns)
            await conn.execute(
                "INSERT INTO tickwheel_jobs (ns, id, shard, task, payload, json_payload,"
                " max_attempts, due_ms, record) SELECT $1, 'j' || lpad(g::text, 5, '0'), 0,"
                " 't', '\\x00', false, 3, 1000, '\\x00' FROM generate_series(1, 4000) g",
                ns,
            )
            ids = [f"j{k:05}" for k in range(1, 1001)]
            refs = [(i, 1, 1000 if k % 2 else 2000, 0) for k, i in enumerate(ids)]
            read = "SELECT pg_stat_get_xact_tuples_returned('tickwheel_jobs_pkey'::regclass)"
            tr = conn.transaction()
            await tr.start()
            before = int(await conn.fetchval(read))
            codes = await _ack(conn, ns, 1, refs)
            entries = int(await conn.fetchval(read)) - before
            await tr.commit()
            assert codes == [1 if k % 2 else 4 for k in range(1000)]
            assert entries <= 2 * len(ids), entries
            (n,) = await rows(pg_url, "SELECT count(*) FROM tickwheel_jobs WHERE state = 1")
            assert n[0] == 500
        finally:
            await conn.close()

    run(main())
