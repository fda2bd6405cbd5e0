"""Benchmarks of ``tickwheel.wheel`` against the timers of asyncio's loop and uvloop.

How to run: see ``bench/README.md``. In short::

    .venv/bin/pytest bench/bench_wheel.py --benchmark-only -p no:cacheprovider \\
        --benchmark-columns=median,iqr,ops,rounds --benchmark-sort=name
    .venv/bin/python bench/bench_wheel.py all          # memory, idle, lateness tables

Timed groups (one table per operation and size ``N``; the wheel and its peers run in the
same table, so ratios are read from one run; ``bench/conftest.py`` prints them):

``schedule+cancel N=...``
    ``N`` far timers pending (1-2 h out), then per round 1000 x (schedule a timer 10-60 s
    out, cancel it). Peers: ``call_later`` + ``cancel`` on asyncio's loop and on uvloop,
    and the wheel with ``context=copy_context()`` (what ``call_later`` does by default).
``reschedule N=...``
    ``N`` pending, then per round 1000 x move one pending timer to a later deadline:
    ``Timer.reschedule``, the wheel's ``Timeout.reschedule``, and ``asyncio.Timeout
    .reschedule`` on asyncio's loop and on uvloop. All four run as one
    ``run_until_complete`` of a coroutine doing the 1000 calls.
``fire N=...``
    ``N`` timers due within one 10 ms window (``schedule_at`` / ``call_at``), scheduled
    in the untimed setup, which then sleeps until all are due; timed:
    ``run_until_complete`` until a countdown callback has run ``N`` times.
``core insert+remove N=...`` / ``core pop_due N=...``
    The pure core on virtual ticks, no loop: the core's share of the two paths above.

Between rounds every setup runs ``loop.run_until_complete(asyncio.sleep(0))`` on the loop
under test, untimed. asyncio keeps cancelled handles in its heap and rebuilds the heap
only on a loop iteration that finds more than half of it cancelled, so the peer's heap
stays below ``2 N + 1000`` entries (uvloop and the wheel remove at once).

Reports (``python bench/bench_wheel.py memory|idle|lateness``; under pytest the same
figures go to ``extra_info['report']`` of a carrier benchmark of a no-op, whose time
means nothing):

``memory``   bytes per pending timer, each figure from a fresh subprocess.
``idle``     the wheel's wake-ups and the loop's ``select`` calls over 0.5 s of idling.
``lateness`` ``loop.time() - when`` at firing of 5 x 2000 timers 1-50 ms out (scheduled
             20 per loop iteration), with ``N`` far timers pending.

Profiling: ``python bench/bench_wheel.py profile schedule+cancel|reschedule|fire`` loops
one hot path for a while (for ``py-spy record``), ``... top FILE [FRAME]`` sums a
py-spy ``raw`` file by own time per line (only stacks through FRAME, if given).

``TICKWHEEL_BENCH_SIZES=1000,10000`` restricts the sizes (default 10^3..10^6).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import linecache
import math
import os
import random
import resource
import selectors
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

import pytest

from tickwheel.wheel import TimingWheel
from tickwheel.wheel import _driver as _pydriver
from tickwheel.wheel._core import Core, Entry

try:
    import uvloop
except ImportError:  # pragma: no cover - the dev extra installs it off Windows
    uvloop = None


def _sizes() -> tuple[int, ...]:
    raw = os.environ.get("TICKWHEEL_BENCH_SIZES", "")
    if not raw.strip():
        return (10**3, 10**4, 10**5, 10**6)
    return tuple(int(float(s)) for s in raw.split(",") if s.strip())


SIZES = _sizes()
TICK = 0.001  # the wheel's tick (the default)
BATCH = 1000  # operations per timed round in the batch groups
BATCH_ROUNDS = 300
BATCH_WARMUP = 10
FAR = (3600.0, 7200.0)  # delays of the background timers: never due during a run
NEAR = (10.0, 60.0)  # delays of the timers scheduled and cancelled
FIRE_WINDOW = 0.010  # the fire group's timers are due within this many seconds
FIRE_ROUNDS = {10**3: 100, 10**4: 40, 10**5: 12, 10**6: 5}
CORE_ELAPSED = 10**8  # virtual start tick of the core benchmarks (~28 h at 1 ms)
SEED = 20240611

LOOP_KINDS = ("asyncio", "uvloop")


def _noop() -> None:
    pass


def _label(n: int) -> str:
    """``1e6`` for powers of ten, else the number."""
    exp = round(math.log10(n)) if n > 0 else 0
    return f"1e{exp}" if 10**exp == n else str(n)


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        if uvloop is None:
            pytest.skip("uvloop is not installed")
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _far_delays(n: int) -> list[float]:
    rng = random.Random(SEED)
    lo, hi = FAR
    return [lo + (hi - lo) * rng.random() for _ in range(n)]


def _near_delays() -> list[float]:
    rng = random.Random(SEED + 1)
    lo, hi = NEAR
    return [lo + (hi - lo) * rng.random() for _ in range(BATCH)]


def _wheels(loops: dict[str, asyncio.AbstractEventLoop]) -> dict[str, Any]:
    """The wheel in use (``wheel``: the compiled one where it was built) and the
    pure-Python reference (``wheel-py``), each on its own loop."""
    return {
        "wheel": TimingWheel(TICK, loop=loops["wheel"]),
        "wheel-py": _pydriver.TimingWheel(TICK, loop=loops["wheel-py"]),
    }


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """One pass of the loop: runs what is due and lets asyncio prune cancelled handles."""
    loop.run_until_complete(asyncio.sleep(0))


def _sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    """Block (the loop not running) until ``loop.time() >= when``."""
    while (left := when - loop.time()) > 0:
        time.sleep(left)


def _freeze_gc() -> None:
    """Move what exists now out of the collector's way (a million background timers
    would make every full collection in a timed round cost ~1 s, whichever peer)."""
    gc.collect()
    gc.freeze()


def _thaw_gc() -> None:
    gc.unfreeze()
    gc.collect()


def _countdown(loop: asyncio.AbstractEventLoop, n: int) -> tuple[Callable[[], None], Any]:
    """A callback and a future resolved on the callback's ``n``-th call."""
    done = loop.create_future()
    left = n

    def hit() -> None:
        nonlocal left
        left -= 1
        if not left:
            done.set_result(None)

    return hit, done


