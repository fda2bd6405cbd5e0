"""``cancel`` and ``reschedule`` of :class:`SyncScheduler` in the Postgres mode.

The same steps as :meth:`PostgresMode.cancel` and :meth:`PostgresMode.reschedule`, on a
pooled psycopg connection of the SyncScheduler (``_sync_pool.py``) and the same SQL text
(``_writes.py``): a transaction takes the id's advisory lock and its row lock, in id
order as every writer does; Redis is changed inside it (only Redis knows whether the job
is leased), by the ``redis_*`` callable the SyncScheduler passes; the row follows before
the commit. If Redis fails, the transaction rolls back and nothing changed in either.
``cancel(conn=)`` runs in the application's transaction instead, as the asyncio
``cancel(conn=)`` does: PostgreSQL only, Redis by the relays after the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tickwheel.durable.model import JobState

from . import _replacing, _writes
from ._drivers import SyncDb, sync_connection
from ._errors import translated
from ._sync_pool import SyncPgPool

__all__ = ["cancel_in_sync", "cancel_sync", "reschedule_sync"]


def _lock(db: SyncDb, ns: str, job_id: str) -> dict[str, int]:
    """The id's advisory lock, then its row's: the pending row's due, if any."""
    db.fetch(_writes.LOCK_IDS, ns, [job_id])
    rows = db.fetch(_writes.LOCKED_ROWS, ns, [job_id])
    return {r[0]: int(r[1]) for r in rows if r[2] == 0}


def cancel_sync(
    pool: SyncPgPool, ns: str, job_id: str, redis_cancel: Callable[[], JobState | None]
) -> tuple[bool, JobState | None]:
    """Remove a job from both stores; whether PostgreSQL had a pending row, and the
    state Redis had it in.

    Raises:
        RedisUnavailable, PostgresUnavailable: nothing was removed from either.
    """
    with pool.transaction() as db:
        _lock(db, ns, job_id)
        db.execute(_writes.CANCEL_OUTBOX, ns, job_id)
        dropped = db.fetch(_replacing.DROP, ns, [job_id])  # a replacement in waiting
        rows = db.fetch(_writes.CANCEL_ROW, ns, job_id)
        found = (bool(rows) and rows[0][0] == 0) or bool(dropped and dropped[0][0])
        state = redis_cancel()
    return found, state


def cancel_in_sync(conn: Any, pool: SyncPgPool, ns: str, job_id: str) -> bool:
    """``SyncScheduler.cancel(job_id, conn=conn)``: in ``conn``'s transaction, the id's
    advisory lock (held to its end), its row, outbox rows and any replacement in waiting
    deleted, and a cancel mark that the relays turn into the Redis removal once the
    transaction commits. A rollback leaves both stores as they were. True if PostgreSQL
    had the job pending (or a replacement of it waiting).

    Raises:
        TypeError, ValueError: for a bad ``conn`` (nothing written).
        SchemaNotReady: if the database lacks the current schema.
        PostgresUnavailable: if PostgreSQL cannot be reached or fails transiently.
    """
    db = sync_connection(conn)
    pool.check_schema(db)
    with translated(None):
        db.fetch(_writes.LOCK_IDS, ns, [job_id])
        rows = db.fetch(_writes.CANCEL_IN, ns, job_id)
        dropped = db.fetch(_replacing.DROP, ns, [job_id])
    return bool(rows and rows[0][0] == 0) or bool(dropped and dropped[0][0])


def reschedule_sync(
    pool: SyncPgPool,
    ns: str,
    job_id: str,
    when: tuple[int, int],
    redis_reschedule: Callable[[int], tuple[int, int]],
) -> bool:
    """Move a due job to the occurrence ``when`` (``(mode, time_ms)``: 1 a delay, 0 an
    absolute time). False, with nothing changed, if PostgreSQL has no pending row for it
    or Redis refused (leased, dead, gone, or the new occurrence done already).
    ``redis_reschedule(version)`` moves the Redis entry, writing the job's new row
    version into it (taken under the row's lock, recorded in the row with the move).

    Raises:
        RedisUnavailable, PostgresUnavailable: nothing was moved in either.
    """
    mode, time_ms = when
    with pool.transaction() as db:
        pending = _lock(db, ns, job_id)
        if mode == 0 and db.fetch(_writes.DONE_OF, ns, [job_id], [time_ms]):
            return False
        ((replacement, version),) = db.fetch(_replacing.MOVE, ns, job_id, mode, time_ms)
        if replacement:
            return True  # a replacement in waiting moves, not the job
        if job_id not in pending:
            return False
        status, due = redis_reschedule(int(version))
        if status != 1:
            return False
        db.execute(_writes.MOVED, ns, job_id, due, int(version))
    return True
