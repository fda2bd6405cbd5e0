"""The wheel's figures that are not times: memory per timer, idle wake-ups, lateness.

Each report returns a table (text) and its figures (a dict), for the wheel and its peers
(asyncio's loop, uvloop):

- :func:`memory_report`: bytes per pending timer, each figure from a fresh process
  (``python -m bench.workloads.wheel_reports _memory-child IMPL N METHOD``), by
  tracemalloc and by the change in resident set size;
- :func:`idle_report`: the wheel's wake-ups and the loop's ``select`` calls over 0.5 s
  of idling, empty, after churn, and with one timer an hour away;
- :func:`lateness_report`: ``loop.time() - when`` at firing of 5 x 2000 timers 1-50 ms
  out (scheduled 20 per loop iteration), with ``N`` far timers pending.

Run by ``python -m bench.probes.wheel_reports``, by the report carriers of
bench/suites/bench_wheel.py and by the wheel section of ``python -m bench``.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import os
import random
import resource
import selectors
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.loops import HAVE_UVLOOP, new_loop
from bench.workloads.wheel_ops import (
    CORE_ELAPSED,
    FAR,
    SEED,
    TICK,
    far_delays,
    freeze_gc,
    label,
    near_delays,
    noop,
    thaw_gc,
)
from tickwheel.wheel import TimingWheel
from tickwheel.wheel._core import Core, Entry

ROOT = Path(__file__).resolve().parents[2]  # the repository: the memory child imports bench
CHILD = "bench.workloads.wheel_reports"


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
    loop = new_loop("uvloop" if impl == "uvloop" else "asyncio")
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
            add(lo + i * step, noop, context=copy_context())
    else:
        for i in range(n):
            add(lo + i * step, noop)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else _rss()
    return {"impl": impl, "n": n, "method": method, "bytes_per_timer": (after - before) / n}


def memory_report(sizes: tuple[int, ...] = MEMORY_SIZES) -> tuple[str, dict[str, Any]]:
    """Run each (impl, n, method) in a subprocess; return a table and the figures."""
    figures: dict[str, Any] = {}
    for n in sizes:
        for impl in MEMORY_IMPLS:
            if impl == "uvloop" and not HAVE_UVLOOP:
                continue
            for method in ("tracemalloc", "rss"):
                out = subprocess.run(
                    [sys.executable, "-m", CHILD, "_memory-child", impl, str(n), method],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                figures[f"{impl} N={label(n)} {method}"] = round(result["bytes_per_timer"], 1)
    lines = [
        "memory: bytes per pending timer (fresh process per figure)",
        f"{'impl':<10} {'N':>5} {'tracemalloc':>12} {'RSS delta':>10}  reported",
    ]
    for n in sizes:
        for impl in MEMORY_IMPLS:
            key = f"{impl} N={label(n)}"
            if f"{key} rss" not in figures:
                continue
            tm, rss = figures[f"{key} tracemalloc"], figures[f"{key} rss"]
            # tracemalloc misses allocations made outside Python's allocators (libuv).
            reported = f"{rss:.0f} (RSS)" if impl == "uvloop" else f"{tm:.0f} (tracemalloc)"
            figures[f"{key} reported"] = rss if impl == "uvloop" else tm
            lines.append(f"{impl:<10} {label(n):>5} {tm:>12.1f} {rss:>10.1f}  {reported}")
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
        for d in near_delays():
            wheel.schedule(d, noop).cancel()

    def one_hour(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> object:
        assert wheel is not None
        return wheel.schedule(3600.0, noop)

    def one_hour_call_later(wheel: TimingWheel | None, loop: asyncio.AbstractEventLoop) -> object:
        return loop.call_later(3600.0, noop)

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


def lateness_samples(impl: str, n: int) -> tuple[list[float], list[float]]:
    """``loop.time() - when`` at firing of 5 x 2000 timers 1-50 ms out, ``n`` far pending.

    Also returns stalls: how long the loop stays busy after the last short timer has run,
    before a ``call_soon`` made in that callback runs (the wheel re-arms then, which
    means finding the earliest far timer).
    """
    loop = new_loop("uvloop" if impl == "uvloop" else "asyncio")
    wheel = TimingWheel(TICK, loop=loop) if impl == "wheel" else None
    add: Callable[..., Any] = wheel.schedule if wheel is not None else loop.call_later
    for d in far_delays(n):
        add(d, noop)
    freeze_gc()
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
        thaw_gc()
    return samples, stalls


def percentiles(samples: list[float]) -> dict[str, float]:
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
            if impl == "uvloop" and not HAVE_UVLOOP:
                continue
            samples, stalls = lateness_samples(impl, n)
            p = percentiles(samples)
            p["stall_median_ms"] = round(statistics.median(stalls) * 1e3, 3)
            p["stall_max_ms"] = round(max(stalls) * 1e3, 3)
            figures[f"{impl} N={label(n)}"] = p
            lines.append(
                f"{impl:<8} {label(n):>5} {p['p50_ms']:>8.3f} {p['p99_ms']:>8.3f} "
                f"{p['max_ms']:>8.3f} {p['min_ms']:>8.3f} "
                f"{p['stall_median_ms']:>12.3f} {p['stall_max_ms']:>12.3f}"
            )
    lines.append("uvloop's clock has 1 ms resolution, so its figures are multiples of ~1 ms.")
    lines.append(
        "stall: time the loop stays busy after a lone short timer's callback, before a "
        "call_soon made in it runs (wheel: re-arming onto the far timers)."
    )
    return "\n".join(lines), figures


def main(argv: list[str]) -> None:
    """The memory report's child: one figure, measured in this fresh process."""
    if len(argv) != 4 or argv[0] != "_memory-child":
        raise SystemExit(
            "usage: python -m bench.workloads.wheel_reports _memory-child IMPL N METHOD"
        )
    print(json.dumps(_memory_child(argv[1], int(argv[2]), argv[3])))


if __name__ == "__main__":
    main(sys.argv[1:])
