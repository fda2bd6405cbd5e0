"""A failed attempt: its retry (or its dead letter) written with the failure, counted,
then logged.

Ground rules:

- The failure kept with the job is :func:`failure_text` (its repr and the tail of its
  traceback); the line is a WARNING when the job will be retried, an ERROR when it is
  dead, both with the exception.
- A retry that cannot be written is still logged (WARNING), and its error raised on:
  the lease expires and the reaper retries the job.
- A job no retry can mend (an undecodable payload, an unknown task) is dead-lettered at
  once, with the reason.
"""

from __future__ import annotations

from tickwheel.durable.model import Defer, Job, JobState, LeaseLost
from tickwheel.durable.scheduler import (
    DEAD,
    DEFERRED,
    LEASE_LOST,
    RETRIED,
    TIMED_OUT,
    UNSETTLED,
    Scheduler,
)

from ._history import DEAD as DEAD_OUTCOME
from ._history import DEFERRED as DEFERRED_OUTCOME
from ._history import RETRIED as RETRIED_OUTCOME
from ._loader_stats import LoaderStats
from ._logs import failure_text, job_fields, logger

__all__ = ["Failures"]


class Failures:
    """Write and log the retries and dead letters of failed runs.

    Args:
        scheduler: its leases write the retries.
        stats: where the retried and dead jobs are counted.
    """

    def __init__(self, scheduler: Scheduler, stats: LoaderStats) -> None:
        self.leases = scheduler.leases
        self.stats = stats
        self.tracer = scheduler.tracer  # run spans (None: tracing off)

    async def failed(
        self, job: Job, exc: BaseException, doing: str = "", timed_out: bool = False
    ) -> None:
        """Write the retry (or the dead letter) of a failed run, its traceback kept with
        the job, then log it: WARNING when it will be retried, ERROR when it is dead,
        with the exception. If the retry cannot be written, the failure is still logged
        (WARNING) and the error raised on (the lease expires: the reaper retries it).
        A :class:`Defer` is no failure: :meth:`deferred` writes it."""
        if isinstance(exc, Defer) and not timed_out:
            await self.deferred(job, exc)
            return
        text = failure_text(exc)
        try:
            state = await self.leases.retry(job, text)
        except BaseException as unwritten:
            if self.tracer is not None:
                lost = isinstance(unwritten, LeaseLost)
                self.tracer.settle(job, LEASE_LOST if lost else UNSETTLED, unwritten)
            logger.warning(
                "%sjob %r (task %s) failed at attempt %d/%d; its retry was not written (%r)",
                doing,
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                unwritten,
                exc_info=exc,
                extra=job_fields(job),
            )
            raise
        self.count(job, state, text)
        if self.tracer is not None:
            outcome = DEAD if state is JobState.DEAD else RETRIED
            self.tracer.settle(job, TIMED_OUT if timed_out else outcome, exc, outcome)
        if state is JobState.DEAD:
            self.log_dead(job, f"{doing}failed: {exc!r}", exc)
            return
        logger.warning(
            "%sjob %r (task %s) failed at attempt %d/%d, will retry: %r",
            doing,
            job.id,
            job.task,
            job.attempt,
            job.max_attempts,
            exc,
            exc_info=exc,
            extra=job_fields(job),
        )

    async def deferred(self, job: Job, request: Defer) -> None:
        """Hand the job back for later, its attempt unspent (the handler raised
        ``request``), logged at DEBUG; if that cannot be written, the lease expires and
        the reaper retries it (that attempt is spent)."""
        try:
            when = await self.leases.defer(job, request.seconds)
        except BaseException as unwritten:
            if self.tracer is not None:
                lost = isinstance(unwritten, LeaseLost)
                self.tracer.settle(job, LEASE_LOST if lost else UNSETTLED, unwritten)
            logger.warning(
                "job %r (task %s) deferred for %g s; the deferral was not written (%r)",
                job.id,
                job.task,
                request.seconds,
                unwritten,
                extra=job_fields(job),
            )
            raise
        self.stats.deferred += 1
        if self.stats.history is not None:
            self.stats.history.ended(job, DEFERRED_OUTCOME)
        if self.tracer is not None:
            self.tracer.settle(job, DEFERRED)
        logger.debug(
            "job %r (task %s) deferred to %d, attempt %d kept",
            job.id,
            job.task,
            when,
            job.attempt,
            extra=job_fields(job),
        )

    async def dead(self, job: Job, reason: str) -> None:
        """Dead-letter ``job`` at once with ``reason`` (no retry would mend it)."""
        self.count(job, await self.leases.retry(job, reason, final=True), reason)
        if self.tracer is not None:
            self.tracer.settle(job, DEAD, reason)
        self.log_dead(job, reason)

    def count(self, job: Job, state: JobState, error: str) -> None:
        """Count a failed attempt's retry or dead letter (and record it, with the first
        line of ``error``)."""
        history = self.stats.history
        if history is not None:
            history.ended(job, DEAD_OUTCOME if state is JobState.DEAD else RETRIED_OUTCOME, error)
        if state is JobState.DEAD:
            self.stats.dead += 1
            self.stats.tasks.dead(job.task)
        else:
            self.stats.retried += 1
            self.stats.tasks.retried(job.task)

    @staticmethod
    def log_dead(job: Job, reason: str, exc: BaseException | None = None) -> None:
        logger.error(
            "job %r dead-lettered (task %s, attempt %d/%d): %s",
            job.id,
            job.task,
            job.attempt,
            job.max_attempts,
            reason,
            exc_info=exc,
            extra={**job_fields(job), "reason": reason},
        )
