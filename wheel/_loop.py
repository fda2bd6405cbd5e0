"""The stdlib selector event loop with its timers on a :class:`TimingWheel`.

``WheelEventLoop`` is an ``asyncio.SelectorEventLoop`` whose ``call_later`` and
``call_at`` file their handles in a wheel (``_loop_timers.py``) instead of the loop's
heap; everything else is the stdlib loop, unchanged. Two hooks join the wheel to
``BaseEventLoop._run_once``, which is not overridden:

* The selector is wrapped (:class:`_WheelSelector`): ``select(timeout)`` waits no longer
  than until the wheel's alarm, as ``_run_once`` itself bounds the wait by the heap's
  earliest deadline (capped at the same 24 h).
* ``_process_events`` (called by ``_run_once`` right after the select, before it moves
  due heap timers to the ready queue) fires the wheel once its alarm is due and appends
  the due handles to ``_ready``, sorted by ``when()``: after the I/O callbacks of this
  iteration, where ``_run_once`` puts due timers.

So a due timer runs in the iteration asyncio would run it in, as its own ready handle
(debug mode's slow-callback report included), never early: asyncio moves a timer to the
ready queue up to ``clock_resolution`` before its ``when``, the wheel only once its tick
has begun. The heap (``loop._scheduled``) stays empty.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVarTuple, Unpack

from ._api import DEFAULT_TICK
from ._loop_timers import (
    WheelTimerHandle,
    check_tick,
    close_wheel,
    filer,
    new_wheel,
    sort_due,
)

if TYPE_CHECKING:
    from ._uvloop import WheelUVLoop

_Ts = TypeVarTuple("_Ts")

__all__ = ["WheelEventLoop", "new_event_loop", "new_uvloop_event_loop"]

# asyncio.base_events.MAXIMUM_SELECT_TIMEOUT: the longest wait _run_once asks of a
# selector (some cannot take more); the same cap for a wait bounded by the wheel.
_MAX_WAIT = 24 * 3600
_monotonic = time.monotonic


class WheelEventLoop(asyncio.SelectorEventLoop):
    """An ``asyncio.SelectorEventLoop`` whose ``call_later``/``call_at`` use a wheel.

    Args:
        selector: the selector to wait on; ``selectors.DefaultSelector()`` when None.
        tick: the wheel's resolution in seconds (positive, finite): a timer runs at most
            one tick after its ``when()``, never before.

    Raises:
        ValueError: ``tick`` is not a positive finite number.
        TypeError: ``tick`` is not a number.
    """

    _selector: _WheelSelector

    def __init__(
        self, selector: selectors.BaseSelector | None = None, *, tick: float = DEFAULT_TICK
    ) -> None:
        try:
            check_tick(tick)  # before anything is opened
        except (TypeError, ValueError):
            self._closed = True  # what BaseEventLoop.__del__ reads of a loop never made
            raise
        wheel, alarm, due = new_wheel(self, tick)
        self._wheel = wheel  # every call_later/call_at of this loop
        self._wheel_alarm = alarm  # when the wheel must next run (inf: no timer)
        self._wheel_due: list[WheelTimerHandle] = due  # one firing's handles, to sort
        self._wheel_run: Callable[[], None] = wheel._run
        self._wheel_file = filer(wheel)  # file(handle, when): into the wheel
        inner = selectors.DefaultSelector() if selector is None else selector
        super().__init__(_WheelSelector(inner, alarm))

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
        """Call ``callback(*args)`` ``delay`` seconds from now, as asyncio does.

        Returns:
            A :class:`WheelTimerHandle` (an ``asyncio.TimerHandle``).
        """
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

        A ``when`` in the past runs at the next iteration; ``inf`` never runs.

        Returns:
            A :class:`WheelTimerHandle` (an ``asyncio.TimerHandle``).

        Raises:
            ValueError: ``when`` is NaN.
            TypeError: ``when`` is None or not a real number.
            RuntimeError: the loop is closed.

        Runtime complexity: O(1).
        """
        if when is None:
            raise TypeError("when cannot be None")
        me: Any = self  # BaseEventLoop's private checks are not in typeshed
        if me._closed:
            raise RuntimeError("Event loop is closed")
        if me._debug:
            me._check_thread()
            me._check_callback(callback, "call_at")
        # new_handle(), inlined: this is every timer's path (bench/probes/callgrind wheel).
        handle: Any = WheelTimerHandle(when, callback, args, self, context)
        if handle._source_traceback:  # the frame of this method
            del handle._source_traceback[-1]
        self._wheel_file(handle, when)
        return handle  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the loop; pending timers are dropped, as the stdlib loop drops its heap."""
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        close_wheel(self._wheel)
        super().close()

    def _process_events(self, event_list: list[Any]) -> None:
        super()._process_events(event_list)  # type: ignore[misc]
        if self._wheel_alarm.when <= _monotonic():
            self._fire_wheel()

    def _fire_wheel(self) -> None:
        """Run the wheel; queue what it fired, by ``when()``, after this turn's I/O."""
        due = self._wheel_due
        try:
            self._wheel_run()
        finally:
            sort_due(due)
            self._ready.extend(due)  # type: ignore[attr-defined]
            due.clear()


class _WheelSelector(selectors.BaseSelector):
    """A selector whose ``select`` waits no longer than the wheel's alarm."""

    def __init__(self, inner: selectors.BaseSelector, alarm: Any) -> None:
        self._inner = inner  # the selector that waits
        self._alarm = alarm  # the wheel's Alarm: .when is its next wake-up

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        when = self._alarm.when
        if when != float("inf"):
            wait = when - _monotonic()
            if timeout is None or wait < timeout:
                timeout = min(max(wait, 0.0), _MAX_WAIT)
        return self._inner.select(timeout)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


def new_event_loop(*, tick: float = DEFAULT_TICK) -> WheelEventLoop:
    """A new :class:`WheelEventLoop`: the stdlib loop with its timers on a wheel.

    A loop factory: ``asyncio.run(main(), loop_factory=new_event_loop)`` (Python 3.12+),
    ``asyncio.Runner(loop_factory=new_event_loop)`` (3.11+), or
    ``uvicorn app:app --loop tickwheel.wheel:new_event_loop``.

    Args:
        tick: the wheel's resolution in seconds; timers run at most one tick late.

    Raises:
        ValueError: ``tick`` is not a positive finite number.
        TypeError: ``tick`` is not a number.
    """
    return WheelEventLoop(tick=tick)


def new_uvloop_event_loop(*, tick: float = DEFAULT_TICK) -> WheelUVLoop:
    """A new :class:`WheelUVLoop`: uvloop with its timers on a wheel.

    A loop factory, as :func:`new_event_loop` is
    (``uvicorn app:app --loop tickwheel.wheel:new_uvloop_event_loop``).

    Args:
        tick: the wheel's resolution in seconds; timers run at most one tick late.

    Raises:
        ImportError: uvloop is not installed (``pip install tickwheel[uvloop]``).
        ValueError: ``tick`` is not a positive finite number.
        TypeError: ``tick`` is not a number.
    """
    try:
        from ._uvloop import WheelUVLoop  # noqa: PLC0415  (uvloop is optional)
    except ModuleNotFoundError as exc:
        if exc.name != "uvloop":
            raise
        raise ImportError(
            "new_uvloop_event_loop needs uvloop: pip install 'tickwheel[uvloop]'"
        ) from exc
    return WheelUVLoop(tick=tick)
