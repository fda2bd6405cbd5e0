"""The job writes: the SQL a producer and a worker run on the job rows, on a connection.

Each function runs its statements on the connection it is given and returns plain
values; which connection, which transaction and the translation of the driver's errors
are :class:`PgStore`'s (``_pg_store.py``). The writes are calls of the functions the
migrations made (``tickwheel_put``, ``tickwheel_put_many``, ``tickwheel_claim_check``,
``tickwheel_ack``, ``tickwheel_moved``, ``tickwheel_dead``,
``tickwheel_retried``, ``tickwheel_reaped``): one round trip each.

Lock order: every write that locks several job rows takes them in id order (``COLLATE
"C"``), and :func:`lock` takes the ids' advisory locks in the same order, so two
callers never deadlock (migration 0003 says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tickwheel.durable.store import ClaimedRef

from ._rows import PgJob

__all__ = [
    "CANCEL_IN",
    "CANCEL_OUTBOX",
    "CANCEL_ROW",
    "DONE_OF",
    "LOCKED_ROWS",
    "LOCK_IDS",
    "MOVED",
    "NOW",
    "RACED",
    "ack",
    "cancel",
    "cancel_in",
    "claim_check",
    "dead",
    "done_of",
    "lock",
    "moved",
    "now",
    "now_version",
    "overwrite",
    "raced_statement",
    "reaped",
    "retried",
    "schedule",
    "schedule_replies",
    "schedule_statement",
    "skipped",
    "undead",
    "version",
]

# $16: notify the relays at commit (migration 0005): only when they are the indexers.
# Every parameter carries its type, so a driver that sends untyped values (psycopg,
# Django's client-side binding) calls the same function as asyncpg (``_drivers.py``).
_PUT_ARGS = (
    "$16::boolean, $1::text, $2::text, $3::integer, $4::text, $5::bytea, $6::boolean,"
    " $7::integer, $8::integer, $9::bigint, $10::smallint, $11::text, $12::smallint,"
    " $13::integer, $14::bigint, $15::bytea"
)
_SCHEDULE = f"SELECT status, when_ms, seq FROM tickwheel_put({_PUT_ARGS})"
# A batch in one statement: the function per row of the arrays, in their order.
_SCHEDULE_MANY = """
SELECT s.status, s.when_ms, s.seq
FROM unnest($2::text[], $3::integer[], $4::text[], $5::bytea[], $6::boolean[],
            $7::integer[], $8::integer[], $9::bigint[], $10::smallint[], $11::text[],
            $12::smallint[], $13::integer[], $14::bigint[], $15::bytea[])
     WITH ORDINALITY AS u(id, shard, task, payload, json, max, mode, t, rkind, rspec,
                          policy, cap, grace, record, k)
CROSS JOIN LATERAL tickwheel_put($16::boolean, $1::text, u.id, u.shard, u.task, u.payload,
    u.json, u.max, u.mode, u.t, u.rkind, u.rspec, u.policy, u.cap, u.grace, u.record) AS s
ORDER BY u.k
"""
# A batch of distinct ids: one set-based statement (migration 0004). Its number and
# boolean arrays go as text (PostgreSQL's array literal, _numbers): asyncpg's array
# encoder asks each element whether it is an iterable (ABC checks, ~0.4 us each), 9,000
# for these arrays of 1,000 jobs.
_SCHEDULE_DISTINCT = (
    "SELECT status, when_ms, seq FROM tickwheel_put_many($16::boolean, $1::text,"
    " $2::text[], $3::text::integer[], $4::text[], $5::bytea[], $6::text::boolean[],"
    " $7::text::integer[], $8::text::integer[], $9::text::bigint[], $10::text::smallint[],"
    " $11::text[], $12::text::smallint[], $13::text::integer[], $14::text::bigint[],"
    " $15::bytea[])"
)
# The columns of PgJob.args that _SCHEDULE_DISTINCT takes as text: json, max, mode, time,
# rkind, policy, cap and grace.
_NUMBERS = frozenset({2, 3, 4, 5, 6, 8, 9, 10})


def _numbers(values: Sequence[Any]) -> str:
    """PostgreSQL's array literal of ints or bools."""
    return "{" + ",".join(map(str, values)) + "}"


