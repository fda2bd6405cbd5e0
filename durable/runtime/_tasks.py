"""The task registry: names for the functions that timers and durable jobs run.

Ground rules:

- A durable job stores only a task *name* (and a payload): the function is looked up by
  that name in the process that runs the job, so names are the contract between the
  producer and the worker and must stay stable across deploys.
- A name is registered once per registry; registering it again is an error, never a
  silent replacement (two modules claiming one name is a bug to see at import time).
- A task is called as ``fn(ctx)`` with a :class:`TaskContext`; it may be a coroutine
  function or a plain function. A plain function runs on the event loop thread, so it
  must be short, unless it is registered with ``thread=True`` (it then runs in the
  worker's thread pool).
- A task may carry a ``timeout`` (seconds): a run past it is stopped and counts as a
  failed attempt with the reason ``timeout`` (see ``_stopping.py``).
- A task schedules follow-up jobs through its context (``ctx.schedule``, or
  ``ctx.scheduler``, the worker's own :class:`Scheduler`), never through a global. A
  chain gives every occurrence an id of its own: the running job's id is leased, so
  scheduling that id again from inside its run writes nothing (``KEPT``, or ``BUSY``
  with ``replace=True``) and would end the chain; ``ctx.schedule`` logs that mistake
  (once per task name).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, overload

from tickwheel.durable.model import (
    Job,
    Limits,
    ScheduleResult,
    ScheduleStatus,
    check_limits,
    check_task_name,
    finite_seconds_ms,
)

from ._handles import P, R, TaskHandle, payload_type_of, typed_runner

if TYPE_CHECKING:
    from tickwheel.durable.scheduler import Scheduler, SyncScheduler

__all__ = [
    "TaskContext",
    "TaskDecorator",
    "TaskFunc",
    "TaskOptions",
    "TaskRegistry",
    "check_timeout",
    "job_context",
]


def check_timeout(timeout: float | None) -> float | None:
    """A task timeout in seconds (whole ms, rounded up), or None for none.

    Raises:
        TypeError: if it is not a number.
        ValueError: naming ``timeout`` if it is zero, negative, NaN or infinite.
    """
    if timeout is None:
        return None
    return finite_seconds_ms("timeout", timeout, minimum_ms=1) / 1000


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How a worker runs a task: its timeout (s; None: the worker's default), whether
    a plain function runs in the worker's thread pool, and its flow limits per key
    (None: none declared here; docs/limits.md)."""

    timeout: float | None = None
    thread: bool = False
    limits: Limits | None = None


logger = logging.getLogger("tickwheel.durable.tasks")

# Task names already warned about scheduling their own id (the warning is logged once).
_warned_same_id: set[str] = set()


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a task is told about the occurrence it runs.

    ``(job_id, nominal_ms)`` is the idempotency key: delivery is at least once, so a task
    with side effects records that key (e.g. ``SET key NX``) and skips a repeat.
    """

    job_id: str  # the job id (generated for an in-memory timer)
    task: str  # the task name
    payload: Any  # bytes, or the decoded JSON value
    nominal_ms: int  # nominal due (epoch ms); Redis's clock for durable jobs
    attempt: int  # attempt number, from 1 (always 1 in memory)
    epoch: int  # the shard owner's fencing epoch of the lease; 0 in memory
    durable: bool  # True when the job came from Redis
    job: Job | None = None  # the claimed job (durable only)
    # The producer of the worker (or Timers) that runs the task: for follow-up jobs.
    scheduler: Scheduler | None = None

    @property
    def key(self) -> tuple[str, int]:
        """The idempotency key ``(job_id, nominal_ms)``."""
        return (self.job_id, self.nominal_ms)

    @property
    def flow_key(self) -> str:
        """The job's flow key (``schedule(key=)``; ``""``: none): what its task's
        ``concurrency`` and ``rate`` count by."""
        return self.job.key if self.job is not None else ""

    async def schedule(
        self, job_id: str, task: str, payload: Any = b"", **kwargs: Any
    ) -> ScheduleResult:
        """Schedule a follow-up job: :meth:`Scheduler.schedule` on :attr:`scheduler`,
        with its arguments and result.

        For a chain, give each occurrence its own id (``f"{chain}:{n}"``, or the id
        with the next due in it): the job running now is leased, so scheduling *its*
        id again writes nothing (``KEPT``, or ``BUSY`` with ``replace=True``) and the
        chain would end there. That mistake is logged as a warning (once per task
        name); the returned status tells it too. A fixed period is simpler with
        ``every=`` or ``cron=``.

        Raises:
            RuntimeError: if this context has no scheduler.
            What :meth:`Scheduler.schedule` raises.
        """
        if self.scheduler is None:
            raise RuntimeError("this TaskContext has no scheduler to schedule with")
        result = await self.scheduler.schedule(job_id, task, payload, **kwargs)
        if (
            job_id == self.job_id
            and self.durable
            and result.status in (ScheduleStatus.KEPT, ScheduleStatus.BUSY)
            and self.task not in _warned_same_id
        ):
            _warned_same_id.add(self.task)
            logger.warning(
                "task %s scheduled its own job id %r from inside its run: that job is"
                " running (leased), so nothing was written (%s) and a chain of jobs"
                " ends here; give each occurrence its own id, e.g. f'{chain}:{n}'"
                " (logged once per task)",
                self.task,
                job_id,
                result.status.name,
            )
        return result


def job_context(job: Job, scheduler: Scheduler | None) -> TaskContext:
    """The context a claimed job's task is called with."""
    return TaskContext(
        job_id=job.id,
        task=job.task,
        payload=job.payload,
        nominal_ms=job.nominal_ms,
        attempt=job.attempt,
        epoch=job.epoch,
        durable=True,
        job=job,
        scheduler=scheduler,
    )


