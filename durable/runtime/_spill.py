"""The spill: one ``schedule`` for short in-memory timers and durable Redis jobs.

Ground rules:

- A timer that must survive a crash (``durable=True``) or that is too far away to keep
  in memory (``delay > threshold``) is written to Redis as a job of a *task name*; the
  :class:`~tickwheel.durable.Loader` of whichever process owns its shard loads it back
  into a wheel shortly before it falls due.
- Everything else stays in this process's :class:`TimingWheel` and is lost with it.
- Only task names cross into Redis: a callable cannot be stored, so asking for a durable
  callback is an error, never a silent in-memory timer.
- The payload of an in-memory timer goes through the same JSON/bytes encoding as a
  durable one, so a task sees the same value whichever side of the threshold it fell.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    check_job_id,
    finite_seconds_ms,
)
from tickwheel.durable.scheduler import Scheduler
from tickwheel.durable.store import decode_payload, encode_payload
from tickwheel.wheel import Timer, TimingWheel

from ._tasks import TaskContext, TaskRegistry, call_task

__all__ = ["DEFAULT_THRESHOLD", "Timers"]

logger = logging.getLogger("tickwheel.durable")

# Delays above this (s) go to Redis: a minute-long timer lost in a crash is usually
# noticed, an hour-long one silently never fires; and far timers are the ones that
# accumulate in memory.
DEFAULT_THRESHOLD = 60.0


class Timers:
    """Schedule tasks by name: in memory when short, in Redis when durable or long.

    Args:
        scheduler: where durable timers go.
        registry: the tasks in-memory timers run (durable ones run in a worker's).
        wheel: the wheel in-memory timers wait in; a new one on the running loop if None.
        threshold: seconds; a longer delay goes to Redis even without ``durable=True``.
        max_attempts: attempts of a durable job before it goes dead.

    Raises:
        TypeError, ValueError: naming a bad parameter.
        RuntimeError: ``wheel`` is None and no loop is running.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        *,
        wheel: TimingWheel | None = None,
        threshold: float | timedelta = DEFAULT_THRESHOLD,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if not isinstance(registry, TaskRegistry):
            raise TypeError(f"registry must be a TaskRegistry, got {registry!r}")
        self.scheduler = scheduler  # durable side
        self.registry = registry  # in-memory tasks
        self.wheel = wheel if wheel is not None else TimingWheel()  # in-memory side
        self.threshold_ms = finite_seconds_ms("threshold", threshold)  # spill above this
        self.max_attempts = max_attempts  # of durable jobs
        self._memory: dict[str, Timer] = {}  # in-memory timer id -> its wheel timer
        self._running: set[asyncio.Task[None]] = set()  # in-memory tasks running

    def __len__(self) -> int:
        """In-memory timers pending."""
        return len(self._memory)

    async def schedule(
        self,
        delay: float | timedelta,
        task: str,
        payload: Any = b"",
        *,
        job_id: str | None = None,
        durable: bool = False,
    ) -> str:
        """Run task ``task`` with ``payload`` after ``delay`` seconds.

        Args:
            delay: seconds (finite, >= 0). Over the threshold, the timer goes to Redis.
            task: a task *name* (see :class:`TaskRegistry`).
            payload: bytes or a JSON-serialisable value.
            job_id: a stable id; generated when None. Scheduling an id again keeps the
                pending timer (idempotent, like :meth:`Scheduler.schedule`).
            durable: put it in Redis whatever the delay.

        Returns:
            The job id (for :meth:`cancel`).

        Raises:
            TypeError: ``task`` is not a str (a callable cannot be durable: use
                :meth:`schedule_callback`), or a bad payload/delay/job_id.
            ValueError: an in-memory timer's task is not registered, or a bad value.
            RedisUnavailable: a durable timer could not be written.
        """
        name: object = task  # checked at run time: a callable here is a common mistake
        if not isinstance(name, str):
            hint = (
                "; a callable cannot be stored in Redis: use schedule_callback() for an "
                "in-memory callback, or register it as a task"
                if callable(name)
                else ""
            )
            raise TypeError(f"task must be a task name (str), got {name!r}{hint}")
        delay_ms = finite_seconds_ms("delay", delay)
        job_id = uuid.uuid4().hex if job_id is None else check_job_id(job_id)
        if durable or delay_ms > self.threshold_ms:
            await self.scheduler.schedule(
                job_id, task, payload, delay=delay_ms / 1000, max_attempts=self.max_attempts
            )
            return job_id
        if task not in self.registry:
            raise ValueError(
                f"task {task!r} is not registered; an in-memory timer runs a registered task"
            )
        data, flags = encode_payload(payload, self.scheduler.max_payload_bytes)
        if job_id in self._memory:
            return job_id
        nominal_ms = int(time.time() * 1000) + delay_ms  # no Redis clock in memory
        ctx = TaskContext(
            job_id=job_id,
            task=task,
            payload=decode_payload(data, flags),
            nominal_ms=nominal_ms,
            attempt=1,
            epoch=0,
            durable=False,
            scheduler=self.scheduler,
        )
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        self._memory[job_id] = self.wheel.schedule(seconds, self._fire, ctx)
        return job_id

    def schedule_callback(self, delay: float, fn: Callable[..., object], *args: Any) -> Timer:
        """Call ``fn(*args)`` after ``delay`` seconds, in memory only.

        Returns:
            The wheel's :class:`Timer`.

        Raises:
            TypeError: ``fn`` is not callable.
            ValueError: ``delay`` is negative, NaN or infinite.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        return self.wheel.schedule(delay, fn, *args)

    async def cancel(self, job_id: str) -> bool:
        """Cancel a timer by id, in memory or in Redis; True if one was cancelled."""
        timer = self._memory.pop(job_id, None)
        if timer is not None:
            return timer.cancel()
        return await self.scheduler.cancel(job_id)

    def _fire(self, ctx: TaskContext) -> None:
        self._memory.pop(ctx.job_id, None)
        fn = self.registry.get(ctx.task)
        if fn is None:  # unregistered after scheduling: nothing to run
            logger.error("task %r is no longer registered", ctx.task)
            return
        task = asyncio.ensure_future(self._run(fn, ctx))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    @staticmethod
    async def _run(fn: Any, ctx: TaskContext) -> None:
        try:
            await call_task(fn, ctx)
        except asyncio.CancelledError:
            raise  # close() or the loop's end
        except BaseException:  # SystemExit, KeyboardInterrupt...: the task's, not ours
            # In memory there is no retry: the timer is not durable by choice.
            logger.exception("in-memory task %r failed", ctx.task)

    async def close(self) -> list[str]:
        """Cancel the pending in-memory timers and wait for running in-memory tasks.

        Returns:
            The ids of the in-memory timers that had not fired.
        """
        ids = list(self._memory)
        for timer in self._memory.values():
            timer.cancel()
        self._memory.clear()
        if self._running:
            await asyncio.wait(set(self._running))
        return ids