# Prefixed to a schedule statement of the library's own transaction: it also deletes
# outbox rows whose jobs the producer wrote to Redis already (PgStore.relayed_later).
# A data-modifying WITH runs whether or not the query reads it.
# A row a relay holds (it is writing that job to Redis) is skipped: the relay deletes it,
# and the producer never waits on a relay's Redis call.
_FORGET = (
    "WITH forgotten AS (DELETE FROM tickwheel_outbox o WHERE o.seq IN (SELECT f.seq"
    " FROM tickwheel_outbox f WHERE f.ns = $1::text AND f.seq = ANY(${n}::bigint[])"
    " FOR UPDATE SKIP LOCKED)) "
)
# The due of ids kept because a concurrent producer created them mid-statement.
_RACED = "SELECT id, due_ms FROM tickwheel_jobs WHERE ns = $1::text AND id = ANY($2::text[])"
_NOW = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# A new row version (migration 0012): the outbox's sequence, as tickwheel_put takes it.
_VERSION = "SELECT nextval(pg_get_serial_sequence('tickwheel_outbox', 'seq'))"
# What _drivers.py runs through the other drivers (the same text).
NOW, RACED = _NOW, _RACED
# lock(): the ids' advisory locks (transaction-level), then their rows' locks, in id
# order (migration 0003 says why that order).
_LOCK_IDS = (
    "SELECT count(pg_advisory_xact_lock(hashtextextended($1::text || ':' || i, 0)))"
    " FROM unnest($2::text[]) WITH ORDINALITY AS u(i, k)"
)
# Both look each id up by its key (a LATERAL subquery per id, OFFSET 0 so that it is not
# flattened into a join): with `id = ANY(...)` or a join, a table not yet analyzed got
# the whole namespace scanned (migration 0010 says more). The rows are locked in the
# order of the ids given, which lock() sorts.
_LOCKED_ROWS = (
    "SELECT x.id, x.due_ms, x.state FROM unnest($2::text[]) AS u(i), LATERAL (SELECT j.id,"
    " j.due_ms, j.state FROM tickwheel_jobs j WHERE j.ns = $1::text AND j.id = u.i"
    " FOR UPDATE) AS x"
)
_DONE_OF = (
    "SELECT o.id, o.nominal FROM unnest($2::text[], $3::bigint[]) AS o(id, nominal),"
    " LATERAL (SELECT 1 FROM tickwheel_done d WHERE d.ns = $1::text AND d.id = o.id"
    " AND d.nominal_ms = o.nominal OFFSET 0) AS x"
)
# A reschedule: the row at its new occurrence and version (the one its Redis entry took).
_MOVED = (
    "UPDATE tickwheel_jobs SET due_ms = $3::bigint, attempt = 1, run_ms = 0,"
    " version = $4::bigint, updated_at = now()"
    " WHERE ns = $1::text AND id = $2::text AND state = 0"
)
_CANCEL_OUTBOX = "DELETE FROM tickwheel_outbox WHERE ns = $1::text AND id = $2::text"
_CANCEL_ROW = "DELETE FROM tickwheel_jobs WHERE ns = $1::text AND id = $2::text RETURNING state"
# What the synchronous cancel and reschedule run (``_sync_ops.py``): the same texts.
LOCK_IDS, LOCKED_ROWS, DONE_OF, MOVED = _LOCK_IDS, _LOCKED_ROWS, _DONE_OF, _MOVED
CANCEL_OUTBOX, CANCEL_ROW = _CANCEL_OUTBOX, _CANCEL_ROW
_OVERWRITE = """
INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload, max_attempts,
    due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record, version)
SELECT $1, u.* FROM unnest($2::text[], $3::integer[], $4::text[], $5::bytea[],
    $6::boolean[], $7::integer[], $8::bigint[], $9::smallint[], $10::text[],
    $11::smallint[], $12::integer[], $13::bigint[], $14::bytea[], $15::bigint[]) AS u
ON CONFLICT (ns, id) DO UPDATE SET shard = excluded.shard, task = excluded.task,
    payload = excluded.payload, json_payload = excluded.json_payload,
    max_attempts = excluded.max_attempts, due_ms = excluded.due_ms, rkind = excluded.rkind,
    rspec = excluded.rspec, policy = excluded.policy, max_catch_up = excluded.max_catch_up,
    grace_ms = excluded.grace_ms, record = excluded.record, state = 0, attempt = 1,
    run_ms = 0, epoch = 0, updated_at = now(), version = excluded.version
"""

# -- producers ---------------------------------------------------------------------


async def now(conn: Any) -> int:
    """PostgreSQL's clock (ms)."""
    return int((await conn.fetch(_NOW))[0][0])


