"""One claimed job's publish handoff: publish, then ack; or give the lease back unrun.

Ground rules:

- The lease is cleared (acked) only after the broker confirmed the publish.
- A publish the broker did not confirm (:class:`BrokerUnavailable`: down, a nack, no
  confirm in time) costs no attempt: the job is released at the same attempt
  (``release.lua``), due again after a back-off, and published again then. A broker
  outage longer than ``max_attempts x lease`` dead-letters nothing.
- The publish waits at most until shortly before the lease ends, so the release comes
  while the lease is still held (an expired lease would be the reaper's, which charges
  an attempt).
- The back-off doubles with each unconfirmed publish in a row, from
  :data:`BACKOFF_FIRST` to :data:`BACKOFF_CAP` seconds, with jitter; a confirm resets it.
  During an outage each job is tried about once per cap, so a worker does not spin.
- A publish that failed in any other way (a bug, an unencodable message) is a failed
  attempt, retried with the task's backoff, as before.
- A release that cannot be written (Redis is down too) leaves the lease to the reaper.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from tickwheel.durable.model import BrokerUnavailable, Job
from tickwheel.durable.scheduler import RELEASED

from ._logs import job_fields, logger

if TYPE_CHECKING:
    from ._runner import Runner
    from ._stream import Publisher

__all__ = ["BACKOFF_CAP", "BACKOFF_FIRST", "Handoff"]

# Seconds before a job whose publish was not confirmed is due again: the first time in
# a row, and at most.
BACKOFF_FIRST = 0.2
BACKOFF_CAP = 5.0
# The part of what is left of a lease that a publish may wait for its confirm; the rest
# is for the release.
_WAIT_SHARE = 0.75


class Handoff:
    """Publish fired jobs; ack each after its confirm, or release it after a back-off.

    Args:
        publisher: the broker.
        runner: the runner whose jobs these are (its scheduler, wheel, ack batcher,
            failures, counters and outage log).
    """

    def __init__(self, publisher: Publisher, runner: Runner) -> None:
        self.publisher = publisher
        self.scheduler = runner.scheduler  # whose leases are released
        self.wheel = runner.wheel  # lease ends are in its time
        self._acks = runner._acks  # a confirmed job's lease is cleared through it
        self._failures = runner._failures  # a publish that failed otherwise: a retry
        self.stats = runner.stats  # released, unavailable
        self.outages = runner.outages  # one line when the broker goes, one when back
        self.streak = 0  # unconfirmed publishes in a row (0: the broker confirms)
        self.given_back = 0  # jobs released unrun, no attempt spent, after no confirm

    @classmethod
    def maybe(cls, publisher: Publisher | None, runner: Runner) -> Handoff | None:
        """A handoff to ``publisher``; None without one (the worker runs tasks)."""
        return None if publisher is None else cls(publisher, runner)

    def backoff(self) -> float:
        """Seconds until a job given back now is due again (with jitter)."""
        base = min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** min(self.streak, 16))
        return base * random.uniform(0.75, 1.0)

    async def publish(self, job: Job, lease_end: float) -> None:
        """Publish ``job`` then submit its ack; without a confirm, give it back.

        Raises:
            RedisUnavailable, Fenced, LeaseLost: from the release or the retry (the
                runner's to count; the reaper recovers the job).
        """
        wait = (lease_end - self.wheel.time()) * _WAIT_SHARE
        try:
            if wait <= 0:
                raise BrokerUnavailable("no time left in the lease to publish")
            try:
                async with asyncio.timeout(wait):
                    await self.publisher.publish(job)
            except TimeoutError:
                raise BrokerUnavailable(f"no confirm within {wait:.3f}s") from None
        except BrokerUnavailable as exc:
            self.streak += 1
            self.outages.failed("publish", exc)
            await self._give_back(job, lease_end, exc)
            return
        except Exception as exc:
            # Published or not, we cannot tell: retry (a duplicate is dropped downstream).
            await self._failures.failed(job, exc, "publishing ")
            return
        if self.streak:
            self.streak = 0
            self.outages.ok("publish")
        self._acks.submit(job, lease_end)

    async def _give_back(self, job: Job, lease_end: float, exc: BrokerUnavailable) -> None:
        """Release ``job`` at its attempt, due again after the back-off (Redis's clock:
        the lease's deadline less what is left of it here)."""
        delay = self.backoff()
        left_ms = (lease_end - self.wheel.time()) * 1000
        due_ms = int(job.deadline_ms - left_ms + delay * 1000)
        self.stats.unavailable += 1
        leases = self.scheduler.leases
        (ok,) = await leases.release([job], due_ms=max(due_ms, job.due_ms + 1))
        if ok:
            self.stats.released += 1
            self.given_back += 1
            if self.scheduler.tracer is not None:  # its run span ends "released"
                self.scheduler.tracer.settle(job, RELEASED)
        logger.debug(
            "job %r not confirmed (%s): %s, due again in %.2fs",
            job.id,
            exc,
            "given back" if ok else "lease already lost",
            delay,
            extra=job_fields(job),
        )
