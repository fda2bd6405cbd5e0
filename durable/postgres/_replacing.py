"""``schedule(..., replace=True, conn=)``: a replace in the application's transaction.

Only Redis knows whether a job is leased, and only at the moment it is asked, which is
after the application's commit. So the transaction writes the replacement beside the
job (``tickwheel_replacing``, migration 0009, one row per id with a generation) and
leaves the job row alone; after the commit a relay applies it as the asyncio mode's
own replace does: in a transaction holding the id, Redis decides (``schedule.lua`` with
``replace`` on), and the row follows before the commit. A rollback leaves nothing.

Generations: the relay applies a replacement only under the id's advisory lock (taken
without waiting) and deletes exactly the generation it read. Every later write of the
id deletes the id's replacement in its own transaction (:data:`DROP`: a replace of its
own, a cancel, ``cancel(conn=)``) or moves it (:data:`MOVE`: a reschedule), so a late
relay never overtakes a later write.

A replacement whose job is leased (BUSY) is kept and tried again at the next relay
round: it takes effect once that run has ended. One whose occurrence PostgreSQL has
done by then is dropped (a replace of a done occurrence is DONE).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tickwheel.durable.model import (
    JobSpec,
    RedisUnavailable,
    ScheduleResult,
    ScheduleStatus,
)
from tickwheel.durable.store import Keys, Store

from . import _writes
from ._enqueue import STATUS, encode_jobs, needs_now, sorted_by_id
from ._relay import marks
from ._rows import PgJob, redis_job

if TYPE_CHECKING:
    from ._drivers import SyncDb
    from ._pg_store import PgStore
    from ._sync_pool import SyncPgPool

__all__ = [
    "DROP",
    "MOVE",
    "REPLACE_IN",
    "apply",
    "apply_all",
    "replace_in",
    "replace_in_sync",
    "replace_sync",
]

# tickwheel_replace_in's status codes: 1 created, 3 replaced, 5 done (schedule.lua's).
_STATUS = {**STATUS, 3: ScheduleStatus.REPLACED}
REPLACE_IN = (
    "SELECT status, when_ms, gen FROM tickwheel_replace_in($1::text, $2::text, $3::integer,"
    " $4::text, $5::bytea, $6::boolean, $7::integer, $8::integer, $9::bigint, $10::smallint,"
    " $11::text, $12::smallint, $13::integer, $14::bigint, $15::bytea)"
)
# A later write of the ids supersedes their replacements (in its own transaction).
# A statement with rows, so every driver's fetch takes it.
DROP = (
    "WITH d AS (DELETE FROM tickwheel_replacing WHERE ns = $1::text AND id = ANY($2::text[])"
    " RETURNING 1) SELECT count(*) FROM d"
)
# A reschedule of an id with a replacement moves the replacement (mode 1: a delay on
# PostgreSQL's clock), under a new generation. One row: whether there was one, and if
# not, the job's new row version (the outbox's sequence, as _writes.version takes it;
# the caller holds the row's lock), which the job's Redis entry and row then carry.
MOVE = (
    "WITH m AS (UPDATE tickwheel_replacing SET gen = nextval('tickwheel_replacing_gen'),"
    " due_ms = CASE WHEN $3::integer = 1"
    " THEN floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + $4::bigint"
    " ELSE $4::bigint END WHERE ns = $1::text AND id = $2::text RETURNING due_ms)"
    " SELECT c.n > 0, CASE WHEN c.n = 0 THEN"
    " nextval(pg_get_serial_sequence('tickwheel_outbox', 'seq')) END"
    " FROM (SELECT count(*) AS n FROM m) AS c"
)
# Oldest generation first, skipping rows another relay holds.
_TAKE = """
SELECT id, gen, shard, task, payload, json_payload, max_attempts, due_ms, rkind, rspec,
       policy, max_catch_up, grace_ms, record
