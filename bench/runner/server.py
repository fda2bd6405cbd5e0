"""Section 2 of ``python -m bench``: the network-server scenario
(bench/workloads/server_scenario.py).

Per repeat, the four servers run one after the other in a fresh process each, with the
load generator in this process; the pairs compared differ only in the timer.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.runner.harness import Checks, Figure, Plan, Progress, percentiles
from bench.workloads import server_scenario as ss

SECTION = "server"
# (tickwheel's server, the peer's): same protocol or handler, a different timer
PAIRS = (
    ("protocol/wheel", "protocol/call_later"),
    ("stream/wheel.timeout", "stream/asyncio.timeout"),
    ("protocol/wheel", "stream/asyncio.timeout"),
)


def steps(plan: Plan) -> int:
    return plan.repeats * len(ss.MODES)


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in ss.MODES}
    for r in range(plan.repeats):
        for mode in ss.MODES:
            progress.step(f"server: {mode} x{plan.server_conns:,} repeat {r + 1}/{plan.repeats}")
            res = ss.run_mode(mode, plan.server_conns, plan.server_rounds, plan.server_idle)
            late = res.pop("idle_late")
            res["close_late_ms"] = {k: v * 1e3 for k, v in percentiles(late).items()}
            res["closed_early"] = sum(x < 0 for x in late)
            res["cpu_us_per_request"] = res["cpu"] / res["requests"] * 1e6
            # user space only: without the kernel's socket work, which no timer changes
            res["user_cpu_us_per_request"] = res["cpu_user"] / res["requests"] * 1e6
            res["requests_per_s"] = res["requests"] / res["wall"]
            rows[mode].append(res)
            checks.expect(
                res["closed_early"] == 0,
                f"server: {mode}: no idle connection closed before its timeout "
                f"({res['closed_early']} early)",
            )
            checks.expect(
                len(late) == plan.server_conns, f"server: {mode}: every connection closed"
            )
    figures = []
    for ours, theirs in PAIRS:
        peer = theirs.split("/", 1)[1]
        cpu = Figure(SECTION, f"CPU per request, {ours}", peer, "us/req", "lower")
        user = Figure(SECTION, f"user CPU per request, {ours}", peer, "us/req", "lower")
        rps = Figure(SECTION, f"requests/s, {ours}", peer, "req/s", "higher")
        for a, b in zip(rows[ours], rows[theirs], strict=True):
            cpu.add(a["cpu_us_per_request"], b["cpu_us_per_request"])
            user.add(a["user_cpu_us_per_request"], b["user_cpu_us_per_request"])
            rps.add(a["requests_per_s"], b["requests_per_s"])
        figures += [cpu, user, rps]
    summary = {
        mode: {
            "cpu_us_per_request": statistics.median(x["cpu_us_per_request"] for x in rs),
            "user_cpu_us_per_request": statistics.median(x["user_cpu_us_per_request"] for x in rs),
            "requests_per_s": statistics.median(x["requests_per_s"] for x in rs),
            "close_late_p50_ms": statistics.median(x["close_late_ms"]["p50"] for x in rs),
            "close_late_p99_ms": statistics.median(x["close_late_ms"]["p99"] for x in rs),
            "close_late_max_ms": max(x["close_late_ms"]["max"] for x in rs),
            "closed_early": sum(x["closed_early"] for x in rs),
            "open_s": statistics.median(x["open_s"] for x in rs),
        }
        for mode, rs in rows.items()
    }
    return {"figures": figures, "raw": {"runs": rows, "summary": summary}}
