"""asyncio's own event loop and uvloop: the loops whose timers the wheel is measured against.

uvloop is optional (the dev extra installs it off Windows): :data:`HAVE_UVLOOP` says
whether it is here, and :func:`new_loop` raises :class:`LoopUnavailable` for a kind that
is not.
"""

from __future__ import annotations

import asyncio
from typing import Any

uvloop: Any
try:
    import uvloop
except ImportError:  # pragma: no cover - the dev extra installs it off Windows
    uvloop = None

LOOP_KINDS = ("asyncio", "uvloop")
HAVE_UVLOOP = uvloop is not None


class LoopUnavailable(RuntimeError):
    """The loop asked for is not installed here."""


def available(kind: str) -> bool:
    """Whether :func:`new_loop` can make a loop of ``kind``."""
    return kind != "uvloop" or HAVE_UVLOOP


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind``: ``asyncio`` (the standard library's) or ``uvloop``."""
    if kind == "uvloop":
        if uvloop is None:
            raise LoopUnavailable("uvloop is not installed")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    if kind != "asyncio":
        raise ValueError(f"unknown loop kind {kind!r}; known: {', '.join(LOOP_KINDS)}")
    return asyncio.new_event_loop()
