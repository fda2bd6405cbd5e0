"""The pure-Python ``TimingWheel``: its hot path on an asyncio loop (adding, cancelling
and moving timers, arming ``loop.call_at``, firing what is due) over the core of
``_core.py``; the reference the compiled driver (``_cdriver.py``) is held equal to.

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
import contextvars
import math
from collections.abc import Callable
from typing import Any

from ._api import DEFAULT_TICK, WheelStats, _clock_of, _validated, _WheelAPI
from ._core import Core
from ._errors import WheelClosed, WheelFull
from ._handle import _FIRED, Timer

__all__ = ["TimingWheel"]

_INF = math.inf
_NEG_INF = -math.inf
_ceil = math.ceil
# Skips a Python-level __init__ call (see bench/suites/bench_wheel.py: schedule).
_new_timer = Timer.__new__


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
        # The body of _add, inlined: this is the hottest path (see bench/suites/bench_wheel.py).
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
