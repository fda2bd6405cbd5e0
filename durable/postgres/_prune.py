"""Retention: :func:`prune` deletes what no longer needs keeping (``tickwheel pg prune``).

It runs on a connection of the caller's (the command's own), outside any
:class:`PgStore`: an operator's job, not a scheduler's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prune"]

# Rows deleted per statement by prune(): short transactions, so autovacuum and
# replication keep up, and no long lock on the tables.
_PRUNE_BATCH = 10_000


async def prune(conn: Any, older_than_s: float) -> tuple[int, int]:
    """Delete done rows, and completed (state 1) job rows, older than ``older_than_s``,
    in batches of their own transactions.

    A done row only matters while a copy of its occurrence can still turn up (a Redis
    restored from an old backup); reconcile never brings a completed occurrence back.

    Returns:
        (done rows deleted, job rows deleted).

    Raises:
        ValueError: if ``older_than_s`` is negative or not finite.
    """
    if not isinstance(older_than_s, int | float) or not 0 <= older_than_s < float("inf"):
        raise ValueError(f"older_than must be a finite number >= 0, got {older_than_s!r}")
    counts = [0, 0]
    statements = (
        "DELETE FROM tickwheel_done WHERE ctid = ANY(ARRAY(SELECT ctid FROM tickwheel_done"
        " WHERE done_at < now() - make_interval(secs => $1) LIMIT $2))",
        "DELETE FROM tickwheel_jobs WHERE ctid = ANY(ARRAY(SELECT ctid FROM tickwheel_jobs"
        " WHERE state = 1 AND updated_at < now() - make_interval(secs => $1) LIMIT $2))",
    )
    for k, sql in enumerate(statements):
        while True:
            status = await conn.execute(sql, float(older_than_s), _PRUNE_BATCH)
            n = int(status.rsplit(" ", 1)[-1])
            counts[k] += n
            if n < _PRUNE_BATCH:
                break
    return counts[0], counts[1]
