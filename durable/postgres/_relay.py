"""What goes from PostgreSQL to Redis: the outbox the relay empties, and reconcile's reads.

Like ``_writes.py``, each function runs its SQL on the connection it is given;
:class:`PgStore` (``_pg_store.py``) picks the connection and the transaction. The rows come
back in the schedule.lua form (``_rows.py``), ready for the Redis store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import PostgresUnavailable, RedisUnavailable

from ._rows import OutboxRow, PendingRow, redis_job, retried_job

if TYPE_CHECKING:
    from ._pg_store import PgStore

__all__ = [
    "delete_outbox",
    "listen",
    "marks",
    "pending",
    "reindex",
    "relay_loop",
    "relayed",
    "shard_epochs",
    "take_outbox",
]

logger = logging.getLogger("tickwheel.durable")

# Oldest first, skipping rows another relay holds; ``live``: the job is still pending at
# the outbox row's due (else there is nothing to write: gone, or moved on since);
# ``mark``: a cancel mark (due -1, ``cancel(conn=)``), resolved by :func:`marks`. A
# retried row (run_ms set) is written from its columns, as reconcile writes it: at its
# attempt and run time (0013: so that its entry is not behind the row at its claim).
_TAKE_OUTBOX = """
SELECT o.seq, o.id, o.due_ms, j.shard, j.record,
       coalesce(j.state = 0 AND j.due_ms = o.due_ms, false) AS live, o.due_ms < 0 AS mark,
       j.version, j.run_ms, j.attempt, j.task,
       CASE WHEN j.run_ms <> 0 THEN j.payload END AS payload, j.json_payload,
       j.max_attempts, j.rkind, j.rspec, j.policy, j.max_catch_up, j.grace_ms
FROM (SELECT seq, id, due_ms FROM tickwheel_outbox
      WHERE ns = $1 ORDER BY seq LIMIT $2
      FOR UPDATE SKIP LOCKED) o
LEFT JOIN tickwheel_jobs j ON j.ns = $1 AND j.id = o.id
ORDER BY o.seq
"""
# A page in (due, id) order: the partial index on pending rows serves it.
_PENDING = """
SELECT id, shard, due_ms, record, run_ms, attempt, task, payload,
       json_payload, max_attempts, rkind, rspec, policy, max_catch_up,
       grace_ms, version
