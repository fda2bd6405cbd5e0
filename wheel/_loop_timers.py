"""What both wheel-timed event loops share: the handle, the alarm and the insert.

An event loop of ``_loop.py`` or ``_uvloop.py`` keeps one :class:`TimingWheel` for every
``call_later`` and ``call_at``. Each call makes a :class:`WheelTimerHandle` (an
``asyncio.TimerHandle``: the caller's context is copied, ``when()`` is the time asked for)
and files it in the wheel. When the wheel fires it, the handle is not run there: it is
appended to the loop's due list, which the loop sorts by ``when()`` (ties keep call order)
and runs as ordinary handles.

Two forms of the handle, one behaviour:

* On the compiled core the handle *is* the wheel's entry: a C subclass of
  ``asyncio.TimerHandle`` made here at import (``_cwheel._make_loop_handle``; see
  wheel/csrc/handle.h) whose tail holds the core's list links, filed by the wheel's
  ``_file`` and fired straight onto the due list (one object per timer).
* On the pure-Python wheel (``IMPLEMENTATION == "python"``) it is the Python class below,
  filed as the callback of a wheel ``Timer`` (``_timer``), whose call appends it to the
  due list (two objects per timer).

Ground rules:

1. The wheel never arms a timer of the loop it serves: it is given an :class:`Alarm` as
   its "loop", whose ``call_at`` only records the loop time the wheel wants to be woken
   at (``Alarm.when``; inf when disarmed). The loop reads it to bound its wait (the
   selector's timeout, or one native timer on uvloop) and calls ``wheel._run()`` once
   ``when <= time()``.
2. A handle is filed in the wheel only with a finite ``when``: ``+inf`` never fires (as
   in asyncio's heap) and is kept outside it; ``-inf`` fires at the next iteration.
3. A fired handle is in the due list or the loop's ready queue, ``_scheduled`` False.
   (Pure Python: its ``_timer`` is its pending wheel timer, or None once fired or
   cancelled.)
"""

from __future__ import annotations

import asyncio
import functools
import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._api import _validated
from ._impl import IMPLEMENTATION

if TYPE_CHECKING or IMPLEMENTATION == "python":
    from ._driver import TimingWheel
    from ._handle import Timer
else:
    from ._cdriver import Timer, TimingWheel

__all__ = [
    "Alarm",
    "LoopClockAlarm",
    "WheelTimerHandle",
    "check_tick",
    "close_wheel",
    "file_timer",
    "filer",
    "new_wheel",
    "sort_due",
]

_INF = math.inf
_when_of = operator.attrgetter("_when")
# Stands in for the loop in _validated, which then checks the tick alone.
_NO_LOOP: Any = object()


class WheelTimerHandle(asyncio.TimerHandle):  # the pure-Python form; see the docstring
    """The handle ``call_later``/``call_at`` return on a wheel-timed loop.

    An :class:`asyncio.TimerHandle` (``when()``, ``cancel()``, ``cancelled()``, the
    caller's context, debug mode's source traceback), whose pending state is a wheel
    timer instead of a heap entry. ``when()`` is the time asked for; the callback runs
    once the wheel's tick holding it has begun: never before ``when()``, at most one tick
    after it (plus the loop's own latency).
    """

    __slots__ = ("_timer",)

    _timer: Timer | None  # the pending wheel timer; None once fired or cancelled
    _loop: Any  # the wheel-timed loop (asyncio types it as AbstractEventLoop)

    def cancel(self) -> None:
        """Cancel the call; a no-op once it has run or been cancelled. O(1)."""
        if not self._cancelled:
            timer = self._timer
            if timer is not None:
                self._timer = None
                timer.cancel()
            self._scheduled = False
        asyncio.Handle.cancel(self)

    def __getstate__(self) -> object:
        """The slots, as asyncio's handle gives them, but not the wheel timer: a copy
        (``copy.copy``) is not filed in the wheel, as a copy of asyncio's is not in its
        heap (its ``cancel()`` must not cancel this handle's timer)."""
        state: Any = super().__getstate__()  # (None, slots)
        return state[0], {**state[1], "_timer": None}

    def __call__(self) -> None:
        # The wheel fired this handle's timer: it is due. Hand it to the loop, which runs
        # it among its ready callbacks in asyncio's order (see the module docstring).
        self._timer = None
        self._scheduled = False
        self._loop._wheel_due.append(self)


class Alarm:
    """The wheel's stand-in for a loop: records when the wheel wants to be woken.

    ``TimingWheel`` arms ``loop.call_at(when, run)`` and cancels the handle it got back;
    here both only set :attr:`when`. ``on_change`` (optional) is told of every new value,
    for a loop that keeps a native timer in step (uvloop).
    """

    __slots__ = ("_loop", "on_change", "when")

    # The wheel reads its clock as time.monotonic when a loop's time() is asyncio's.
    time = asyncio.BaseEventLoop.time

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # the loop served, for its exception handler
        self.when = _INF  # loop time of the wake-up the wheel asked for; inf: none
        self.on_change: Callable[[float], None] | None = None  # told of each new when

    def call_at(
        self, when: float, callback: Callable[[], object], *, context: object = None
    ) -> Alarm:
        # The callback is always the wheel's own _run: the loop calls it.
        self.when = when
        if self.on_change is not None:
            self.on_change(when)
        return self

    def cancel(self) -> None:
        self.when = _INF
        if self.on_change is not None:
            self.on_change(_INF)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self._loop.call_exception_handler(context)


