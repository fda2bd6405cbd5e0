"""The Postgres mode of a :class:`Scheduler`: PostgreSQL holds the jobs, Redis indexes them.

What changes against the Redis-only mode (everything else is the same code):

- ``schedule`` writes the job row and an outbox row in one PostgreSQL transaction (the
  application's own, when it passes ``conn=``). After a commit of its own it writes the
  Redis index entry (one job's after the call returns: ``_behind.py``); what it could
  not write the relay writes from the outbox. The write is schedule.lua at the stored
  nominal due with ``replace`` off, so writing an entry twice is a no-op.
- ``claim`` records the owner's epoch in PostgreSQL and drops (acks unrun) any claimed
  occurrence that PostgreSQL has done already: an acked occurrence never runs again,
  even when Redis lost the ack.
- ``ack`` writes the done rows (and a recurring job's next occurrence) to PostgreSQL
  first, under the epoch, then acks in Redis. A stale epoch is refused in both.
- :meth:`PostgresMode.reconcile` rebuilds the Redis index from the pending rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from tickwheel.durable.model import (
    ClaimBatch,
    Fenced,
    JobSpec,
    JobState,
    RedisUnavailable,
    ScheduleResult,
    ScheduleStatus,
)
from tickwheel.durable.store import ClaimedRef, EncodedJob, Keys, Store

from . import _pauses, _replacing, _writes
from ._behind import REDIS_BATCH as _REDIS_BATCH
from ._behind import IndexBehind
from ._claimed import after_claim
from ._clock import warn_of_skew
from ._drivers import async_connection
from ._enqueue import encode_jobs, first_run, needs_now, sorted_by_id
from ._enqueue import results as enqueue_results
from ._errors import stored_epoch
from ._pg_store import MAX_LOCKED, PgStore
from ._relay import relay_loop
from ._rows import PgJob, encode_pg_job, redis_job

__all__ = ["DEFAULT_RECONCILE_PAGE", "DEFAULT_RELAY_INTERVAL", "PostgresMode", "ReconcileResult"]

logger = logging.getLogger("tickwheel.durable")

# How often (s) a worker's relay looks at the outbox without being notified. A commit
# that leaves its jobs to the relays notifies them at once (pg_notify in tickwheel_put
# and tickwheel_put_many, migration 0005); this bounds the delay when a notification is
# lost (the listening connection dropped).
DEFAULT_RELAY_INTERVAL = 1.0
# Pending rows read per reconcile page (and written per schedule.lua call).
DEFAULT_RECONCILE_PAGE = 1000
_CHANNEL = "tickwheel_outbox"
# What a replace writes to PostgreSQL after Redis: the outcomes that wrote the job.
_WRITTEN = (ScheduleStatus.CREATED, ScheduleStatus.REPLACED)


@dataclasses.dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one reconcile did."""

    pending: int  # pending jobs in PostgreSQL (all written to Redis, or there already)
    restored: int  # of those, missing from Redis and written back
    epochs_raised: int  # shards whose Redis epoch was below PostgreSQL's (Redis lost it)
    relayed: int  # outbox rows handled
    seconds: float  # how long it took
    skipped: bool = False  # if_free and another reconcile held the lock: nothing done
    paused: int = 0  # recorded pauses (tasks, or the namespace) written back to Redis


class RedisSide(Protocol):
    """What the Postgres mode uses of the Redis side: a :class:`Scheduler` is one.

    The scheduler layer sits above this one, so the mode names what it needs rather
    than importing it (the layer rule, tests/test_layers.py).
    """

    @property
    def store(self) -> Store: ...  # the Redis store: the due index, leases, epochs

    @property
    def keys(self) -> Keys: ...  # the namespace's shard count, for an id's shard

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def dedup_window_ms(self) -> int: ...

    async def open(self) -> object:
        """Check (or create) the namespace's layout in Redis; idempotent."""