FROM tickwheel_jobs
WHERE ns = $1 AND state = 0 AND (due_ms, id) > ($2, $3)
ORDER BY due_ms, id LIMIT $4
"""


async def take_outbox(conn: Any, ns: str, limit: int) -> list[OutboxRow]:
    """Lock up to ``limit`` outbox rows (in the caller's transaction) and read them."""
    rows = await conn.fetch(_TAKE_OUTBOX, ns, limit)
    return [
        OutboxRow(
            int(r[0]),
            None
            if not r[5]
            else retried_job(r)
            if r[8]
            else redis_job(r[1], int(r[2]), bytes(r[4]), int(r[7])),
            int(r[3]) if r[3] is not None else -1,
            r[1] if r[6] else "",
        )
        for r in rows
    ]


_TRY_IDS = (
    "SELECT u.id FROM unnest($2::text[]) AS u(id)"
    " WHERE pg_try_advisory_xact_lock(hashtextextended($1 || ':' || u.id, 0))"
)
_GONE = (
    "SELECT u.id FROM unnest($2::text[]) AS u(id) WHERE NOT EXISTS"
    " (SELECT 1 FROM tickwheel_jobs j WHERE j.ns = $1 AND j.id = u.id)"
)


async def marks(conn: Any, ns: str, ids: Sequence[str]) -> tuple[set[str], set[str]]:
    """Resolve cancel marks in the relay's transaction: the ids whose advisory lock was
    free (taken, without waiting: a replace, cancel or application transaction holding
    one is never waited for, its mark is kept for a later round), and of those the ids
    with no row, read after the lock (a statement of its own): to remove from Redis."""
    locked = {r[0] for r in await conn.fetch(_TRY_IDS, ns, sorted(set(ids)))}
    gone = {r[0] for r in await conn.fetch(_GONE, ns, sorted(locked))} if locked else set()
    return locked, gone


async def delete_outbox(conn: Any, seqs: Sequence[int]) -> None:
    """Delete the outbox rows :func:`take_outbox` locked."""
    await conn.execute("DELETE FROM tickwheel_outbox WHERE seq = ANY($1::bigint[])", seqs)


async def relayed(conn: Any, ns: str, seqs: Sequence[int]) -> None:
    """``tickwheel_relayed``: delete outbox rows whose jobs are in Redis already."""
    await conn.execute("SELECT tickwheel_relayed($1, $2::bigint[])", ns, seqs)


async def pending(
    conn: Any, ns: str, after: tuple[int, str] | None, limit: int
) -> list[PendingRow]:
    """A page of pending jobs in (due, id) order, after ``after``."""
    due, last = after if after is not None else (-(2**63), "")
    rows = await conn.fetch(_PENDING, ns, due, last, limit)
    return [
        PendingRow(
            int(r[1]),
            int(r[2]),
            redis_job(r[0], int(r[2]), bytes(r[3]), int(r[15])) if not r[4] else retried_job(r),
        )
        for r in rows
    ]


# An outbox row for each pending row of the ids (one key lookup each), and the relays
# woken at the commit.
_REINDEX = """
WITH o AS (
    INSERT INTO tickwheel_outbox (ns, id, due_ms)
    SELECT $1, x.id, x.due_ms FROM unnest($2::text[]) AS u(i),
        LATERAL (SELECT j.id, j.due_ms FROM tickwheel_jobs j
                 WHERE j.ns = $1 AND j.id = u.i AND j.state = 0 OFFSET 0) AS x
    RETURNING 1)
SELECT count(pg_notify('tickwheel_outbox', $1)) FROM (SELECT 1 FROM o LIMIT 1) AS one
"""


async def reindex(store: PgStore, ids: Sequence[str]) -> None:
    """Hand the pending rows of ``ids`` to the relays (an outbox row each), after their
    stale Redis entries were removed (migration 0012). A failure is logged: reconcile
    puts such a row back in Redis."""
    try:
        async with store.transaction() as c:
            await c.execute(_REINDEX, store.namespace, sorted(ids))
    except PostgresUnavailable as exc:
        logger.warning("%d job(s) not indexed again (%s): reconcile restores them", len(ids), exc)


async def shard_epochs(conn: Any, ns: str) -> dict[int, int]:
    """The highest epoch recorded per shard."""
    rows = await conn.fetch("SELECT shard, epoch FROM tickwheel_shard_epochs WHERE ns = $1", ns)
    return {int(r[0]): int(r[1]) for r in rows}


async def listen(store: PgStore, channel: str, wake: asyncio.Event) -> Any:
    """A connection of its own LISTENing to ``channel``'s commit notifications of
    ``store``'s namespace, setting ``wake`` at each (None if PostgreSQL is down: the
    relay then polls)."""
    import asyncpg  # noqa: PLC0415

    ns = store.namespace

    def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == ns:
            wake.set()

    bound = store.call_timeout
    conn = None
    try:
        conn = await asyncpg.connect(store.url, timeout=bound)
        await asyncio.wait_for(conn.add_listener(channel, notified), bound)
    except Exception as exc:  # the poll goes on without notifications
        logger.warning("relay cannot listen (%r)", exc)
        if conn is not None:
            conn.terminate()  # no goodbye to wait on: this connection failed
        return None
    return conn


async def relay_loop(
    relay_all: Callable[[], Awaitable[object]],
    store: PgStore,
    channel: str,
    stop: asyncio.Event,
    interval: float,
) -> None:
    """Run ``relay_all`` until ``stop`` is set: at each commit notification on
    ``channel`` (:func:`listen`), and every ``interval`` seconds. Errors are logged, and
    the next round tries again."""
    wake = asyncio.Event()
    listener: Any = None
    while not stop.is_set():
        if listener is None:
            listener = await listen(store, channel, wake)
        try:
            await relay_all()
        except (RedisUnavailable, PostgresUnavailable) as exc:
            logger.warning("relay round failed (%s)", exc)
        except Exception:  # a bug or an unexpected reply: the next round may do better
            logger.exception("relay round failed")
        wake.clear()
        with contextlib.suppress(TimeoutError):
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
            try:
                await asyncio.wait(waits, timeout=interval, return_when="FIRST_COMPLETED")
            finally:
                for w in waits:
                    w.cancel()
        if listener is not None and listener.is_closed():
            listener = None
    if listener is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(listener.close(), 5)
