"""One wheel per event loop, and asyncio's helper names on it.

``from tickwheel.wheel import timeout, timeout_at, sleep`` replaces the asyncio names of
the same signature: each call uses the running loop's default wheel (1 ms tick), made on
first use and dropped with the loop.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, TypeVar

from ._api import _real
from ._driver import TimingWheel
from ._impl import IMPLEMENTATION
from ._timeout import Timeout, sleep_on

if TYPE_CHECKING or IMPLEMENTATION == "python":
    _wheel_type: type[TimingWheel] = TimingWheel  # what get_wheel makes
else:
    from ._cdriver import TimingWheel as _CWheel

    _wheel_type = _CWheel

__all__ = ["get_wheel", "sleep", "timeout", "timeout_at"]

T = TypeVar("T")

_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TimingWheel] = (
    weakref.WeakKeyDictionary()
)


def get_wheel() -> TimingWheel:
    """Return the running loop's default :class:`TimingWheel` (1 ms tick).

    Raises:
        RuntimeError: no event loop is running.
    """
    loop = asyncio.get_running_loop()
    wheel = _wheels.get(loop)
    if wheel is None or wheel.closed or type(wheel) is not _wheel_type:
        wheel = _wheels[loop] = _wheel_type(loop=loop)
    return wheel


def timeout(delay: float | None) -> Timeout:
    """Like :func:`asyncio.timeout`, on the running loop's default wheel.

    Args:
        delay: seconds until the block is cancelled and :class:`TimeoutError` raised;
            None never expires; a delay <= 0 expires at the next tick.

    Raises:
        RuntimeError: no event loop is running.
        ValueError: ``delay`` is NaN.
    """
    wheel = get_wheel()
    return wheel._timeout_type(wheel, None if delay is None else wheel.time() + _real(delay))


def timeout_at(when: float | None) -> Timeout:
    """Like :func:`asyncio.timeout_at`, on the running loop's default wheel.

    Args:
        when: loop time (``loop.time()``) of expiry; None never expires.
    """
    wheel = get_wheel()
    return wheel._timeout_type(wheel, None if when is None else _real(when, "when"))


async def sleep(delay: float, result: T = None) -> T:  # type: ignore[assignment]
    """Like :func:`asyncio.sleep`, on the running loop's default wheel."""
    return await sleep_on(get_wheel(), delay, result)
