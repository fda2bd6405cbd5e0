"""The batch statements look each job up by its key (migration 0010, ``_writes.py``'s
``LOCKED_ROWS`` and ``DONE_OF``), whatever the planner knows of the tables: on a
namespace of a few thousand rows never analyzed they used to read every index entry of
the namespace per call. Checked by the index entries each call reads (PostgreSQL's
per-transaction counters), not by its time.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from durable_support import run
from pg_support import migrated

from tickwheel.durable import JobSpec
from tickwheel.durable.postgres import _writes
from tickwheel.durable.postgres._rows import encode_pg_job

pytestmark = [pytest.mark.postgres]

_ROWS = 4000  # rows of the namespace before the call (never analyzed)
_BATCH = 50  # ids per call
_READ = "SELECT pg_stat_get_xact_tuples_returned($1::regclass)"


async def _filled(conn: Any, ns: str) -> list[tuple[str, int]]:
    """``_ROWS`` pending jobs, half of them acked (a done row each): (id, due)."""
    jobs = [
        encode_pg_job(JobSpec(f"f{k:05}", "t", b"p", delay=60), 0, 1 << 16) for k in range(_ROWS)
    ]
    got = await _writes.schedule(conn, ns, jobs, False)
    await conn.execute("INSERT INTO tickwheel_shard_epochs VALUES ($1, 0, 1)", ns)
    half = [(j.id, g[1]) for j, g in zip(jobs[::2], got[::2], strict=True)]
    await conn.execute(
        "SELECT tickwheel_ack($1, 0, 1, $2, $3, $4, $5)",
        ns,
        [i for i, _ in half],
        [1] * len(half),
        [d for _, d in half],
        [0] * len(half),
    )
    return [(j.id, g[1]) for j, g in zip(jobs, got, strict=True)]


async def _entries_read(conn: Any, index: str, call: Any) -> int:
    """Index entries of ``index`` that ``call(conn)`` read, in a transaction rolled back."""
    tr = conn.transaction()
    await tr.start()
    try:
        before = await conn.fetchval(_READ, index)
        await call(conn)
        return int(await conn.fetchval(_READ, index)) - int(before)
    finally:
        await tr.rollback()


def test_batch_statements_read_only_their_own_keys(pg_url: str) -> None:
    """A batch of 50 ids reads about 50 entries per lookup, not the namespace's 4,000:
    ``schedule_many``'s statement (new ids and ids it keeps), the claim check, the row
    locks of replace/cancel/reschedule, and the done check. Each also still answers
    as before."""

    async def main() -> None:
        await migrated(pg_url)
        conn = await asyncpg.connect(pg_url)
        try:
            ns = "keyed"
            rows = await _filled(conn, ns)
            known = rows[1 : 2 * _BATCH : 2]  # pending, not done
            done = rows[0 : 2 * _BATCH : 2]  # acked
            new = [encode_pg_job(JobSpec(f"n{k:03}", "t", b"p"), 0, 1 << 16) for k in range(_BATCH)]
            kept = [encode_pg_job(JobSpec(i, "t", b"p", delay=60), 0, 1 << 16) for i, _ in known]
            bound = 4 * _BATCH  # a few lookups per id; the namespace has 4,000 rows

            async def put_new(c: Any) -> None:
                got = await _writes.schedule(c, ns, new, False)
                assert {g[0] for g in got} == {1}  # created

            async def put_kept(c: Any) -> None:
                got = await _writes.schedule(c, ns, kept, False)
                assert {g[0] for g in got} == {2}  # kept

            async def check(c: Any) -> None:
                pairs = known + done
                found_done, gone = await _writes.claim_check(
                    c, ns, 0, 1, ids=[i for i, _ in pairs], nominals=[d for _, d in pairs]
                )
                assert found_done == set(range(len(known), len(pairs))) and gone == set()

            async def lock(c: Any) -> None:
                pending = await _writes.lock(c, ns, [i for i, _ in known + done])
                assert pending == dict(known)

            async def done_of(c: Any) -> None:
                assert await _writes.done_of(c, ns, known + done) == set(done)

            for call in (put_new, put_kept, check, lock):
                assert await _entries_read(conn, "tickwheel_jobs_pkey", call) <= bound, call
            for call in (put_new, check, done_of):
                assert await _entries_read(conn, "tickwheel_done_pkey", call) <= bound, call
        finally:
            await conn.close()

    run(main())
