"""Stopping running handlers: at their timeout, at a cancel of their job, at the drain
deadline, or when their lease was found lost; and settling each by why it was stopped.

Ground rules:

- Each stop cancels the handler's task with a reason (``Stopper.stops``); the task
  tells its own cancellation (a reason is set) from one it did not ask for.
- A timeout fails the attempt with :class:`TaskTimeout` (retried or dead); a cancel (the
  record is gone) is neither acked nor retried; a lost lease leaves nothing to ack or
  retry; a drain past its deadline releases the job unrun (same attempt), and a handler
  that catches that cancellation and returns did run, and is acked.
- A handler stopped for any reason but the drain (which has its own deadline) that
  still runs ``TIMEOUT_GRACE`` s later ignored its cancellation: its slot is freed then
  (``abandoned``), not when (if ever) it returns, and its job goes to the reaper.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tickwheel.durable.model import Job
from tickwheel.durable.scheduler import CANCELLED as STOPPED
from tickwheel.durable.scheduler import LEASE_LOST, RELEASED, Scheduler
from tickwheel.wheel import TimingWheel

from ._failures import Failures
from ._history import CANCELLED as CANCELLED_OUTCOME
from ._history import LEASE_LOST as LOST_OUTCOME
from ._loader_stats import LoaderStats
from ._logs import job_fields, logger

__all__ = ["CANCELLED", "DRAIN", "LOST", "TIMEOUT", "TIMEOUT_GRACE", "Stopper", "TaskTimeout"]

# Seconds past a handler's timeout during which its lease is still extended: the time
# a cancelled handler has to clean up and its retry to be written. Read when a Stopper
# is made (Stopper.grace).
TIMEOUT_GRACE = 5.0

# Why a handler's task was cancelled (the values of Stopper.stops).
TIMEOUT = "timeout"  # past its timeout: a failed attempt
CANCELLED = "cancelled"  # its job was cancelled (record gone): no ack, no retry
DRAIN = "drain"  # shutdown past the drain deadline: released unrun, same attempt
LOST = "lost"  # an extension found the lease gone: nothing left to ack or retry


class TaskTimeout(TimeoutError):
    """A handler ran past its timeout (the failure kept with its retry or dead letter)."""


class Stopper:
    """Stop the running handlers of one :class:`Runner`, and settle them once stopped.

    Args:
        scheduler: its ownership counts the timeouts and stops.
        wheel: the clock of the grace timers.
        stats: where outcomes are counted.
        running: the runner's tasks of fired jobs, with their job.
        free_slot: frees the slot of an abandoned handler.
        release: hands jobs of one shard back to due; how many were (a drain's job).
        failures: writes a timed-out attempt's retry.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        wheel: TimingWheel,
        stats: LoaderStats,
        running: dict[asyncio.Task[None], Job],
        *,
        free_slot: Callable[[], None],
        release: Callable[[int, list[Job]], Awaitable[int]],
        failures: Failures,
    ) -> None:
        self.scheduler = scheduler
        self.wheel = wheel
        self.stats = stats
        self._running = running
        self._free_slot = free_slot
        self._release = release
        self._failures = failures
        self.grace = TIMEOUT_GRACE
        # Job id -> the task whose handler runs it (until the handler returned). Kept by
        # the runner's task itself, on its hot path.
        self.handling: dict[str, asyncio.Task[None]] = {}
        # Tasks cancelled here, with the reason (TIMEOUT, CANCELLED, DRAIN, LOST).
        self.stops: dict[asyncio.Task[None], str] = {}
        # Stopped tasks whose handler ignored the cancellation past the grace: their
        # slot was freed then, not when (if ever) they return.
        self.abandoned: set[asyncio.Task[None]] = set()

    def runs(self, job: Job) -> bool:
        """Does a handler here run ``job``'s lease (id, epoch, attempt, occurrence)? A
        claim returns it again when its start's extension came after its pre-start
        lease expired: that extension, and the run's ack, hold the new lease too."""
        task = self.handling.get(job.id)
        held = None if task is None else self._running.get(task)
        if held is None:
            return False
        mine = (held.shard, held.epoch, held.attempt, held.nominal_ms)
        return mine == (job.shard, job.epoch, job.attempt, job.nominal_ms)

    def stop(self, task: asyncio.Task[None], reason: str) -> None:
        """Cancel a handler's task, telling it why (a wheel callback, or a stop)."""
        if not task.done():
            self.stops[task] = reason
            task.cancel()
            if reason != DRAIN:  # the drain has its own deadline
                self.wheel.schedule(self.grace, self._abandon, task)

    def _abandon(self, task: asyncio.Task[None]) -> None:
        """A stopped handler still runs ``grace`` s later (it ignored its cancellation):
        free its slot now. Its lease is no longer extended, so its job goes to the
        reaper; if the handler ever returns, its outcome is written then (and most
        likely refused: the lease is gone)."""
        job = self._running.get(task)
        if job is None or self.handling.get(job.id) is not task:
            return  # it returned
        del self.handling[job.id]
        self.abandoned.add(task)
        self.stats.errors += 1
        logger.error(
            "handler of job %r (task %s, attempt %d) ignored its cancellation for %g s:"
            " its slot is freed, and the job is left to the reaper",
            job.id,
            job.task,
            job.attempt,
            self.grace,
            extra=job_fields(job),
        )
        self._free_slot()

    def expire(self, job: Job, task: asyncio.Task[None]) -> None:
        """A handler's timeout came (a wheel callback): stop it if it still runs."""
        if self.handling.get(job.id) is task:
            self.stop(task, TIMEOUT)

    def lost(self, job: Job, task: asyncio.Task[None]) -> None:
        """An extension found the lease of ``job`` gone: stop its handler if it still
        runs (there is nothing left to ack or retry)."""
        if self.handling.get(job.id) is task:
            self.stop(task, LOST)

    def cancel(self, job_id: str) -> bool:
        """Stop the handler running job ``job_id`` (its record was removed); True if one
        runs here."""
        task = self.handling.get(job_id)
        if task is None:
            return False
        self.stop(task, CANCELLED)
        return True

    def drain(self, task: asyncio.Task[None]) -> None:
        """Cancel a task at the drain deadline: one whose handler runs releases its job
        unrun (same attempt) for another worker; any other is cancelled plainly."""
        job = self._running.get(task)
        if job is not None and self.handling.get(job.id) is task:
            self.stop(task, DRAIN)
        else:
            task.cancel()

    def returned(self, task: asyncio.Task[None], stopped: str | None) -> tuple[str | None, bool]:
        """The handler of ``task`` ended while some handler was stopped or abandoned
        (``stopped``: the reason of the cancellation it raised, if any). The reason it is
        to be settled by, and whether its slot was freed already (it was abandoned)."""
        if stopped is None and task in self.stops:
            # Cancelled, but the handler swallowed it and returned (or raised): stopped
            # all the same, except at the drain deadline, where a handler that returned
            # did run (it is acked).
            stopped = self.stops.pop(task)
            task.uncancel()
            if stopped == DRAIN:
                stopped = None
        if task in self.abandoned:
            self.abandoned.discard(task)
            return stopped, True
        return stopped, False

    async def settle(self, job: Job, reason: str, limit: float | None) -> None:
        """Settle a handler stopped here, by the reason it was stopped."""
        if reason == TIMEOUT:
            self.stats.timeouts += 1
            self.scheduler.ownership.counters.timeouts += 1
            await self._failures.failed(
                job, TaskTimeout(f"timeout: ran past its {limit:g} s timeout"), timed_out=True
            )
            return
        if self.scheduler.tracer is not None:
            outcome = {CANCELLED: STOPPED, LOST: LEASE_LOST}.get(reason, RELEASED)
            self.scheduler.tracer.settle(job, outcome)
        history = self.stats.history
        if history is not None and reason in (CANCELLED, LOST):
            history.ended(job, CANCELLED_OUTCOME if reason == CANCELLED else LOST_OUTCOME)
        if reason == CANCELLED:
            self.stats.cancelled += 1
            self.scheduler.ownership.counters.stopped += 1
            logger.info(
                "job %r (task %s, attempt %d) stopped: it was cancelled while running",
                job.id,
                job.task,
                job.attempt,
                extra=job_fields(job),
            )
        elif reason == LOST:
            self.stats.lease_lost += 1
            logger.warning(
                "lease of job %r (task %s, attempt %d) was lost while it ran (cancelled, or"
                " expired and reaped): its handler was stopped",
                job.id,
                job.task,
                job.attempt,
                extra=job_fields(job),
            )
        else:  # DRAIN
            self.stats.released += await self._release(job.shard, [job])
