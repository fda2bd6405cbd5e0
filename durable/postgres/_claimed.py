"""A claimed batch checked against PostgreSQL (``PostgresMode.after_claim``).

The claim is Redis's; PostgreSQL then says which of the claimed occurrences are done
already (acked unrun in Redis), and which entries are gone: no row (cancelled while a
producer or a reconcile was still writing them to Redis), or behind their row (a late
index write: an older version, migration 0012; a dead or done row, a later occurrence,
a higher attempt of the same occurrence, migration 0013). Gone entries are taken out of
Redis unrun, and the pending rows among them are handed to the relays, which write each
from its own state (``_relay.take_outbox``). Both count as the batch's ``dropped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

from tickwheel.durable.model import ClaimBatch, Fenced, Job, PostgresUnavailable, RedisUnavailable
from tickwheel.durable.store import ClaimedRef

from ._errors import stored_epoch
from ._relay import reindex

if TYPE_CHECKING:
    from ._mode import RedisSide
    from ._pg_store import PgStore

__all__ = ["after_claim", "claimed_ref"]

logger = logging.getLogger("tickwheel.durable")


async def after_claim(
    store: PgStore, sched: RedisSide, batch: ClaimBatch, epoch: int
) -> ClaimBatch:
    """Record the epoch in PostgreSQL; ack unrun what PostgreSQL has done already, and
    take out of Redis unrun the entries PostgreSQL has no row for or a row ahead of
    (a pending one is indexed again, from its state).

    Raises:
        Fenced: if PostgreSQL holds a higher epoch (Redis lost its epochs): the
            Redis epoch is lifted above it first, so the next take is current.
    """
    if not batch.jobs:
        return batch
    shard, claimed = batch.shard, batch.jobs
    try:
        done, gone = await store.claimed(
            shard,
            epoch,
            [j.id for j in claimed],
            [j.nominal_ms for j in claimed],
            [j.version for j in claimed],
            [j.attempt for j in claimed],
        )
    except Fenced as exc:
        with contextlib.suppress(RedisUnavailable):
            await sched.store.raise_epoch(shard, stored_epoch(exc))
        raise
    except PostgresUnavailable:
        # Hand the batch back unrun (no attempt spent): without PostgreSQL nothing
        # can be acked, and a long outage must not run jobs out of attempts.
        refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, j.due_ms) for j in batch.jobs]
        with contextlib.suppress(RedisUnavailable, Fenced):
            await sched.store.release(shard, epoch, refs)
        raise
    if not done and not gone:
        return batch
    for k in sorted(gone):  # leased by this claim: nobody else moves them meanwhile
        await sched.store.cancel(shard, batch.jobs[k].id)
    if gone:
        await reindex(store, [batch.jobs[k].id for k in gone])  # a pending row, from its state
        logger.warning(
            "%d claimed job(s) without a PostgreSQL row, or behind it, removed unrun"
            " from shard %d (cancelled, a late write, or written to Redis by a producer"
            " without postgres_url)",
            len(gone),
            shard,
        )
    dups = [j for k, j in enumerate(batch.jobs) if k in done and k not in gone]
    if dups:
        refs = [claimed_ref(j) for j in dups]
        await sched.store.ack(shard, epoch, refs, sched.dedup_window_ms)
    jobs = [j for k, j in enumerate(batch.jobs) if k not in done and k not in gone]
    dropped = batch.dropped + len(batch.jobs) - len(jobs)
    return dataclasses.replace(batch, jobs=jobs, dropped=dropped)


def claimed_ref(job: Job) -> ClaimedRef:
    """The ack of a claimed job done already: a recurring one moves to its next
    occurrence."""
    nxt = job.next_due_ms
    if not nxt and job.recurrence is not None:
        nxt = job.recurrence.next_after(job.nominal_ms, job.nominal_ms)
    return ClaimedRef(job.id, job.attempt, job.nominal_ms, nxt)