def _tag(benchmark: Any, group: str, n: int, impl: str, *, ops: int, base: bool) -> None:
    benchmark.group = f"{group} N={_label(n)}"
    benchmark.extra_info.update(n=n, impl=impl, ops_per_round=ops)
    if base:
        benchmark.extra_info["base"] = True  # bench/conftest.py divides the others by it


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
            if kind != "uvloop" or uvloop is not None:
                self.loops[kind] = _new_loop(kind)
        self.wheels = _wheels(self.loops)
        self.wheel = self.wheels["wheel"]
        delays = _far_delays(n)
        for wheel in self.wheels.values():
            schedule = wheel.schedule
            for d in delays:
                schedule(d, _noop)
        for kind in LOOP_KINDS:
            if kind in self.loops:
                call_later = self.loops[kind].call_later
                for d in delays:
                    call_later(d, _noop)

    def loop(self, kind: str) -> asyncio.AbstractEventLoop:
        if kind not in self.loops:
            pytest.skip(f"{kind} is not installed")
        return self.loops[kind]

    def close(self) -> None:
        for wheel in self.wheels.values():
            wheel.close()
        for loop in self.loops.values():
            loop.close()


@pytest.fixture(scope="module", params=SIZES, ids=_label)
def population(request: pytest.FixtureRequest) -> Iterator[Population]:
    """Built once per size and shared by every test of that size."""
    pop = Population(request.param)
    _freeze_gc()
    yield pop
    pop.close()
    _thaw_gc()


# -- schedule + cancel ----------------------------------------------------------------


