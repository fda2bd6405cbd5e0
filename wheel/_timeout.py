"""Timeouts and sleeps on a wheel, with asyncio's names and semantics.

:class:`Timeout` mirrors the running Python's :class:`asyncio.Timeout` (``when()``,
``reschedule(when)``, ``expired()``, :class:`TimeoutError` on expiry, its chaining,
nesting and ``uncancel`` handled the same way, the same errors on misuse), so
``asyncio.timeout`` -> ``tickwheel.wheel.timeout`` is a one-name change. Where asyncio
changed between versions, this follows the interpreter it runs on: from 3.13 a subclass
of ``CancelledError`` leaving an expired block becomes ``TimeoutError`` too, and any other
exception leaving it (and each member of an exception group, as a ``TaskGroup`` raises)
gets a ``TimeoutError`` put into its ``__context__`` chain before the ``CancelledError``.
tests/test_wheel_timeout_dropin.py compares the two on each version.

The difference is the cost of ``reschedule``: it moves the wheel timer in O(1) and
allocates nothing, where asyncio cancels a heap entry and pushes a new one.
"""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, final

if TYPE_CHECKING:
    from ._handle import Timer

__all__ = ["Timeout", "TimeoutWheel", "sleep_on"]

T = TypeVar("T")

_INF = float("inf")
# asyncio 3.13's Timeout: CancelledError subclasses convert, foreign exceptions get a
# TimeoutError in their context chain (gh-113848, gh-115957).
_PY313 = sys.version_info >= (3, 13)


class TimeoutWheel(Protocol):
    """What a :class:`Timeout` and a sleep use of their wheel (``TimingWheel`` is one);
    named here so that this module imports nothing of the driver."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def _time(self) -> float:
        """The loop's clock."""

    def schedule(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Call ``callback(*args)`` after ``delay`` seconds."""

    def schedule_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Call ``callback(*args)`` at loop time ``when``."""


class _State(enum.Enum):
    CREATED = "created"
    ENTERED = "active"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "finished"


@final
class Timeout:
    """An ``async with`` block that cancels the current task at a loop time.

    Make one with :func:`tickwheel.wheel.timeout` / :func:`~tickwheel.wheel.timeout_at`
    or ``TimingWheel.timeout``; not directly.
    """

    __slots__ = ("_cancelling", "_soon", "_state", "_task", "_time", "_timer", "_wheel", "_when")

    def __init__(self, wheel: TimeoutWheel, when: float | None) -> None:
        self._wheel = wheel  # the wheel the expiry is scheduled on
        self._time = wheel._time  # the loop's clock (loop.time or its C twin), per reschedule
        self._when = when  # deadline as given (loop time); None: never
        self._state = _State.CREATED
        self._timer: Timer | None = None  # the pending expiry, while entered
        # A deadline already past expires at the next loop iteration, as asyncio's does
        # (loop.call_soon), not one tick later: the pending call_soon, if any.
        self._soon: asyncio.Handle | None = None
        self._task: asyncio.Task[object] | None = None  # the task to cancel
        self._cancelling = 0  # the task's cancelling() on entry, to tell our cancel apart

    def when(self) -> float | None:
        """Return the deadline (loop time), or None if it never expires."""
        return self._when

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to loop time ``when`` (None: never). O(1), no allocation.

        Raises:
            RuntimeError: the block has not been entered, or has expired or exited.
            ValueError: ``when`` is NaN.
        """
        if self._state is not _State.ENTERED:
            if self._state is _State.CREATED:
                raise RuntimeError("Timeout has not been entered")
            raise RuntimeError(f"Cannot change state of {self._state.value} Timeout")
        timer = self._timer
        if when is None or when == _INF:
            if timer is not None:
                timer.cancel()
                self._timer = None
            self._cancel_soon()
        else:
            try:
                past = when <= self._time()  # NaN: False, for reschedule_at to refuse
            except TypeError:
                raise TypeError(f"when must be a real number, got {when!r}") from None
            if past:
                if timer is not None:
                    timer.cancel()
                    self._timer = None
                if self._soon is None:
                    self._soon = self._wheel.loop.call_soon(self._on_timeout)
            else:
                if timer is None or not timer.reschedule_at(when):  # raises before a change
                    self._timer = self._wheel.schedule_at(when, self._on_timeout)
                if self._soon is not None:
                    self._cancel_soon()
        self._when = when

    def _cancel_soon(self) -> None:
        soon = self._soon
        if soon is not None:
            soon.cancel()
            self._soon = None

    def expired(self) -> bool:
        """Return True if the timeout expired while the block ran."""
        return self._state is _State.EXPIRING or self._state is _State.EXPIRED

    def __repr__(self) -> str:
        when = ""
        if self._state is _State.ENTERED:
            when = f" when={round(self._when, 3) if self._when is not None else None}"
        return f"<Timeout [{self._state.value}]{when}>"

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._state = _State.ENTERED
        self._task = task
        self._cancelling = task.cancelling()
        self.reschedule(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        if self._state is not _State.ENTERED and self._state is not _State.EXPIRING:
            raise AssertionError  # as asyncio's: exit without enter, or a second exit
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        self._cancel_soon()
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            assert self._task is not None
            # No one else asked to cancel the task: the cancellation is ours.
            if self._task.uncancel() <= self._cancelling and exc_type is not None:
                if not _PY313:
                    if exc_type is asyncio.CancelledError:
                        raise TimeoutError from exc_val
                elif issubclass(exc_type, asyncio.CancelledError):
                    raise TimeoutError from exc_val
                elif exc_val is not None:
                    _insert_timeout_error(exc_val)
                    if isinstance(exc_val, ExceptionGroup):
                        for member in exc_val.exceptions:
                            _insert_timeout_error(member)
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED
        return None

    def _on_timeout(self) -> None:
        assert self._state is _State.ENTERED
        assert self._task is not None
        self._task.cancel()
        self._state = _State.EXPIRING
        self._timer = None
        self._soon = None


def _insert_timeout_error(exc: BaseException) -> None:
    """Put a TimeoutError, caused by it, before the first CancelledError in ``exc``'s
    context chain (asyncio 3.13's Timeout does, so that a logger sees the expiry)."""
    while (context := exc.__context__) is not None:
        if isinstance(context, asyncio.CancelledError):
            error = TimeoutError()
            error.__context__ = error.__cause__ = context
            exc.__context__ = error
            return
        exc = context


def _wake(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


async def sleep_on(wheel: TimeoutWheel, delay: float, result: T) -> T:
    """Sleep ``delay`` seconds on ``wheel``; the body of ``sleep`` and ``wheel.sleep``.

    Raises:
        ValueError: ``delay`` is NaN.
        TypeError: ``delay`` is not a real number.
    """
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):  # a tuple: no union per call
        raise TypeError(f"delay must be a real number, got {delay!r}")
    if delay != delay:  # noqa: PLR0124
        raise ValueError("delay must be a number, got nan")
    if delay <= 0:
        await asyncio.sleep(0)
        return result
    future: asyncio.Future[T] = wheel.loop.create_future()
    if delay == float("inf"):
        return await future  # as asyncio.sleep(inf): until cancelled
    timer = wheel.schedule(delay, _wake, future, result)
    try:
        return await future
    finally:
        timer.cancel()
