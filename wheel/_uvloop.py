"""uvloop's event loop with its timers on a :class:`TimingWheel`.

``WheelUVLoop`` is a ``uvloop.Loop`` whose Python-level ``call_later`` and ``call_at``
file their handles in a wheel (``_loop_timers.py``) instead of one libuv timer each.
The wheel itself is woken by a single native timer (``uvloop.Loop.call_later``), kept no
later than the wheel's alarm (``_wheel_rearm``); that wake-up fires the wheel and runs
the due handles at once, sorted by ``when()``, each as its own handle (exceptions to the
loop's handler; in debug mode a slow callback is logged as asyncio logs it).

uvloop's own internal timers (its ``sock_*`` and connection timeouts in Cython) do not go
through ``call_later`` and stay on libuv's heap; everything a Python library schedules
(asyncio.timeout, wait_for, sleep, uvicorn's and aiohttp's keep-alive) uses the wheel.

``uvloop`` is imported by this module only: install the ``uvloop`` extra.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVarTuple, Unpack

import uvloop

from ._api import DEFAULT_TICK
from ._loop_timers import (
    LoopClockAlarm,
    WheelTimerHandle,
    check_tick,
    close_wheel,
    filer,
    new_wheel,
    sort_due,
)

_Ts = TypeVarTuple("_Ts")

__all__ = ["WheelUVLoop"]

_INF = float("inf")
_ceil = math.ceil
# uvloop's call_at calls self.call_later, which is ours: the wake-up takes the native one.
_native_call_later = uvloop.Loop.call_later
_logger = logging.getLogger("asyncio")  # where asyncio reports slow callbacks


class WheelUVLoop(uvloop.Loop):
    """A ``uvloop.Loop`` whose ``call_later``/``call_at`` use a wheel.

    Args:
        tick: the wheel's resolution in seconds (positive, finite): a timer runs at most
            one tick after its ``when()``, never before.

    Raises:
        ValueError: ``tick`` is not a positive finite number.
        TypeError: ``tick`` is not a number.
    """

    def __init__(self, *, tick: float = DEFAULT_TICK) -> None:
        check_tick(tick)  # before uvloop opens anything
        super().__init__()
        wheel, alarm, due = new_wheel(self, tick, LoopClockAlarm)
        self._wheel = wheel  # every Python-level call_later/call_at of this loop
        self._wheel_alarm = alarm
        self._wheel_due: list[WheelTimerHandle] = due  # one firing's handles, to sort
        self._wheel_file = filer(wheel)  # file(handle, when): into the wheel
        self._wheel_native: asyncio.TimerHandle | None = None  # the wheel's wake-up
        self._wheel_native_when = _INF  # the loop time it is armed for
        alarm.on_change = self._wheel_rearm

    @property
    def tick(self) -> float:
        """The wheel's resolution in seconds."""
        return self._wheel._tick

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Call ``callback(*args)`` ``delay`` seconds from now, as asyncio does."""
        if delay is None:
            raise TypeError("delay must not be None")
        handle: Any = self.call_at(self.time() + delay, callback, *args, context=context)
        if handle._source_traceback:  # the frame of this method
            del handle._source_traceback[-1]
        return handle  # type: ignore[no-any-return]

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Call ``callback(*args)`` at loop time ``when``, as asyncio does.

        Raises:
            ValueError: ``when`` is NaN.
            TypeError: ``when`` is None or not a real number, ``callback`` is not
                callable, or (in debug mode, as asyncio checks it) a coroutine function.
            RuntimeError: the loop is closed.
        """
        if when is None:
            raise TypeError("when cannot be None")
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        if self.get_debug() and (
            asyncio.iscoroutine(callback) or asyncio.iscoroutinefunction(callback)
        ):  # in debug mode only, as asyncio's own check (it costs more than the insert)
            raise TypeError("coroutines cannot be used with call_at()")
        if not callable(callback):
            raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")
        handle: Any = WheelTimerHandle(when, callback, args, self, context)
        if handle._source_traceback:  # the frame of this method
            del handle._source_traceback[-1]
        self._wheel_file(handle, when)
        return handle  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the loop; pending timers are dropped."""
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        close_wheel(self._wheel)
        native = self._wheel_native
        if native is not None:
            self._wheel_native = None
            native.cancel()
        super().close()

    def _wheel_rearm(self, when: float) -> None:
        """Keep the native wake-up no later than the wheel's alarm (``when``).

        Lazily: an armed wake-up that comes first is kept (it finds nothing due, and the
        wheel then re-arms), so a server's timers arming and cancelling on every request
        do not each cancel and make a libuv timer. When the wheel empties (``inf``) the
        wake-up is left to fire once, finding nothing; ``close()`` cancels it.
        """
        if when == _INF:
            return
        native = self._wheel_native
        if native is not None:
            if when >= self._wheel_native_when:
                return
            native.cancel()
        # uvloop rounds a delay to whole ms (libuv's clock): round up, or the wake-up
        # would come before the wheel's tick has begun and find nothing due.
        delay = _ceil((when - self.time()) * 1000.0) / 1000.0
        self._wheel_native = _native_call_later(self, max(delay, 0.0), self._wheel_wake)
        self._wheel_native_when = when

    def _wheel_wake(self) -> None:
        """The native timer: fire the wheel, then run what it fired, by ``when()``."""
        self._wheel_native = None
        due = self._wheel_due
        try:
            self._wheel._run()
        finally:
            sort_due(due)
            batch = due[:]
            due.clear()
        if self.get_debug():
            slow = self.slow_callback_duration
            for handle in batch:
                if not handle._cancelled:
                    t0 = self.time()
                    handle._run()
                    took = self.time() - t0
                    if took >= slow:
                        _logger.warning("Executing %r took %.3f seconds", handle, took)
        else:
            for handle in batch:
                if not handle._cancelled:
                    handle._run()
