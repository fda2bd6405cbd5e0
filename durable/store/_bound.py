"""The time bound of single script calls, without a timer per call.

Why: ``async with timeout(s)`` around every call arms the loop's timer on entry and
disarms it on exit whenever nothing else is pending (the wheel keeps no wake-up armed
while it is empty): 3.4 us of a ~130 us awaited ``schedule`` on loopback, measured.

How: every call bounded here has the same length, so deadlines come in the order the
calls start, and the calls in flight are a FIFO by deadline (a dict, task -> deadline).
One check is armed for the oldest deadline. A call that starts while a check is armed
arms nothing; a call that ends arms and cancels nothing. When the check fires it cancels
the tasks whose deadline has passed, then arms for the oldest call still in flight, or
for none. A busy producer so pays one wake-up per bound's length, not two timer
operations per call, and the bound is exact: a call is cancelled at its deadline, as
with ``timeout``.

Cancellation follows :func:`asyncio.timeout`: the check cancels the task, and
:meth:`Bound.expired` tells the call that the CancelledError it caught is this bound's
own (``Task.uncancel`` brings the task's count of cancel requests back to where it was
when the call started), and then the caller raises its own error instead; a cancel from
anyone else goes on as CancelledError.
"""

from __future__ import annotations

import asyncio

__all__ = ["Bound"]


class Bound:
    """Deadlines of calls in flight, all ``seconds`` long, on one event loop at a time.

    Use::

        task = bound.enter()
        try:
            ...  # the awaited call
        except asyncio.CancelledError:
            if bound.expired(task):
                raise ...  # the call's own timeout error
            raise
        finally:
            bound.leave(task)

    Args:
        seconds: the length of every call's bound, > 0.

    Raises:
        ValueError: if ``seconds`` is not > 0.
    """

    __slots__ = ("_calls", "_cancelling", "_expired", "_handle", "_loop", "seconds")

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:  # also refuses NaN
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        self.seconds = float(seconds)
        self._loop: asyncio.AbstractEventLoop | None = None  # of the calls in flight
        self._calls: dict[asyncio.Task[object], float] = {}  # in flight: deadline, FIFO
        # Tasks already being cancelled when their call started: that count (see expired).
        self._cancelling: dict[asyncio.Task[object], int] = {}
        self._expired: set[asyncio.Task[object]] = set()  # cancelled here, not yet seen
        self._handle: asyncio.TimerHandle | None = None  # the check, if armed

    def __len__(self) -> int:
        """The calls in flight."""
        return len(self._calls)

    @property
    def armed(self) -> bool:
        """True while a check is armed."""
        return self._handle is not None

    def enter(self) -> asyncio.Task[object]:
        """Start bounding the current task's call; returns the task, for
        :meth:`expired` and :meth:`leave`.

        Raises:
            RuntimeError: outside a task (no call can be cancelled there).
        """
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a bounded call must run in an asyncio task")
        loop = task.get_loop()
        if loop is not self._loop:  # first use, or the last loop is gone: start afresh
            self._reset(loop)
        deadline = loop.time() + self.seconds
        self._calls[task] = deadline
        count = task.cancelling()
        if count:  # rare: a call made while the task handles its own cancellation
            self._cancelling[task] = count
        if self._handle is None:
            self._handle = loop.call_at(deadline, self._check)
        return task

    def leave(self, task: asyncio.Task[object]) -> None:
        """The call ended (whatever way). A cancel of this bound that the call never
        saw (it swallowed the CancelledError) is taken back here."""
        if self._calls.pop(task, None) is None and task in self._expired:
            self._expired.discard(task)
            task.uncancel()
        if self._cancelling:
            self._cancelling.pop(task, None)

    def expired(self, task: asyncio.Task[object]) -> bool:
        """For a call that caught CancelledError: True if that was this bound's cancel
        and no other is pending (the caller then raises its timeout error)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() <= self._cancelling.pop(task, 0)

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._calls.clear()
        self._expired.clear()
        self._cancelling.clear()
        self._loop = loop

    def _check(self) -> None:
        self._handle = None
        loop = self._loop
        assert loop is not None  # armed by enter(), which set it
        now = loop.time()
        calls = self._calls
        live: tuple[asyncio.Task[object], float] | None = None  # the oldest not expired
        for task, deadline in calls.items():
            if deadline > now:
                live = (task, deadline)
                break
        # Every call before it has expired (FIFO by deadline).
        while calls:
            first = next(iter(calls))
            if live is not None and first is live[0]:
                break
            del calls[first]
            if not first.done():
                self._expired.add(first)
                first.cancel()
        if live is not None:
            self._handle = loop.call_at(live[1], self._check)
