"""Running fired jobs: each job's handler in one of ``max_running`` slots, the jobs that
wait for a slot (and are shed when they waited too long), and the lease extension of a
handler that runs long. What a handler's end writes: its retry here, its ack through
the :class:`AckBatcher`.

Ground rules:

- A job starts only while its shard is still owned under the job's epoch, and only if
  its lease has not run out by the local clock (the loop or the process stalled: the
  reaper may already have handed it to another owner).
- A slot is held while the handler runs, not while its ack or retry is written: in the
  Postgres mode that write is a commit, and holding the slot through it capped a worker
  at ``max_running`` commits' worth of jobs per second.
- A job that fires while every slot is taken waits, in due order, until half a lease
  is left; then it is shed (:class:`Waiting`, ``_waiting.py``).
- A handler still running when half a lease is left has its lease extended then and
  every half lease after (:class:`LeaseExtender`, ``_extending.py``), until it returns,
  or until its timeout plus ``TIMEOUT_GRACE`` passed (a handler that does not stop
  when cancelled loses its job to the reaper, and its slot is freed then).
- Stopping a running handler (a wheel timer at its timeout, a cancel of its job, a drain
  past its deadline at shutdown, a lease found lost) and settling it is the
  :class:`Stopper`'s (``_stopping.py``); a failed attempt's retry or dead letter, and
  its log line, the :class:`Failures`' (``_failures.py``).
- A plain function of a ``thread=True`` task runs in a pool of daemon threads
  (``_threads.py``). A timeout or a cancel frees its slot and settles its job at once;
  the thread runs on until the function returns (a daemon: it never keeps the process).
- A job of a task with flow limits takes its key's permit before it starts, and its
  run's end releases it (:class:`Limiter`, ``_limiter.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine

from tickwheel.durable.model import BrokerUnavailable, Fenced, Job, LeaseLost, UndecodablePayload
from tickwheel.durable.scheduler import Scheduler
from tickwheel.wheel import TimingWheel

from ._acks import UNAVAILABLE, AckBatcher
from ._extending import LeaseExtender, first_extension
from ._failures import Failures
from ._handing import Handoff
from ._limiter import Limiter
from ._loader_stats import LoaderStats
from ._logs import Outages, job_fields, log_start, logger
from ._stopping import Stopper
from ._stream import Publisher
from ._tasks import TaskContext, TaskFunc, TaskRegistry, call_task, job_context
from ._threads import DaemonPool
from ._waiting import Waiting

__all__ = ["DEFAULT_MAX_RUNNING", "Release", "Runner"]

# Tasks running at once. Each may hold two Redis connections (its ack and its lease
# extension), and redis-py's asyncio pool refuses more than 100 by default
# (MaxConnectionsError): 32 tasks keep the loader, reaper and renewals well inside it.
# Measured ~5,400-7,000 jobs/s per process with no-op tasks (bench: spill load+fire).
DEFAULT_MAX_RUNNING = 32

# Hands jobs of one shard and epoch back to due; how many were. Never raises.
Release = Callable[[int, list[Job]], Awaitable[int]]

# How a task runs (the first value of Runner._kinds).
_ASYNC = "async"
_PLAIN = "plain"
_THREAD = "thread"
_FOREVER = float("inf")


async def _raise(exc: BaseException) -> None:
    """Raise ``exc`` when awaited: a plain task function's failure, handed to the task
    path that writes its retry."""
    raise exc


class Runner:
    """Run the handlers of fired jobs, at most ``max_running`` at once.

    Args:
        scheduler: retries, plain acks of duplicates, lease extensions, ownership.
        registry: the tasks to run, by name.
        wheel: the clock lease ends are in, and the timers of shedding and extension.
        stats: where outcomes are counted.
        acks: where the acks of returned handlers go.
        lease_ms: the run time a lease covers; extended every half of it.
        max_running: slots.
        publisher: hand each job to this broker instead of running a task.
        release: hands shed jobs back to due (counted and logged there on failure).
        outages: where store outages are reported (logged once each).
        default_timeout: seconds a handler may run when its task has no timeout of its
            own; None: no limit.
        start_ms: the pre-start margin (``Loader.start_ms``; extended at a run's start).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        wheel: TimingWheel,
        stats: LoaderStats,
        acks: AckBatcher,
        *,
        lease_ms: int,
        max_running: int,
        publisher: Publisher | None,
        release: Release,
        outages: Outages | None = None,
        default_timeout: float | None = None,
        start_ms: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.leases = scheduler.leases  # ack, retry, extend, without the facade's call
        self.registry = registry
        self.wheel = wheel
        self.stats = stats
        self._acks = acks
        self.lease_ms = lease_ms
        self._half_lease = half = lease_ms / 2000  # s: an extender's pace
        self._shed_lead = min(half, start_ms / 2000) if start_ms else half  # s: shed then
        # Pre-start leases: a run's start is marked (extended) within this many s.
        self._mark_lead = self._shed_lead / 2 if start_ms else None
        self.max_running = max_running
        self.publisher = publisher
        self.outages = outages if outages is not None else Outages()
        self.tracer = scheduler.tracer  # run spans (None: tracing off)
        # Task name -> (how it runs, its timeout or None). How: _ASYNC, a coroutine
        # function (it runs in a task of its own); _PLAIN, a plain function (it runs in
        # the wheel's callback that fires its job); _THREAD, a plain function in the
        # thread pool. By name, not by function: a registered callable need not be
        # hashable, and a name is never registered twice.
        self._kinds: dict[str, tuple[str, float | None]] = {}
        self._running: dict[asyncio.Task[None], Job] = {}  # tasks of fired jobs
        # Of those, the ones whose handler has not returned: the slots max_running counts.
        # A task that only waits for its ack (or retry) left its slot.
        self._busy = 0
        self._waiting = Waiting(stats, release)  # fired while max_running tasks ran
        self.room = asyncio.Event()  # set when the ready queue fell below max_running
        self.default_timeout = default_timeout
        self._failures = Failures(scheduler, stats)  # retries and dead letters, logged
        self._handoff = Handoff.maybe(publisher, self)
        # Stops running handlers (timeout, cancel, drain, lost lease) and settles them.
        self._stopper = Stopper(
            scheduler,
            wheel,
            stats,
            self._running,
            free_slot=self._free_slot,
            release=release,
            failures=self._failures,
        )
        self.runs = self._stopper.runs  # does a handler here run this job's lease?
        self._extender = LeaseExtender(scheduler, wheel, stats, self._stopper, lease_ms=lease_ms)
        self.limiter = Limiter(scheduler, registry, stats, lease_ms=lease_ms)  # flow limits
        self.limiter.admit = self.fire  # a job through its key's gate fires again
        self._extender.limiter = self.limiter  # permits are extended with their leases
        self._pool: DaemonPool | None = None  # made at the first thread task

    # -- inspection ----------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Jobs fired and waiting for a slot."""
        return len(self._waiting.ready)

    @property
    def running(self) -> int:
        """Jobs fired and not settled: their handler runs, or their ack or retry is
        still to be written."""
        return len(self._running) + self._acks.waiting

    @property
    def backlogged(self) -> bool:
        """A slot's worth of jobs waits per slot: claim nothing more until :attr:`room`."""
        return len(self._waiting.ready) >= self.max_running

    def tasks(self, shard: int | None = None) -> set[asyncio.Task[None]]:
        """The tasks of fired jobs (of ``shard``, or all) not finished yet."""
        return {t for t, job in self._running.items() if shard is None or job.shard == shard}

    def waiting_shards(self) -> set[int]:
        """The shards that have a job waiting for a slot."""
        return self._waiting.shards()

    # -- firing --------------------------------------------------------------------

    def fire(
        self, key: tuple[int, str], job: Job, lease_end: float, due: float | None = None
    ) -> None:
        """Start a job that fell due (or got its slot), or queue it for a slot until half
        a lease is left. One function, not two: it runs once per job. ``due`` (wheel
        time) gives the lateness of its start in the DEBUG line."""
        if self._busy >= self.max_running:
            waiting = self._waiting
            shed = self.wheel.schedule_at(
                max(self.wheel.time(), lease_end - self._shed_lead), waiting.shed, key
            )
            waiting.ready[key] = (job, lease_end, shed, due)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("job %r waits for a slot", job.id, extra=job_fields(job))
            return
        if self.scheduler.ownership.owned.get(job.shard) != job.epoch:
            self.limiter.unstarted(job)  # a permit its claim took (its deadline frees it else)
            return  # the shard was lost: counted when it was (the loader's on_fenced)
        if self.wheel.time() >= lease_end:
            # Stalled past the lease: the reaper may have given it to another owner.
            self.stats.expired += 1
            self.limiter.unstarted(job)
            return
        if self.limiter.gated(key, job, lease_end, due):
            return  # it takes its key's permit first, then fires again (or waits)
        self.stats.fired += 1
        if self.stats.history is not None:
            self.stats.history.started(job)
        if logger.isEnabledFor(logging.DEBUG):
            log_start(job, None if due is None else (self.wheel.time() - due) * 1000)
        publishing = self.publisher is not None
        fn = None if job.duplicate or publishing else self.registry.get(job.task)
        if fn is not None and type(job.payload) is not UndecodablePayload:
            kind = self._kinds.get(job.task)
            if kind is None:
                kind = self._kinds[job.task] = self._kind_of(job.task, fn)
            how, limit = kind
            if job.timeout_ms:  # its own (schedule(timeout=)) before the task's
                limit = job.timeout_ms / 1000
            if how is not _ASYNC:
                if how is _THREAD:
                    self._busy += 1
                    started = self._in_thread(fn, job)
                    self._spawn(self._execute(job, lease_end, started, limit), job)
                else:
                    self._run_plain(fn, job, lease_end, limit)
                return
            self._busy += 1
            self._spawn(self._execute(job, lease_end, None, limit), job)
            return
        self._busy += 1
        self._spawn(self._execute(job, lease_end), job)

    def _kind_of(self, task: str, fn: TaskFunc) -> tuple[str, float | None]:
        """How task ``task`` runs (_ASYNC, _PLAIN or _THREAD), and its timeout."""
        options = self.registry.options(task)
        limit = options.timeout if options.timeout is not None else self.default_timeout
        if options.thread:
            return _THREAD, limit
        return (_ASYNC if inspect.iscoroutinefunction(fn) else _PLAIN), limit

    def _in_thread(self, fn: TaskFunc, job: Job) -> Awaitable[object]:
        """Start ``fn`` in the thread pool (in a copy of the context); its future."""
        if self._pool is None:
            # Twice the slots: a thread that timed out holds its pool thread until it
            # returns, and the jobs after it should still find one.
            self._pool = DaemonPool(2 * self.max_running)
        tracer = self.tracer  # with tracing, the run span is current in the copy
        context = contextvars.copy_context() if tracer is None else tracer.run_context(job)
        return self._pool.submit(context.run, fn, self._context(job))

    def close(self) -> None:
        """Let go of the thread pool (its threads finish what they run, unwaited)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _spawn(
        self,
        coro: Coroutine[object, object, None],
        job: Job,
        context: contextvars.Context | None = None,
    ) -> None:
        if context is None and self.tracer is not None and not job.duplicate:
            context = self.tracer.run_context(job)  # its run span current in the task
        task = asyncio.get_running_loop().create_task(coro, context=context)
        self._running[task] = job
        task.add_done_callback(self._forget)

    def _run_plain(self, fn: TaskFunc, job: Job, lease_end: float, limit: float | None) -> None:
        """Run a plain (not async) task function at once, here in the wheel's callback
        and in a copy of its context, as a task would (and it would block the loop as
        long there); no task is made unless it raises or returns an awaitable. Its ack
        joins the shard's next ack batch."""
        tracer = self.tracer  # with tracing, the run span is current in the copy
        context = contextvars.copy_context() if tracer is None else tracer.run_context(job)
        try:
            result = context.run(fn, self._context(job))
        except BaseException as exc:  # a failure of the job's own, whatever its class
            # Raised again in the task path: it writes the retry (a CancelledError ends
            # that task cancelled, as it ended a task before: the reaper's job). A
            # SystemExit or KeyboardInterrupt raised by the function is its failure too:
            # a real signal reaches the worker through the loop's handler, never here.
            result = _raise(exc)
        if inspect.isawaitable(result):
            self._busy += 1
            # In the same context: what the function set is seen by what it returned.
            self._spawn(self._execute(job, lease_end, result, limit), job, context)
        else:
            self._acks.submit(job, lease_end)
            self.limiter.finished(job)

    def _context(self, job: Job) -> TaskContext:
        return job_context(job, self.scheduler)

    def _forget(self, task: asyncio.Task[None]) -> None:
        if (job := self._running.pop(task, None)) is not None:
            self.limiter.finished(job)  # its permit (if it holds one) is handed on
            if self.tracer is not None:
                self.tracer.forget(job)  # a span still open here is unsettled

    def _free_slot(self) -> None:
        """A handler returned (or never ran): start the jobs waiting for its slot. It
        runs inside the task that freed the slot: a failure to start another job (a
        plain function runs right here) must not end that task before its ack."""
        self._busy -= 1
        ready = self._waiting.ready
        while ready and self._busy < self.max_running:
            key = next(iter(ready))
            job, lease_end, shed, due = ready.pop(key)
            shed.cancel()
            try:
                self.fire(key, job, lease_end, due)  # a slot is free: it starts
            except Exception:  # a bug: the job stays leased, for the reaper
                self.stats.errors += 1
                logger.exception("job %r left to the reaper", job.id, extra=job_fields(job))
        if len(ready) < self.max_running:
            self.room.set()

    # -- running -------------------------------------------------------------------

    async def _execute(
        self,
        job: Job,
        lease_end: float,
        started: Awaitable[object] | None = None,
        limit: float | None = None,
    ) -> None:
        """A fired job's task: its handler (or ``started``, what its plain function
        returned, or its thread's future), stopped after ``limit`` s if given, then its
        retry; its ack is left to the batcher."""
        leases = self.leases
        failures = self._failures
        busy = True  # holds a slot until its handler returns (then ack or retry wait freely)
        try:
            if started is None:
                if job.duplicate:
                    self.stats.duplicates += 1
                    await leases.ack(job)
                    return
                if type(job.payload) is UndecodablePayload:
                    # Dead-lettered at once with the reason: no retry decodes it.
                    await failures.dead(job, str(job.payload))
                    return
                if self._handoff is not None:
                    await self._handoff.publish(job, lease_end)
                    return
                fn = self.registry.get(job.task)
                if fn is None:
                    # Dead-lettered at once with the reason: no retry mends a missing task.
                    # A rolling deploy that brings the task requeues it (requeue_dead).
                    self.stats.unknown += 1
                    await failures.dead(job, f"unknown task {job.task!r}")
                    return
                started = call_task(fn, self._context(job))
            finished = asyncio.Event()  # set when the task returned or raised
            task = asyncio.current_task()
            assert task is not None
            # Most tasks end well inside their lease: a wheel timer (O(1), no task) starts
            # the extender only for one still running when half a lease is left (at once
            # for a job that waited for its slot until then). With a timeout, that one
            # timer is set at whichever comes first, and sets the other when it fires: a
            # handler that returns before both costs one timer, timeout or not.
            now = self.wheel.time()
            halfway_at = first_extension(now, lease_end, self._half_lease, self._mark_lead)
            if limit is None:
                halfway = self.wheel.schedule_at(
                    halfway_at, self._extender.spawn, job, finished, task, _FOREVER
                )
            else:
                expires = now + limit
                halfway = self.wheel.schedule_at(
                    min(expires, halfway_at),
                    self._extender.first_deadline,
                    job,
                    finished,
                    task,
                    expires,
                    halfway_at,
                )
            stopper = self._stopper
            handling = stopper.handling
            handling[job.id] = task
            failed: BaseException | None = None
            stopped: str | None = None
            try:
                try:
                    await started
                except asyncio.CancelledError:
                    stopped = stopper.stops.pop(task, None)
                    if stopped is None:
                        raise  # not ours to stop: the task ends cancelled, as before
                    task.uncancel()
                except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit
                    # and the like, raised by the task: its failure, never the worker's end
                    failed = exc
                finally:
                    busy = False
                    if handling.get(job.id) is task:
                        del handling[job.id]
                    # Only while some handler is stopped or abandoned: was it this one?
                    freed = False  # its slot, already (abandoned)
                    if stopper.stops or stopper.abandoned:
                        stopped, freed = stopper.returned(task, stopped)
                    if not freed:
                        self._free_slot()  # before the retry or the ack: they wait freely
                if stopped is not None:
                    await stopper.settle(job, stopped, limit)
                    return
                if failed is not None:  # the lease is still extended while it is written
                    with self._acks.retrying(job, failed):
                        await failures.failed(job, failed)
                    return
            finally:
                # Not cancel() of the extender: redis-py may swallow a cancellation that
                # lands inside a command, which would leave the extender running on.
                finished.set()
                halfway.cancel()
            self._acks.submit(job, max(lease_end, now + 2 * self._half_lease))  # since extended
        except LeaseLost:
            self.stats.lease_lost += 1
            logger.warning(
                "lease of job %r (task %s, attempt %d) was lost before its retry was written:"
                " another worker may run it",
                job.id,
                job.task,
                job.attempt,
                extra=job_fields(job),
            )
        except Fenced:
            pass  # counted, and the shard's other jobs forgotten, by the loader's on_fenced
        except (*UNAVAILABLE, BrokerUnavailable) as exc:
            self.stats.unavailable += 1
            self.outages.failed("runner", exc)
            logger.debug("job %r left to the reaper (%s)", job.id, exc, extra=job_fields(job))
        except Exception:
            self.stats.errors += 1
            logger.exception("job %r left to the reaper", job.id, extra=job_fields(job))
        finally:
            if busy:  # no handler ran (a duplicate, an unknown task or payload, the publisher)
                self._free_slot()

    # -- stopping running handlers (the Stopper's) ----------------------------------

    def stop_job(self, job_id: str) -> bool:
        """Stop the handler running job ``job_id`` (its record was removed: a cancel):
        it sees ``CancelledError``, and its run ends neither acked nor retried. A job
        that waits for a slot is forgotten. True if there was such a job here. O(1)."""
        if self._stopper.cancel(job_id):
            return True
        key = (self.scheduler.keys.shard_of(job_id), job_id)
        entry = self._waiting.ready.get(key)
        if entry is None or not self._waiting.forget(key):
            return False
        self.limiter.unstarted(entry[0])  # a permit its claim took is freed
        self.stats.cancelled += 1
        return True

    def stop_for_drain(self, task: asyncio.Task[None]) -> None:
        """Cancel a task at the drain deadline: one whose handler runs releases its job
        unrun (same attempt) for another worker; any other is cancelled plainly."""
        self._stopper.drain(task)

    # -- the jobs waiting for a slot (the Waiting's) ------------------------------

    def take_waiting(self, shard: int) -> list[Job]:
        """Take the jobs of ``shard`` that wait for a slot out of the queue (in order),
        to be handed back."""
        return self._waiting.take(shard)

    def drop_waiting(self, shard: int, epoch: int | None) -> int:
        """Forget the jobs of ``shard`` waiting for a slot (all, or those leased under
        ``epoch`` or before); how many."""
        return self._waiting.drop(shard, epoch, self.limiter.unstarted)
