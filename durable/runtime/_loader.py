"""The loader: claim durable jobs shortly before they fall due and fire them in the wheel.

Ground rules:

- Only shards this process owns are claimed, with their epoch; a :class:`Fenced` claim,
  ack, retry or extend drops the shard and every job of it that is loaded but not fired
  (their leases belong to a stale epoch: the new owner gets them back from the reaper).
- Never early: a job is placed at ``t_reply + (due_ms - now_ms) / 1000`` in loop time,
  where ``now_ms`` is Redis's now inside the claim script (plus the whole ms the claim
  spent after its reply, in the Postgres mode) and ``t_reply`` is ``loop.time()`` once
  the claim returned. The reply comes after the script ran, so the placement can only
  be late (by the round trip), never early.
- A loaded job holds a lease of ``lookahead + lease``: it covers the wait in the wheel
  and one lease of run time; a running task's lease is extended every ``lease / 2``.
- A job whose lease has run out by the local clock when it fires (the loop or the
  process stalled) is not run: the reaper may already have handed it to another owner.
  The lease deadline is placed from ``loop.time()`` *before* the claim was sent, so this
  check errs towards not running.
- Backpressure: while ``max_running`` fired jobs wait for a task slot (as many as
  run), the loader claims nothing more; a job that waited until only half a lease is
  left is released (same attempt) for this or another worker to claim again. Without
  that, a backlog outlived its leases in the queue and went to the dead letters unrun,
  an attempt at a time.
- Every job leaves memory through exactly one of: ack, retry (or dead), release, or
  drop (fenced / lease lost / Redis unavailable, recovered by the reaper). Nothing here
  crashes the loop: errors are counted and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Coroutine
from datetime import timedelta

from tickwheel.durable.model import (
    Fenced,
    Job,
    JobState,
    LatenessHistogram,
    LeaseLost,
    NotOwner,
    PostgresUnavailable,
    RedisUnavailable,
    finite_seconds_ms,
    int_between,
)
from tickwheel.durable.scheduler import DEFAULT_LEASE, MAX_BATCH, Scheduler
from tickwheel.wheel import Timer, TimingWheel

from ._acks import UNAVAILABLE, AckBatcher
from ._loader_stats import LoaderStats
from ._stream import Publisher
from ._tasks import TaskContext, TaskFunc, TaskRegistry, call_task

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_LOADED",
    "DEFAULT_MAX_RUNNING",
    "DEFAULT_POLL_INTERVAL",
    "Loader",
    "LoaderStats",
]

logger = logging.getLogger("tickwheel.durable")

# How far ahead jobs are claimed (s). Long enough to hide a claim round trip and a poll
# interval, short enough that a crash strands few jobs until their lease expires.
DEFAULT_LOOKAHEAD = 1.0
# Pause between claim rounds (s) when no shard had a full batch: jobs are claimed
# `lookahead` early, so a poll of a tenth of it never makes one late.
DEFAULT_POLL_INTERVAL = 0.1
# Claimed per shard per call: the source document's LIMIT 500 per 100 ms poll.
DEFAULT_LIMIT = 500
# Jobs loaded or running before the loader stops claiming: bounds memory when the
# handlers fall behind (the rest stays due in Redis for other workers).
DEFAULT_MAX_LOADED = 50_000
# Wait after Redis was unreachable (s): long enough not to spin, short next to a lease.
UNAVAILABLE_BACKOFF = 0.5
# Tasks running at once. Each may hold two Redis connections (its ack and its lease
# extension), and redis-py's asyncio pool refuses more than 100 by default
# (MaxConnectionsError): 32 tasks keep the loader, reaper and renewals well inside it.
# Measured ~5,400-7,000 jobs/s per process with no-op tasks (bench: spill load+fire).
DEFAULT_MAX_RUNNING = 32
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
    ) -> None:
        if not isinstance(registry, TaskRegistry):
            raise TypeError(f"registry must be a TaskRegistry, got {registry!r}")
        for name, value, top in (
            ("limit", limit, MAX_BATCH),
            ("max_loaded", max_loaded, None),
            ("max_running", max_running, None),
        ):
            int_between(name, value, 1, top)
        self.scheduler = scheduler  # claims, acks, owned shards
        self.registry = registry  # task name -> function
        self.wheel = wheel  # where loaded jobs wait
        self.lookahead_ms = finite_seconds_ms("lookahead", lookahead)
        self.lease_ms = finite_seconds_ms("lease", lease, minimum_ms=2)
        self.limit = limit  # per shard per claim
        self.poll_ms = finite_seconds_ms("poll_interval", poll_interval, minimum_ms=1)
        self.max_loaded = max_loaded  # loaded + running cap
        self.max_running = max_running  # concurrent tasks
        self.publisher = publisher  # publish handoff instead of tasks, when set
        self.stats = LoaderStats()  # counters
        # Acks that arrive together share a call; it counts their outcomes in stats.
        self._acks = AckBatcher(scheduler, wheel, self.stats)
        # Task name -> True when its function is a coroutine function (it runs in a task
        # of its own); a plain function runs in the wheel's callback that fires its job.
        # By name, not by function: a registered callable need not be hashable, and a
        # name is never registered twice.
        self._is_async: dict[str, bool] = {}
        scheduler.ownership.on_fenced(self._on_fenced)
        # Firing lateness (s): loop time at firing minus the job's due in loop time.
        self.lateness = LatenessHistogram()
        # (shard, job id) -> (job, its wheel timer, loop time its lease runs out, loop
        # time it is due: Redis's due converted with the claim's offset)
        self._loaded: dict[tuple[int, str], tuple[Job, Timer, float, float]] = {}
        self._running: dict[asyncio.Task[None], Job] = {}  # tasks of fired jobs
        # Of those, the ones whose handler has not returned: the slots max_running counts.
        # A task that only waits for its ack (or retry) left its slot: in the Postgres
        # mode that wait is a commit, and holding the slot through it capped a worker at
        # max_running commits' worth of jobs per second.
        self._busy = 0
        # (shard, job id) -> (job, lease end, its shed timer): fired while max_running
        # tasks ran; FIFO
        self._ready: dict[tuple[int, str], tuple[Job, float, Timer]] = {}
        self._to_shed: list[Job] = []  # waited too long for a slot: to be released
        self._shedding: set[asyncio.Task[None]] = set()  # their release calls
        self._room = asyncio.Event()  # set when the ready queue fell below max_running
        self._extenders: set[asyncio.Future[None]] = set()  # lease extenders running
        self._claiming = True  # False once stop_claiming() was called
        # Held while a shard is claimed and placed: giving a shard back takes it, so no
        # claim reply lands after the shard's jobs were released.
        self.lock = asyncio.Lock()
        self._stopped = asyncio.Event()  # set by stop_claiming(): wakes run()

    # -- inspection ----------------------------------------------------------------

    @property
    def loaded(self) -> int:
        """Jobs loaded and not started: in the wheel, or due and waiting for a slot."""
        return len(self._loaded) + len(self._ready)

    @property
    def running(self) -> int:
        """Jobs fired and not settled: their handler runs, or their ack or retry is
        still to be written."""
        return len(self._running) + self._acks.waiting

    # -- claiming ------------------------------------------------------------------

    async def load_once(self) -> bool:
        """One claim round over the owned shards.

        Returns:
            True if some shard returned a full batch (more may be due: claim again now).

        Raises:
            RedisUnavailable: if Redis cannot be reached (nothing is lost: the jobs stay
                due, or leased until the reaper returns them).
        """
        full = False
        loop = asyncio.get_running_loop()
        lease_ms = self.lookahead_ms + self.lease_ms
        for shard in list(self.scheduler.ownership.owned):
            if not self._claiming or self.loaded + self.running >= self.max_loaded:
                break
            if len(self._ready) >= self.max_running:  # a slot's worth waits per slot
                self._room.clear()
                break
            async with self.lock:
                t_sent = loop.time()
                try:
                    batch = await self.scheduler.claim(
                        shard,
                        limit=self.limit,
                        lookahead=self.lookahead_ms / 1000,
                        lease=lease_ms / 1000,
                    )
                except Fenced:  # counted, and the shard forgotten, by _on_fenced
                    continue
                except NotOwner:  # given back while we were claiming another shard
                    continue
                t_reply = loop.time()
                self.stats.claimed += len(batch.jobs)
                full = full or len(batch.jobs) + batch.dropped + batch.moved >= self.limit
                for job in batch.jobs:
                    self._place(
                        job,
                        t_reply + (job.due_ms - batch.now_ms) / 1000,
                        t_sent + (job.deadline_ms - batch.now_ms) / 1000,
                    )
        return full

    def _place(self, job: Job, when: float, lease_end: float) -> None:
        key = (job.shard, job.id)
        old = self._loaded.pop(key, None)
        if old is not None:  # a stale copy (its lease was lost): forget it
            old[1].cancel()
        timer = self.wheel.schedule_at(when, self._fire, key)
        self._loaded[key] = (job, timer, lease_end, when)

    async def run(self) -> None:
        """Forever: :meth:`load_once`, then wait ``poll_interval`` unless a batch was
        full. Redis outages are logged and waited out. Returns after
        :meth:`stop_claiming`, once the current round is placed (cancelling the task
        instead may strand a claimed batch until its lease expires)."""
        while self._claiming:
            try:
                full = await self.load_once()
            except (RedisUnavailable, PostgresUnavailable) as exc:
                self.stats.unavailable += 1
                logger.warning("tickwheel.durable: loader cannot reach its store (%s)", exc)
                await self._pause(UNAVAILABLE_BACKOFF)
                continue
            except Exception:  # a bug or a server error: keep the other shards going
                self.stats.errors += 1
                logger.exception("tickwheel.durable: claim round failed")
                await self._pause(UNAVAILABLE_BACKOFF)
                continue
            if len(self._ready) >= self.max_running:
                # Backpressure: claim again as soon as the queue shortens.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), self.poll_ms / 1000)
            elif not full:
                await self._pause(self.poll_ms / 1000)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if :meth:`stop_claiming` is called meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    # -- firing --------------------------------------------------------------------

    def _fire(self, key: tuple[int, str]) -> None:
        entry = self._loaded.pop(key, None)
        if entry is None:
            return
        job, _, lease_end, when = entry
        self.lateness.observe(self.wheel.time() - when)
        if self._busy >= self.max_running:
            # Waits for a free slot, in due order, until half a lease is left.
            shed = self.wheel.schedule_at(
                max(self.wheel.time(), lease_end - self.lease_ms / 2000), self._shed, key
            )
            self._ready[key] = (job, lease_end, shed)
            return
        self._start(job, lease_end)

    def _shed(self, key: tuple[int, str]) -> None:
        entry = self._ready.pop(key, None)
        if entry is None:
            return
        self._to_shed.append(entry[0])
        if len(self._to_shed) == 1:  # the first of this loop turn: one release call
            task = asyncio.ensure_future(self._release_shed())
            self._shedding.add(task)
            task.add_done_callback(self._shedding.discard)

    async def _release_shed(self) -> None:
        await asyncio.sleep(0)  # one loop turn: the jobs of a batch shed together
        jobs, self._to_shed = self._to_shed, []
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.shard, job.epoch), []).append(job)
        for (shard, _), group in groups.items():
            self.stats.shed += await self._release(shard, group)

    def _start(self, job: Job, lease_end: float) -> None:
        if self.scheduler.ownership.owned.get(job.shard) != job.epoch:
            return  # the shard was lost: counted when it was (_on_fenced)
        if self.wheel.time() >= lease_end:
            # Stalled past the lease: the reaper may have given it to another owner.
            self.stats.expired += 1
            return
        self.stats.fired += 1
        publishing = self.publisher is not None
        fn = None if job.duplicate or publishing else self.registry.get(job.task)
        if fn is not None:
            is_async = self._is_async.get(job.task)
            if is_async is None:
                is_async = self._is_async[job.task] = inspect.iscoroutinefunction(fn)
            if not is_async:
                self._run_plain(fn, job, lease_end)
                return
        self._busy += 1
        self._spawn(self._execute(job, lease_end), job)

    def _spawn(
        self,
        coro: Coroutine[object, object, None],
        job: Job,
        context: contextvars.Context | None = None,
    ) -> None:
        task = asyncio.get_running_loop().create_task(coro, context=context)
        self._running[task] = job
        task.add_done_callback(self._forget)

    def _run_plain(self, fn: TaskFunc, job: Job, lease_end: float) -> None:
        """Run a plain (not async) task function at once, here in the wheel's callback
        and in a copy of its context, as a task would (and it would block the loop as
        long there); no task is made unless it raises or returns an awaitable. Its ack
        joins the shard's next ack batch."""
        context = contextvars.copy_context()
        try:
            result = context.run(fn, self._context(job))
        except (Exception, asyncio.CancelledError) as exc:  # a failure of the job's own
            # Raised again in the task path: it writes the retry (a CancelledError ends
            # that task cancelled, as it ended a task before: the reaper's job).
            result = _raise(exc)
        if inspect.isawaitable(result):
            self._busy += 1
            # In the same context: what the function set is seen by what it returned.
            self._spawn(self._execute(job, lease_end, result), job, context)
        else:
            self._acks.submit(job, lease_end)

    @staticmethod
    def _context(job: Job) -> TaskContext:
        return TaskContext(
            job.id, job.task, job.payload, job.nominal_ms, job.attempt, job.epoch, True, job
        )

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)

    def _free_slot(self) -> None:
        """A handler returned (or never ran): start the jobs waiting for its slot. It
        runs inside the task that freed the slot: a failure to start another job (a
        plain function runs right here) must not end that task before its ack."""
        self._busy -= 1
        ready = self._ready
        while ready and self._busy < self.max_running:
            key = next(iter(ready))
            job, lease_end, shed = ready.pop(key)
            shed.cancel()
            try:
                self._start(job, lease_end)
            except Exception:  # a bug: the job stays leased, for the reaper
                self.stats.errors += 1
                logger.exception("tickwheel.durable: job %r left to the reaper", job.id)
        if len(ready) < self.max_running:
            self._room.set()

    async def _execute(
        self, job: Job, lease_end: float, started: Awaitable[object] | None = None
    ) -> None:
        """A fired job's task: its handler (or ``started``, what its plain function
        returned), then its retry; its ack is left to the batcher."""
        sched = self.scheduler
        busy = True  # holds a slot until its handler returns (then ack or retry wait freely)
        try:
            if started is None:
                if job.duplicate:
                    self.stats.duplicates += 1
                    await sched.ack(job)
                    return
                if self.publisher is not None:
                    await self._publish(job, lease_end)
                    return
                fn = self.registry.get(job.task)
                if fn is None:
                    # Dead-lettered at once with the reason: no retry mends a missing task.
                    # A rolling deploy that brings the task requeues it (requeue_dead).
                    self.stats.unknown += 1
                    state = await sched.retry(job, f"unknown task {job.task!r}", final=True)
                    self._count_retry(state)
                    return
                started = call_task(fn, self._context(job))
            finished = asyncio.Event()  # set when the task returned or raised
            # Most tasks end well inside their lease: a wheel timer (O(1), no task) starts
            # the extender only for one still running when half a lease is left (at once
            # for a job that waited for its slot until then).
            halfway = self.wheel.schedule_at(
                max(self.wheel.time(), lease_end - self.lease_ms / 2000),
                self._spawn_extender,
                job,
                finished,
            )
            failed: Exception | None = None
            try:
                try:
                    await started
                except Exception as exc:
                    failed = exc
                finally:
                    busy = False
                    self._free_slot()  # before the retry or the ack: they wait freely
                if failed is not None:  # the lease is still extended while it is written
                    logger.info("tickwheel.durable: task %s of job %r failed", job.task, job.id)
                    self._count_retry(await sched.retry(job, repr(failed)))
                    return
            finally:
                # Not cancel() of the extender: redis-py may swallow a cancellation that
                # lands inside a command, which would leave the extender running on.
                finished.set()
                halfway.cancel()
            self._acks.submit(job, lease_end)
        except LeaseLost:
            self.stats.lease_lost += 1
        except Fenced:
            pass  # counted, and the shard's other jobs forgotten, by _on_fenced
        except UNAVAILABLE as exc:
            self.stats.unavailable += 1
            logger.warning("tickwheel.durable: job %r left to the reaper (%s)", job.id, exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("tickwheel.durable: job %r left to the reaper", job.id)
        finally:
            if busy:  # no handler ran (a duplicate, an unknown task, the publisher)
                self._free_slot()

    async def _publish(self, job: Job, lease_end: float) -> None:
        """Publish, then ack: the lease is cleared only after the broker confirmed."""
        assert self.publisher is not None
        try:
            await self.publisher.publish(job)
        except Exception as exc:
            # Published or not, we cannot tell: retry (a duplicate is dropped downstream).
            logger.info("tickwheel.durable: publishing job %r failed (%r)", job.id, exc)
            self._count_retry(await self.scheduler.retry(job, repr(exc)))
            return
        self._acks.submit(job, lease_end)

    def _count_retry(self, state: JobState) -> None:
        if state is JobState.DEAD:
            self.stats.dead += 1
        else:
            self.stats.retried += 1

    def _spawn_extender(self, job: Job, finished: asyncio.Event) -> None:
        if not finished.is_set():
            extender = asyncio.ensure_future(self._extend(job, finished))
            self._extenders.add(extender)
            extender.add_done_callback(self._extenders.discard)

    async def _extend(self, job: Job, finished: asyncio.Event) -> None:
        """Extend a running job's lease now and every half lease until ``finished``."""
        while not finished.is_set():
            try:
                await self.scheduler.extend(job, self.lease_ms / 1000)
            except (LeaseLost, Fenced):
                return  # the ack will say so and count it
            except RedisUnavailable:
                pass
            else:
                self.stats.extended += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self.lease_ms / 2000)

    # -- handing back --------------------------------------------------------------

    def stop_claiming(self) -> None:
        """Claim nothing more (a shutdown has begun)."""
        self._claiming = False
        self._stopped.set()

    def _on_fenced(self, shard: int, epoch: int) -> None:
        """The ownership saw a call under ``epoch`` refused (by whichever layer made it):
        count it and forget the shard's loaded jobs of that epoch or older."""
        self.stats.fenced += 1
        self.drop_shard(shard, epoch)

    def drop_shard(self, shard: int, epoch: int | None = None) -> int:
        """Forget the loaded jobs of ``shard`` without a Redis call (it is fenced): all
        of them, or those leased under ``epoch`` or before (a late refusal must not
        forget the jobs of the shard taken again since).

        Returns:
            How many were dropped.
        """
        keys = [
            key
            for key, (job, *_) in self._loaded.items()
            if key[0] == shard and (epoch is None or job.epoch <= epoch)
        ]
        for key in keys:
            self._loaded.pop(key)[1].cancel()
        ready = [
            key
            for key, (job, *_) in self._ready.items()
            if key[0] == shard and (epoch is None or job.epoch <= epoch)
        ]
        for key in ready:
            self._ready.pop(key)[2].cancel()
        return len(keys) + len(ready)

    async def release_shard(self, shard: int) -> int:
        """Hand the loaded, unfired jobs of ``shard`` back to due at once.

        Returns:
            How many were released.
        """
        entries = [self._loaded.pop(k) for k in [k for k in self._loaded if k[0] == shard]]
        by_epoch: dict[int, list[Job]] = {}
        for job, timer, _, _ in entries:
            timer.cancel()
            by_epoch.setdefault(job.epoch, []).append(job)
        for key in [k for k in self._ready if k[0] == shard]:
            job, _, shed = self._ready.pop(key)
            shed.cancel()
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
        try:
            for i in range(0, len(jobs), MAX_BATCH):
                released += sum(await self.scheduler.release(jobs[i : i + MAX_BATCH]))
        except Fenced:
            pass  # the ownership dropped the shard and told _on_fenced
        except RedisUnavailable as exc:
            self.stats.unavailable += 1
            logger.warning("tickwheel.durable: release left to the reaper (%s)", exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("tickwheel.durable: release left to the reaper")
        return released

    async def release_all(self) -> int:
        """Hand back every loaded, unfired job (stop claiming first).

        Returns:
            How many were released.
        """
        shards = sorted({shard for shard, _ in self._loaded} | {shard for shard, _ in self._ready})
        return sum([await self.release_shard(shard) for shard in shards])

    async def drain(self, grace: float | None = None, shard: int | None = None) -> int:
        """Wait for the fired jobs (of ``shard``, or all) to settle: their tasks, then
        their acks; cancel what still runs ``grace`` s after the call. The acks get at
        least ``CANCEL_GRACE`` s even when the tasks took all of ``grace``: a handler
        that returned at the deadline did run, and its ack is what keeps it from
        running again.

        A cancelled task is neither acked nor retried, and a cancelled ack call leaves
        its jobs leased: their leases expire and the reaper hands them out again.

        Returns:
            How many tasks and ack calls were cancelled.
        """
        loop = asyncio.get_running_loop()
        end = None if grace is None else loop.time() + grace
        cancelled = 0
        tasks = {t for t, job in self._running.items() if shard is None or job.shard == shard}
        for least in (0.0, CANCEL_GRACE):
            if least:  # the acks: the tasks just waited for have submitted theirs
                tasks = self._acks.flushes(shard)
            if not tasks:
                continue
            _, pending = await asyncio.wait(
                tasks, timeout=None if end is None else max(least, end - loop.time())
            )
            for task in pending:
                task.cancel()
            if pending:
                # Bounded: a task may swallow its cancellation (redis-py can, mid-command).
                await asyncio.wait(pending, timeout=CANCEL_GRACE)
            cancelled += len(pending)
        return cancelled


async def _raise(exc: BaseException) -> None:
    """Raise ``exc`` when awaited: a plain task function's failure, handed to the task
    path that writes its retry."""
    raise exc