def schedule_statement(ns: str, jobs: Sequence[PgJob], notify: bool) -> tuple[str, list[Any]]:
    """The one statement that creates ``jobs`` and their outbox rows, and its arguments
    (asyncpg's ``$n`` form; ``_drivers.py`` renders it for the other drivers):
    ``tickwheel_put`` for one job, ``tickwheel_put_many`` for distinct ids, the function
    per row (each copy of an id seeing the ones before it) for a batch that names an id
    twice."""
    if len(jobs) == 1:
        job = jobs[0]
        return _SCHEDULE, [ns, job.id, job.shard, *job.args, notify]
    ids = [job.id for job in jobs]
    columns = list(zip(*(job.args for job in jobs), strict=True))
    shards = [job.shard for job in jobs]
    if len(set(ids)) != len(ids):
        return _SCHEDULE_MANY, [ns, ids, shards, *(list(col) for col in columns), notify]
    args = [_numbers(c) if k in _NUMBERS else list(c) for k, c in enumerate(columns)]
    return _SCHEDULE_DISTINCT, [ns, ids, _numbers(shards), *args, notify]


def raced_statement(ns: str, jobs: Sequence[PgJob], rows: Sequence[Any]) -> list[Any] | None:
    """Arguments of ``RACED`` for the rows kept with no due (when_ms NULL: created by a
    concurrent producer after the statement began; their due is read next), or None."""
    raced = [jobs[k].id for k, r in enumerate(rows) if r[1] is None]
    return [ns, raced] if raced else None


def schedule_replies(
    jobs: Sequence[PgJob], rows: Sequence[Any], found: dict[str, int]
) -> list[tuple[int, int, int]]:
    """Per job, (status, when_ms, outbox seq) from the statement's rows (and the dues
    :func:`raced_statement` read)."""
    return [
        (int(r[0]), int(found.get(jobs[k].id, 0) if r[1] is None else r[1]), int(r[2] or 0))
        for k, r in enumerate(rows)
    ]


async def schedule(
    conn: Any, ns: str, jobs: Sequence[PgJob], notify: bool, forget: Sequence[int] = ()
) -> list[tuple[int, int, int]]:
    """Create jobs and their outbox rows in one statement (:func:`schedule_statement`);
    ``conn`` is asyncpg's, or a driver's behind ``_drivers.py``'s facade. ``forget``:
    outbox rows (seq) of jobs already in Redis, deleted by the same statement."""
    sql, args = schedule_statement(ns, jobs, notify)
    if forget:
        # The seqs are the statement's last parameter, after however many it has.
        sql, args = _FORGET.format(n=len(args) + 1) + sql, [*args, list(forget)]
    rows = await conn.fetch(sql, *args)
    raced = raced_statement(ns, jobs, rows)
    found = {r[0]: int(r[1]) for r in await conn.fetch(_RACED, *raced)} if raced else {}
    return schedule_replies(jobs, rows, found)


async def lock(conn: Any, ns: str, ids: Sequence[str]) -> dict[str, int]:
    """Take the ids' transaction-level advisory locks, then their rows' locks, both in
    id order; return the pending rows' due times by id."""
    order = sorted(set(ids))
    await conn.execute(_LOCK_IDS, ns, order)
    rows = await conn.fetch(_LOCKED_ROWS, ns, order)
    return {r[0]: int(r[1]) for r in rows if r[2] == 0}


async def done_of(
    conn: Any, ns: str, occurrences: Sequence[tuple[str, int]]
) -> set[tuple[str, int]]:
    """The ``(id, nominal)`` pairs whose occurrence has a done row."""
    if not occurrences:
        return set()
    rows = await conn.fetch(_DONE_OF, ns, [i for i, _ in occurrences], [n for _, n in occurrences])
    return {(r[0], int(r[1])) for r in rows}


async def now_version(conn: Any) -> tuple[int, int]:
    """PostgreSQL's clock (ms) and a new row version (:func:`version`), one statement."""
    row = (await conn.fetch(_NOW + ", " + _VERSION.removeprefix("SELECT ")))[0]
    return int(row[0]), int(row[1])


async def version(conn: Any) -> int:
    """A new row version for a replace (migration 0012); taken under the ids' locks, so
    later than the version of every write of them before."""
    return int((await conn.fetch(_VERSION))[0][0])


async def overwrite(conn: Any, ns: str, jobs: Sequence[tuple[PgJob, int]]) -> None:
    """Upsert ``(job, due)`` rows as pending at attempt 1, at their jobs' versions, in id
    order."""
    if not jobs:
        return
    jobs = sorted(jobs, key=lambda item: item[0].id)  # rows locked in id order
    columns = list(zip(*(job.args for job, _ in jobs), strict=True))
    await conn.execute(
        _OVERWRITE,
        ns,
        [job.id for job, _ in jobs],
        [job.shard for job, _ in jobs],
        list(columns[0]),  # task
        list(columns[1]),  # payload
        list(columns[2]),  # json
        list(columns[3]),  # max attempts
        [due for _, due in jobs],
        *(list(col) for col in columns[6:]),  # rkind .. record
        [job.version for job, _ in jobs],
    )