# A task: ``fn(ctx)``, returning an awaitable (a coroutine function) or anything else.
TaskFunc = Callable[[TaskContext], object]


async def call_task(fn: TaskFunc, ctx: TaskContext) -> object:
    """Run ``fn(ctx)``, awaiting the result when it is awaitable.

    Raises:
        Whatever the task raises.
    """
    result = fn(ctx)
    if inspect.isawaitable(result):
        return await result
    return result


_NO_OPTIONS = TaskOptions()


class TaskDecorator(Protocol):
    """What ``@registry.task(name=..., ...)`` returns: it registers the function and
    returns its :class:`TaskHandle`."""

    @overload
    def __call__(self, fn: Callable[[TaskContext, P], R], /) -> TaskHandle[P, R]: ...

    @overload
    def __call__(self, fn: Callable[[TaskContext], R], /) -> TaskHandle[Any, R]: ...


class TaskRegistry:
    """Task names mapped to functions.

    Usage::

        tasks = TaskRegistry()

        @tasks.task
        async def send_reminder(ctx: TaskContext) -> None: ...

        @tasks.task(name="billing.charge")
        def charge(ctx: TaskContext, args: ChargeArgs) -> None: ...  # a typed task

        tasks.bind(scheduler)
        await charge.schedule(ChargeArgs(order=7), id="charge:7", delay=3 * 86400)

    ``@tasks.task`` returns a :class:`TaskHandle` (``_handles.py``), callable as the
    function; :meth:`register` registers a function as it is and returns it.

    A worker runs a coroutine function in a task of its own, and a plain function at
    once, on the loop, when its job fires (in a copy of the context, with no task made
    for it): cheaper per job, and fine for short work, but it blocks the loop while it
    runs, so anything that waits on I/O belongs in an ``async def``.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, TaskFunc] = {}  # name -> function
        self._options: dict[str, TaskOptions] = {}  # name -> options, when not the defaults
        # The producers handles use when given none (bind()).
        self.scheduler: Scheduler | None = None
        self.sync_scheduler: SyncScheduler | None = None

    @overload
    def task(self, fn: Callable[[TaskContext, P], R], /) -> TaskHandle[P, R]: ...

    @overload
    def task(self, fn: Callable[[TaskContext], R], /) -> TaskHandle[Any, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        timeout: float | None = None,
        thread: bool = False,
        payload: Any = None,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        thread: bool = False,
        payload: Any = None,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
    ) -> Any:
        """Register a function as a task; usable bare or with options.

        The default name is the function's ``__qualname__``. ``timeout`` (seconds) stops
        a run that takes longer: an ``async def`` is cancelled, and the attempt fails
        with the reason ``timeout`` (retried with backoff, dead after ``max_attempts``).
        ``thread=True`` runs a plain function in the worker's thread pool, where a
        timeout frees its slot and its lease; the thread itself cannot be stopped and
        runs on until the function returns (its result is then ignored).

        A function of two parameters, ``fn(ctx, payload)``, is a typed task: its payload
        type (``payload=``, else the second parameter's annotation: a dataclass, a
        ``TypedDict`` or a pydantic model) is checked when the handle schedules a job
        and rebuilt from the stored dict for the function (see ``_handles.py``).

        ``concurrency=N``: at most N runs of the task at once per flow key
        (``schedule(key=)``; no key: the task's single key), across all workers and
        shards. ``rate=(n, seconds)``: at most n starts per key in any window of that
        many seconds. A job over a limit waits in Redis, unspent, and is released when
        a permit frees or at its start's time (docs/limits.md).

        Returns:
            The function's :class:`TaskHandle` (callable as the function), or a
            decorator that returns it when called with options.

        Raises:
            TypeError: if the decorated object is not callable, ``name`` not a str, or
                ``payload`` not a payload type.
            ValueError: if the name is taken or malformed.
        """
        limits = check_limits(concurrency, rate)  # at the decorator's call
        if fn is None:
            check_timeout(timeout)  # at the decorator's call, not at the function's

            def decorate(f: Callable[..., Any]) -> TaskHandle[Any, Any]:
                return self._handle(f, name, timeout, thread, payload, limits)

            return decorate
        return self._handle(fn, name, timeout, thread, payload, limits)

    def _handle(  # noqa: PLR0917 (the decorator's options, in order)
        self,
        fn: Callable[..., Any],
        name: str | None,
        timeout: float | None,
        thread: bool,
        payload: Any,
        limits: Limits | None = None,
    ) -> TaskHandle[Any, Any]:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        typed, codec = payload_type_of(fn, payload)
        if name is None:
            name = getattr(fn, "__qualname__", None)
            if not isinstance(name, str):
                raise TypeError(f"fn has no __qualname__; give name= for {fn!r}")
        run = typed_runner(fn, codec) if typed else fn
        self.register(run, name=name, timeout=timeout, thread=thread)
        if limits is not None:
            self._options[name] = replace(self.options(name), limits=limits)
        return TaskHandle(self, name, fn, codec)

    def bind(self, scheduler: Scheduler | SyncScheduler) -> None:
        """Make ``scheduler`` the default producer of this registry's handles: a
        :class:`Scheduler` for ``handle.schedule``, a :class:`SyncScheduler` for
        ``handle.schedule_sync`` (call once for each you use).

        Raises:
            TypeError: for anything else.
        """
        from tickwheel.durable.scheduler import Scheduler, SyncScheduler  # noqa: PLC0415

        if isinstance(scheduler, SyncScheduler):
            self.sync_scheduler = scheduler
        elif isinstance(scheduler, Scheduler):
            self.scheduler = scheduler
        else:
            raise TypeError(f"scheduler must be a Scheduler or SyncScheduler, got {scheduler!r}")

    def register(
        self,
        fn: TaskFunc,
        *,
        name: str | None = None,
        timeout: float | None = None,
        thread: bool = False,
    ) -> TaskFunc:
        """Register ``fn`` under ``name`` (default: its ``__qualname__``). O(1).

        Returns:
            ``fn``.

        Raises:
            TypeError: if ``fn`` is not callable, or ``name`` is not a str, or ``thread``
                is given for a coroutine function.
            ValueError: if the name is already registered or malformed, or ``timeout``
                is not a positive finite number of seconds.
        """
        limit = check_timeout(timeout)
        if not isinstance(thread, bool):
            raise TypeError(f"thread must be a bool, got {thread!r}")
        if thread and inspect.iscoroutinefunction(fn):
            raise TypeError(f"thread=True is for plain functions, not coroutine function {fn!r}")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        if name is None:
            name = getattr(fn, "__qualname__", None)
            if not isinstance(name, str):
                raise TypeError(f"fn has no __qualname__; give name= for {fn!r}")
        check_task_name(name)
        if name in self._tasks:
            raise ValueError(f"task name {name!r} is already registered to {self._tasks[name]!r}")
        self._tasks[name] = fn
        if limit is not None or thread:
            self._options[name] = TaskOptions(limit, thread)
        return fn

    def options(self, name: str) -> TaskOptions:
        """How the task ``name`` runs (defaults for an unknown name). O(1)."""
        return self._options.get(name, _NO_OPTIONS)

    def limits(self) -> dict[str, Limits | None]:
        """Each registered task's declared flow limits (None: none), as a worker
        writes them to Redis at its start (docs/limits.md)."""
        return {name: self.options(name).limits for name in self._tasks}

    def get(self, name: str) -> TaskFunc | None:
        """The function registered under ``name``, or None. O(1)."""
        return self._tasks.get(name)

    def __getitem__(self, name: str) -> TaskFunc:
        """The function registered under ``name``.

        Raises:
            KeyError: naming the unknown task and the known ones.
        """
        try:
            return self._tasks[name]
        except KeyError:
            raise KeyError(f"no task named {name!r}; known: {sorted(self._tasks)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return f"TaskRegistry({sorted(self._tasks)})"
