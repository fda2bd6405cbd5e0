"""The wheel's timed operations, beside the same operations on asyncio's loop and uvloop.

Built once here and timed twice: by the pytest-benchmark groups of
bench/suites/bench_wheel.py and by the wheel section of ``python -m bench``
(bench/runner/wheel.py). Each builder returns the loop under test and one round of
``BATCH`` operations (or, for ``fire``, a setup and the timed firing):

- :func:`schedule_cancel_batch`: ``N`` far timers pending (1-2 h out), then ``BATCH`` x
  (schedule a timer 10-60 s out, cancel it); the peers' ``call_later`` + ``cancel``;
- :func:`reschedule_batch`: ``BATCH`` moves of one pending timer to a later deadline
  (``Timer.reschedule``, the wheel's ``Timeout.reschedule``, ``asyncio.Timeout
  .reschedule``), as one ``run_until_complete``;
- :func:`fire_round`: ``N`` timers due within one 10 ms window, scheduled in the untimed
  setup, which then sleeps until all are due; timed: running the loop until all fired.

``wheel`` is the implementation in use (the compiled core where it was built),
``wheel-py`` the pure-Python reference; each has a loop of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import math
import random
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from bench.peers.loops import LOOP_KINDS, available, new_loop
from tickwheel.wheel import TimingWheel
from tickwheel.wheel import _driver as _pydriver

TICK = 0.001  # the wheel's tick (the default)
BATCH = 1000  # operations per timed round in the batch groups
FAR = (3600.0, 7200.0)  # delays of the background timers: never due during a run
NEAR = (10.0, 60.0)  # delays of the timers scheduled and cancelled
FIRE_WINDOW = 0.010  # the fire group's timers are due within this many seconds
FIRE_ROUNDS = {10**3: 100, 10**4: 40, 10**5: 12, 10**6: 5}
CORE_ELAPSED = 10**8  # virtual start tick of the pure core's runs (~28 h at 1 ms)
SEED = 20240611


def noop() -> None:
    pass


def label(n: int) -> str:
    """``1e6`` for powers of ten, else the number."""
    exp = round(math.log10(n)) if n > 0 else 0
    return f"1e{exp}" if 10**exp == n else str(n)


def far_delays(n: int) -> list[float]:
    rng = random.Random(SEED)
    lo, hi = FAR
    return [lo + (hi - lo) * rng.random() for _ in range(n)]


def near_delays() -> list[float]:
    rng = random.Random(SEED + 1)
    lo, hi = NEAR
    return [lo + (hi - lo) * rng.random() for _ in range(BATCH)]


def wheels(loops: dict[str, asyncio.AbstractEventLoop]) -> dict[str, Any]:
    """The wheel in use (``wheel``: the compiled one where it was built) and the
    pure-Python reference (``wheel-py``), each on its own loop."""
    return {
        "wheel": TimingWheel(TICK, loop=loops["wheel"]),
        "wheel-py": _pydriver.TimingWheel(TICK, loop=loops["wheel-py"]),
    }


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """One pass of the loop: runs what is due and lets asyncio prune cancelled handles."""
    loop.run_until_complete(asyncio.sleep(0))


def sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    """Block (the loop not running) until ``loop.time() >= when``."""
    while (left := when - loop.time()) > 0:
        time.sleep(left)


def freeze_gc() -> None:
    """Move what exists now out of the collector's way (a million background timers
    would make every full collection in a timed round cost ~1 s, whichever peer)."""
    gc.collect()
    gc.freeze()


def thaw_gc() -> None:
    gc.unfreeze()
    gc.collect()


def countdown(loop: asyncio.AbstractEventLoop, n: int) -> tuple[Callable[[], None], Any]:
    """A callback and a future resolved on the callback's ``n``-th call."""
    done = loop.create_future()
    left = n

    def hit() -> None:
        nonlocal left
        left -= 1
        if not left:
            done.set_result(None)

    return hit, done


# -- background populations -----------------------------------------------------------


