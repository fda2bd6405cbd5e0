"""The index write behind a single ``schedule``: a committed job is written to Redis
after the call returns, the jobs of calls made meanwhile in the same batch.

Ground rules (docs/postgres.md, "The index written behind"):

- A job is handed over only once its row and outbox row are committed: it is safe in
  PostgreSQL from then on, and its Redis write is an index write like the relay's
  (``schedule.lua`` at the stored nominal due, ``replace`` off: an entry Redis has is
  kept as it is, so a write that comes twice, or after a relay's, is a no-op).
- A write that fails (Redis down) leaves the outbox rows to the relays, as when the
  producer dies between its commit and its write; one that succeeds hands the rows to
  :meth:`PgStore.relayed_later` (deleted by the producer's next statement).
- Read your writes: the scheduler's own calls that read or change Redis by id (claim,
  get, cancel, reschedule, replace, inspect, relay, reconcile, close) wait for the
  writes handed over so far (:meth:`IndexBehind.settled`), so within a process a job
  is in Redis for every later call, as when ``schedule`` wrote it before returning,
  and a ``cancel`` after ``schedule`` is never overtaken by the write.
- Another process's call sees the job a write later. A write that lands after another
  process's ``cancel`` or ``replace`` of the id is what the synchronous write did in
  the same race (a window of one Redis call then, a batch's now): a claim finds no row
  for a cancelled job and removes it unrun, and a replaced job Redis holds is kept
  (``replace`` off). See docs/postgres.md for what remains.
- One write in flight at a time; the jobs committed meanwhile go together in the next
  (as the worker's acks do): with concurrent producers, one Redis round trip per
  batch (one call per shard in it) rather than one per job.
- A write waits for this scheduler's schedule statements in flight (their jobs join
  it), for at most :data:`LINGER` seconds: a producer that awaits one schedule after
  another then sends one Redis call per few jobs rather than one per job. A write with
  no statement in flight goes at once, and :meth:`IndexBehind.settled` cuts the wait
  short, so the scheduler's own reads never wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from tickwheel.durable.model import PostgresUnavailable, RedisUnavailable
from tickwheel.durable.store import EncodedJob

from ._rows import PgJob, redis_job

if TYPE_CHECKING:
    from ._mode import RedisSide
    from ._pg_store import PgStore

__all__ = ["LINGER", "REDIS_BATCH", "IndexBehind", "write"]

logger = logging.getLogger("tickwheel.durable")

# Jobs per schedule.lua call (MAX_BATCH of the scheduler: a script blocks Redis).
REDIS_BATCH = 1000
# Seconds a write waits at most for the schedule statements in flight (their jobs join
# it). A schedule's commit took 0.5-1.5 ms here on a quiet machine and 5-10 ms at a load
# of 8 (pg_messages --jobs 500, Redis calls per schedule: 0.87-0.89 with 5 ms, 0.54-0.62
# with 20 ms at that load; 0.25-0.31 with 5 ms at a load of 2-3). Another process sees a
# job this much later at most; this scheduler's own calls never wait for it.
LINGER = 0.02


class IndexBehind:
    """The Redis writes of committed single schedules, one batch in flight."""

    __slots__ = ("_flying", "_hurry", "_pending", "_sched", "_store", "_task", "_wake")

    def __init__(self, store: PgStore) -> None:
        self._store = store
        # (job, nominal due, outbox seq) committed and not yet taken by a write
        self._pending: list[tuple[PgJob, int, int]] = []
        self._task: asyncio.Task[None] | None = None  # the write in flight, if any
        self._sched: RedisSide | None = None  # the scheduler whose Redis they go to
        self._flying = 0  # this scheduler's schedule statements in flight
        self._wake: asyncio.Future[None] | None = None  # a lingering write waits on it
        self._hurry = False  # settled() waits: no more lingering

    async def index(self, sched: RedisSide, created: Sequence[tuple[PgJob, int, int]]) -> None:
        """Write committed jobs ``(job, nominal due, outbox seq)`` to Redis, drop their
        outbox rows; on failure leave both to the relay (the job is committed: never
        the caller's error). One job goes behind the call (:meth:`add`), a batch is
        written before the call returns."""
        if len(created) == 1:
            self.add(sched, created)
            return
        try:
            await sched.open()
            await write(
                sched,
                [redis_job(job.id, when, job.record, v, job.count) for job, when, v in created],
            )
            self._store.relayed_later([seq for _, _, seq in created])
        except (RedisUnavailable, PostgresUnavailable) as exc:
            logger.warning("%d committed job(s) left to the relay (%s)", len(created), exc)
        except Exception:  # the jobs are committed: whatever failed, the relay repairs it
            logger.exception("%d committed job(s) left to the relay", len(created))

    @contextlib.contextmanager
    def flying(self) -> Iterator[None]:
        """Around a schedule statement of this scheduler: a write waiting to start
        takes its job along (see :data:`LINGER`)."""
        self._flying += 1
        try:
            yield
        finally:
            self._flying -= 1
            self._wakeup()

    def _wakeup(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    def add(self, sched: RedisSide, created: Sequence[tuple[PgJob, int, int]]) -> None:
        """Hand over committed jobs ``(job, nominal due, outbox seq)`` to be written to
        Redis; returns at once. O(1) per job."""
        self._pending.extend(created)
        self._sched = sched
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    @property
    def busy(self) -> bool:
        """Whether a write is in flight or waiting."""
        return self._task is not None

    async def settled(self) -> None:
        """Wait until every job handed over so far was written (or left to the relays);
        a write still lingering (:data:`LINGER`) goes at once."""
        while self._task is not None:
            self._hurry = True
            self._wakeup()
            await asyncio.shield(self._task)

    async def aclose(self, seconds: float) -> None:
        """:meth:`settled`, bounded: what is not written by then is the relays'."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.settled(), seconds)

    async def _run(self) -> None:
        try:
            while self._pending:
                await self._linger()
                batch, self._pending = self._pending, []
                sched = self._sched
                assert sched is not None
                try:
                    await sched.open()
                    await write(
                        sched,
                        [
                            redis_job(job.id, when, job.record, v, job.count)
                            for job, when, v in batch
                        ],
                    )
                    self._store.relayed_later([seq for _, _, seq in batch])
                except (RedisUnavailable, PostgresUnavailable) as exc:
                    logger.warning("%d committed job(s) left to the relay (%s)", len(batch), exc)
                except Exception:  # the jobs are committed: the relay repairs whatever failed
                    logger.exception("%d committed job(s) left to the relay", len(batch))
        finally:
            self._task = None  # in the step that found the list empty
            self._hurry = False

    async def _linger(self) -> None:
        """Wait while a schedule statement is in flight (its job joins this write), at
        most :data:`LINGER` seconds and :data:`REDIS_BATCH` jobs; not once settled()
        is waiting."""
        loop = asyncio.get_running_loop()
        end = loop.time() + LINGER
        while self._flying and not self._hurry and len(self._pending) < REDIS_BATCH:
            left = end - loop.time()
            if left <= 0:
                return
            wake = self._wake = loop.create_future()
            timer = loop.call_later(left, self._wakeup)
            try:
                await wake
            finally:
                timer.cancel()


async def write(sched: RedisSide, jobs: Sequence[EncodedJob]) -> None:
    """Write stored jobs to Redis with ``schedule.lua`` (``replace`` off): the jobs of
    one shard in one call, those of several shards in one round trip (``Store.
    schedule_many``: a MULTI/EXEC of one call per shard and :data:`REDIS_BATCH` on one
    Redis, bounded rounds)."""
    groups: dict[int, list[EncodedJob]] = {}
    for job in jobs:  # the shard by this scheduler's count, as claims see it
        groups.setdefault(sched.keys.shard_of(job.id), []).append(job)
    if len(groups) == 1 and len(jobs) <= REDIS_BATCH:
        ((shard, encoded),) = groups.items()
        await sched.store.schedule(shard, encoded, False)
        return
    chunked = {
        shard: [encoded[i : i + REDIS_BATCH] for i in range(0, len(encoded), REDIS_BATCH)]
        for shard, encoded in groups.items()
    }
    await sched.store.schedule_many(chunked, False)