FROM tickwheel_replacing WHERE ns = $1 ORDER BY gen LIMIT $2 FOR UPDATE SKIP LOCKED
"""
_FORGET = (
    "DELETE FROM tickwheel_replacing r USING unnest($2::text[], $3::bigint[]) AS u(id, gen)"
    " WHERE r.ns = $1 AND r.id = u.id AND r.gen = u.gen"
)
# What the relay applies: the outcomes that wrote the job, and those that end the
# replacement unwritten (its occurrence done). BUSY keeps it.
_WRITTEN = (ScheduleStatus.CREATED, ScheduleStatus.REPLACED)


class _Facade(Protocol):
    async def fetch(self, sql: str, *args: Any) -> list[Any]: ...


class RedisSide(Protocol):
    """What applying a replacement uses of a scheduler (``_mode.RedisSide``'s part)."""

    @property
    def store(self) -> Store: ...

    @property
    def keys(self) -> Keys: ...


def _replies(jobs: Sequence[PgJob], rows: Sequence[Sequence[Any]]) -> list[ScheduleResult]:
    return [
        ScheduleResult(job.id, _STATUS[int(r[0])], int(r[1]))
        for job, r in zip(jobs, rows, strict=True)
    ]


async def replace_in(
    conn: _Facade, ns: str, specs: Sequence[JobSpec], shard_of: Any, limit: int
) -> list[ScheduleResult]:
    """Write the replacements of ``specs`` in the caller's transaction (``conn``:
    asyncpg's, or a driver's facade), one statement per job in id order (the advisory
    locks are taken in that order); results in the order of ``specs``.

    Raises:
        TypeError, ValueError: for bad specs (nothing written).
    """
    jobs = encode_jobs(specs, shard_of, limit, None)
    if needs_now(specs):
        now = int((await conn.fetch(_writes.NOW))[0][0])
        jobs = encode_jobs(specs, shard_of, limit, now)
    out: list[ScheduleResult | None] = [None] * len(jobs)
    for k in sorted_by_id(jobs):
        job = jobs[k]
        rows = await conn.fetch(REPLACE_IN, ns, job.id, job.shard, *job.args)
        out[k] = _replies([job], rows)[0]
    return [r for r in out if r is not None]


def replace_in_sync(
    db: SyncDb, ns: str, specs: Sequence[JobSpec], shard_of: Any, limit: int
) -> list[ScheduleResult]:
    """:func:`replace_in` on a synchronous connection (``_drivers.SyncDb``)."""
    jobs = encode_jobs(specs, shard_of, limit, None)
    if needs_now(specs):
        jobs = encode_jobs(specs, shard_of, limit, int(db.fetch(_writes.NOW)[0][0]))
    out: list[ScheduleResult | None] = [None] * len(jobs)
    for k in sorted_by_id(jobs):
        job = jobs[k]
        out[k] = _replies([job], db.fetch(REPLACE_IN, ns, job.id, job.shard, *job.args))[0]
    return [r for r in out if r is not None]


def _job(r: Any) -> tuple[PgJob, int, int]:
    """(job, due, generation) of a replacement row."""
    due = int(r["due_ms"])
    args = (
        r["task"],
        bytes(r["payload"]),
        bool(r["json_payload"]),
        int(r["max_attempts"]),
        0,
        due,
        int(r["rkind"]),
        r["rspec"],
        int(r["policy"]),
        int(r["max_catch_up"]),
        int(r["grace_ms"]),
        bytes(r["record"]),
    )
    return PgJob(r["id"], int(r["shard"]), args, bytes(r["record"])), due, int(r["gen"])


async def apply(store: PgStore, sched: RedisSide, limit: int = 500) -> tuple[int, int]:
    """Apply up to ``limit`` committed replacements: (handled, kept). Handled ones were
    written to both stores, or dropped (their occurrence done); kept ones wait for a
    later round (their job leased, or their id held by another transaction).

    Raises:
        RedisUnavailable: after committing what Redis accepted before it failed.
        PostgresUnavailable: nothing applied in PostgreSQL (a Redis replace made
            before the failure is made again by the next round: it is idempotent).
    """
    ns = store.namespace
    failure: RedisUnavailable | None = None
    async with store.transaction() as c:
        taken = [_job(r) for r in await c.fetch(_TAKE, ns, limit)]
        if not taken:
            return 0, 0
        locked, _ = await marks(c, ns, [job.id for job, _, _ in taken])
        held = [t for t in taken if t[0].id in locked]
        await _writes.lock(c, ns, [job.id for job, _, _ in held])  # row locks, id order
        done = await _writes.done_of(c, ns, [(job.id, due) for job, due, _ in held])
        ver = await _writes.version(c) if held else 0  # under the ids' locks (0012)
        held = [(dataclasses.replace(job, version=ver), due, gen) for job, due, gen in held]
        ended: list[tuple[PgJob, int, int]] = [t for t in held if (t[0].id, t[1]) in done]
        written: list[tuple[PgJob, int, int]] = []
        groups: dict[int, list[tuple[PgJob, int, int]]] = {}
        for t in held:
            if (t[0].id, t[1]) not in done:
                groups.setdefault(sched.keys.shard_of(t[0].id), []).append(t)
        try:
            for shard, items in groups.items():
                encoded = [redis_job(job.id, due, job.record, ver) for job, due, _ in items]
                replies = await sched.store.schedule(shard, encoded, True)
                for t, reply in zip(items, replies, strict=True):
                    if reply.status in _WRITTEN:
                        written.append(t)
                    elif reply.status is ScheduleStatus.DONE:
                        ended.append(t)
        except RedisUnavailable as exc:
            failure = exc  # commit what Redis accepted, then raise
        await _writes.overwrite(c, ns, [(job, due) for job, due, _ in written])
        gone = written + ended
        if gone:
            await c.execute(
                _FORGET, ns, [job.id for job, _, _ in gone], [gen for _, _, gen in gone]
            )
    if failure is not None:
        raise failure
    return len(gone), len(taken) - len(gone)


async def apply_all(store: PgStore, sched: RedisSide) -> int:
    """:func:`apply` until a round handles nothing; the replacements handled."""
    total = 0
    while True:
        handled, _ = await apply(store, sched)
        if not handled:
            return total
        total += handled


def replace_sync(
    conn: Any,
    pool: SyncPgPool,
    ns: str,
    specs: Sequence[JobSpec],
    *,
    shard_of: Any,
    limit: int,
    before_write: Callable[[], object] = lambda: None,
) -> list[ScheduleResult]:
    """``SyncScheduler.schedule(..., replace=True)`` in the Postgres mode: the
    replacements in ``conn``'s transaction, or with ``conn`` None in a transaction of
    its own on ``pool``; either way a relay applies them after the commit (a leased job
    is replaced once its run has ended).

    Raises:
        TypeError, ValueError: for bad specs or a bad ``conn`` (nothing written).
        SchemaNotReady, PostgresUnavailable: as :func:`_drivers.enqueue_sync`.
    """
    from ._drivers import sync_connection  # noqa: PLC0415

    encode_jobs(specs, shard_of, limit, None)  # bad specs raise before conn is used
    if conn is not None:
        db = sync_connection(conn)
        pool.check_schema(db)
        before_write()
        return replace_in_sync(db, ns, specs, shard_of, limit)
    before_write()
    with pool.transaction() as own:
        return replace_in_sync(own, ns, specs, shard_of, limit)