class Population:
    """``n`` far timers pending on each of three loops: the wheel's, asyncio's, uvloop's.

    The wheel has a loop of its own, so asyncio's heap under it holds only the wheel's
    single armed ``call_at``.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.loops = {"wheel": asyncio.new_event_loop(), "wheel-py": asyncio.new_event_loop()}
        for kind in LOOP_KINDS:
            if available(kind):
                self.loops[kind] = new_loop(kind)
        self.wheels = wheels(self.loops)
        self.wheel = self.wheels["wheel"]
        delays = far_delays(n)
        for wheel in self.wheels.values():
            schedule = wheel.schedule
            for d in delays:
                schedule(d, noop)
        for kind in LOOP_KINDS:
            if kind in self.loops:
                call_later = self.loops[kind].call_later
                for d in delays:
                    call_later(d, noop)

    def loop(self, kind: str) -> asyncio.AbstractEventLoop:
        return self.loops[kind]  # KeyError for a loop not installed here

    def close(self) -> None:
        for wheel in self.wheels.values():
            wheel.close()
        for loop in self.loops.values():
            loop.close()


# -- schedule + cancel ----------------------------------------------------------------


def schedule_cancel_batch(
    population: Population, impl: str
) -> tuple[asyncio.AbstractEventLoop, Callable[[], None]]:
    """The loop under test and one round: ``BATCH`` x (schedule a near timer, cancel it)."""
    delays = near_delays()
    if impl.startswith("wheel"):
        which = impl.partition("+")[0]  # wheel (the one in use) or wheel-py
        loop = population.loop(which)
        schedule = population.wheels[which].schedule
        if not impl.endswith("+ctx"):

            def batch() -> None:
                for d in delays:
                    schedule(d, noop).cancel()

        else:
            copy_context = contextvars.copy_context

            def batch() -> None:
                for d in delays:
                    schedule(d, noop, context=copy_context()).cancel()

    else:
        loop = population.loop(impl)
        call_later = loop.call_later

        def batch() -> None:
            for d in delays:
                call_later(d, noop).cancel()

    return loop, batch


# -- reschedule -----------------------------------------------------------------------


class _Reschedulable(Protocol):
    def reschedule(self, when: float | None, /) -> Any: ...


def _enter(
    loop: asyncio.AbstractEventLoop, make: Callable[[], Any]
) -> tuple[_Reschedulable, Callable[[], None]]:
    """Enter the async context manager ``make()`` in a task parked inside it.

    Returns the entered manager and a function that lets the task leave the block.
    """
    entered = loop.create_future()
    release = loop.create_future()

    async def park() -> None:
        async with make() as cm:
            entered.set_result(cm)
            await release

    task = loop.create_task(park())
    cm = loop.run_until_complete(entered)

    def leave() -> None:
        release.set_result(None)
        loop.run_until_complete(task)

    return cm, leave


def harness_cost(loop: asyncio.AbstractEventLoop, repeat: int = 200) -> float:
    """Median seconds of ``run_until_complete`` of an empty coroutine: the part of each
    reschedule round that is not rescheduling."""

    async def empty() -> None:
        pass

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        loop.run_until_complete(empty())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def reschedule_batch(
    population: Population, impl: str
) -> tuple[asyncio.AbstractEventLoop, Callable[[], None], Callable[[], None]]:
    """The loop under test, one round (``BATCH`` reschedules of one pending timer, run as
    one ``run_until_complete``) and a function that ends the timer or its block."""
    # Each call moves the deadline 1 ms later than the previous one (an idle timeout
    # being reset); every round starts from the current time, so it moves later too.
    ladder = [30.0 + i * 1e-3 for i in range(BATCH)]
    kind = impl.partition(".")[0]
    loop = population.loop(kind)
    batch: Callable[[], Coroutine[Any, Any, None]]
    if impl.endswith(".Timer"):
        timer = population.wheels[kind].schedule(30.0, noop)
        move = timer.reschedule  # takes a delay: reads the clock on every call

        async def batch() -> None:
            for d in ladder:
                move(d)

        def leave() -> None:
            timer.cancel()

    else:
        if kind.startswith("wheel"):
            wheel = population.wheels[kind]
            cm, leave = _enter(loop, lambda: wheel.timeout(30.0))
        else:
            cm, leave = _enter(loop, lambda: asyncio.timeout(30.0))
        move_to = cm.reschedule  # takes a loop time
        clock = loop.time

        async def batch() -> None:
            base = clock()
            for d in ladder:
                move_to(base + d)

    return loop, lambda: loop.run_until_complete(batch()), leave


# -- fire -----------------------------------------------------------------------------


class IdleLoops:
    """One loop per kind with nothing pending, and a wheel on its own asyncio loop."""

    def __init__(self) -> None:
        self.loops = {"wheel": asyncio.new_event_loop(), "wheel-py": asyncio.new_event_loop()}
        self.wheels = wheels(self.loops)
        self.wheel = self.wheels["wheel"]

    def loop(self, kind: str) -> asyncio.AbstractEventLoop:
        if kind not in self.loops:
            self.loops[kind] = new_loop(kind)
        return self.loops[kind]

    def close(self) -> None:
        for wheel in self.wheels.values():
            wheel.close()
        for loop in self.loops.values():
            loop.close()


def fire_round(
    idle: IdleLoops, n: int, impl: str
) -> tuple[Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], Callable[[Any], None]]:
    """``setup`` (schedule ``n`` timers due within ``FIRE_WINDOW``, wait until all are
    due) and ``fire(done)`` (run the loop until all have fired): the timed part."""
    loop = idle.loop(impl)
    # Absolute deadlines (schedule_at / call_at), so that all N fall within FIRE_WINDOW
    # however long scheduling them takes.
    add_at = idle.wheels[impl].schedule_at if impl.startswith("wheel") else loop.call_at
    step = FIRE_WINDOW / n
    offsets = [i * step for i in range(n)]

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        hit, done = countdown(loop, n)
        start = loop.time()
        for offset in offsets:
            add_at(start + offset, hit)
        sleep_until(loop, start + FIRE_WINDOW + 2 * TICK)  # all due: time only the firing
        return (done,), {}

    def fire(done: Any) -> None:
        loop.run_until_complete(done)

    return setup, fire
