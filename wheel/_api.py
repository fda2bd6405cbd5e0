"""What the two ``TimingWheel`` implementations share: the constructor's checks, the
stats snapshot, and the cold methods that face the loop (``_WheelAPI``).

``_driver.TimingWheel`` (pure Python) and ``_cdriver.TimingWheel`` (the compiled core)
each add their own hot path (schedule, cancel, reschedule, firing) on top.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from ._impl import IMPLEMENTATION
from ._timeout import Timeout, TimeoutWheel, sleep_on

if TYPE_CHECKING:
    from ._handle import Timer

__all__ = ["DEFAULT_TICK", "WheelStats"]

T = TypeVar("T")

_INF = math.inf
# The default tick: 1 ms, the resolution of uvloop's clock and of most I/O timeouts.
DEFAULT_TICK = 0.001
_floor = math.floor


@dataclass(frozen=True, slots=True)
class WheelStats:
    """A snapshot of a wheel's counters."""

    pending: int  #: timers scheduled and not yet fired or cancelled
    fired: int  #: callbacks run since the wheel was made
    wakeups: int  #: times the loop woke the wheel (each one armed ``call_at``)
    levels: int  #: levels allocated so far (grows with the farthest deadline seen)
    next_when: float | None  #: loop time of the next wake-up; None when idle
    cancelled: int = 0  #: timers whose ``cancel()`` prevented the callback
    #: how late (s) the loop woke the wheel, past the armed tick: the worst and the sum
    #: over wakeups (a timer fires within one tick of its wake-up, so this is the loop's
    #: share of its lateness; one subtraction per wake-up, none per timer)
    wakeup_lateness_max: float = 0.0
    wakeup_lateness_sum: float = 0.0
    #: which implementation runs this wheel: "c" or "python" (the public
    #: ``TimingWheel`` is the one ``IMPLEMENTATION`` names)
    implementation: str = IMPLEMENTATION


class _WheelAPI:
    """What both implementations of ``TimingWheel`` share: the cold, loop-facing
    methods. The hot path (schedule, cancel, reschedule, firing) is the subclass's own:
    ``_driver.TimingWheel`` in Python, ``_cdriver.TimingWheel`` on the C core."""

    __slots__ = ()

    _tick: float
    _loop: asyncio.AbstractEventLoop
    _time: Callable[[], float]
    _closed: bool
    #: What ``timeout()`` makes: ``_timeout.Timeout`` (the reference), or its compiled
    #: twin on the compiled wheel (``_cdriver.TimingWheel`` sets it).
    _timeout_type: ClassVar[type[Timeout]] = Timeout

    if TYPE_CHECKING:

        def __len__(self) -> int: ...

        def schedule(
            self,
            delay: float,
            callback: Callable[..., object],
            *args: Any,
            context: contextvars.Context | None = None,
        ) -> Timer: ...

    @property
    def tick(self) -> float:
        """Seconds per tick."""
        return self._tick

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop driving the wheel."""
        return self._loop

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def time(self) -> float:
        """The loop's clock (``loop.time()``), the clock every deadline refers to."""
        return self._time()

    def schedule_threadsafe(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> concurrent.futures.Future[Timer]:
        """Schedule from another thread; the delay counts from when the loop takes it.

        The arguments are checked in the calling thread, so bad input raises here.
        Counting the delay in the loop's thread means the timer is late by the hand-off
        time at worst, never early (uvloop's clock, read from another thread, can be
        stale by as long as the loop has been asleep).

        Returns:
            A :class:`concurrent.futures.Future` that resolves to the :class:`Timer`, or
            to the error (e.g. :class:`WheelClosed`) the loop's thread met.
        """
        self._when_after(delay)  # only to check it, in the caller's thread
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        future: concurrent.futures.Future[Timer] = concurrent.futures.Future()

        def add() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self.schedule(delay, callback, *args, context=context))
            except Exception as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(add)
        return future

    async def sleep(self, delay: float, result: T = None) -> T:  # type: ignore[assignment]
        """Sleep ``delay`` seconds on the wheel; like :func:`asyncio.sleep`.

        ``delay <= 0`` yields to the loop once, as asyncio does.

        Raises:
            ValueError: ``delay`` is NaN.
            TypeError: ``delay`` is not a real number.
        """
        return await sleep_on(cast("TimeoutWheel", self), delay, result)

    def timeout(self, delay: float | None) -> Timeout:
        """An ``async with`` block that cancels itself after ``delay`` seconds.

        Like :func:`asyncio.timeout`: raises :class:`TimeoutError` on expiry; ``None``
        never expires; a negative delay expires at the next tick.
        """
        when = None if delay is None else self._loop.time() + _real(delay)
        return self._timeout_type(cast("TimeoutWheel", self), when)

    def timeout_at(self, when: float | None) -> Timeout:
        """Like :meth:`timeout`, with an absolute loop time; :func:`asyncio.timeout_at`."""
        when_ = None if when is None else _real(when, "when")
        return self._timeout_type(cast("TimeoutWheel", self), when_)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={len(self)}"
        return f"<TimingWheel tick={self._tick} {state}>"

    # -- internals ------------------------------------------------------------------------

    def _floor_tick(self, t: float) -> int:
        """The last tick ``n`` with ``n * tick <= t`` in float arithmetic."""
        tick = self._tick
        n = _floor(t / tick)
        if n * tick > t:
            n -= 1
        return n

    def _when_after(self, delay: float) -> float:
        try:
            if 0.0 <= delay < _INF:
                return self._time() + delay
        except TypeError:
            raise TypeError(f"delay must be a real number, got {delay!r}") from None
        raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")

    @staticmethod
    def _check_when(when: float) -> float:
        try:
            if -_INF < when < _INF:
                return when
        except TypeError:
            raise TypeError(f"when must be a real number, got {when!r}") from None
        raise ValueError(f"when must be a finite number, got {when!r}")


def _validated(
    tick: float, loop: asyncio.AbstractEventLoop | None, max_pending: int | None
) -> tuple[float, asyncio.AbstractEventLoop]:
    """Check ``TimingWheel``'s arguments; return the tick as a float and the loop."""
    if isinstance(tick, bool) or not isinstance(tick, int | float):
        raise TypeError(f"tick must be a positive finite number, got {tick!r}")
    if not 0.0 < tick < _INF:
        raise ValueError(f"tick must be a positive finite number, got {tick!r}")
    if max_pending is not None and (
        isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1
    ):
        raise ValueError(f"max_pending must be a positive int or None, got {max_pending!r}")
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "TimingWheel() needs a running event loop; pass loop= to make one outside it"
            ) from None
    return float(tick), loop


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time`` itself, or ``time.monotonic`` when that is all the loop's time() does:
    the stdlib's is a Python-level wrapper costing a call per schedule."""
    return time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time


def _real(value: float, name: str = "delay") -> float:
    """Check a timeout's delay or deadline: any real number but NaN; inf means never."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number or None, got {value!r}")
    if value != value:  # noqa: PLR0124  (true only for NaN)
        raise ValueError(f"{name} must be a number or None, got nan")
    return float(value)
