"""The loader: claim durable jobs shortly before they fall due, fire them in the wheel,
run them and ack them. This room composes the three that do it (:class:`Claimer` in
``_claims.py``, :class:`Runner` in ``_runner.py``, :class:`AckBatcher` in ``_acks.py``)
and holds what spans them: starting and stopping, handing jobs back, and draining.

Ground rules:

- A :class:`Fenced` claim, ack, retry or extend drops the shard and every job of it that
  is loaded but not started (their leases belong to a stale epoch: the new owner gets
  them back from the reaper).
- Every job leaves memory through exactly one of: ack, retry (or dead), release, or
  drop (fenced / lease lost / Redis unavailable, recovered by the reaper). Nothing here
  crashes the loop: errors are counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from tickwheel.durable.model import (
    PRIORITY_AGING,
    Fenced,
    Job,
    LatenessHistogram,
    aging_ms,
    finite_seconds_ms,
    int_between,
)
from tickwheel.durable.scheduler import DEFAULT_LEASE, MAX_BATCH, Scheduler
from tickwheel.wheel import TimingWheel

from ._acks import AckBatcher
from ._claims import (
    DEFAULT_LIMIT,
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_LOADED,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_START_MARGIN,
    Claimer,
)
from ._limiter import Limiter
from ._loader_stats import LoaderStats
from ._logs import OUTAGE_ERRORS, Outages
from ._runner import DEFAULT_MAX_RUNNING, Runner
from ._stream import Publisher
from ._tasks import TaskRegistry, check_timeout

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_LOADED",
    "DEFAULT_MAX_RUNNING",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_START_MARGIN",
    "Loader",
    "LoaderStats",
]

logger = logging.getLogger("tickwheel.durable")

# How long (s) a cancelled task gets to unwind before the loader stops waiting for it.
CANCEL_GRACE = 1.0


class Loader:
    """Claim due jobs of the owned shards into a wheel, run their tasks, ack them.

    Args:
        scheduler: the scheduler whose ownership says which shards to claim.
        registry: the tasks to run, by name.
        wheel: the timing wheel to place jobs in (on the running loop).
        lookahead: claim jobs due within this many seconds.
        lease: seconds of run time a lease covers; extended every half of it.
        limit: jobs per shard per claim.
        poll_interval: seconds between claim rounds.
        max_loaded: stop claiming while this many jobs are loaded or running.
        max_running: run at most this many tasks at once; due jobs beyond it wait (in
            due order) for a free slot.
        publisher: hand each due job to this broker instead of running a task (the
            publish handoff, see ``_stream.py``); the registry is then not consulted.
        outages: where store outages are reported, logged once when each starts and
            once when it ends (a worker shares one with its other loops).
        default_timeout: seconds a handler may run when its task sets no timeout of
            its own (None: no limit); a run past it fails with the reason ``timeout``.
        start_margin: seconds of the pre-start lease past the lookahead (default
            :data:`DEFAULT_START_MARGIN`): a claim leases its jobs for
            ``lookahead + start_margin`` only, and a run's start extends its lease to
            ``lease`` (and marks it started). A worker that dies with jobs claimed but
            not started leaves them to the reaper within that, not a whole lease, and
            at the same attempt. A job that waits for a slot is shed when half the
            margin is left. None: claims lease ``lookahead + lease`` (no pre-start).
        priority_aging: seconds (default :data:`PRIORITY_AGING`, 60) after which a late
            job is claimed before any priority, oldest first: the bound on a low
            priority's wait under a sustained higher backlog. None: no aging.

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        wheel: TimingWheel,
        *,
        lookahead: float | timedelta = DEFAULT_LOOKAHEAD,
        lease: float | timedelta = DEFAULT_LEASE,
        limit: int = DEFAULT_LIMIT,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL,
        max_loaded: int = DEFAULT_MAX_LOADED,
        max_running: int = DEFAULT_MAX_RUNNING,
        publisher: Publisher | None = None,
        outages: Outages | None = None,
        default_timeout: float | None = None,
        start_margin: float | timedelta | None = DEFAULT_START_MARGIN,
        priority_aging: float | timedelta | None = PRIORITY_AGING,
    ) -> None:
        if not isinstance(registry, TaskRegistry):
            raise TypeError(f"registry must be a TaskRegistry, got {registry!r}")
        for name, value, top in (
            ("limit", limit, MAX_BATCH),
            ("max_loaded", max_loaded, None),
            ("max_running", max_running, None),
        ):
            int_between(name, value, 1, top)
        default_timeout = check_timeout(default_timeout)
        aging_ms(priority_aging)  # checked here, at construction
        if isinstance(priority_aging, timedelta):
            priority_aging = priority_aging.total_seconds()
        self.scheduler = scheduler  # claims, acks, owned shards
        self.registry = registry  # task name -> function
        self.wheel = wheel  # where loaded jobs wait
        self.lookahead_ms = finite_seconds_ms("lookahead", lookahead)
        self.lease_ms = finite_seconds_ms("lease", lease, minimum_ms=2)
        # The pre-start margin (ms), at most a lease; None: no pre-start leases.
        self.start_ms = (
            None
            if start_margin is None
            else min(self.lease_ms, finite_seconds_ms("start_margin", start_margin, minimum_ms=1))
        )
        self.limit = limit  # per shard per claim
        self.poll_ms = finite_seconds_ms("poll_interval", poll_interval, minimum_ms=1)
        self.max_loaded = max_loaded  # loaded + running cap
        self.max_running = max_running  # concurrent tasks
        self.publisher = publisher  # publish handoff instead of tasks, when set
        self.stats = LoaderStats()  # counters, shared by the rooms below
        self.outages = outages if outages is not None else Outages()  # logged once each
        # Acks that arrive together share a call; it counts their outcomes in stats.
        self._acks = AckBatcher(scheduler, wheel, self.stats, self.outages)
        # Fired jobs' handlers, in max_running slots; sheds through _release.
        self._runner = Runner(
            scheduler,
            registry,
            wheel,
            self.stats,
            self._acks,
            lease_ms=self.lease_ms,
            max_running=max_running,
            publisher=publisher,
            release=self._release,
            outages=self.outages,
            default_timeout=default_timeout,
            start_ms=self.start_ms,
        )
        scheduler.ownership.on_fenced(self._on_fenced)
        # The claim rounds, and the jobs they placed in the wheel.
        self._claims = Claimer(
            scheduler,
            wheel,
            self.stats,
            self._runner,
            lookahead_ms=self.lookahead_ms,
            lease_ms=self.lease_ms,
            limit=limit,
            poll_ms=self.poll_ms,
            max_loaded=max_loaded,
            outages=self.outages,
            start_ms=self.start_ms,
            held=None if self.start_ms is None else self._held,
            claiming=None if self.start_ms is None else self._acks.claiming,
            priority_aging=priority_aging,
        )
        self._runner.limiter.poke = self._claims.poke  # a woken waiter is claimed now
        self._runner.limiter.claim_now = self._claims.claim_now  # ... in its shard only
        if scheduler.pg is None:  # woken and leased in one call (Postgres: claimed)
            self._runner.limiter.take_woken = self._claims.take_woken
        # Firing lateness (s): loop time at firing minus the job's due in loop time.
        self.lateness: LatenessHistogram = self._claims.lateness
        # Held while a shard is claimed and placed: giving a shard back takes it, so no
        # claim reply lands after the shard's jobs were released.
        self.lock: asyncio.Lock = self._claims.lock

    # -- inspection ----------------------------------------------------------------

    @property
    def loaded(self) -> int:
        """Jobs loaded and not started: in the wheel, or due and waiting for a slot."""
        return self._claims.placed + self._runner.waiting

    @property
    def limiter(self) -> Limiter:
        """The flow limits' side of this loader's runs (``_limiter.py``)."""
        return self._runner.limiter

    @property
    def running(self) -> int:
        """Jobs fired and not settled: their handler runs, or their ack or retry is
        still to be written."""
        return self._runner.running

    # -- starting and stopping -----------------------------------------------------

    async def load_once(self) -> bool:
        """One claim round over the owned shards.

        Returns:
            True if some shard returned a full batch (more may be due: claim again now).

        Raises:
            RedisUnavailable: if Redis cannot be reached (nothing is lost: the jobs stay
                due, or leased until the reaper returns them).
        """
        return await self._claims.load_once()

    async def run(self) -> None:
        """Forever: :meth:`load_once`, then wait ``poll_interval`` unless a batch was
        full. Redis outages are logged and waited out. Returns after
        :meth:`stop_claiming`, once the current round is placed (cancelling the task
        instead may strand a claimed batch until its lease expires)."""
        await self._claims.run()

    def stop_claiming(self) -> None:
        """Claim nothing more (a shutdown has begun)."""
        self._claims.stop()

    # -- handing back --------------------------------------------------------------

    def _on_fenced(self, shard: int, epoch: int) -> None:
        """The ownership saw a call under ``epoch`` refused (by whichever layer made it):
        count it and forget the shard's loaded jobs of that epoch or older."""
        self.stats.fenced += 1
        dropped = self.drop_shard(shard, epoch)
        if dropped:  # the fencing itself is logged once, by the ownership
            logger.info("forgot %d loaded job(s) of fenced shard %d", dropped, shard)

    def drop_shard(self, shard: int, epoch: int | None = None) -> int:
        """Forget the loaded jobs of ``shard`` without a Redis call (it is fenced): all
        of them, or those leased under ``epoch`` or before (a late refusal must not
        forget the jobs of the shard taken again since).

        Returns:
            How many were dropped.
        """
        placed = self._claims.drop_placed(shard, epoch)
        return placed + self._runner.drop_waiting(shard, epoch)

    def _held(self, job: Job) -> bool:
        """Is ``job``'s very lease run (its handler) or acked here (waiting, or acked
        while the claim that returned it again was in flight)?"""
        return self._runner.runs(job) or self._acks.holds(job)

    async def release_shard(self, shard: int) -> int:
        """Hand the loaded, unfired jobs of ``shard`` back to due at once.

        Returns:
            How many were released.
        """
        by_epoch: dict[int, list[Job]] = {}
        for job in self._claims.take_placed(shard) + self._runner.take_waiting(shard):
            by_epoch.setdefault(job.epoch, []).append(job)
        released = 0
        for jobs in by_epoch.values():
            released += await self._release(shard, jobs)
        self.stats.released += released
        return released

    async def _release(self, shard: int, jobs: list[Job]) -> int:
        """Release jobs of one shard and epoch; how many were. A refusal is counted and
        logged, not raised: the reaper returns what was not released."""
        released = 0
        for job in jobs:  # unstarted: a permit its claim took is freed (Limiter.unstarted)
            self._runner.limiter.unstarted(job)
        try:
            for i in range(0, len(jobs), MAX_BATCH):
                released += sum(await self.scheduler.leases.release(jobs[i : i + MAX_BATCH]))
        except Fenced:
            pass  # the ownership dropped the shard and told _on_fenced
        except OUTAGE_ERRORS as exc:
            self.stats.unavailable += 1
            self.outages.failed("release", exc)
            logger.debug("release left to the reaper (%s)", exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("release left to the reaper")
        return released

    async def release_all(self) -> int:
        """Hand back every loaded, unfired job (stop claiming first).

        Returns:
            How many were released.
        """
        shards = sorted(self._claims.placed_shards() | self._runner.waiting_shards())
        return sum([await self.release_shard(shard) for shard in shards])

    def stop_job(self, job_id: str) -> bool:
        """Stop the handler of job ``job_id`` if it runs here, or forget it if it is
        loaded here and not started (its job was cancelled); see
        :meth:`Runner.stop_job`. True if it was here."""
        if self._runner.stop_job(job_id):
            return True
        if self._claims.drop_one((self.scheduler.keys.shard_of(job_id), job_id)):
            self.stats.cancelled += 1
            return True
        return False

    def close(self) -> None:
        """Let go of the runner's thread pool (after :meth:`drain`)."""
        self._runner.close()

    # -- draining ------------------------------------------------------------------

    async def drain(self, grace: float | None = None, shard: int | None = None) -> int:
        """Wait for the fired jobs (of ``shard``, or all) to settle: their tasks, then
        their acks; cancel what still runs ``grace`` s after the call. The acks get at
        least ``CANCEL_GRACE`` s even when the tasks took all of ``grace``: a handler
        that returned at the deadline did run, and its ack is what keeps it from
        running again.

        A task whose handler still runs at ``grace`` has its handler cancelled and its
        job released unrun (same attempt) for another worker to claim. A task cancelled
        after its handler returned (its retry being written) is neither acked nor
        retried, and a cancelled ack call leaves its jobs leased: their leases expire
        and the reaper hands them out again.

        Returns:
            How many tasks and ack calls were cancelled.
        """
        loop = asyncio.get_running_loop()
        end = None if grace is None else loop.time() + grace
        cancelled = 0
        tasks = self._runner.tasks(shard)
        for least in (0.0, CANCEL_GRACE):
            if least:  # the acks: the tasks just waited for have submitted theirs
                tasks = self._acks.flushes(shard)
            if not tasks:
                continue
            _, pending = await asyncio.wait(
                tasks, timeout=None if end is None else max(least, end - loop.time())
            )
            for task in pending:
                if least:
                    task.cancel()
                else:
                    self._runner.stop_for_drain(task)
            if pending:
                # Bounded: a task may swallow its cancellation (redis-py can, mid-command).
                await asyncio.wait(pending, timeout=CANCEL_GRACE)
            cancelled += len(pending)
        return cancelled