class LoopClockAlarm(Alarm):
    """An :class:`Alarm` on the loop's own ``time()`` (uvloop's is libuv's cached clock,
    which may trail ``time.monotonic``: deadlines must be judged by the clock they were
    set by, or a callback could see ``loop.time() < when()``)."""

    __slots__ = ()

    def time(self) -> float:
        return self._loop.time()


def check_tick(tick: float) -> None:
    """Refuse a bad ``tick`` before a loop opens anything (TimingWheel's own check).

    Raises:
        ValueError: ``tick`` is not a positive finite number.
        TypeError: ``tick`` is not a number.
    """
    _validated(tick, _NO_LOOP, None)


def _loop_when(when: Any) -> float:
    """A ``when`` that is not a float, as a float (the compiled ``_file`` calls this).

    Raises:
        ValueError: ``when`` is NaN.
        TypeError: ``when`` is not a real number.
    """
    try:
        if -_INF <= when <= _INF:
            return float(when)
    except TypeError:
        raise TypeError(f"when must be a real number, got {when!r}") from None
    raise ValueError(f"when must be a number, got {when!r}")


if not TYPE_CHECKING and IMPLEMENTATION == "c":
    from . import _cwheel

    # The compiled form (see the module docstring): the same name, asyncio's semantics.
    WheelTimerHandle = _cwheel._make_loop_handle(
        asyncio.TimerHandle, asyncio.Handle.cancel, _loop_when
    )

    def _getstate(self: Any) -> object:
        # The slots, as object.__getstate__ gives them for asyncio's handle (whose
        # default refuses a type with a C tail): copy.copy works and pickling fails on
        # the loop, as both do for asyncio.TimerHandle.
        return object.__getstate__(self)  # type: ignore[attr-defined, unused-ignore]

    WheelTimerHandle.__getstate__ = _getstate


def new_wheel(
    loop: asyncio.AbstractEventLoop, tick: float, alarm_type: type[Alarm] = Alarm
) -> tuple[TimingWheel, Alarm, list[WheelTimerHandle]]:
    """Make the wheel of ``loop`` with its alarm and its due list (``tick`` checked by
    TimingWheel): the handles each firing of the wheel makes due, for the loop to run."""
    alarm = alarm_type(loop)
    wheel = TimingWheel(tick, loop=alarm)  # type: ignore[arg-type]  # a duck of a loop
    due: list[WheelTimerHandle] = []
    if IMPLEMENTATION == "c":
        wheel._set_due(due)  # type: ignore[attr-defined]  # the compiled wheel's
    return wheel, alarm, due


def filer(wheel: TimingWheel) -> Callable[[WheelTimerHandle, float], object]:
    """``file(handle, when)`` for the handles of ``wheel``'s loop: :func:`file_timer`,
    or on the compiled core the wheel's own ``_file`` (the same checks and errors)."""
    if IMPLEMENTATION == "c":
        return wheel._file  # type: ignore[attr-defined, no-any-return]
    return functools.partial(file_timer, wheel)


def file_timer(wheel: TimingWheel, handle: WheelTimerHandle, when: float) -> None:
    """File the pure-Python ``handle`` in ``wheel`` for loop time ``when`` (ground rule 2).

    Raises:
        ValueError: ``when`` is NaN.
        TypeError: ``when`` is not a real number.
    """
    handle._timer = None
    try:
        if -_INF < when < _INF:
            handle._timer = wheel.schedule_at(when, handle)
        elif when == -_INF:  # one tick back: due now (``now`` itself would round up)
            handle._timer = wheel.schedule_at(wheel._time() - wheel._tick, handle)
        elif when != _INF:
            raise ValueError(f"when must be a number, got {when!r}")
    except TypeError:
        raise TypeError(f"when must be a real number, got {when!r}") from None
    handle._scheduled = True


def close_wheel(wheel: TimingWheel) -> None:
    """Close a loop's ``wheel``: its pending timers are dropped (as the stdlib loop drops
    its heap), and their handles let go of them."""
    closed = wheel.close()  # compiled: the handles themselves, no longer filed
    if IMPLEMENTATION == "python":
        for timer in closed:
            handle = timer.callback  # the handle is its timer's callback
            if isinstance(handle, WheelTimerHandle):
                handle._timer = None


def sort_due(due: list[WheelTimerHandle]) -> None:
    """Order one firing's handles by ``when()``; ties keep their call order (stable).

    The wheel fires a tick's timers in call order, but two deadlines in one tick may have
    been asked for in the other order; asyncio runs the earlier ``when`` first.
    """
    if len(due) > 1:
        due.sort(key=_when_of)
