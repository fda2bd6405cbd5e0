"""The timer handle: what ``schedule()`` returns, and the wheel's entry at the same time.

A handle is one object with five slots (72 bytes); a pending timer costs that, its
deadline ``int`` and one entry in a bucket ``dict``: about 144 bytes in all, against
about 216 for ``loop.call_later``. The owning wheel is not a slot but a class attribute:
each wheel makes its own subclass of :class:`Timer` (``TimingWheel._timer_type``), which
saves 8 bytes and a store per timer.

States, read off the fields (no separate state field, to keep the object small):

==========  =================  ======================================
state       ``_bucket``        ``_callback``
==========  =================  ======================================
pending     a bucket ``dict``  the callback
fired       ``None``           ``_FIRED``
cancelled   ``None``           ``None`` (callback and args dropped)
closed out  ``None``           the callback (``close()`` returned it)
==========  =================  ======================================
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from ._core import Entry

__all__ = ["Timer", "TimerOwner"]

_INF = math.inf
_ceil = math.ceil


class TimerOwner(Protocol):
    """What a :class:`Timer` uses of the wheel that owns it (``TimingWheel`` is one).

    The handle never touches the wheel's insides (its core, its armed call): it reports
    a cancel and asks for a move, as tokio's entries call ``clear_entry`` and
    ``reregister`` on the driver. So the handle imports nothing of the driver.
    """

    @property
    def _tick(self) -> float: ...  # seconds per tick

    def _time(self) -> float:
        """The loop's clock."""

    def _clear_entry(self) -> None:
        """A pending timer has left its bucket (cancelled): count it; disarm if empty."""

    def _reregister(self, timer: Timer, when: float) -> None:
        """Move a pending ``timer`` to loop time ``when`` (never early)."""


def _FIRED() -> None:  # a sentinel that is also a valid callback
    """Stands in for the callback of a timer that has fired."""


class Timer(Entry):
    """A pending call, like :class:`asyncio.TimerHandle`. Made by ``TimingWheel.schedule``.

    Not thread-safe: use it from the loop's thread (``loop.call_soon_threadsafe(t.cancel)``
    from others).
    """

    __slots__ = ("_args", "_callback", "_context")

    _callback: Callable[..., object] | None  # the function; see the state table above
    _args: tuple[Any, ...] | None  # its positional arguments; None once dropped
    _context: contextvars.Context | None  # context to run in; None: the wheel's own
    _wheel: ClassVar[TimerOwner]  # owner (class attribute of the wheel's own subclass)

    def cancel(self) -> bool:
        """Cancel the timer, dropping its callback and arguments at once.

        Returns:
            True if this call prevented the callback from running; False if it had
            already run, been cancelled, or been returned by ``close()``.

        Runtime complexity: O(1).
        """
        bucket = self._bucket
        if bucket is None:
            return False
        del bucket[self]
        self._bucket = None
        self._callback = None
        self._args = None
        self._context = None
        self._wheel._clear_entry()
        return True

    def cancelled(self) -> bool:
        """Return True if the timer will not run: cancelled, or returned by ``close()``."""
        return self._bucket is None and self._callback is not _FIRED

    def pending(self) -> bool:
        """Return True if the timer is still to run."""
        return self._bucket is not None

    def when(self) -> float:
        """Return the loop time the timer is due at: its deadline rounded up to a tick."""
        return self._deadline * self._wheel._tick

    def reschedule(self, delay: float) -> bool:
        """Move a pending timer to ``delay`` seconds from now, as if newly scheduled.

        The handle is reused (no allocation), and the timer goes to the back of the queue
        of its new tick. The idle-timeout reset of a network server.

        Returns:
            True if the timer was pending and was moved; False if it had already fired
            or been cancelled (then nothing changes).

        Raises:
            ValueError: ``delay`` is negative, NaN or infinite.
            TypeError: ``delay`` is not a real number.

        Runtime complexity: O(1).
        """
        try:
            if not 0.0 <= delay < _INF:
                raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
            when = self._wheel._time() + delay
        except TypeError:
            raise TypeError(f"delay must be a real number, got {delay!r}") from None
        return self._move_to(when)

    def reschedule_at(self, when: float) -> bool:
        """Move a pending timer to loop time ``when``; see :meth:`reschedule`.

        Raises:
            ValueError: ``when`` is NaN or infinite.
            TypeError: ``when`` is not a real number.
        """
        try:
            if not -_INF < when < _INF:
                raise ValueError(f"when must be a finite number, got {when!r}")
        except TypeError:
            raise TypeError(f"when must be a real number, got {when!r}") from None
        return self._move_to(when)

    def _move_to(self, when: float) -> bool:
        if self._bucket is None:
            return False
        self._wheel._reregister(self, when)
        return True

    @property
    def callback(self) -> Callable[..., object] | None:
        """The callback; None once the timer has fired or been cancelled."""
        cb = self._callback
        return None if cb is _FIRED else cb

    @property
    def args(self) -> tuple[Any, ...]:
        """The callback's positional arguments; empty once dropped."""
        return self._args or ()

    @property
    def context(self) -> contextvars.Context | None:
        """The context given to ``schedule``; None when the wheel's own is used."""
        return self._context

    def __repr__(self) -> str:
        if self._bucket is not None:
            state = f"pending when={self.when():.6f}"
        elif self._callback is _FIRED:
            state = "fired"
        else:
            state = "cancelled"
        cb = self.callback
        name = getattr(cb, "__qualname__", repr(cb)) if cb is not None else "-"
        return f"<Timer {state} {name}>"
