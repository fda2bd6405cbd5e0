"""Benchmarks of ``tickwheel.wheel`` against the timers of asyncio's loop and uvloop.

How to run: see ``bench/README.md``. In short::

    .venv/bin/pytest bench/suites/bench_wheel.py --benchmark-only -p no:cacheprovider \\
        --benchmark-columns=median,iqr,ops,rounds --benchmark-sort=name
    .venv/bin/python -m bench.probes.wheel_reports all    # memory, idle, lateness tables

Timed groups (one table per operation and size ``N``; the wheel and its peers run in the
same table, so ratios are read from one run; ``bench/suites/conftest.py`` prints them).
The operations are built in bench/workloads/wheel_ops.py, shared with ``python -m bench``:

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

Reports (bench/workloads/wheel_reports.py, ``python -m bench.probes.wheel_reports
memory|idle|lateness``; under pytest the same figures go to ``extra_info['report']`` of a
carrier benchmark of a no-op, whose time means nothing):

``memory``   bytes per pending timer, each figure from a fresh subprocess.
``idle``     the wheel's wake-ups and the loop's ``select`` calls over 0.5 s of idling.
``lateness`` ``loop.time() - when`` at firing of 5 x 2000 timers 1-50 ms out (scheduled
             20 per loop iteration), with ``N`` far timers pending.

Profiling: ``python -m bench.probes.profile wheel schedule+cancel|reschedule|fire`` loops
one hot path for a while (for ``py-spy record``), ``python -m bench.probes.profile top
FILE [FRAME]`` sums a py-spy ``raw`` file by own time per line.

``TICKWHEEL_BENCH_SIZES=1000,10000`` restricts the sizes (default 10^3..10^6).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from bench.peers.loops import available
from bench.workloads import wheel_reports
from bench.workloads.wheel_ops import (
    BATCH,
    CORE_ELAPSED,
    FAR,
    FIRE_ROUNDS,
    FIRE_WINDOW,
    SEED,
    TICK,
    IdleLoops,
    Population,
    fire_round,
    freeze_gc,
    harness_cost,
    label,
    near_delays,
    noop,
    reschedule_batch,
    schedule_cancel_batch,
    settle,
    thaw_gc,
)
from tickwheel.wheel._core import Core, Entry


def _sizes() -> tuple[int, ...]:
    raw = os.environ.get("TICKWHEEL_BENCH_SIZES", "")
    if not raw.strip():
        return (10**3, 10**4, 10**5, 10**6)
    return tuple(int(float(s)) for s in raw.split(",") if s.strip())


SIZES = _sizes()
BATCH_ROUNDS = 300
BATCH_WARMUP = 10


def _need(impl: str) -> None:
    """Skip a peer whose loop is not installed here (uvloop is optional)."""
    kind = impl.partition(".")[0]
    if not available(kind):
        pytest.skip(f"{kind} is not installed")


def _tag(benchmark: Any, group: str, n: int, impl: str, *, ops: int, base: bool) -> None:
    benchmark.group = f"{group} N={label(n)}"
    benchmark.extra_info.update(n=n, impl=impl, ops_per_round=ops)
    if base:
        benchmark.extra_info["base"] = True  # bench/suites/conftest.py divides the others by it


@pytest.fixture(scope="module", params=SIZES, ids=label)
def population(request: pytest.FixtureRequest) -> Iterator[Population]:
    """Built once per size and shared by every test of that size."""
    pop = Population(request.param)
    freeze_gc()
    yield pop
    pop.close()
    thaw_gc()


@pytest.mark.parametrize("impl", ["wheel", "wheel+ctx", "wheel-py", "asyncio", "uvloop"])
def test_schedule_cancel(benchmark: Any, population: Population, impl: str) -> None:
    _need(impl)
    loop, batch = schedule_cancel_batch(population, impl)
    _tag(benchmark, "schedule+cancel", population.n, impl, ops=BATCH, base=impl == "wheel")
    benchmark.pedantic(
        batch, setup=lambda: settle(loop), rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP
    )


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
    _need(impl)
    loop, run, leave = reschedule_batch(population, impl)
    _tag(benchmark, "reschedule", population.n, impl, ops=BATCH, base=impl == "wheel.Timer")
    benchmark.extra_info["harness_s"] = harness_cost(loop)
    try:
        benchmark.pedantic(
            run, setup=lambda: settle(loop), rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP
        )
    finally:
        leave()


@pytest.fixture(scope="module")
def idle_loops() -> Iterator[IdleLoops]:
    idle = IdleLoops()
    yield idle
    idle.close()


@pytest.mark.parametrize("impl", ["wheel", "wheel-py", "asyncio", "uvloop"])
@pytest.mark.parametrize("n", SIZES, ids=label)
def test_fire(benchmark: Any, idle_loops: IdleLoops, n: int, impl: str) -> None:
    _need(impl)
    setup, fire = fire_round(idle_loops, n, impl)
    _tag(benchmark, "fire", n, impl, ops=n, base=impl == "wheel")
    rounds = FIRE_ROUNDS.get(n, 5)
    benchmark.pedantic(fire, setup=setup, rounds=rounds, warmup_rounds=1 if n < 10**6 else 0)
    if impl == "wheel":
        assert len(idle_loops.wheel) == 0


# -- the pure core --------------------------------------------------------------------


@pytest.fixture(scope="module", params=SIZES, ids=label)
def core_population(request: pytest.FixtureRequest) -> Iterator[Core[Entry]]:
    core: Core[Entry] = Core(CORE_ELAPSED)
    rng = random.Random(SEED)
    lo, hi = (round(x / TICK) for x in FAR)
    for _ in range(request.param):
        core.insert(Entry(), CORE_ELAPSED + rng.randrange(lo, hi))
    freeze_gc()
    yield core
    thaw_gc()


def test_core_insert_remove(benchmark: Any, core_population: Core[Entry]) -> None:
    core = core_population
    pairs = [(Entry(), CORE_ELAPSED + round(d / TICK)) for d in near_delays()]
    insert = core.insert
    remove = core.remove

    def batch() -> None:
        for entry, deadline in pairs:
            insert(entry, deadline)
            remove(entry)

    _tag(benchmark, "core insert+remove", len(core), "core", ops=BATCH, base=True)
    benchmark.pedantic(batch, rounds=BATCH_ROUNDS, warmup_rounds=BATCH_WARMUP)


@pytest.mark.parametrize("n", SIZES, ids=label)
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


# -- reports as benchmarks (carriers: the timed no-op means nothing) --------------------


def _carry(benchmark: Any, group: str, report: str, figures: dict[str, Any]) -> None:
    benchmark.group = group
    benchmark.extra_info.update(figures)
    benchmark.extra_info["report"] = report
    print(f"\n{report}")
    benchmark.pedantic(noop, rounds=1)


def test_report_memory(benchmark: Any) -> None:
    report, figures = wheel_reports.memory_report()
    _carry(benchmark, "report: memory (carrier)", report, figures)


def test_report_idle(benchmark: Any) -> None:
    report, figures = wheel_reports.idle_report()
    _carry(benchmark, "report: idle (carrier)", report, figures)


def test_report_lateness(benchmark: Any) -> None:
    report, figures = wheel_reports.lateness_report()
    _carry(benchmark, "report: lateness (carrier)", report, figures)