class PostgresMode:
    """The PostgreSQL half of a scheduler (``Scheduler(..., postgres_url=...)``)."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.behind = IndexBehind(store)  # one job's Redis write, after schedule returns

    # -- producers -----------------------------------------------------------------

    async def schedule(
        self, sched: RedisSide, specs: Sequence[JobSpec], conn: Any
    ) -> list[ScheduleResult]:
        """Write the jobs in one transaction, then (own transaction only) index them.

        ``conn``: None (a transaction of its own), or the application's connection in
        its transaction: asyncpg's, or an async psycopg 3 or SQLAlchemy one
        (``_drivers.py``).

        Raises:
            TypeError, ValueError: for bad specs or a bad ``conn`` (nothing written).
        """
        limit = sched.max_payload_bytes
        jobs = encode_jobs(specs, sched.keys.shard_of, limit, None)  # checked before conn
        if conn is not None:
            conn = await async_connection(conn)
        if needs_now(specs):
            now = await self.store.now(conn)
            jobs = encode_jobs(specs, sched.keys.shard_of, limit, now)
        order = sorted_by_id(jobs)
        # Our own transaction indexes its jobs itself (_index): the relays sleep on.
        with self.behind.flying():
            replies = await self.store.schedule(
                [jobs[k] for k in order], conn, notify=conn is not None
            )
        done = enqueue_results(jobs, order, replies)
        if conn is None:
            created = [
                (job, result.when_ms, seq)
                for job, result, seq in done
                if result.status is ScheduleStatus.CREATED
            ]
            if created:
                await self._index(sched, created)
        return [result for _, result, _ in done]

    @staticmethod
    async def connection(conn: Any) -> Any:
        """The application's connection, checked and ready for :meth:`schedule` (asyncpg's
        as it is, another driver's behind a facade); see ``_drivers.async_connection``.

        Raises:
            TypeError, ValueError: for a connection :meth:`schedule` cannot take.
        """
        return await async_connection(conn)

    async def replace(self, sched: RedisSide, specs: Sequence[JobSpec]) -> list[ScheduleResult]:
        """``schedule(..., replace=True)``: overwrite jobs that are due or dead, never
        a leased one. Only Redis knows a lease, so Redis decides, inside a PostgreSQL
        transaction that holds the ids (:meth:`PgStore.locked`): an occurrence
        PostgreSQL has done is refused first (DONE), then schedule.lua runs with
        ``replace`` on, and what it created or replaced is written to the rows before
        the commit. BUSY and DONE leave the row as it was. A batch of more than
        ``MAX_LOCKED`` jobs is done in transactions of that many, in order.

        If Redis fails part way, what it accepted is still committed and the error
        raised after (later transactions of the batch are not started). A commit that
        fails after Redis accepted leaves Redis ahead of PostgreSQL until the same
        replace is repeated (it is idempotent).

        Raises:
            RedisUnavailable, PostgresUnavailable: on a failure of either.
        """
        await sched.open()
        await self.behind.settled()  # this process's own writes first (_behind.py)
        out: list[ScheduleResult] = []
        for i in range(0, len(specs), MAX_LOCKED):  # in order: an id given twice, the last wins
            out += await self._replace(sched, specs[i : i + MAX_LOCKED])
        return out

    async def _replace(self, sched: RedisSide, specs: Sequence[JobSpec]) -> list[ScheduleResult]:
        limit = sched.max_payload_bytes
        results: list[ScheduleResult | None] = [None] * len(specs)
        failure: RedisUnavailable | None = None
        async with self.store.locked([spec.id for spec in specs]) as (conn, _):
            now, ver = await _writes.now_version(conn)  # the version under the locks
            firsts = [self._first_run(spec, now) for spec in specs]
            jobs = [encode_pg_job(s, sched.keys.shard_of(s.id), limit, ver) for s in firsts]
            dues = [now + s.time_ms if s.mode == 1 else s.time_ms for s in firsts]
            done = await self.store.done_of(
                conn, [(job.id, due) for job, due in zip(jobs, dues, strict=True)]
            )
            groups: dict[int, list[int]] = {}
            for k, (job, due) in enumerate(zip(jobs, dues, strict=True)):
                if (job.id, due) in done:
                    results[k] = ScheduleResult(job.id, ScheduleStatus.DONE, due)
                else:
                    groups.setdefault(job.shard, []).append(k)
            try:
                for shard, ks in groups.items():
                    for i in range(0, len(ks), _REDIS_BATCH):
                        chunk = ks[i : i + _REDIS_BATCH]
                        encoded = [
                            redis_job(jobs[k].id, dues[k], jobs[k].record, ver, jobs[k].count)
                            for k in chunk
                        ]
                        replies = await sched.store.schedule(shard, encoded, True)
                        for k, reply in zip(chunk, replies, strict=True):
                            results[k] = reply
            except RedisUnavailable as exc:
                failure = exc  # commit what Redis accepted, then raise
            accepted: dict[str, tuple[PgJob, int]] = {}  # an id given twice: the last wins
            for k, result in enumerate(results):
                if result is not None and result.status in _WRITTEN:
                    accepted[jobs[k].id] = (jobs[k], dues[k])
            await self.store.overwrite(conn, list(accepted.values()))
            if accepted:  # a later write: the ids' replacements in waiting are superseded
                await conn.execute(_replacing.DROP, self.store.namespace, sorted(accepted))
        if failure is not None:
            raise failure
        return [r for r in results if r is not None]

    async def replace_in(
        self, sched: RedisSide, specs: Sequence[JobSpec], conn: Any
    ) -> list[ScheduleResult]:
        """``schedule(..., replace=True, conn=)``: the replacements written in the
        caller's transaction, applied by a relay after its commit (``_replacing.py``).

        Raises:
            TypeError, ValueError: for bad specs or a bad ``conn`` (nothing written).
        """
        encode_jobs(specs, sched.keys.shard_of, sched.max_payload_bytes, None)  # before conn
        facade = await async_connection(conn)
        return await self.store.replace_in(
            facade, specs, sched.keys.shard_of, sched.max_payload_bytes
        )

    async def cancel(self, sched: RedisSide, job_id: str) -> tuple[bool, JobState | None]:
        """Remove a job from both stores: its row and outbox rows, then its Redis
        entries, in one PostgreSQL transaction holding the id (:meth:`PgStore.locked`).
        Returns whether PostgreSQL had a pending row, and the state Redis had it in.

        Holding the id orders a cancel with a replace or reschedule of it. A replace of
        a new id writes Redis before its row commits; a cancel in between used to find
        no row, take the job out of Redis, and leave the row the replace then committed
        pending with Redis empty, for a reconcile to bring back. Now the cancel waits
        for that commit, and a replace waits for the cancel's: either order ends with
        both stores agreeing.

        If Redis fails, the transaction rolls back: nothing is removed from either. A
        commit that fails after Redis removed the job leaves the row pending (a
        reconcile would bring it back) and raises: repeat the cancel.

        Raises:
            RedisUnavailable, PostgresUnavailable: on a failure of either.
        """
        await sched.open()
        await self.behind.settled()
        shard = sched.keys.shard_of(job_id)
        async with self.store.locked([job_id]) as (conn, _):
            found = await self.store.cancel(job_id, conn)
            # A replacement waiting for the relay is superseded (and counts as found).
            found |= bool(await conn.fetchval(_replacing.DROP, self.store.namespace, [job_id]))
            state = await sched.store.cancel(shard, job_id)
        return found, state

    async def reschedule(self, sched: RedisSide, job_id: str, mode: int, time_ms: int) -> bool:
        """Move a due job to a new occurrence: Redis moves it (only it knows whether
        the job is leased), inside a PostgreSQL transaction holding the job's row, and
        the row follows before the commit. False, with nothing changed, if PostgreSQL
        has no pending row for it or Redis refused (leased, dead, gone, or the new
        occurrence done already).

        The move takes a new row version (under the row's lock) into the entry and the
        row: a late index write of the job as it was (a write behind, a relay's) is then
        older than the row, and a claim removes it unrun (:meth:`after_claim`).

        A commit that fails after Redis moved the job leaves Redis ahead of PostgreSQL
        (a reconcile after a Redis loss would bring back the old due) until the same
        reschedule with ``at=`` is repeated.

        Raises:
            RedisUnavailable, PostgresUnavailable: on a failure of either.
        """
        await sched.open()
        await self.behind.settled()
        shard = sched.keys.shard_of(job_id)
        async with self.store.locked([job_id]) as (conn, pending):
            if mode == 0 and await self.store.done_of(conn, [(job_id, time_ms)]):
                return False
            ns = self.store.namespace  # a replacement in waiting moves, not the job
            ((replacement, version),) = await conn.fetch(_replacing.MOVE, ns, job_id, mode, time_ms)
            if replacement:
                return True
            if job_id not in pending:
                return False
            status, when = await sched.store.reschedule(shard, job_id, mode, time_ms, version)
            if status != 1:
                return False
            await self.store.moved(conn, job_id, when, version)
        return True

    _first_run = staticmethod(first_run)

    async def _index(self, sched: RedisSide, created: Sequence[tuple[PgJob, int, int]]) -> None:
        """Write committed jobs to Redis (``IndexBehind.index``: one job behind the call,
        a batch before it returns); a failure leaves them to the relay."""
        await self.behind.index(sched, created)

    # -- workers -------------------------------------------------------------------

    async def after_claim(self, sched: RedisSide, batch: ClaimBatch, epoch: int) -> ClaimBatch:
        """Record the epoch in PostgreSQL; ack unrun what PostgreSQL has done already,
        and take out of Redis unrun the jobs PostgreSQL has no row for (cancelled while
        a producer or a reconcile was still writing them to Redis) or a row ahead of (a
        late write: an older version, a dead or done row, a later occurrence or a
        higher attempt; a pending row is indexed again, from its state). Both count as
        ``dropped`` (``_claimed.py``).

        Raises:
            Fenced: if PostgreSQL holds a higher epoch (Redis lost its epochs): the
                Redis epoch is lifted above it first, so the next take is current.
        """
        return await after_claim(self.store, sched, batch, epoch)

    async def before_reap(
        self,
        sched: RedisSide,
        shard: int,
        epoch: int,
        now: int,
        plan: list[tuple[str, int, int, int]],
    ) -> None:
        """Record in PostgreSQL what a reap is about to do (``Store.reap_look``'s plan:
        id, nominal, attempt after, action; ``now``: Redis's at the look), before Redis
        does it. A pre-start lease returned at the same attempt writes nothing.

        Raises:
            Fenced: if PostgreSQL holds a higher epoch (the Redis epoch is lifted above
                it first, as :meth:`after_claim` does); PostgresUnavailable: nothing is
                reaped this round.
        """
        writes = [(i, nominal, attempt, act == 2) for i, nominal, attempt, act in plan if act]
        if not writes:
            return
        try:
            await self.store.reaped(shard, epoch, writes, now)
        except Fenced as exc:
            with contextlib.suppress(RedisUnavailable):
                await sched.store.raise_epoch(shard, stored_epoch(exc))
            raise

    async def ack(self, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[int]:
        """The PostgreSQL half of an ack (before the Redis half)."""
        return await self.store.ack(shard, epoch, refs)

    # -- relay and reconcile -------------------------------------------------------

    async def relay(self, sched: RedisSide, limit: int = 1000) -> int:
        """Write up to ``limit`` outbox rows to Redis and delete them; return how many
        rows were handled. Safe beside other relays (rows are locked, skipped by the
        others) and to repeat (a job indexed already is kept as it is).

        Raises:
            RedisUnavailable, PostgresUnavailable: nothing was deleted.
        """
        await sched.open()
        async with self.store.outbox(limit) as rows:
            groups: dict[int, list[EncodedJob]] = {}
            for row in rows:
                if row.job is not None:  # the shard by this scheduler's count, as claims see it
                    groups.setdefault(sched.keys.shard_of(row.job.id), []).append(row.job)
            for shard, jobs in groups.items():
                await sched.store.schedule(shard, jobs, False)
            for row in rows:  # cancel(conn=) committed: Redis follows, the id held
                if row.cancel:
                    await sched.store.cancel(sched.keys.shard_of(row.cancel), row.cancel)
        return len(rows)

    async def relay_all(self, sched: RedisSide) -> int:
        """:meth:`relay` until the outbox is empty (of rows no other relay holds), then
        the committed replacements (``_replacing.apply``; a leased job's waits)."""
        await self.behind.settled()
        total = 0
        while n := await self.relay(sched):
            total += n
        return total + await _replacing.apply_all(self.store, sched)

    async def reconcile(
        self, sched: RedisSide, *, page: int = DEFAULT_RECONCILE_PAGE, if_free: bool = False
    ) -> ReconcileResult:
        """Rebuild the Redis index from PostgreSQL after a Redis loss (or to check).

        - Each shard's Redis epoch is lifted above PostgreSQL's when it is below (Redis
          lost it): owners that took the shard since are fenced and take it again.
        - Every pending job is written at its nominal due with ``replace`` off: a job
          Redis has (due, leased, dead) is left as it is; a missing one is due again.
          Nothing done comes back: done rows are not pending, and a claim drops an
          occurrence PostgreSQL has done.
        - The pauses PostgreSQL records are written to Redis first (``_pauses.py``), so
          a claim parks a paused task's restored jobs instead of leasing them.
        - The outbox is relayed.

        Idempotent, and safe beside running workers. With ``if_free``, it runs only if
        no other reconcile of this namespace holds its advisory lock, and else returns
        at once with ``skipped`` set: workers reconcile that way, so N workers do not
        each read every pending row every interval.
        """
        if not if_free:
            return await self._reconcile(sched, page)
        async with self.store.exclusive("reconcile") as got:
            if not got:
                return ReconcileResult(0, 0, 0, 0, 0.0, skipped=True)
            return await self._reconcile(sched, page)

    async def _reconcile(self, sched: RedisSide, page: int) -> ReconcileResult:
        start = time.monotonic()
        await sched.open()
        await self.behind.settled()
        await sched.store.init(postgres=True)  # the layout and mode, if Redis lost them
        raised = 0
        for shard, epoch in sorted((await self.store.shard_epochs()).items()):
            if shard < sched.keys.shards:
                raised += await sched.store.raise_epoch(shard, epoch)
        paused = await _pauses.restore(self.store, sched.store)  # before the jobs come back
        pending = restored = 0
        after: tuple[int, str] | None = None
        while rows := await self.store.pending(after, page):
            groups: dict[int, list[EncodedJob]] = {}
            for row in rows:
                groups.setdefault(sched.keys.shard_of(row.job.id), []).append(row.job)
            for shard, jobs in groups.items():
                results = await sched.store.schedule(shard, jobs, False)
                restored += sum(r.status is ScheduleStatus.CREATED for r in results)
            pending += len(rows)
            after = (rows[-1].due_ms, rows[-1].job.id)
        relayed = await self.relay_all(sched)
        took = time.monotonic() - start
        await warn_of_skew(self.store.now, lambda: sched.store.now(0))  # "One clock"
        return ReconcileResult(pending, restored, raised, relayed, took, paused=paused)

    async def pause(self, sched: RedisSide, task: str, since_ms: int) -> None:
        """Pause ``task`` (``''``: all) in PostgreSQL, then Redis (``_pauses.pause``)."""
        await _pauses.pause(self.store, sched.store, task, since_ms)

    async def resume(self, sched: RedisSide, task: str) -> int:
        """Resume ``task`` in PostgreSQL, then Redis (``_pauses.resume``); jobs moved."""
        return await _pauses.resume(self.store, sched.store, task)

    async def run_relay(
        self, sched: RedisSide, stop: asyncio.Event, interval: float = DEFAULT_RELAY_INTERVAL
    ) -> None:
        """Relay until ``stop`` is set: at each commit notification, and every
        ``interval`` seconds. Errors are logged, and the next round tries again."""
        await relay_loop(lambda: self.relay_all(sched), self.store, _CHANNEL, stop, interval)
