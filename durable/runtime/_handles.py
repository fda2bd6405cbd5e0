"""Task handles: what ``@registry.task`` returns, to schedule a task by its function.

::

    @dataclass
    class ReminderArgs:
        user: int

    @registry.task
    async def send_reminder(ctx: TaskContext, args: ReminderArgs) -> None: ...

    registry.bind(scheduler)  # or pass scheduler= to each call
    await send_reminder.schedule(ReminderArgs(user=42), id="remind:42", delay=7200)
    send_reminder.schedule_sync(ReminderArgs(user=42), id="remind:42", delay=7200)  # SyncScheduler

- The handle is generic in the payload type, so ``mypy`` refuses a wrong payload in the
  application's code; at run time the payload is checked too (``_payloads.py``): a wrong
  one raises naming the field, before anything is written.
- A task of one parameter (``fn(ctx)``) has an untyped handle: its payload is any
  JSON value or bytes, as with ``Scheduler.schedule``.
- The function stays callable through the handle (``send_reminder(ctx, args)``).
- Which producer: ``scheduler=`` (a :class:`Scheduler`, a :class:`SyncScheduler` for
  ``schedule_sync``, or a :class:`TaskContext`, whose scheduler a follow-up uses), else
  the one :meth:`TaskRegistry.bind` gave the registry.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tickwheel.durable.model import DEFAULT_MAX_ATTEMPTS, JobSpec, ScheduleResult

from ._payloads import PayloadType

if TYPE_CHECKING:
    from tickwheel.durable.scheduler import Scheduler, SyncScheduler

    from ._tasks import TaskContext, TaskRegistry

__all__ = ["P", "R", "TaskHandle", "payload_type_of", "typed_runner"]

P = TypeVar("P")
R = TypeVar("R")


def _positional(fn: Callable[..., object]) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def payload_type_of(fn: Callable[..., object], given: Any) -> tuple[bool, PayloadType | None]:
    """Whether ``fn`` takes the payload as its second parameter, and the payload's codec
    (``given``, else the second parameter's annotation when it is a dataclass, a
    TypedDict or a pydantic model; None: taken as stored).

    Raises:
        TypeError: if ``given`` is not such a type, or the annotation cannot be resolved.
    """
    params = _positional(fn)
    typed = len(params) >= 2
    if given is not None:
        if not typed:
            raise TypeError(f"payload= needs a task taking (ctx, payload), got {fn!r}")
        return True, PayloadType(given)
    if not typed:
        return False, None
    hint = params[1].annotation
    if hint is inspect.Parameter.empty:
        return True, None
    if isinstance(hint, str):
        try:
            hint = typing.get_type_hints(fn)[params[1].name]
        except Exception as exc:
            raise TypeError(
                f"cannot resolve the payload annotation {hint!r} of {fn!r} ({exc});"
                " pass payload=<the type> to the decorator"
            ) from None
    try:
        return True, PayloadType(hint)
    except TypeError:
        return True, None  # dict, Any, ...: the stored value as it is


def typed_runner(
    fn: Callable[..., object], codec: PayloadType | None
) -> Callable[[TaskContext], object]:
    """The ``fn(ctx)`` a worker runs for a task taking ``(ctx, payload)``: the stored
    payload rebuilt as its type (also in ``ctx.payload``), then ``fn(ctx, payload)``.
    A coroutine function stays one, so the worker runs it as it would ``fn``."""

    def typed(ctx: TaskContext) -> TaskContext:
        if codec is None:
            return ctx
        return dataclasses.replace(ctx, payload=codec.decode(ctx.payload))

    if inspect.iscoroutinefunction(fn):

        async def run_async(ctx: TaskContext) -> object:
            ctx = typed(ctx)
            return await fn(ctx, ctx.payload)

        return functools.wraps(fn)(run_async)

    def run(ctx: TaskContext) -> object:
        ctx = typed(ctx)
        return fn(ctx, ctx.payload)

    return functools.wraps(fn)(run)


class TaskHandle(Generic[P, R]):
    """A registered task: call it as its function, schedule it with a typed payload.

    Attributes:
        name: the task name jobs carry.
        fn: the decorated function.
        payload_type: the payload's type, or None for an untyped task.
    """

    def __init__(
        self,
        registry: TaskRegistry,
        name: str,
        fn: Callable[..., R],
        codec: PayloadType | None,
    ) -> None:
        self.registry = registry
        self.name = name
        self.fn = fn
        self._codec = codec
        functools.update_wrapper(self, fn)

    @property
    def payload_type(self) -> Any:
        return None if self._codec is None else self._codec.tp

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Call the function itself."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TaskHandle({self.name!r})"

    def encode(self, payload: P) -> Any:
        """The stored form of ``payload`` (checked against the payload type).

        Raises:
            TypeError, ValueError: naming the field that does not fit.
        """
        return payload if self._codec is None else self._codec.encode(payload)

    def spec(
        self,
        payload: P,
        *,
        id: str,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        priority: int = 0,
    ) -> JobSpec:
        """A :class:`JobSpec` of this task, for ``schedule_many``: ``timeout`` (the job's
        own) and ``priority`` (0 .. 9) as :meth:`Scheduler.schedule` takes them.

        Raises:
            TypeError, ValueError: for a payload that does not fit, or a bad argument.
        """
        return JobSpec(
            id,
            self.name,
            self.encode(payload),
            delay=delay,
            at=at,
            max_attempts=max_attempts,
            timeout=timeout,
            priority=priority,
        )

    async def schedule(
        self,
        payload: P,
        *,
        id: str,
        scheduler: Scheduler | TaskContext | None = None,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
        replace: bool = False,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        conn: Any = None,
        **options: Any,
    ) -> ScheduleResult:
        """:meth:`Scheduler.schedule` of this task: ``options`` are its other keyword
        arguments (``every``, ``cron``, ``tz``, ``missed``, ...). ``scheduler``: a
        :class:`Scheduler`, or a :class:`TaskContext` (a follow-up job, through
        ``ctx.schedule``); default: the registry's bound one.

        Raises:
            TypeError, ValueError: for a payload that does not fit (nothing written).
            RuntimeError: if there is no scheduler to use.
            What :meth:`Scheduler.schedule` raises.
        """
        stored = self.encode(payload)
        from ._tasks import TaskContext  # noqa: PLC0415  (_tasks imports this module)

        kwargs = dict(
            options, delay=delay, at=at, replace=replace, max_attempts=max_attempts, conn=conn
        )
        if isinstance(scheduler, TaskContext):
            return await scheduler.schedule(id, self.name, stored, **kwargs)
        sched = scheduler if scheduler is not None else self.registry.scheduler
        if sched is None:
            raise RuntimeError(
                f"task {self.name!r} has no scheduler: pass scheduler=, or call"
                " registry.bind(scheduler) once"
            )
        return await sched.schedule(id, self.name, stored, **kwargs)

    def schedule_sync(
        self,
        payload: P,
        *,
        id: str,
        scheduler: SyncScheduler | None = None,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
        replace: bool = False,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        conn: Any = None,
        **options: Any,
    ) -> ScheduleResult:
        """:meth:`SyncScheduler.schedule` of this task (blocking), as :meth:`schedule`.

        Raises:
            TypeError, ValueError: for a payload that does not fit (nothing written).
            RuntimeError: if there is no SyncScheduler to use.
        """
        stored = self.encode(payload)
        sched = scheduler if scheduler is not None else self.registry.sync_scheduler
        if sched is None:
            raise RuntimeError(
                f"task {self.name!r} has no SyncScheduler: pass scheduler=, or call"
                " registry.bind(sync_scheduler) once"
            )
        return sched.schedule(
            id,
            self.name,
            stored,
            delay=delay,
            at=at,
            replace=replace,
            max_attempts=max_attempts,
            conn=conn,
            **options,
        )
