"""The ack batcher: the acks of jobs whose handler returned go to the store together,
one call per shard and epoch in flight, tried again through a short outage, and left
to the reaper once a job's lease would run out before the next try."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from tickwheel.durable.model import Defer, Fenced, Job
from tickwheel.durable.scheduler import ACKED, LEASE_LOST, UNSETTLED, Scheduler
from tickwheel.wheel import TimingWheel

from ._history import ACKED as ACKED_OUTCOME
from ._history import LEASE_LOST as LOST_OUTCOME
from ._loader_stats import LoaderStats
from ._logs import OUTAGE_ERRORS, Outages, job_fields

__all__ = ["ACK_RETRY_PAUSES", "UNAVAILABLE", "AckBatcher"]

# The stores' transient errors: a job's end state waits them out while its lease lasts.
UNAVAILABLE = OUTAGE_ERRORS

logger = logging.getLogger("tickwheel.durable")

# Pauses (s) between tries of an ack that found Redis unreachable, the last one repeated
# until the lease runs out: an outage (a failover, a restart) shorter than what is left
# of the lease should not cost a rerun after the lease expires.
ACK_RETRY_PAUSES = (0.05, 0.2, 0.5)


class AckBatcher:
    """Acks of one shard and epoch go out together: at most one ``ack_many`` per shard
    and epoch is in flight, and the acks submitted meanwhile wait for it and go out
    together in the next one (group commit).

    A steady stream of due jobs then costs one round trip per shard per round-trip
    time, whatever the rate, instead of one per job: that round trip, not the wheel, is
    what bounds a loader's jobs/s (bench/probes/lateness_vs_peers.py), and in the Postgres mode each
    ack is a commit that waits for its WAL flush.

    Nobody awaits an ack: the batcher counts each outcome in the loader's stats
    (``succeeded``, ``lease_lost``; ``unavailable`` and ``errors`` for those left to the
    reaper). While Redis (or PostgreSQL) is unreachable, a batch is tried again after
    the pauses of ``ACK_RETRY_PAUSES`` (then of its last one), each job as long as its
    lease lasts by the local clock: a job that ran must not run again because Redis
    restarted or failed over meanwhile (a pooled connection broken by a restart also
    fails once). That is safe: a second ack of the same lease finds the occurrence done
    and counts as acked. Past its lease the reaper may have handed the job on, and the
    job is the reaper's.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        wheel: TimingWheel,
        stats: LoaderStats,
        outages: Outages | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.leases = scheduler.leases  # ack_many, without the facade's extra call
        self.wheel = wheel  # its clock is the one lease ends are in
        self.stats = stats  # where outcomes are counted
        self.outages = outages if outages is not None else Outages()  # logged once each
        # (shard, epoch) -> (job, loop time its lease ends) waiting to be acked, in order
        self._pending: dict[tuple[int, int], list[tuple[Job, float]]] = {}
        self._flushes: dict[tuple[int, int], asyncio.Task[None]] = {}  # one per key at most
        self.waiting = 0  # jobs submitted whose outcome is not counted yet
        self._acking: dict[str, Job] = {}  # job id -> the job, submitted and not settled
        # Claim calls in flight (:meth:`claiming`), and the jobs acked meanwhile: job id ->
        # the job. Such a claim may have run in the store before the ack, and its reply
        # then holds the very lease the ack settled (see :meth:`holds`).
        self._claims = 0
        self._acked_meanwhile: dict[str, Job] = {}
        self.tracer = scheduler.tracer  # run spans, ended with the ack (None: off)

    def submit(self, job: Job, lease_end: float) -> None:
        """Ack ``job`` with whatever else is acked before its batch goes out. O(1)."""
        key = (job.shard, job.epoch)
        self.waiting += 1
        self._acking[job.id] = job
        if self.tracer is not None:
            self.tracer.acking(job)
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [(job, lease_end)]
        else:
            pending.append((job, lease_end))
        if key not in self._flushes:
            self._flushes[key] = asyncio.ensure_future(self._flush(key))

    def holds(self, job: Job) -> bool:
        """Is an ack (or a retry: :meth:`retrying`) of ``job``'s lease (id, epoch,
        attempt, occurrence) waiting here, or did one succeed while the claim that
        returned ``job`` was in flight? A claim returns it again when its pre-start
        lease ran out before that write (the reaper put it back in due at the same
        attempt): the write settles the new lease as well (a run must not start for
        it). Its reply can come before the claim's although the store ran the claim
        first: the write then settled the claim's lease already."""
        held = self._acking.get(job.id)
        meanwhile = held is None and not job.duplicate  # a duplicate's claim only acks it
        if meanwhile:
            held = self._acked_meanwhile.get(job.id)
        if held is None:
            return False
        mine = (held.shard, held.epoch, held.attempt, held.nominal_ms)
        if mine != (job.shard, job.epoch, job.attempt, job.nominal_ms):
            return False
        if meanwhile and logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "job %r was acked (or retried) while a claim that returned it was in flight",
                job.id,
                extra=job_fields(job),
            )
        return True

    @contextlib.contextmanager
    def retrying(self, job: Job, exc: BaseException) -> Iterator[None]:
        """Around the write of a failed run's retry (or dead letter): :meth:`holds` knows
        its lease meanwhile, and after it as an ack's (a retry settles a lease that a
        claim returned again just as an ack does). Not around a deferral: that keeps
        the attempt, and a claim may return the job at it again."""
        if isinstance(exc, Defer):
            yield
            return
        self._acking[job.id] = job
        written = False
        try:
            yield
            written = True
        finally:
            if self._acking.get(job.id) is job:
                del self._acking[job.id]
            if written and self._claims:
                self._acked_meanwhile[job.id] = job

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim call and the placing of its reply: the jobs acked meanwhile
        are remembered (:meth:`holds` knows them) until no claim is in flight."""
        self._claims += 1
        try:
            yield
        finally:
            self._claims -= 1
            if not self._claims:
                self._acked_meanwhile.clear()

    def _settled(self, entries: list[tuple[Job, float]]) -> None:
        for job, _ in entries:
            if self._acking.get(job.id) is job:
                del self._acking[job.id]

    def flushes(self, shard: int | None = None) -> set[asyncio.Task[None]]:
        """The calls in flight or about to be made (of ``shard``, or all)."""
        return {t for key, t in self._flushes.items() if shard is None or key[0] == shard}

    async def _flush(self, key: tuple[int, int]) -> None:
        batch: list[tuple[Job, float]] = []
        pauses = iter(ACK_RETRY_PAUSES)
        try:
            await asyncio.sleep(0)  # one loop turn: let the other jobs of this tick join
            # Until no ack of this key waits: the ones that came during a call go next.
            while batch := self._pending.pop(key, []):
                error = await self._send(batch)
                if error is None:
                    self._settled(batch)
                    pauses = iter(ACK_RETRY_PAUSES)
                    continue
                pause = next(pauses, ACK_RETRY_PAUSES[-1])
                end = self.wheel.time() + pause
                kept = [entry for entry in batch if end < entry[1]]
                self._settled([entry for entry in batch if not end < entry[1]])
                self._left(len(batch) - len(kept), error)
                self._unsettled([entry for entry in batch if end >= entry[1]])
                if kept:  # first in the next batch, with those that came meanwhile
                    self._pending[key] = kept + self._pending.get(key, [])
                    batch = []
                    await asyncio.sleep(pause)
        except BaseException:  # cancelled (a drain's grace ran out): left to the reaper
            left = batch + self._pending.pop(key, [])
            self._settled(left)
            self._unsettled(left)
            self.waiting -= len(left)
            raise
        finally:
            # In the same step as the last look at _pending: a later ack starts a flush.
            del self._flushes[key]

    async def _send(self, batch: list[tuple[Job, float]]) -> Exception | None:
        """One ``ack_many``, its outcomes counted; the error if the store was
        unreachable (the batch is not settled then)."""
        try:
            results = await self.leases.ack_many([job for job, _ in batch])
        except UNAVAILABLE as exc:
            self.outages.failed("acks", exc)
            return exc
        except Fenced:
            self.waiting -= len(batch)  # counted, and the shard forgotten, by the loader
            self._unsettled(batch)
            return None
        except Exception:
            self.waiting -= len(batch)
            self._unsettled(batch)
            self.stats.errors += len(batch)
            first = batch[0][0].id
            logger.exception("%d job(s) left to the reaper (%r, ...)", len(batch), first)
            return None
        self.outages.ok("acks")
        self.waiting -= len(batch)
        debug = logger.isEnabledFor(logging.DEBUG)
        tracer = self.tracer
        history = self.stats.history
        for (job, _), ok in zip(batch, results, strict=True):
            if tracer is not None:
                tracer.settle(job, ACKED if ok else LEASE_LOST)
            if history is not None:
                history.ended(job, ACKED_OUTCOME if ok else LOST_OUTCOME)
            if ok:
                self.stats.succeeded += 1
                self.stats.tasks.acked(job.task)
                if self._claims:  # a claim in flight may return this lease: see holds()
                    self._acked_meanwhile[job.id] = job
                if debug:
                    logger.debug(
                        "job %r acked (task %s, attempt %d)",
                        job.id,
                        job.task,
                        job.attempt,
                        extra=job_fields(job),
                    )
            else:
                self.stats.lease_lost += 1
                logger.warning(
                    "lease of job %r (task %s, attempt %d) was lost before its ack: it ran,"
                    " and may run again",
                    job.id,
                    job.task,
                    job.attempt,
                    extra=job_fields(job),
                )
        return None

    def _unsettled(self, batch: list[tuple[Job, float]]) -> None:
        """End the run spans of acks given up on (left to the reaper)."""
        if self.tracer is not None:
            for job, _ in batch:
                self.tracer.settle(job, UNSETTLED)

    def _left(self, count: int, error: Exception) -> None:
        """``count`` acks given up on (their leases end before Redis can be tried again)."""
        if count:
            self.waiting -= count
            self.stats.unavailable += count
            # The outage itself was logged once, when it began (Outages).
            logger.debug("%d ack(s) left to the reaper (%s)", count, error)
