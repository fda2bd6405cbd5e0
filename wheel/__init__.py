"""tickwheel.wheel: a hierarchical hashed timing wheel driven by an asyncio loop.

O(1) schedule, cancel and reschedule; never early; late by at most one tick; no
wake-ups while idle. ``timeout``, ``timeout_at`` and ``sleep`` are drop-in replacements
for asyncio's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._api import DEFAULT_TICK, WheelStats
from ._default import get_wheel, sleep, timeout, timeout_at
from ._errors import WheelClosed, WheelError, WheelFull
from ._impl import IMPLEMENTATION
from ._loop import WheelEventLoop, new_event_loop, new_uvloop_event_loop
from ._loop_timers import WheelTimerHandle

# The public names bind to the implementation in use (``IMPLEMENTATION``): the compiled
# core, or the pure-Python reference. Type checkers see the pure-Python classes; the
# compiled ones have the same names, methods, attributes and errors.
if TYPE_CHECKING or IMPLEMENTATION == "python":
    from ._driver import TimingWheel
    from ._handle import Timer
    from ._timeout import Timeout
else:
    from ._cdriver import Timeout, Timer, TimingWheel
if TYPE_CHECKING:
    from ._uvloop import WheelUVLoop

__all__ = [
    "DEFAULT_TICK",
    "IMPLEMENTATION",
    "Timeout",
    "Timer",
    "TimingWheel",
    "WheelClosed",
    "WheelError",
    "WheelEventLoop",
    "WheelFull",
    "WheelStats",
    "WheelTimerHandle",
    "WheelUVLoop",
    "get_wheel",
    "new_event_loop",
    "new_uvloop_event_loop",
    "sleep",
    "timeout",
    "timeout_at",
]

# Quiet unless the application configures logging (the wheel reports callback errors
# through the loop's exception handler; this logger is for what the driver may add).
logging.getLogger("tickwheel.wheel").addHandler(logging.NullHandler())


def __getattr__(name: str) -> object:
    # WheelUVLoop subclasses uvloop.Loop: imported on first use, uvloop being optional.
    if name == "WheelUVLoop":
        from ._uvloop import WheelUVLoop  # noqa: PLC0415

        return WheelUVLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
