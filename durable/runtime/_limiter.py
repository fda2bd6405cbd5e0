"""A worker's side of the flow limits (issue 35; docs/limits.md): the permit a limited
task's job takes before its handler starts, the wait of a job over its key's limit, and
the release that hands freed permits to the waiters and wakes them.

Ground rules:

- The limits are those Redis holds (``{ns}:limits``): the worker writes its registry's
  declarations when it starts (the last writer wins) and reads them back every
  ``LIMITS_REFRESH`` s. A task without limits there costs a dict look-up per job.
- A limited job fires (the wheel's timer, as any job), then takes a permit in its key's
  slot (limits.lua) before the runner starts it. Over the limit, it goes back to due in
  its shard, unspent (retry.lua mode 3): for a permit, queued in its key's waiters and
  due again at the recheck time; for the rate, due at the start booked for it. Nothing
  of it stays in this process.
- A run's end (its handler returned, was stopped or failed) releases its permit; the
  release hands the freed permits to the first waiters, and each is made due now in
  its shard (wake.lua) and claimed by its shard's owner at once (this worker's next
  round is started right away; another worker's within its poll interval).
- A permit is held under the run's lease: its deadline is the lease's length, pushed
  with every lease extension. A worker killed while a run holds a permit leaks it for
  at most a lease. The recheck time (two leases) bounds the wait of a job whose wake
  was lost the same way (its waker killed between the release and the wake).
- Nothing here raises into the runner: a failed call is counted and logged, and the job
  is left to its lease (the reaper returns it unspent: a pre-start lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from tickwheel.durable.model import Fenced, Job, Limits, PostgresUnavailable, RedisUnavailable
from tickwheel.durable.scheduler import Scheduler
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of

from ._loader_stats import LoaderStats
from ._tasks import TaskRegistry

__all__ = ["LIMITS_REFRESH", "Limiter"]

logger = logging.getLogger("tickwheel.durable")

# Seconds between two reads of the limits of record by one worker.
LIMITS_REFRESH = 1.0
# Permit calls (acquire and wait, release and wakes) one worker has in flight at once.
CALLS_IN_FLIGHT = 32
# Fires a job the gate let through: the runner's fire (key, job, lease end, due).
Admit = Callable[[tuple[int, str], Job, float, "float | None"], None]


class Limiter:
    """The permits of one worker's limited jobs.

    Args:
        scheduler: its store's limit calls and its ownership (fencing).
        registry: the tasks whose declared limits this worker writes.
        stats: where waits are counted.
        lease_ms: the run's lease: a permit's length, and half the recheck time.
        poke: starts the worker's next claim round at once (a woken job is due now).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        stats: LoaderStats,
        *,
        lease_ms: int,
        poke: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.calls = scheduler.store.limits
        self.registry = registry
        self.stats = stats
        self.hold_ms = lease_ms  # a permit's length
        self.recheck_ms = 2 * lease_ms  # a permit waiter's due, unless woken first
        self.poke = poke
        self.admit: Admit | None = None  # the runner's fire, set by the runner
        self.current: dict[str, Limits] = {}  # the limits of record, by task
        self.waiting: dict[str, int] = {}  # jobs waiting, by limited task (at the read)
        # Let through, firing again: the very claim (Job object) its gate admitted. A
        # fire that stops before its gate check (its lease ran out, its shard left)
        # leaves the entry; a later claim of the same id must not pass on it.
        self.admitted: dict[tuple[int, str], Job] = {}
        self.held: dict[tuple[int, str], tuple[Job, Limits]] = {}  # permits held here
        self._loaded: asyncio.Future[None] | None = None  # the first declare and read
        self._read_at = 0.0  # loop time of the last read
        self._tasks: set[asyncio.Task[Any]] = set()  # gates and releases in flight
        # Permit calls in flight at once: a claim of 1,000 limited jobs must not open
        # 1,000 connections (redis-py's pool would grow, then refuse).
        self._calls_room = asyncio.Semaphore(CALLS_IN_FLIGHT)

    # -- the limits of record -------------------------------------------------------

    async def start(self) -> None:
        """Write this worker's declarations, then read the limits of record (once; a
        failure is tried again at the next call or job).

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._loaded is None or (self._loaded.done() and self._loaded.exception()):
            self._loaded = asyncio.ensure_future(self._declare())
        await asyncio.shield(self._loaded)

    async def _declare(self) -> None:
        await self.calls.declare(self.registry.limits())
        await self._read()

    async def _read(self) -> None:
        self._read_at = asyncio.get_running_loop().time()
        self.current = await self.calls.read()
        # The metrics' waiting totals, per limited task (one pipeline; never per key).
        self.waiting = await self.calls.waiting(sorted(self.current))

    async def _ready(self) -> None:
        """The limits of record are known (started once), and not older than
        ``LIMITS_REFRESH`` s (a refresh in the background)."""
        await self.start()
        loop = asyncio.get_running_loop()
        if loop.time() - self._read_at > LIMITS_REFRESH:
            self._read_at = loop.time()
            self._spawn(self._refresh())

    async def _refresh(self) -> None:
        # On a failure the last limits read stay in force until Redis answers again.
        with contextlib.suppress(RedisUnavailable, PostgresUnavailable):
            await self._read()

    # -- the gate (the runner's fire) ---------------------------------------------------

    def gated(self, key: tuple[int, str], job: Job, lease_end: float, due: float | None) -> bool:
        """True if ``job`` must take a permit first (its gate now runs, and fires it
        again once through); False: it starts now. Called once per fired job."""
        if self.admitted.pop(key, None) is job:
            return False
        loaded = self._loaded is not None and self._loaded.done()
        if loaded and job.task not in self.current:
            return False
        if job.duplicate:
            return False  # acked unrun: no run to limit
        self._spawn(self._gate(key, job, lease_end, due))
        return True

    async def _gate(
        self, key: tuple[int, str], job: Job, lease_end: float, due: float | None
    ) -> None:
        try:
            await self._ready()
            lim = self.current.get(job.task)
            if lim is not None:
                async with self._calls_room:
                    granted = await self._acquire(job, lim)
                if not granted:
                    return
                self.held[key] = (job, lim)
                if self.scheduler.ownership.owned.get(job.shard) != job.epoch:
                    self.finished(job)  # the shard left meanwhile: its run is not ours
                    return
            if self.admit is not None:
                self.admitted[key] = job
                self.admit(key, job, lease_end, due)
        except Fenced:
            pass  # counted, and the shard forgotten, by the loader's on_fenced
        except (RedisUnavailable, PostgresUnavailable) as exc:
            self.stats.unavailable += 1
            logger.debug("job %r left to the reaper at its permit (%s)", job.id, exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("job %r left to the reaper at its permit", job.id)

    async def _acquire(self, job: Job, lim: Limits) -> bool:
        """Take ``job``'s permit (True), or hand it back to wait for one (False)."""
        with self.scheduler.ownership.guard(job.shard, job.epoch):
            code, delay = await self.calls.acquire(job, lim, self.hold_ms)
            if code == ACQUIRED:
                return True
            permit = code == PERMIT_WAIT
            wait_ms = self.recheck_ms if permit else max(delay, 1)
            await self.calls.wait(job, wait_ms, permit=permit)
            self.stats.limit_waits += 1
            return False

    # -- the end of a run -----------------------------------------------------------

    def finished(self, job: Job) -> None:
        """A run of ``job`` ended here (its handler returned, failed or was stopped):
        its permit, if it holds one, is released and handed on."""
        held = self.held.pop((job.shard, job.id), None)
        if held is not None:
            self._spawn(self._release(*held))

    async def _release(self, job: Job, lim: Limits) -> None:
        holder = f"{job.epoch}:{job.attempt}"
        await self._hand_on(job.task, job.key, member_of(job), holder, lim)

    async def _hand_on(self, task: str, key: str, member: str, holder: str, lim: Limits) -> None:
        """Release ``member``'s permit, then wake each waiter it was handed to; a waiter
        that no longer waits (cancelled, done, moved) frees its handed permit in turn."""
        todo = [(member, holder)]
        try:
            async with self._calls_room:
                await self._hand_on_all(task, key, todo, lim)
        except (RedisUnavailable, PostgresUnavailable) as exc:
            # The permit runs out at its deadline; a waiter not woken is due at its
            # recheck time.
            self.stats.unavailable += 1
            logger.debug("permit of %r left to its deadline (%s)", member, exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("permit of %r left to its deadline", member)

    async def _hand_on_all(
        self, task: str, key: str, todo: list[tuple[str, str]], lim: Limits
    ) -> None:
        while todo:
            member, holder = todo.pop()
            woken = await self.calls.release(
                task, key, member, holder, lim=lim, hold_ms=self.hold_ms
            )
            for waiter in woken:
                if await self.calls.wake(task, waiter) == 0:
                    todo.append((waiter, ""))
                else:
                    self.stats.limit_wakes += 1
            if woken and self.poke is not None:
                self.poke()

    async def extend(self, job: Job) -> None:
        """Push the permit ``job``'s run holds (if any) with its lease."""
        held = self.held.get((job.shard, job.id))
        if held is not None:
            await self.calls.extend(job, held[1], self.hold_ms)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the gates and releases in flight (a drain, before the worker ends)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
