"""The pause state of the Postgres mode: ``tickwheel_paused`` (migration 0008).

Ground rules:

- PostgreSQL holds the state of record (task -> since, ``''`` for the whole namespace),
  as it holds the jobs; Redis holds its copies (``store/_pauses.py``), which the claims
  read. Reconcile puts PostgreSQL's pauses back in Redis after a Redis loss.
- Pause, resume and reconcile's restore each run in one PostgreSQL transaction that holds
  the namespace's pause lock (a transaction-level advisory lock): the row is written
  first, then Redis inside the transaction, then the commit. So the three never
  interleave: a reconcile cannot write back a pause that a resume is taking out. If
  Redis fails, the transaction rolls back (a pause or resume cut short in Redis is
  finished by calling it again, as in the Redis-only mode).
- A pause recorded in Redis only (made before this migration) is left alone by
  reconcile: pausing it again records it here.
- The SQL text serves asyncpg (these functions) and the SyncScheduler's psycopg pool
  (``pause_sync``, ``resume_sync``) alike (``_drivers.render``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tickwheel.durable.store import Store

from ._pg_store import PgStore
from ._sync_pool import SyncPgPool

__all__ = [
    "LOCK",
    "pause",
    "pause_key",
    "pause_sync",
    "paused",
    "record_pause",
    "record_resume",
    "restore",
    "resume",
    "resume_sync",
]

# The namespace's pause lock, held to the end of the transaction.
LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
# Pausing what is paused keeps its first time: the stored one is returned.
_PAUSE = """
INSERT INTO tickwheel_paused AS p (ns, task, since_ms) VALUES ($1, $2, $3)
ON CONFLICT (ns, task) DO UPDATE SET since_ms = p.since_ms
RETURNING since_ms
"""
_RESUME = "DELETE FROM tickwheel_paused WHERE ns = $1 AND task = $2"
_STATE = "SELECT task, since_ms FROM tickwheel_paused WHERE ns = $1 ORDER BY task"


def pause_key(ns: str) -> str:
    """The advisory lock's key text of namespace ``ns``'s pause state."""
    return f"tickwheel:{ns}:pause"


async def record_pause(conn: Any, ns: str, task: str, since_ms: int) -> int:
    """Take the pause lock and record the pause of ``task`` (in the caller's
    transaction); the time it was paused first (ms)."""
    await conn.execute(LOCK, pause_key(ns))
    return int(await conn.fetchval(_PAUSE, ns, task, since_ms))


async def record_resume(conn: Any, ns: str, task: str) -> None:
    """Take the pause lock and delete the pause of ``task`` (in the caller's transaction)."""
    await conn.execute(LOCK, pause_key(ns))
    await conn.execute(_RESUME, ns, task)


async def paused(conn: Any, ns: str, *, lock: bool = False) -> dict[str, int]:
    """The recorded pauses: task (``''``: the whole namespace) -> since (ms); with
    ``lock``, after taking the pause lock (in the caller's transaction)."""
    if lock:
        await conn.execute(LOCK, pause_key(ns))
    return {r[0]: int(r[1]) for r in await conn.fetch(_STATE, ns)}


async def pause(pg: PgStore, redis: Store, task: str, since_ms: int) -> None:
    """Record the pause of ``task`` (``''``: all), then write it in Redis (its state and
    every shard's copy, with the recorded first time), in one transaction.

    Raises:
        RedisUnavailable, PostgresUnavailable: the row rolled back (Redis may hold the
            pause on some shards: call it again).
    """
    async with pg.transaction() as conn:
        since = await record_pause(conn, pg.namespace, task, since_ms)
        await redis.pauses.pause(task, since)


async def resume(pg: PgStore, redis: Store, task: str) -> int:
    """Delete the pause of ``task``, then resume it in Redis, in one transaction; the
    parked jobs moved back to due.

    Raises:
        RedisUnavailable, PostgresUnavailable: the row rolled back (call it again).
    """
    async with pg.transaction() as conn:
        await record_resume(conn, pg.namespace, task)
        return await redis.pauses.resume(task)


async def restore(pg: PgStore, redis: Store) -> int:
    """Write every recorded pause in Redis (reconcile: after a Redis loss, or a pause
    cut short there); how many there are. A claim parks their due jobs again."""
    async with pg.transaction() as conn:
        state = await paused(conn, pg.namespace, lock=True)
        for task, since in state.items():
            await redis.pauses.pause(task, since)
    return len(state)


def pause_sync(
    pool: SyncPgPool, ns: str, task: str, since_ms: int, redis_pause: Callable[[int], object]
) -> None:
    """:func:`record_pause` on a pooled psycopg connection, then ``redis_pause(since)``
    inside the transaction (rolled back if it raises)."""
    with pool.transaction() as db:
        db.fetch(LOCK, pause_key(ns))
        since = int(db.fetch(_PAUSE, ns, task, since_ms)[0][0])
        redis_pause(since)


def resume_sync(pool: SyncPgPool, ns: str, task: str, redis_resume: Callable[[], int]) -> int:
    """:func:`record_resume` on a pooled psycopg connection, then ``redis_resume()``
    inside the transaction (rolled back if it raises); what it returned."""
    with pool.transaction() as db:
        db.fetch(LOCK, pause_key(ns))
        db.execute(_RESUME, ns, task)
        return redis_resume()