def schedule_cancel_batch(
    population: Population, impl: str
) -> tuple[asyncio.AbstractEventLoop, Callable[[], None]]:
    """The loop under test and one round: ``BATCH`` x (schedule a near timer, cancel it)."""
    delays = _near_delays()
    if impl.startswith("wheel"):
        which = impl.partition("+")[0]  # wheel (the one in use) or wheel-py
        loop = population.loop(which)
        schedule = population.wheels[which].schedule
        if not impl.endswith("+ctx"):

            def batch() -> None:
                for d in delays:
                    schedule(d, _noop).cancel()

        else:
            copy_context = contextvars.copy_context

            def batch() -> None:
                for d in delays:
                    schedule(d, _noop, context=copy_context()).cancel()

    else:
        loop = population.loop(impl)
        call_later = loop.call_later

        def batch() -> None:
            for d in delays:
                call_later(d, _noop).cancel()

    return loop, batch


@pytest.mark.parametrize("impl", ["wheel", "wheel+ctx", "wheel-py", "asyncio", "uvloop"])
def test_schedule_cancel(benchmark: Any, population: Population, impl: str) -> None:
    loop, batch = schedule_cancel_batch(population, impl)
    _tag(benchmark, "schedule+cancel", population.n, impl, ops=BATCH, base=impl == "wheel")
    benchmark.pedantic(
        batch, setup=lambda: _settle(loop), rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP
    )


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


def _harness_cost(loop: asyncio.AbstractEventLoop, repeat: int = 200) -> float:
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
        timer = population.wheels[kind].schedule(30.0, _noop)
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


@pytest.mark.parametrize(
    "impl",
    [
        "wheel.Timer",
        "wheel.Timeout",
        "wheel-py.Timer",
        "wheel-py.Timeout",
        "asyncio.Timeout",
        "uvloop.Timeout",
    ],
)
def test_reschedule(benchmark: Any, population: Population, impl: str) -> None:
    loop, run, leave = reschedule_batch(population, impl)
    _tag(benchmark, "reschedule", population.n, impl, ops=BATCH, base=impl == "wheel.Timer")
    benchmark.extra_info["harness_s"] = _harness_cost(loop)
    try:
        benchmark.pedantic(
            run, setup=lambda: _settle(loop), rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP
        )
    finally:
        leave()


# -- fire -----------------------------------------------------------------------------


class _Idle:
    """One loop per kind with nothing pending, and a wheel on its own asyncio loop."""

    def __init__(self) -> None:
        self.loops = {"wheel": asyncio.new_event_loop(), "wheel-py": asyncio.new_event_loop()}
        self.wheels = _wheels(self.loops)
        self.wheel = self.wheels["wheel"]

    def loop(self, kind: str) -> asyncio.AbstractEventLoop:
        if kind not in self.loops:
            self.loops[kind] = _new_loop(kind)
        return self.loops[kind]

    def close(self) -> None:
        for wheel in self.wheels.values():
            wheel.close()
        for loop in self.loops.values():
            loop.close()


@pytest.fixture(scope="module")
def idle_loops() -> Iterator[_Idle]:
    idle = _Idle()
    yield idle
    idle.close()


