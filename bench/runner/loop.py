"""Section 8 of ``python -m bench``: real servers on the wheel-timed event loops (issue 41).

uvicorn (trivial ASGI app) and aiohttp, each on the stdlib loop, uvloop,
``tickwheel.wheel.new_event_loop`` (``wheel``) and ``new_uvloop_event_loop``
(``wheel-uvloop``); per repeat, every (server, loop) is one fresh server process, the
loops in a rotating order (bench/workloads/loop_servers.py says what is measured).
tickwheel's loops are compared with the same loop without the wheel: ``wheel`` with the
stdlib loop, ``wheel-uvloop`` with uvloop; memory per idle connection also with uvloop.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.runner.harness import Checks, Figure, Plan, Progress
from bench.workloads import loop_servers as ls

SECTION = "loop"
# (tickwheel's loop, the same loop without the wheel)
PAIRS = (("wheel", "stdlib"), ("wheel-uvloop", "uvloop"))
# Memory per idle connection is also held against uvloop's (issue 41's target).
MEMORY_PAIRS = (*PAIRS, ("wheel", "uvloop"))
_PEER_NAME = {"stdlib": "stdlib loop", "uvloop": "uvloop"}


def steps(plan: Plan) -> int:
    return plan.repeats * len(ls.SERVERS) * len(ls.available_loops())


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    ls.raise_fd_limit()
    loops = ls.available_loops()
    use_wrk = ls.have_wrk()
    runs: list[dict[str, Any]] = []
    for r in range(plan.repeats):
        order = loops[r % len(loops) :] + loops[: r % len(loops)]
        for kind in ls.SERVERS:
            for loop in order:
                progress.step(f"loop: {kind} on {loop}, repeat {r + 1}/{plan.repeats}")
                res = ls.measure(
                    kind,
                    loop,
                    plan.loop_conns,
                    plan.loop_seconds,
                    plan.loop_idle,
                    use_wrk=use_wrk,
                    short=plan.quick,
                )
                res["repeat"] = r
                runs.append(res)
                _check(res, plan, checks)
    figures = _figures(runs, plan)
    return {
        "figures": figures,
        "raw": {"runs": runs, "load": "wrk" if use_wrk else "python", "summary": _summary(runs)},
    }


def _check(res: dict[str, Any], plan: Plan, checks: Checks) -> None:
    what = f"loop: {res['server']} on {res['loop']}"
    checks.expect(
        res.get("idle_bad", 0) == 0,
        f"{what}: every idle connection answered 200 ({res.get('idle_bad', 0)} did not)",
    )
    if not res["loop"].startswith("wheel"):
        return  # a peer's own errors are its figures' (raw), not a check of tickwheel's
    for c in plan.loop_conns:
        row = res[f"c{c}"]
        checks.expect(
            row["bad"] == 0 and row["lost"] == 0 and row["requests"] > 0,
            f"{what}, {c:,} connections: requests answered, every answer 200 and no open "
            f"connection lost ({row['requests']} answered, {row['bad']} bad answers, "
            f"{row['lost']} lost)",
        )


def _pick(runs: list[dict[str, Any]], kind: str, loop: str) -> list[dict[str, Any]]:
    return sorted(
        (x for x in runs if x["server"] == kind and x["loop"] == loop),
        key=lambda x: int(x["repeat"]),
    )


def _figures(runs: list[dict[str, Any]], plan: Plan) -> list[Figure]:
    figures = []
    present = {x["loop"] for x in runs}
    for kind in ls.SERVERS:
        for ours, theirs in PAIRS:
            if ours not in present or theirs not in present:
                continue
            a_runs, b_runs = _pick(runs, kind, ours), _pick(runs, kind, theirs)
            for c in plan.loop_conns:
                cpu = Figure(
                    SECTION,
                    f"{kind} CPU per request, {c:,} conns, {ours}",
                    _PEER_NAME[theirs],
                    "us/req",
                    "lower",
                )
                rps = Figure(
                    SECTION,
                    f"{kind} requests/s, {c:,} conns, {ours}",
                    _PEER_NAME[theirs],
                    "req/s",
                    "higher",
                )
                for a, b in zip(a_runs, b_runs, strict=True):
                    cpu.add(a[f"c{c}"]["cpu_us_per_request"], b[f"c{c}"]["cpu_us_per_request"])
                    rps.add(a[f"c{c}"]["requests_per_s"], b[f"c{c}"]["requests_per_s"])
                figures += [cpu, rps]
        if not plan.loop_idle:
            continue
        for ours, theirs in MEMORY_PAIRS:
            if ours not in present or theirs not in present:
                continue
            a_runs, b_runs = _pick(runs, kind, ours), _pick(runs, kind, theirs)
            for key, label in (("traced_bytes_per_idle", "traced"), ("rss_bytes_per_idle", "RSS")):
                if key not in a_runs[0]:
                    continue
                mem = Figure(
                    SECTION,
                    f"{kind} memory per idle connection ({label}), {ours}",
                    _PEER_NAME[theirs],
                    "B",
                    "lower",
                )
                for a, b in zip(a_runs, b_runs, strict=True):
                    mem.add(a[key], b[key])
                figures.append(mem)
    return figures


def _summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Medians per (server, loop), and the bytes per idle connection below uvloop's."""
    out: dict[str, dict[str, float]] = {}
    for x in runs:
        key = f"{x['server']} {x['loop']}"
        if key in out:
            continue
        mine = _pick(runs, x["server"], x["loop"])
        row: dict[str, float] = {}
        for name, value in mine[0].items():
            if name.startswith("c") and isinstance(value, dict):
                for k in ("requests_per_s", "cpu_us_per_request"):
                    row[f"{k} {name[1:]}"] = statistics.median(m[name][k] for m in mine)
            elif name.endswith("_per_idle"):
                row[name] = statistics.median(m[name] for m in mine)
        uv = _pick(runs, x["server"], "uvloop")
        if uv and "traced_bytes_per_idle" in row and x["loop"] != "uvloop":
            row["traced_bytes_below_uvloop"] = statistics.median(
                b["traced_bytes_per_idle"] - a["traced_bytes_per_idle"]
                for a, b in zip(mine, uv, strict=True)
            )
        out[key] = row
    return out


def notes(raw: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The section's lines of report.md above its figures: the medians per loop."""
    conns = plan["loop_conns"]
    head = ["server", "loop"]
    head += [f"req/s {c:,}" for c in conns] + [f"CPU us/req {c:,}" for c in conns]
    head += ["B/idle conn traced", "RSS", "traced below uvloop's"]
    lines = [
        f"Load: {raw.get('load', '?')} on {', '.join(f'{c:,}' for c in conns)} keep-alive "
        f"connections, {plan['loop_seconds']:g} s each (twice that above 1,000); "
        f"{plan['loop_idle']:,} idle "
        "connections for memory (bench/workloads/loop_servers.py). Medians:",
        "",
        "| " + " | ".join(head) + " |",
        "|---|---|" + "---:|" * (len(head) - 2),
    ]

    def cell(row: dict[str, float], key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "-"

    for key, row in raw.get("summary", {}).items():
        cells = key.split(" ", 1)
        cells += [cell(row, f"requests_per_s {c}", ",.0f") for c in conns]
        cells += [cell(row, f"cpu_us_per_request {c}", ".1f") for c in conns]
        cells += [
            cell(row, "traced_bytes_per_idle", ",.0f"),
            cell(row, "rss_bytes_per_idle", ",.0f"),
            cell(row, "traced_bytes_below_uvloop", ",.0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]
