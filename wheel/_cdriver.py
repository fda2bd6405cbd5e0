"""The driver on the compiled core: ``TimingWheel`` whose hot path runs in ``_cwheel``.

``schedule``, ``schedule_at``, the timer's ``cancel``/``reschedule``, the firing loop
(``_run``), arming and ``next_when`` are C (wheel/_cwheel.c and its parts in
wheel/csrc/); the cold methods are the ones both wheels share (``_api._WheelAPI``), and
the argument checks for anything but ``float`` and ``int`` are Python (the C code calls
back into the helpers below). The pure-Python modules are the reference: tests run both
and hold them equal.

Importing this module raises ImportError when the C core was not built.
"""

from __future__ import annotations

import asyncio
import asyncio.exceptions
import contextvars
import math
from typing import Any

from . import _cwheel
from ._api import DEFAULT_TICK, WheelStats, _clock_of, _validated, _WheelAPI
from ._errors import WheelClosed, WheelFull
from ._handle import Timer as _PyTimer

__all__ = ["Timeout", "Timer", "TimingWheel"]

_INF = math.inf
# The compiled core's clock is an int64 of ticks; deadlines from 2**62 ticks on are kept
# (with their loop time) but cannot come due, so the clock must start well below that.
_TICK_LIMIT = 2**61

#: The timer handle of the compiled core: the same methods and properties as
#: ``_handle.Timer`` (96 bytes with its GC header, list links included).
Timer = _cwheel.Timer

#: ``Timeout`` on the compiled core: wheel/_timeout.py's, in C (the same states, errors
#: and order of effects); what ``timeout()`` returns on a compiled wheel.
Timeout = _cwheel.Timeout


class TimingWheel(_WheelAPI, _cwheel.Wheel):
    """A hierarchical hashed timing wheel driven by an asyncio event loop (C core).

    The same class, arguments, behaviour and errors as the pure-Python
    ``tickwheel.wheel._driver.TimingWheel``; see there.
    """

    __slots__ = ("__weakref__",)

    _timeout_type = _cwheel.Timeout  # type: ignore[assignment]  # the same API

    def __init__(
        self,
        tick: float = DEFAULT_TICK,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        max_pending: int | None = None,
    ) -> None:
        tick, loop = _validated(tick, loop, max_pending)
        elapsed = _floor(loop.time(), tick)
        if elapsed < 0:  # as the pure core refuses it
            raise ValueError(f"elapsed must be >= 0, got {elapsed}")
        if elapsed >= _TICK_LIMIT:
            raise ValueError(
                f"tick {tick!r} is too fine for this loop's clock: the compiled wheel counts "
                f"ticks in 62 bits (set TICKWHEEL_PURE=1 for unbounded ticks)"
            )
        self._init_core(
            tick,
            loop,
            _clock_of(loop),
            contextvars.copy_context(),
            max_pending,
            elapsed,
            _INF if max_pending is None else max_pending,
        )

    def close(self) -> list[_PyTimer]:
        """Stop the wheel and return the timers that had not fired, by deadline.

        The timers returned will not run (``cancelled()`` is True) but keep ``callback``
        and ``args``, so a caller can hand them elsewhere. Closing twice returns [].
        """
        if self._closed:
            return []
        self._closed = True
        self._capacity = -1
        self._disarm()
        out = self._drain()
        out.sort(key=_deadline_of)  # stable: FIFO within a tick survives
        return out

    def stats(self) -> WheelStats:
        """Return a snapshot of the wheel's counters."""
        return WheelStats(
            pending=len(self),
            fired=self._fired,
            wakeups=self._wakeups,
            levels=self._levels,
            next_when=None if self._handle is None else self._armed_tick * self._tick,
            cancelled=self._cancelled,
            wakeup_lateness_max=self._late_max,
            wakeup_lateness_sum=self._late_sum,
            implementation="c",
        )

    def _floor_tick(self, t: float) -> int:
        return _floor(t, self._tick)


def _floor(t: float, tick: float) -> int:
    """The last tick ``n`` with ``n * tick <= t`` in float arithmetic."""
    n = math.floor(t / tick)
    if n * tick > t:
        n -= 1
    return n


def _deadline_of(timer: _PyTimer) -> int:
    return timer._deadline


def _slow_when_after(wheel: _cwheel.Wheel, delay: Any) -> tuple[float, float]:
    """``(now, when)`` for a delay that is not a float or an int (as Python checks it)."""
    try:
        if not 0.0 <= delay < _INF:
            raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
        when = wheel._time() + delay
    except TypeError:
        raise TypeError(f"delay must be a real number, got {delay!r}") from None
    return float(when - delay), float(when)


def _slow_check_when(when: Any) -> float:
    """A ``when`` that is not a float, checked as Python checks it."""
    try:
        if -_INF < when < _INF:
            return float(when)
    except TypeError:
        raise TypeError(f"when must be a real number, got {when!r}") from None
    raise ValueError(f"when must be a finite number, got {when!r}")


def _timer_repr(timer: _cwheel.Timer) -> str:
    if timer.pending():
        state = f"pending when={timer.when():.6f}"
    elif timer._fired:
        state = "fired"
    else:
        state = "cancelled"
    cb = timer.callback
    name = getattr(cb, "__qualname__", repr(cb)) if cb is not None else "-"
    return f"<Timer {state} {name}>"


_cwheel._setup(
    WheelClosed,
    WheelFull,
    _slow_when_after,
    _slow_check_when,
    _timer_repr,
    asyncio.current_task,
    asyncio.exceptions.CancelledError,
)