async def moved(conn: Any, ns: str, job_id: str, due_ms: int, version: int) -> None:
    """Move a pending row to the occurrence ``due_ms`` at attempt 1, at ``version``."""
    await conn.execute(_MOVED, ns, job_id, due_ms, version)


async def cancel(conn: Any, ns: str, job_id: str) -> bool:
    """Delete a job's outbox rows and its row; True if the row was pending."""
    await conn.execute(_CANCEL_OUTBOX, ns, job_id)
    state = await conn.fetchval(_CANCEL_ROW, ns, job_id)
    return bool(state == 0)


# cancel_in(): after the id's lock, in one statement: the outbox rows and the row
# deleted, a cancel mark left for the relays (due_ms -1: the Redis removal, after the
# commit), the relays notified at the commit.
_CANCEL_IN = """
WITH o AS (DELETE FROM tickwheel_outbox WHERE ns = $1::text AND id = $2::text RETURNING 1),
     r AS (DELETE FROM tickwheel_jobs WHERE ns = $1::text AND id = $2::text RETURNING state),
     m AS (INSERT INTO tickwheel_outbox (ns, id, due_ms) VALUES ($1::text, $2::text, -1)
           RETURNING 1)
SELECT (SELECT state FROM r), (SELECT count(*) FROM m), (SELECT count(*) FROM o)
FROM (SELECT pg_notify('tickwheel_outbox', $1::text)) AS n
"""
CANCEL_IN = _CANCEL_IN  # and SyncScheduler's cancel(conn=) (``_sync_ops.py``)


async def cancel_in(conn: Any, ns: str, job_id: str) -> bool:
    """``cancel(conn=)``: in the caller's transaction, hold the id (its advisory lock,
    as replace and cancel take it), delete its row and outbox rows, and leave a cancel
    mark that the relays turn into the Redis removal once the transaction commits (a
    rollback leaves both stores as they were). ``conn`` is asyncpg's, or a driver's
    behind ``_drivers.py``'s facade. True if the row was pending."""
    await conn.fetch(_LOCK_IDS, ns, [job_id])
    rows = await conn.fetch(_CANCEL_IN, ns, job_id)
    return bool(rows and rows[0][0] == 0)


# -- workers -----------------------------------------------------------------------


async def claim_check(
    conn: Any,
    ns: str,
    shard: int,
    epoch: int,
    *,
    ids: Sequence[str],
    nominals: Sequence[int],
    cols: Sequence[Sequence[int]] = (),
) -> tuple[set[int], set[int]]:
    """``tickwheel_claim_check``: the 0-based positions done already, and gone (no row;
    given ``cols``, the entries' versions, migration 0012, a row of a newer version;
    and their attempts, 0013, a row dead or done, or at a later occurrence or a higher
    attempt)."""
    args = [ns, shard, epoch, list(ids), list(nominals)]
    versions, attempts = (*cols, (), ())[:2]
    if attempts:  # 0013: every entry compared with its row's state
        args += [list(versions) or [0] * len(ids), list(attempts)]
    elif any(versions):  # entries of the previous release's writers have none
        args.append(list(versions))
    places = ", ".join(f"${n}" for n in range(1, len(args) + 1))
    rows = await conn.fetch(f"SELECT pos, gone FROM tickwheel_claim_check({places})", *args)
    done = {int(r[0]) - 1 for r in rows if not r[1]}
    gone = {int(r[0]) - 1 for r in rows if r[1]}
    return done, gone


