"""The Postgres mode's writes around a lease call: a claim's missed-run moves, written
before Redis makes them, and a retry's exact run time, best effort after Redis
(``Leases`` calls them; the other transitions PostgreSQL decides first are in
``Leases.retry`` and ``Ownership.before_reap``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tickwheel.durable.model import (
    ClaimBatch,
    Fenced,
    Job,
    PostgresUnavailable,
    RedisUnavailable,
)
from tickwheel.durable.store import ClaimedRef, Store

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode

__all__ = ["pg_moved_first", "pg_retried"]

logger = logging.getLogger("tickwheel.durable")


async def pg_moved_first(
    pg: PostgresMode, store: Store, batch: ClaimBatch, epoch: int, moves: Sequence[ClaimedRef]
) -> None:
    """Postgres mode: record in PostgreSQL the recurring jobs a claim is about to move
    on unrun (their missed-run policy: skipped, or run as a later occurrence), before
    Redis moves them. The row moves only from the occurrence the claim holds, so it is
    never behind Redis: if the Redis move then fails (the lease lost, Redis down), the
    old occurrence comes back in Redis, its next claim plans the same move, and
    PostgreSQL, at the new occurrence already, matches nothing and stays.

    Raises:
        PostgresUnavailable: the whole batch is handed back to Redis unrun first (same
            occurrence and attempt), as a claim that cannot reach PostgreSQL does.
        Fenced: PostgreSQL holds a higher epoch (Redis lost it): the Redis epoch is
            lifted above it first, so the next take is current.
    """
    from tickwheel.durable.postgres._errors import stored_epoch  # noqa: PLC0415

    shard = batch.shard
    try:
        await pg.store.skipped(shard, epoch, [(m.id, m.nominal_ms, m.time_ms) for m in moves])
    except PostgresUnavailable:
        refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, j.due_ms) for j in batch.jobs]
        with contextlib.suppress(RedisUnavailable, Fenced):
            await store.release(shard, epoch, refs)
        raise
    except Fenced as exc:
        with contextlib.suppress(RedisUnavailable):
            await store.raise_epoch(shard, stored_epoch(exc))
        raise


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
