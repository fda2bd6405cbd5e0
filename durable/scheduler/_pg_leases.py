"""The Postgres mode's best-effort writes after a lease call Redis decided: a claim's
missed-run moves and a retry's exact run time (``Leases`` calls them; the transitions
PostgreSQL decides first are in ``Leases.retry`` and ``Ownership.before_reap``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tickwheel.durable.model import Fenced, Job, PostgresUnavailable
from tickwheel.durable.store import ClaimedRef

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode

__all__ = ["pg_retried", "pg_skipped"]

logger = logging.getLogger("tickwheel.durable")


async def pg_skipped(pg: PostgresMode, shard: int, epoch: int, moves: Sequence[ClaimedRef]) -> None:
    """Postgres mode: record the recurring jobs a claim moved on unrun (their
    missed-run policy), so that their rows follow Redis. Best effort, after Redis:
    if PostgreSQL cannot take it, the row stays at the occurrence it had, and a
    Redis loss brings that one back, to be moved on again by the next claim."""
    try:
        await pg.store.skipped(shard, epoch, [(m.id, m.nominal_ms, m.time_ms) for m in moves])
    except (PostgresUnavailable, Fenced) as exc:
        logger.warning(
            "%d missed-run move(s) not recorded in PostgreSQL (%s)",
            len(moves),
            exc,
        )


async def pg_retried(pg: PostgresMode, job: Job, when: int, attempt: int = 0) -> None:
    """Postgres mode: record the run time Redis gave the retry (``when``), for
    reconcile. The attempt was recorded before Redis (``Leases.retry``); this second
    write only corrects the run time, best effort: if PostgreSQL cannot take it, a
    Redis loss brings the retry back at this host's estimate of that time. A
    deferral (``attempt``: the same one) is recorded here only, best effort."""
    try:
        await pg.store.retried(
            job.shard,
            job.epoch,
            job.id,
            job.nominal_ms,
            attempt=attempt or job.attempt + 1,
            run_ms=when,
        )
    except (PostgresUnavailable, Fenced) as exc:
        logger.warning("retry of %r not recorded in PostgreSQL (%s)", job.id, exc)
