"""The asyncio driver: the only module of the wheel that touches an event loop.

Ground rules:

1. At most one ``loop.call_at`` is armed, for the start of the earliest non-empty bucket
   (``_armed_tick``); none while the wheel is empty (G5). A new timer re-arms only when
   it is due before the armed tick; cancelling never re-arms (a wake-up for an emptied
   bucket just finds nothing due and arms the next one), except that cancelling the
   last timer disarms.
2. Deadlines convert to ticks rounding up, and the driver fires tick ``n`` only once
   ``n * tick <= loop.time()``, so a callback never runs before its ``when`` (G1); it runs
   at most one tick plus the loop's own latency after it (G2).
3. While ``_run`` fires callbacks, ``_armed_tick`` is -inf so that timers they schedule do
   not arm; ``_run`` arms once at the end.
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

from ._core import Core
from ._errors import WheelClosed, WheelFull
from ._handle import _FIRED, Timer
from ._impl import IMPLEMENTATION
from ._timeout import Timeout, sleep_on

__all__ = ["TimingWheel", "WheelStats"]

T = TypeVar("T")

_INF = math.inf
_NEG_INF = -math.inf
# The default tick: 1 ms, the resolution of uvloop's clock and of most I/O timeouts.
DEFAULT_TICK = 0.001
_ceil = math.ceil
_floor = math.floor
_new_timer = Timer.__new__  # skips a Python-level __init__ call (see bench_wheel: schedule)


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
    """What both implementations of :class:`TimingWheel` share: the cold, loop-facing
    methods. The hot path (schedule, cancel, reschedule, firing) is the subclass's own:
    :class:`TimingWheel` below in Python, ``_cdriver.TimingWheel`` on the C core."""

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
        return await sleep_on(cast("TimingWheel", self), delay, result)

    def timeout(self, delay: float | None) -> Timeout:
        """An ``async with`` block that cancels itself after ``delay`` seconds.

        Like :func:`asyncio.timeout`: raises :class:`TimeoutError` on expiry; ``None``
        never expires; a negative delay expires at the next tick.
        """
        when = None if delay is None else self._loop.time() + _real(delay)
        return self._timeout_type(cast("TimingWheel", self), when)

    def timeout_at(self, when: float | None) -> Timeout:
        """Like :meth:`timeout`, with an absolute loop time; :func:`asyncio.timeout_at`."""
        when_ = None if when is None else _real(when, "when")
        return self._timeout_type(cast("TimingWheel", self), when_)

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


class TimingWheel(_WheelAPI):
    """A hierarchical hashed timing wheel driven by an asyncio event loop.

    Args:
        tick: the wheel's resolution in seconds (positive, finite). Deadlines round up to
            a whole tick; a callback runs at most one tick late (plus loop latency).
        loop: the event loop; the running loop when None.
        max_pending: refuse new timers with :class:`WheelFull` while this many are
            pending; unbounded when None.

    Raises:
        ValueError: ``tick`` or ``max_pending`` is out of range.
        RuntimeError: ``loop`` is None and no loop is running.
    """

    __slots__ = (
        "__weakref__",
        "_armed_tick",
        "_cancelled",
        "_capacity",
        "_closed",
        "_context",
        "_core",
        "_fired",
        "_handle",
        "_late_max",
        "_late_sum",
        "_loop",
        "_max_pending",
        "_tick",
        "_time",
        "_timer_type",
        "_wakeups",
    )

    def __init__(
        self,
        tick: float = DEFAULT_TICK,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        max_pending: int | None = None,
    ) -> None:
        self._tick, self._loop = _validated(tick, loop, max_pending)  # s per tick; the loop
        loop = self._loop
        self._time: Callable[[], float] = _clock_of(loop)  # the clock every deadline uses
        # The handles of this wheel: a subclass whose class attribute names the wheel, so
        # no timer spends a slot on it (see _handle.py).
        self._timer_type: type[Timer] = type(
            "Timer", (Timer,), {"__slots__": (), "_wheel": self, "__module__": Timer.__module__}
        )
        self._core: Core[Timer] = Core(self._floor_tick(loop.time()))  # buckets, on integer ticks
        self._max_pending = max_pending  # cap on pending timers, or None
        # One comparison on the hot path covers both refusals: inf when unbounded,
        # max_pending when bounded, -1 once closed (see _refuse).
        self._capacity: float = _INF if max_pending is None else max_pending
        self._armed_tick: float = _INF  # tick of the armed call_at; inf: none; -inf: firing
        self._handle: asyncio.TimerHandle | None = None  # the armed call_at
        self._closed = False  # set by close(); scheduling then raises WheelClosed
        # Callbacks scheduled without context= run here, not in whatever context happened
        # to arm the wake-up (call_at copies the caller's context by default).
        self._context = contextvars.copy_context()
        self._fired = 0  # callbacks run
        self._wakeups = 0  # times _run was called by the loop
        self._cancelled = 0  # cancel() calls that prevented a callback (counted in _handle)
        self._late_max = 0.0  # worst wake-up lateness (s) past the armed tick
        self._late_sum = 0.0  # sum of wake-up lateness (s)

    # -- public API -----------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of pending timers (exact). O(1)."""
        return self._core._len

    def schedule(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> Timer:
        """Call ``callback(*args)`` after ``delay`` seconds, like ``loop.call_later``.

        Args:
            delay: seconds from now; finite and >= 0.
            callback: a callable; its exceptions go to the loop's exception handler.
            *args: positional arguments for the callback.
            context: the :class:`contextvars.Context` to run it in. Unlike
                ``call_later``, None does not copy the caller's context (that costs time
                and memory per timer): the callback runs in the wheel's own context,
                copied when the wheel was made. Pass ``contextvars.copy_context()`` for
                ``call_later``'s behaviour.

        Returns:
            The :class:`Timer`, to cancel or reschedule it.

        Raises:
            ValueError: ``delay`` is negative, NaN or infinite.
            TypeError: ``delay`` is not a real number, or ``callback`` is not callable.
            WheelClosed: the wheel was closed.
            WheelFull: ``max_pending`` timers are pending.

        Runtime complexity: O(1).
        """
        # The body of _add, inlined: this is the hottest path (see bench_wheel).
        try:
            if not 0.0 <= delay < _INF:
                raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
            when = self._time() + delay
        except TypeError:
            raise TypeError(f"delay must be a real number, got {delay!r}") from None
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        core = self._core
        if core._len >= self._capacity:
            self._refuse()
        tick = self._tick
        deadline = _ceil(when / tick)
        if deadline * tick < when:  # float rounding must never make a timer early (G1)
            deadline += 1
        if not core._len:
            core.advance_idle(self._floor_tick(when - delay))
        timer = _new_timer(self._timer_type)
        timer._callback = callback
        timer._args = args
        timer._context = context
        deadline = core.insert(timer, deadline)
        if deadline < self._armed_tick:
            self._arm(deadline)
        return timer

    def schedule_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> Timer:
        """Call ``callback(*args)`` at loop time ``when``, like ``loop.call_at``.

        A ``when`` in the past fires at the next tick. Otherwise as :meth:`schedule`.

        Raises:
            ValueError: ``when`` is NaN or infinite.
            TypeError: ``when`` is not a real number, or ``callback`` is not callable.
            WheelClosed: the wheel was closed.
            WheelFull: ``max_pending`` timers are pending.
        """
        return self._add(self._check_when(when), callback, args, context)

    def close(self) -> list[Timer]:
        """Stop the wheel and return the timers that had not fired, by deadline.

        The timers returned will not run (``cancelled()`` is True) but keep ``callback``
        and ``args``, so a caller can hand them elsewhere. Closing twice returns [].
        """
        if self._closed:
            return []
        self._closed = True
        self._capacity = -1
        self._disarm()
        return self._core.drain()

    def next_when(self) -> float | None:
        """Loop time of the next wake-up the wheel needs, or None when it is empty."""
        tick = self._core.next_deadline()
        return None if tick is None else tick * self._tick

    def stats(self) -> WheelStats:
        """Return a snapshot of the wheel's counters."""
        return WheelStats(
            pending=self._core._len,
            fired=self._fired,
            wakeups=self._wakeups,
            levels=self._core.levels,
            next_when=None if self._handle is None else self._armed_tick * self._tick,
            cancelled=self._cancelled,
            wakeup_lateness_max=self._late_max,
            wakeup_lateness_sum=self._late_sum,
            implementation="python",
        )

    def _check(self) -> None:
        """Assert the core's and the driver's invariants (for tests). O(n)."""
        self._core._check()
        if self._core._len == 0:
            assert self._handle is None, "armed while empty"
        else:
            earliest = min(t._deadline for t in self._core)
            assert self._handle is not None, "not armed while timers are pending"
            assert self._armed_tick <= earliest, (
                f"armed for tick {self._armed_tick}, a timer is due at tick {earliest}"
            )

    # -- internals ------------------------------------------------------------------------

    def _add(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> Timer:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        core = self._core
        if core._len >= self._capacity:
            self._refuse()
        tick = self._tick
        deadline = _ceil(when / tick)
        if deadline * tick < when:
            deadline += 1
        if not core._len:
            core.advance_idle(self._floor_tick(self._time()))
        timer = _new_timer(self._timer_type)
        timer._callback = callback
        timer._args = args
        timer._context = context
        deadline = core.insert(timer, deadline)
        if deadline < self._armed_tick:
            self._arm(deadline)
        return timer

    def _clear_entry(self) -> None:
        """A pending timer left its bucket (``Timer.cancel``): count it, disarm once empty.

        Runtime complexity: O(1).
        """
        self._cancelled += 1
        core = self._core
        core._len -= 1
        if not core._len:
            self._disarm()

    def _reregister(self, timer: Timer, when: float) -> None:
        """Move a pending ``timer`` to loop time ``when`` (``Timer.reschedule``).

        Runtime complexity: O(1).
        """
        tick = self._tick
        deadline = _ceil(when / tick)
        if deadline * tick < when:  # never early (G1)
            deadline += 1
        deadline = self._core.move(timer, deadline)
        if deadline < self._armed_tick:
            self._arm(deadline)

    def _refuse(self) -> None:
        if self._closed:
            raise WheelClosed("cannot schedule on a closed TimingWheel")
        raise WheelFull(f"max_pending={self._max_pending} timers are pending")

    def _arm(self, deadline: int) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
        self._armed_tick = deadline
        self._handle = self._loop.call_at(deadline * self._tick, self._run, context=self._context)

    def _disarm(self) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
        if self._armed_tick != _NEG_INF:  # while firing, _run re-arms at its end
            self._armed_tick = _INF

    def _run(self) -> None:
        """The armed call_at: fire every due timer, then arm for the next bucket."""
        self._handle = None
        t_now = self._time()
        # asyncio may run a call_at up to its clock resolution early; _run then finds the
        # tick not due yet and re-arms, so this can be slightly negative, never a firing.
        late = t_now - self._armed_tick * self._tick
        if _NEG_INF < late < _INF:  # (infinite: not armed, a direct call)
            self._late_sum += late
            self._late_max = max(self._late_max, late)
        self._armed_tick = _NEG_INF
        self._wakeups += 1
        loop = self._loop
        core = self._core
        now = self._floor_tick(t_now)
        pop_due = core.pop_due
        fired = 0
        bucket = None
        try:
            while (bucket := pop_due(now)) is not None:
                # A snapshot: callbacks may cancel or move timers of this same bucket, which
                # deletes them from it; those no longer point at it and are skipped.
                for timer in list(bucket):
                    if timer._bucket is not bucket:
                        continue
                    timer._bucket = None
                    core._len -= 1
                    callback = timer._callback
                    args = timer._args
                    context = timer._context
                    timer._callback = _FIRED
                    timer._args = None
                    fired += 1
                    try:
                        if context is None:  # _run already runs in the wheel's context
                            callback(*args)  # type: ignore[misc]
                        else:
                            timer._context = None
                            context.run(callback, *args)  # type: ignore[arg-type, misc]
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        loop.call_exception_handler(
                            {
                                "message": f"Exception in timer callback {callback!r}",
                                "exception": exc,
                                "timer": timer,
                            }
                        )
            bucket = None
        finally:
            self._fired += fired
            if bucket is not None:  # unwinding: put back what this bucket still holds
                core.restore(bucket)
            self._armed_tick = _INF
            if not self._closed:
                deadline = core.next_deadline()
                if deadline is not None:
                    self._arm(deadline)


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
