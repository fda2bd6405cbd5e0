"""An asyncio loop whose clock the test controls (after CPython's test_asyncio TestLoop).

Time stands still while callbacks run. When the loop would sleep until its next timer,
the clock jumps there instead, so a test of hours of timers runs in milliseconds and the
times it sees are exact. ``advance(dt)`` jumps the clock by hand: a stalled loop.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """Polls real file descriptors without blocking, and sleeps on the virtual clock."""

    def __init__(self, start: float) -> None:
        super().__init__()
        self.now = start
        self.sleeps = 0  # times the loop had nothing to do and the clock jumped

    def select(self, timeout: float | None = None) -> list[Any]:
        events: list[Any] = super().select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("virtual loop would block forever: nothing is scheduled")
        if timeout > 0:
            self.now += timeout
            self.sleeps += 1
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock starting at ``start``."""

    def __init__(self, start: float = 1000.0) -> None:
        self._vsel = _VirtualSelector(start)
        super().__init__(self._vsel)

    def time(self) -> float:
        return float(self._vsel.now)

    def advance(self, dt: float) -> None:
        """Move the clock forward by ``dt`` seconds at once."""
        self._vsel.now += dt

    @property
    def sleeps(self) -> int:
        """How many times the loop slept (an idle loop must not)."""
        return self._vsel.sleeps
