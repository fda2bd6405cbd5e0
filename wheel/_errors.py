"""The wheel's exceptions: only those a caller acts on.

Bad arguments raise the built-ins (``ValueError``/``TypeError``) naming the parameter.
"""

from __future__ import annotations

__all__ = ["WheelClosed", "WheelError", "WheelFull"]


class WheelError(Exception):
    """Base class of the errors a :class:`~tickwheel.wheel.TimingWheel` raises."""


class WheelClosed(WheelError, RuntimeError):
    """The wheel was closed; nothing more can be scheduled on it. Permanent."""


class WheelFull(WheelError):
    """``max_pending`` timers are pending. Transient: it clears as timers fire or are
    cancelled, so shed load or retry later."""
