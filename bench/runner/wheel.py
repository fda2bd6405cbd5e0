"""Section 1 of ``python -m bench``: the wheel against asyncio's loop and uvloop.

The operations are bench/workloads/wheel_ops.py's (the same builders as the pytest
groups of bench/suites/bench_wheel.py), timed here without pytest-benchmark: per size N,
per repeat, every implementation runs its rounds back to back, and the median time per
operation of each is one sample. Memory, lateness and idle wake-ups are the reports of
bench/workloads/wheel_reports.py.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from bench.peers.loops import HAVE_UVLOOP
from bench.runner.harness import Checks, Figure, Plan, Progress
from bench.workloads import wheel_ops as ops
from bench.workloads import wheel_reports as reports

SECTION = "wheel"
PEERS = ("asyncio", "uvloop")
# "wheel" is the implementation in use (the compiled core where it was built); "wheel-py"
# is the pure-Python reference and fallback, measured in the same run.
WHEELS = ("wheel", "wheel-py")
RESCHEDULE_PEERS = {"asyncio": "asyncio.Timeout", "uvloop": "uvloop.Timeout"}


def steps(plan: Plan) -> int:
    sizes = len(plan.wheel_sizes)
    return sizes * plan.repeats + len(plan.memory_sizes) + len(plan.lateness_sizes) + 1


def _per_op(run: Any, settle: Any, rounds: int, ops: int) -> float:
    samples = []
    for _ in range(rounds):
        settle()
        t = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) / ops


def _time_ops(pop: ops.Population, idle: ops.IdleLoops, n: int, plan: Plan) -> dict[str, float]:
    """Seconds per operation of each (operation, impl) at size ``n``, one repeat."""
    out: dict[str, float] = {}
    for impl in (*WHEELS, *PEERS):
        if impl == "uvloop" and not HAVE_UVLOOP:
            continue
        loop, batch = ops.schedule_cancel_batch(pop, impl)
        out[f"schedule+cancel {impl}"] = _per_op(
            batch, lambda loop=loop: ops.settle(loop), plan.wheel_rounds, ops.BATCH
        )
    timers = [f"{w}.{kind}" for w in WHEELS for kind in ("Timer", "Timeout")]
    for impl in (*timers, *RESCHEDULE_PEERS.values()):
        if impl.startswith("uvloop") and not HAVE_UVLOOP:
            continue
        loop, run, leave = ops.reschedule_batch(pop, impl)
        try:
            out[f"reschedule {impl}"] = _per_op(
                run, lambda loop=loop: ops.settle(loop), plan.wheel_rounds, ops.BATCH
            )
        finally:
            leave()
    fire_rounds = max(1, min(ops.FIRE_ROUNDS.get(n, 3), plan.wheel_rounds // 5))
    for impl in (*WHEELS, *PEERS):
        if impl == "uvloop" and not HAVE_UVLOOP:
            continue
        setup, fire = ops.fire_round(idle, n, impl)
        samples = []
        for _ in range(fire_rounds):
            (done,), _ = setup()
            t = time.perf_counter()
            fire(done)
            samples.append(time.perf_counter() - t)
        out[f"fire {impl}"] = statistics.median(samples) / n
    return out


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    figures: list[Figure] = []
    raw: dict[str, Any] = {"per_op_s": {}}
    idle = ops.IdleLoops()
    try:
        for n in plan.wheel_sizes:
            label = ops.label(n)
            pop = ops.Population(n)
            ops.freeze_gc()
            try:
                per_size: dict[str, Figure] = {}
                for r in range(plan.repeats):
                    progress.step(f"wheel: N={label} repeat {r + 1}/{plan.repeats}")
                    t = _time_ops(pop, idle, n, plan)
                    raw["per_op_s"].setdefault(label, []).append(t)
                    for w, peer in [(w, p) for w in WHEELS for p in PEERS]:
                        pairs = [
                            ("schedule+cancel", f"schedule+cancel {peer}", f"schedule+cancel {w}"),
                            (
                                "reschedule",
                                f"reschedule {RESCHEDULE_PEERS[peer]}",
                                f"reschedule {w}.Timer",
                            ),
                            (
                                "timeout.reschedule",
                                f"reschedule {RESCHEDULE_PEERS[peer]}",
                                f"reschedule {w}.Timeout",
                            ),
                            ("fire", f"fire {peer}", f"fire {w}"),
                        ]
                        # the pure-Python figures are named apart: "... (pure Python)"
                        suffix = "" if w == "wheel" else " (pure Python)"
                        for op, theirs, ours in pairs:
                            if theirs not in t:
                                continue
                            key = f"{op}{suffix} {peer}"
                            fig = per_size.get(key)
                            if fig is None:
                                fig = per_size[key] = Figure(
                                    SECTION, f"{op}{suffix} N={label}", peer, "s/op", "lower"
                                )
                            fig.add(t[ours], t[theirs])
                figures += per_size.values()
            finally:
                pop.close()
                ops.thaw_gc()
    finally:
        idle.close()
    checks.expect(
        all(len(w) == 0 for w in idle.wheels.values()), "wheel: every fired timer left the wheel"
    )

    for n in plan.memory_sizes:
        progress.step(f"wheel: memory N={ops.label(n)}")
        _, mem = reports.memory_report((n,))
        raw.setdefault("memory_bytes_per_timer", {}).update(mem)
        ours = mem.get(f"wheel N={ops.label(n)} reported")
        for peer in PEERS:
            theirs = mem.get(f"{peer} N={ops.label(n)} reported")
            if ours and theirs:
                fig = Figure(
                    SECTION, f"memory per pending timer N={ops.label(n)}", peer, "B", "lower"
                )
                fig.add(ours, theirs)
                figures.append(fig)

    lateness: dict[str, Any] = {}
    for n in plan.lateness_sizes:
        progress.step(f"wheel: lateness N={ops.label(n)}")
        for peer in PEERS:
            if peer == "uvloop" and not HAVE_UVLOOP:
                continue
            fig = Figure(SECTION, f"lateness p99 N={ops.label(n)}", peer, "ms", "lower")
            for _ in range(plan.repeats):
                row: dict[str, Any] = {}
                for impl in ("wheel", peer):
                    samples, _stalls = reports.lateness_samples(impl, n)
                    row[impl] = reports.percentiles(samples)
                    gc.collect()
                lateness.setdefault(f"N={ops.label(n)}", []).append(row)
                checks.expect(
                    row["wheel"]["min_ms"] >= 0,
                    f"wheel: no timer fired early (N={ops.label(n)}, "
                    f"min lateness {row['wheel']['min_ms']} ms)",
                )
                fig.add(row["wheel"]["p99_ms"], row[peer]["p99_ms"])
            figures.append(fig)
    raw["lateness_ms"] = lateness

    progress.step("wheel: idle wake-ups")
    _, idle_figs = reports.idle_report()
    raw["idle"] = idle_figs
    ours_idle = idle_figs["one timer 1 h away pending"]["selects"]
    theirs_idle = idle_figs["asyncio call_later 1 h away pending (peer)"]["selects"]
    fig = Figure(SECTION, "loop wake-ups in 0.5 s, one 1 h timer", "asyncio", "selects", "lower")
    fig.add(ours_idle, theirs_idle)
    figures.append(fig)
    checks.expect(
        idle_figs["wheel empty after 1000 schedule+cancel"]["wakeups"] == 0,
        "wheel: no wake-ups while empty",
    )
    return {"figures": figures, "raw": raw}
