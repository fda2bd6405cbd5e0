"""The thread pool of ``thread=True`` tasks: :class:`DaemonPool`.

Ground rules:

- Its threads are daemon threads. A task that timed out (or was cancelled) may still
  run in its thread, and a Python thread cannot be stopped; the standard library's
  ``ThreadPoolExecutor`` joins its threads at interpreter exit, so one hung function
  would keep a worker process from exiting after SIGTERM. A daemon thread does not.
- Threads start on demand, up to ``max_threads``; an idle thread waits for the next
  call. What a call returns (or raises) is handed to the loop that submitted it, unless
  its future was cancelled meanwhile or the loop closed: then it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonPool"]

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return  # timed out or cancelled: its outcome is dropped
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class DaemonPool:
    """Run plain functions in up to ``max_threads`` daemon threads."""

    def __init__(self, max_threads: int, name: str = "tickwheel-task") -> None:
        self.max_threads = max_threads
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # started and not exited
        self._idle = 0  # of those, waiting for a call
        self._queued = 0  # calls submitted and not yet taken by a thread
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Call ``fn(*args)`` in a thread; a future of the running loop for its outcome.

        Raises:
            RuntimeError: if the pool is closed, or no loop is running.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the thread pool is closed")
            self._queued += 1
            # A thread more only when the idle ones cannot take every queued call.
            start = self._queued > self._idle and self._threads < self.max_threads
            if start:
                self._threads += 1
        self._calls.put((loop, fut, fn, args))
        if start:
            thread = threading.Thread(
                target=self._serve, name=f"{self.name}-{self._threads}", daemon=True
            )
            thread.start()
        return fut

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._calls.get()
            with self._lock:
                self._idle -= 1
                if call is None:
                    self._threads -= 1
                    return
                self._queued -= 1
            loop, fut, fn, args = call
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the loop, as a failure of the job
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: dropped
                loop.call_soon_threadsafe(_settle, fut, result, error)
            del call, fut, result, error  # hold nothing while idle

    def close(self) -> None:
        """Stop taking calls; idle threads exit, busy ones after their call returns
        (unwaited)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._calls.put(None)