async def ack(conn: Any, ns: str, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[int]:
    """``tickwheel_ack`` over ``refs`` in id order; the codes in the order of ``refs``."""
    # In id order: the function locks each id as lock() does (see 0003).
    order = sorted(range(len(refs)), key=lambda k: (refs[k].id, refs[k].nominal_ms))
    ordered = [refs[k] for k in order]
    reply = await conn.fetchval(
        "SELECT tickwheel_ack($1, $2, $3, $4, $5, $6, $7)",
        ns,
        shard,
        epoch,
        [r.id for r in ordered],
        [r.attempt for r in ordered],
        [r.nominal_ms for r in ordered],
        [r.time_ms for r in ordered],
    )
    out = [0] * len(refs)
    for k, v in zip(order, reply, strict=True):
        out[k] = int(v)
    return out


async def skipped(
    conn: Any, ns: str, shard: int, epoch: int, moves: Sequence[tuple[str, int, int]]
) -> None:
    """``tickwheel_moved`` over ``(id, from, to)`` moves, in id order."""
    ordered = sorted(moves)  # in id order: locked as lock() locks
    await conn.execute(
        "SELECT tickwheel_moved($1, $2, $3, $4, $5, $6)",
        ns,
        shard,
        epoch,
        [m[0] for m in ordered],
        [m[1] for m in ordered],
        [m[2] for m in ordered],
    )


async def dead(
    conn: Any, ns: str, shard: int, epoch: int, *, job_id: str, attempt: int, nominal_ms: int
) -> None:
    """``tickwheel_dead``: the job's last attempt of ``nominal_ms`` failed."""
    await conn.execute(
        "SELECT tickwheel_dead($1, $2, $3, $4, $5, $6)",
        ns,
        shard,
        epoch,
        job_id,
        attempt,
        nominal_ms,
    )


async def retried(
    conn: Any,
    ns: str,
    shard: int,
    epoch: int,
    *,
    job_id: str,
    nominal_ms: int,
    attempt: int,
    run_ms: int,
) -> None:
    """``tickwheel_retried``: occurrence ``nominal_ms`` runs next at ``run_ms``."""
    await conn.execute(
        "SELECT tickwheel_retried($1, $2, $3, $4, $5, $6, $7)",
        ns,
        shard,
        epoch,
        job_id,
        nominal_ms,
        attempt,
        run_ms,
    )


async def reaped(
    conn: Any,
    ns: str,
    shard: int,
    epoch: int,
    *,
    plan: Sequence[tuple[str, int, int, bool]],
    run_ms: int,
) -> None:
    """``tickwheel_reaped`` over ``(id, nominal, attempt, dead)`` leases, in id order: what
    a reap is about to do (returned to due at ``run_ms`` as ``attempt``, or dead)."""
    ordered = sorted(plan)  # in id order: locked as lock() locks
    await conn.execute(
        "SELECT tickwheel_reaped($1, $2, $3, $4, $5, $6, $7, $8)",
        ns,
        shard,
        epoch,
        [p[0] for p in ordered],
        [p[1] for p in ordered],
        [p[2] for p in ordered],
        [p[3] for p in ordered],
        run_ms,
    )


# The ids' dead rows, locked in id order (as lock() locks), made pending at attempt 1
# (with an outbox row each: the relays write back a job Redis no longer holds; one it
# holds is kept as it is) or deleted; then the ids Redis is to requeue or purge: the
# rows changed, and those a requeue or purge that died between the stores left behind
# (pending ones for a requeue, ids without a row for a purge). One statement (one
# snapshot: a row changed here is not seen again by the second half).
_UNDEAD_LOCK = (
    "SELECT id FROM tickwheel_jobs WHERE ns = $1 AND state = 2 AND id = ANY($2::text[])"
    ' ORDER BY id COLLATE "C" FOR UPDATE'
)
_REQUEUE = f"""
WITH c AS (UPDATE tickwheel_jobs SET state = 0, attempt = 1, run_ms = 0, epoch = 0,
           updated_at = now()
           WHERE ns = $1 AND id IN ({_UNDEAD_LOCK}) RETURNING id, due_ms),
     o AS (INSERT INTO tickwheel_outbox (ns, id, due_ms) SELECT $1, id, due_ms FROM c)
SELECT id, true FROM c
UNION ALL
SELECT id, false FROM tickwheel_jobs WHERE ns = $1 AND state = 0 AND id = ANY($2::text[])
"""
_PURGE = f"""
WITH c AS (DELETE FROM tickwheel_jobs WHERE ns = $1 AND id IN ({_UNDEAD_LOCK}) RETURNING id)
SELECT id, true FROM c
UNION ALL
SELECT u.i, false FROM unnest($2::text[]) AS u(i)
WHERE NOT EXISTS (SELECT 1 FROM tickwheel_jobs j WHERE j.ns = $1 AND j.id = u.i)
"""


async def undead(
    conn: Any, ns: str, ids: Sequence[str], purge: bool
) -> tuple[list[str], list[str]]:
    """Dead rows of ``ids`` deleted (``purge``) or made pending again at attempt 1.

    Returns:
        The ids whose rows changed, and the ids Redis is to act on (those, and the
        ones an earlier call that died before Redis left to it).
    """
    got = await conn.fetch(_PURGE if purge else _REQUEUE, ns, list(ids))
    changed = [r[0] for r in got if r[1]]
    return changed, [r[0] for r in got]
