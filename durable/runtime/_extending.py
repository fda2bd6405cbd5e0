"""The lease extension of a handler that runs long: started by a wheel timer when half
its lease is left (most handlers end before: no task is made for them), then every
half lease until it returns, or until its timeout plus the grace passed. A lease found
lost (the job was cancelled, or the reaper took it) stops the handler.
"""

from __future__ import annotations

import asyncio
import contextlib

from tickwheel.durable.model import Fenced, Job, LeaseLost, RedisUnavailable
from tickwheel.durable.scheduler import Scheduler
from tickwheel.wheel import TimingWheel

from ._limiter import Limiter
from ._loader_stats import LoaderStats
from ._stopping import Stopper

__all__ = ["LeaseExtender", "first_extension"]


def first_extension(now: float, lease_end: float, half_lease: float, lead: float | None) -> float:
    """When a started handler's lease is first extended (wheel time): when half a lease
    is left; or, for a pre-start lease (``lead``: a quarter of the start margin), within
    ``lead`` of the start and ``lead`` before the pre-start lease ends. That extension
    marks the run started (reap.lua then charges an attempt); a handler that returned
    before it was acked without one, and costs no extension (nor a task)."""
    if lead is None:
        return max(now, lease_end - half_lease)
    return max(now, min(now + lead, lease_end - lead))


class LeaseExtender:
    """Extend the leases of running handlers.

    Args:
        scheduler: its leases are extended.
        wheel: the clock the ``until`` limits are in.
        stats: where extensions are counted.
        stopper: stops a handler whose lease was found lost.
        lease_ms: the run time a lease covers; extended every half of it.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        wheel: TimingWheel,
        stats: LoaderStats,
        stopper: Stopper,
        *,
        lease_ms: int,
    ) -> None:
        self.leases = scheduler.leases
        self.wheel = wheel
        self.stats = stats
        self._stopper = stopper
        self.lease_ms = lease_ms
        self._half_lease = lease_ms / 2000
        self._extenders: set[asyncio.Future[None]] = set()  # running
        self.limiter: Limiter | None = None  # its permits are extended with the leases

    def first_deadline(
        self,
        job: Job,
        finished: asyncio.Event,
        task: asyncio.Task[None],
        expires: float,
        halfway_at: float,
    ) -> None:
        """The first of a timed handler's two deadlines came (a wheel callback): its
        timeout (stop it) or half its lease (start extending it); set the other one. A
        timer set here is not cancelled when the handler returns: each callback checks
        that the handler still runs (a few stay in the wheel until their time, doing
        nothing then)."""
        if finished.is_set():
            return
        until = expires + self._stopper.grace
        if expires <= halfway_at:
            self._stopper.expire(job, task)
            self.wheel.schedule_at(halfway_at, self.spawn, job, finished, task, until)
        else:
            self.spawn(job, finished, task, until)
            self.wheel.schedule_at(expires, self._stopper.expire, job, task)

    def spawn(
        self, job: Job, finished: asyncio.Event, task: asyncio.Task[None], until: float
    ) -> None:
        """Start extending the lease of ``job`` (a wheel callback), unless its handler
        is ``finished``."""
        if not finished.is_set():
            extender = asyncio.ensure_future(self._extend(job, finished, task, until))
            self._extenders.add(extender)
            extender.add_done_callback(self._extenders.discard)

    async def _extend(
        self, job: Job, finished: asyncio.Event, task: asyncio.Task[None], until: float
    ) -> None:
        """Extend a running job's lease now and every half lease until ``finished``, or
        until ``until`` (wheel time: its timeout plus the grace) passed. A lease found
        lost (the job was cancelled, or the reaper took it) stops the handler."""
        while not finished.is_set() and self.wheel.time() < until:
            try:
                await self.leases.extend(job, self.lease_ms / 1000)
            except LeaseLost:
                self._stopper.lost(job, task)  # nothing to ack or retry now
                return
            except Fenced:
                return  # the ack will say so and count it
            except RedisUnavailable:
                pass
            else:
                self.stats.extended += 1
                if self.limiter is not None:  # the permit of its key with its lease
                    with contextlib.suppress(RedisUnavailable):
                        await self.limiter.extend(job)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self._half_lease)