def fire_round(
    idle: _Idle, n: int, impl: str
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
        hit, done = _countdown(loop, n)
        start = loop.time()
        for offset in offsets:
            add_at(start + offset, hit)
        _sleep_until(loop, start + FIRE_WINDOW + 2 * TICK)  # all due: time only the firing
        return (done,), {}

    def fire(done: Any) -> None:
        loop.run_until_complete(done)

    return setup, fire


@pytest.mark.parametrize("impl", ["wheel", "wheel-py", "asyncio", "uvloop"])
@pytest.mark.parametrize("n", SIZES, ids=_label)
def test_fire(benchmark: Any, idle_loops: _Idle, n: int, impl: str) -> None:
    setup, fire = fire_round(idle_loops, n, impl)
    _tag(benchmark, "fire", n, impl, ops=n, base=impl == "wheel")
    rounds = FIRE_ROUNDS.get(n, 5)
    benchmark.pedantic(fire, setup=setup, rounds=rounds, warmup_rounds=1 if n < 10**6 else 0)
    if impl == "wheel":
        assert len(idle_loops.wheel) == 0


# -- the pure core --------------------------------------------------------------------


@pytest.fixture(scope="module", params=SIZES, ids=_label)
def core_population(request: pytest.FixtureRequest) -> Iterator[Core[Entry]]:
    core: Core[Entry] = Core(CORE_ELAPSED)
    rng = random.Random(SEED)
    lo, hi = (round(x / TICK) for x in FAR)
    for _ in range(request.param):
        core.insert(Entry(), CORE_ELAPSED + rng.randrange(lo, hi))
    _freeze_gc()
    yield core
    _thaw_gc()


def test_core_insert_remove(benchmark: Any, core_population: Core[Entry]) -> None:
    core = core_population
    pairs = [(Entry(), CORE_ELAPSED + round(d / TICK)) for d in _near_delays()]
    insert = core.insert
    remove = core.remove

    def batch() -> None:
        for entry, deadline in pairs:
            insert(entry, deadline)
            remove(entry)

    _tag(benchmark, "core insert+remove", len(core), "core", ops=BATCH, base=True)
    benchmark.pedantic(batch, rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP)


@pytest.mark.parametrize("n", SIZES, ids=_label)
def test_core_pop_due(benchmark: Any, n: int) -> None:
    window = round(FIRE_WINDOW / TICK)
    deadlines = [CORE_ELAPSED + 1 + (i * window) // n for i in range(n)]
    now = CORE_ELAPSED + window

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        core: Core[Entry] = Core(CORE_ELAPSED)
        insert = core.insert
        for d in deadlines:
            insert(Entry(), d)
        return (core,), {}

    def pop_all(core: Core[Entry]) -> int:
        # pop_due plus the least a driver must do per entry: mark it no longer pending.
        pop_due = core.pop_due
        count = 0
        while (bucket := pop_due(now)) is not None:
            for entry in bucket:
                entry._bucket = None
            count += len(bucket)
        return count

    _tag(benchmark, "core pop_due", n, "core", ops=n, base=True)
    popped = benchmark.pedantic(pop_all, setup=setup, rounds=FIRE_ROUNDS.get(n, 5))
    assert popped == n


# -- memory ---------------------------------------------------------------------------

MEMORY_IMPLS = ("wheel", "wheel+ctx", "asyncio", "uvloop")
MEMORY_SIZES = (10**5, 10**6)


def _rss() -> int:
    """Resident set size in bytes (/proc/self/statm; peak RSS where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory_child(impl: str, n: int, method: str) -> dict[str, Any]:
    """Bytes per pending timer, measured in this (fresh) process by ``method``."""
    loop = _new_loop("uvloop" if impl == "uvloop" else "asyncio")
    add: Callable[..., Any]
    if impl.startswith("wheel"):
        wheel = TimingWheel(TICK, loop=loop)
        add = wheel.schedule
    else:
        add = loop.call_later
    copy_context = contextvars.copy_context
    lo, hi = FAR
    step = (hi - lo) / n  # deadlines made on the fly: no list of floats in the figure
    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = _rss()
    if impl == "wheel+ctx":
        for i in range(n):
            add(lo + i * step, _noop, context=copy_context())
    else:
        for i in range(n):
            add(lo + i * step, _noop)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else _rss()
    return {"impl": impl, "n": n, "method": method, "bytes_per_timer": (after - before) / n}


def memory_report(sizes: tuple[int, ...] = MEMORY_SIZES) -> tuple[str, dict[str, Any]]:
    """Run each (impl, n, method) in a subprocess; return a table and the figures."""
    figures: dict[str, Any] = {}
    for n in sizes:
        for impl in MEMORY_IMPLS:
            if impl == "uvloop" and uvloop is None:
                continue
            for method in ("tracemalloc", "rss"):
                out = subprocess.run(
                    [sys.executable, __file__, "_memory-child", impl, str(n), method],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                figures[f"{impl} N={_label(n)} {method}"] = round(result["bytes_per_timer"], 1)
    lines = [
        "memory: bytes per pending timer (fresh process per figure)",
        f"{'impl':<10} {'N':>5} {'tracemalloc':>12} {'RSS delta':>10}  reported",
    ]
    for n in sizes:
        for impl in MEMORY_IMPLS:
            key = f"{impl} N={_label(n)}"
            if f"{key} rss" not in figures:
                continue
            tm, rss = figures[f"{key} tracemalloc"], figures[f"{key} rss"]
            # tracemalloc misses allocations made outside Python's allocators (libuv).
            reported = f"{rss:.0f} (RSS)" if impl == "uvloop" else f"{tm:.0f} (tracemalloc)"
            figures[f"{key} reported"] = rss if impl == "uvloop" else tm
            lines.append(f"{impl:<10} {_label(n):>5} {tm:>12.1f} {rss:>10.1f}  {reported}")
    return "\n".join(lines), figures


# -- idle -----------------------------------------------------------------------------


class _CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Counts ``select`` calls: one per iteration of an asyncio loop."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def select(self, timeout: float | None = None) -> Any:
        self.calls += 1
        return super().select(timeout)


def _idle_case(
    prepare: Callable[[TimingWheel | None, asyncio.AbstractEventLoop], object], with_wheel: bool
) -> dict[str, int]:
    selector = _CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    wheel = TimingWheel(TICK, loop=loop) if with_wheel else None
    keep = prepare(wheel, loop)
    wakeups0 = wheel.stats().wakeups if wheel is not None else 0
    selects0 = selector.calls
    loop.run_until_complete(asyncio.sleep(0.5))
    result = {
        "wakeups": (wheel.stats().wakeups - wakeups0) if wheel is not None else 0,
        "selects": selector.calls - selects0,
        "pending": len(wheel) if wheel is not None else 0,
    }
    del keep
    if wheel is not None:
        wheel.close()
    loop.close()
    return result


def _lifetime_wakeups(delay: float) -> int:
    """Wake-ups a lone timer ``delay`` seconds out costs over its life (its cascades)."""
    core: Core[Entry] = Core(CORE_ELAPSED)
    core.insert(Entry(), CORE_ELAPSED + round(delay / TICK))
    wakeups = 0
    while (tick := core.next_deadline()) is not None:
        wakeups += 1
        if core.pop_due(tick) is not None:
            break
    return wakeups


def idle_report() -> tuple[str, dict[str, Any]]:
    def nothing(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> None:
        return None

    def churn(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> None:
        assert wheel is not None
        for d in _near_delays():
            wheel.schedule(d, _noop).cancel()

    def one_hour(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> object:
        assert wheel is not None
        return wheel.schedule(3600.0, _noop)

    def one_hour_call_later(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> object:
        return loop.call_later(3600.0, _noop)

    cases = {
        "asyncio loop alone (baseline)": _idle_case(nothing, with_wheel=False),
        "wheel empty, never used": _idle_case(nothing, with_wheel=True),
        "wheel empty after 1000 schedule+cancel": _idle_case(churn, with_wheel=True),
        "one timer 1 h away pending": _idle_case(one_hour, with_wheel=True),
        "asyncio call_later 1 h away pending (peer)": _idle_case(
            one_hour_call_later, with_wheel=False
        ),
    }
    figures: dict[str, Any] = {name: dict(r) for name, r in cases.items()}
    figures["lifetime wake-ups of a lone 1 h timer"] = _lifetime_wakeups(3600.0)
    lines = [
        "idle: 0.5 s of loop.run_until_complete(asyncio.sleep(0.5))",
        f"{'case':<42} {'wheel wakeups':>13} {'loop selects':>12}",
    ]
    for name, r in cases.items():
        lines.append(f"{name:<42} {r['wakeups']:>13} {r['selects']:>12}")
    lines.append(
        "a lone 1 h timer wakes the loop "
        f"{figures['lifetime wake-ups of a lone 1 h timer']} times over its life "
        "(cascades + firing; core simulation)"
    )
    return "\n".join(lines), figures


# -- lateness -------------------------------------------------------------------------

LATENESS_IMPLS = ("wheel", "asyncio", "uvloop")
LATENESS_SIZES = (10**4, 10**6)
LATENESS_TIMERS = 2000
LATENESS_PASSES = 5
LATENESS_CHUNK = 20  # timers scheduled per loop iteration
LATENESS_STALLS = 11


def _lateness_samples(impl: str, n: int) -> tuple[list[float], list[float]]:
    """``loop.time() - when`` at firing of 5 x 2000 timers 1-50 ms out, ``n`` far pending.

    Also returns stalls: how long the loop stays busy after the last short timer has run,
    before a ``call_soon`` made in that callback runs (the wheel re-arms then, which
    means finding the earliest far timer).
    """
    loop = _new_loop("uvloop" if impl == "uvloop" else "asyncio")
    wheel = TimingWheel(TICK, loop=loop) if impl == "wheel" else None
    add: Callable[..., Any] = wheel.schedule if wheel is not None else loop.call_later
    for d in _far_delays(n):
        add(d, _noop)
    _freeze_gc()
    rng = random.Random(SEED + 2)
    clock = loop.time
    samples: list[float] = []
    record = samples.append

    async def one_pass() -> None:
        done = loop.create_future()
        left = LATENESS_TIMERS

        def fired(when: float) -> None:
            nonlocal left
            record(clock() - when)
            left -= 1
            if not left:
                done.set_result(None)

        # In chunks, yielding between them: a burst of 2000 schedules would block the
        # loop for milliseconds and make the 1 ms timers late through no fault of theirs.
        for _ in range(LATENESS_TIMERS // LATENESS_CHUNK):
            for _ in range(LATENESS_CHUNK):
                d = 0.001 + 0.049 * rng.random()
                add(d, fired, clock() + d)
            await asyncio.sleep(0)
        await done

    async def one_stall() -> float:
        done = loop.create_future()

        def after(fired_at: float) -> None:
            done.set_result(time.perf_counter() - fired_at)

        add(0.001, lambda: loop.call_soon(after, time.perf_counter()))
        return await done

    try:
        for _ in range(LATENESS_PASSES):
            loop.run_until_complete(one_pass())
        stalls = [loop.run_until_complete(one_stall()) for _ in range(LATENESS_STALLS)]
    finally:
        if wheel is not None:
            wheel.close()
        loop.close()
        _thaw_gc()
    return samples, stalls


def _percentiles(samples: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    ms = 1e3
    return {
        "p50_ms": round(cuts[49] * ms, 3),
        "p99_ms": round(cuts[98] * ms, 3),
        "max_ms": round(max(samples) * ms, 3),
        "min_ms": round(min(samples) * ms, 3),
    }


def lateness_report(sizes: tuple[int, ...] = LATENESS_SIZES) -> tuple[str, dict[str, Any]]:
    figures: dict[str, Any] = {}
    lines = [
        f"lateness: loop.time() - when at firing, {LATENESS_PASSES} x {LATENESS_TIMERS} "
        f"timers 1-50 ms out (wheel target: p99 <= {TICK * 1e3:g} tick + 1 ms)",
        f"{'impl':<8} {'N':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'min ms':>8}"
        f" {'stall med ms':>12} {'stall max ms':>12}",
    ]
    for n in sizes:
        for impl in LATENESS_IMPLS:
            if impl == "uvloop" and uvloop is None:
                continue
            samples, stalls = _lateness_samples(impl, n)
            p = _percentiles(samples)
            p["stall_median_ms"] = round(statistics.median(stalls) * 1e3, 3)
            p["stall_max_ms"] = round(max(stalls) * 1e3, 3)
            figures[f"{impl} N={_label(n)}"] = p
            lines.append(
                f"{impl:<8} {_label(n):>5} {p['p50_ms']:>8.3f} {p['p99_ms']:>8.3f} "
                f"{p['max_ms']:>8.3f} {p['min_ms']:>8.3f} "
                f"{p['stall_median_ms']:>12.3f} {p['stall_max_ms']:>12.3f}"
            )
    lines.append("uvloop's clock has 1 ms resolution, so its figures are multiples of ~1 ms.")
    lines.append(
        "stall: time the loop stays busy after a lone short timer's callback, before a "
        "call_soon made in it runs (wheel: re-arming onto the far timers)."
    )
    return "\n".join(lines), figures


# -- reports as benchmarks (carriers: the timed no-op means nothing) --------------------


def _carry(benchmark: Any, group: str, report: str, figures: dict[str, Any]) -> None:
    benchmark.group = group
    benchmark.extra_info.update(figures)
    benchmark.extra_info["report"] = report
    print(f"\n{report}")
    benchmark.pedantic(_noop, rounds=1)


def test_report_memory(benchmark: Any) -> None:
    report, figures = memory_report()
    _carry(benchmark, "report: memory (carrier)", report, figures)


def test_report_idle(benchmark: Any) -> None:
    report, figures = idle_report()
    _carry(benchmark, "report: idle (carrier)", report, figures)


def test_report_lateness(benchmark: Any) -> None:
    report, figures = lateness_report()
    _carry(benchmark, "report: lateness (carrier)", report, figures)


# -- profiling helpers ----------------------------------------------------------------


def _profile(path: str, seconds: float, n: int) -> None:
    """Loop one of the wheel's hot paths for ``seconds`` (run under py-spy/pyinstrument)."""
    loop = asyncio.new_event_loop()
    wheel = TimingWheel(TICK, loop=loop)
    if path != "fire":
        for d in _far_delays(n):
            wheel.schedule(d, _noop)
    delays = _near_delays()
    schedule = wheel.schedule
    deadline = time.perf_counter() + seconds
    rounds = 0
    if path == "schedule+cancel":
        while time.perf_counter() < deadline:
            for d in delays:
                schedule(d, _noop).cancel()
            rounds += 1
    elif path == "reschedule":
        move = schedule(30.0, _noop).reschedule
        while time.perf_counter() < deadline:
            for d in delays:
                move(d)
            rounds += 1
    elif path == "fire":  # as test_fire; the samples include the scheduling, apart
        step = FIRE_WINDOW / n
        offsets = [i * step for i in range(n)]
        schedule_at = wheel.schedule_at
        while time.perf_counter() < deadline:
            hit, done = _countdown(loop, n)
            start = loop.time()
            for offset in offsets:
                schedule_at(start + offset, hit)
            _sleep_until(loop, start + FIRE_WINDOW + 2 * TICK)
            loop.run_until_complete(done)
            rounds += 1
    else:
        raise SystemExit(f"unknown path {path!r}")
    print(f"{path}: {rounds} rounds in {seconds} s (N={n})")
    wheel.close()
    loop.close()


def _top(raw_file: str, under: str = "", limit: int = 15) -> None:
    """Sum a ``py-spy record --format raw`` file by leaf frame (own time), print the top.

    With ``under``, only the stacks with a frame containing that text count (e.g.
    ``TimingWheel._run`` for the firing alone); percentages are of those stacks.
    """
    own: Counter[str] = Counter()
    total = 0
    with open(raw_file) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or under not in stack:
                continue
            own[stack.rsplit(";", 1)[-1]] += int(count)
            total += int(count)
    for frame, count in own.most_common(limit):
        print(f"{100 * count / total:6.1f}%  {frame:<48} {_source_line(frame)}")


def _source_line(frame: str) -> str:
    """The source text of a py-spy frame ``func (path:line)``, read now (best effort)."""
    where = frame.rpartition("(")[2].rstrip(")")
    path, _, line = where.rpartition(":")
    if not line.isdigit():
        return ""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (path, os.path.join(here, path), os.path.join(os.path.dirname(here), path)):
        text = linecache.getline(candidate, int(line)).strip()
        if text:
            return text
    return ""


def main(argv: list[str]) -> None:
    usage = (
        "usage: bench_wheel.py memory|idle|lateness|all\n"
        "       bench_wheel.py profile schedule+cancel|reschedule|fire [SECONDS] [N]\n"
        "       bench_wheel.py top PYSPY_RAW_FILE [FRAME_TEXT]"
    )
    if not argv:
        raise SystemExit(usage)
    what = argv[0]
    if what == "_memory-child":
        print(json.dumps(_memory_child(argv[1], int(argv[2]), argv[3])))
    elif what == "profile":
        n_default = 10**5
        seconds = float(argv[2]) if len(argv) > 2 else 10.0
        _profile(argv[1], seconds, int(float(argv[3])) if len(argv) > 3 else n_default)
    elif what == "top":
        _top(argv[1], argv[2] if len(argv) > 2 else "")
    elif what in ("memory", "idle", "lateness", "all"):
        reports = {"memory": memory_report, "idle": idle_report, "lateness": lateness_report}
        for name, report in reports.items():
            if what in (name, "all"):
                print(report()[0], end="\n\n", flush=True)
    else:
        raise SystemExit(usage)


if __name__ == "__main__":
    main(sys.argv[1:])
