"""Flow control a handler or a producer asks for: :class:`Defer` (a run handed back for
later without spending an attempt) and the checks of ``debounce=``, ``max_wait=`` and
``throttle=``."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING

from ._args import finite_seconds_ms

if TYPE_CHECKING:
    from ._jobs import JobSpec

__all__ = ["MAX_DEFER_S", "NO_FLOW", "Defer", "flow_args", "flow_ms"]

NO_FLOW = ("", 0, 0)

# The longest Defer (and debounce, max_wait, throttle): one year, in seconds.
MAX_DEFER_S = 366 * 86400


def _positive_ms(name: str, value: float | timedelta) -> int:
    """``value`` seconds as ms, in (0, MAX_DEFER_S]."""
    ms = finite_seconds_ms(name, value)
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if ms <= 0 or seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if ms > MAX_DEFER_S * 1000:
        raise ValueError(f"{name} must be at most {MAX_DEFER_S} s (a year), got {value!r}")
    return ms


class Defer(Exception):
    """Raised by a handler to hand its job back for later without spending an attempt.

    The job goes back to due at Redis's now + ``seconds``, as the same attempt of the
    same occurrence (a recurring job's next occurrences are not moved). It is not a
    failure: the error kept with the job is unchanged, and the worker counts it as
    ``deferred``. Deferrals are not bounded in number: a handler that always defers
    keeps its job forever (bound it yourself, for example with a deadline in the
    payload).

    Args:
        seconds: how long to wait, > 0 and at most a year (a number or a timedelta).

    Raises:
        TypeError, ValueError: naming ``seconds``, when it is built.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        self.delay_ms = _positive_ms("seconds", seconds)
        self.seconds = self.delay_ms / 1000
        super().__init__(f"deferred for {self.seconds:g} s")


def flow_ms(name: str, value: float | timedelta | None) -> int:
    """A producer's ``debounce``/``max_wait``/``throttle`` as ms (0 when None).

    Raises:
        TypeError, ValueError: naming ``name`` (negative, zero, NaN, over a year).
    """
    if value is None:
        return 0
    return _positive_ms(name, value)


def flow_args(spec: JobSpec) -> tuple[str, int, int]:
    """The ``(kind, window_ms, max_wait_ms)`` of a spec's debounce or throttle.

    Raises:
        TypeError, ValueError: naming the bad parameter: a duration not in (0, a year];
            ``max_wait`` without ``debounce`` or shorter than it; ``debounce`` with
            ``throttle``; either with ``delay``, ``at`` or a recurrence (their due is
            computed from Redis's now, and a series has its own times).
    """
    debounce = flow_ms("debounce", spec.debounce)
    max_wait = flow_ms("max_wait", spec.max_wait)
    throttle = flow_ms("throttle", spec.throttle)
    name = "debounce" if debounce else "throttle"
    if debounce and throttle:
        raise ValueError("give debounce or throttle, not both")
    if max_wait and not debounce:
        raise ValueError("max_wait needs debounce")
    if max_wait and max_wait < debounce:
        raise ValueError(f"max_wait must be at least debounce, got {spec.max_wait!r}")
    if spec.delay is not None or spec.at is not None:
        raise ValueError(f"{name} computes the due from now: give no delay or at")
    if spec.recurrence is not None:
        raise ValueError(f"{name} applies to one-shot jobs, not a recurrence")
    if debounce:
        return ("d", debounce, max_wait)
    return ("t", throttle, 0)
