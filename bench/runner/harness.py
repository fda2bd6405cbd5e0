"""What every section of ``python -m bench`` shares: the plan, the progress bar, the
figures and the correctness checks, and the machine the figures come from.

A figure is a ratio to its peer measured in the same run: for each repeat the peer and
tickwheel are measured back to back, the ratio is taken in that repeat, and the report
gives the median of the ratios with their min and max. Ratios are oriented so that
above 1 means tickwheel is better (the peer's cost over tickwheel's, or tickwheel's rate
over the peer's).
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Plan:
    """Sizes and repeats of one run: the full run, or ``--quick`` (the CI smoke test)."""

    quick: bool
    repeats: int
    wheel_sizes: tuple[int, ...]
    wheel_rounds: int  # timed rounds of BATCH operations per impl, per repeat
    memory_sizes: tuple[int, ...]
    lateness_sizes: tuple[int, ...]
    server_conns: int
    server_rounds: int
    server_idle: float
    durable_pending: int
    durable_singles: int  # sequential single schedules timed per library
    durable_drain: int  # due jobs drained by each library's worker
    durable_rates: tuple[int, ...]  # jobs/s of the lateness runs
    durable_seconds: float  # length of each lateness run
    durable_kill_jobs: int  # jobs of the SIGKILL row, per library
    example_pending: int
    example_rate: int
    example_seconds: float
    example_capacity_jobs: int  # due jobs of the saturated claim loop
    loop_conns: tuple[int, ...]  # keep-alive connections of each load run (loop section)
    loop_seconds: float  # length of each load run
    loop_idle: int  # idle connections of the memory passes

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(
                quick=True,
                repeats=1,
                wheel_sizes=(10**3, 10**4),
                wheel_rounds=5,
                memory_sizes=(10**4,),
                lateness_sizes=(10**3,),
                server_conns=300,
                server_rounds=2,
                server_idle=1.0,
                durable_pending=2_000,
                durable_singles=200,
                durable_drain=500,
                durable_rates=(1_000, 5_000),
                durable_seconds=0.1,
                durable_kill_jobs=200,
                example_pending=10_000,
                example_rate=2_900,
                example_seconds=2.0,
                example_capacity_jobs=5_000,
                loop_conns=(100,),
                loop_seconds=1.0,
                loop_idle=200,
            )
        return cls(
            quick=False,
            repeats=3,
            wheel_sizes=(10**3, 10**4, 10**5, 10**6),
            wheel_rounds=30,
            memory_sizes=(10**3, 10**4, 10**5, 10**6),
            lateness_sizes=(10**3, 10**4, 10**5, 10**6),
            server_conns=10_000,
            server_rounds=5,
            server_idle=5.0,
            durable_pending=100_000,
            durable_singles=2_000,
            durable_drain=5_000,
            durable_rates=(1_000, 5_000),
            durable_seconds=1.0,
            durable_kill_jobs=1_000,
            example_pending=1_000_000,
            example_rate=2_900,
            example_seconds=60.0,
            example_capacity_jobs=100_000,
            loop_conns=(1_000, 10_000),
            loop_seconds=5.0,
            loop_idle=10_000,
        )


class Progress:
    """A progress bar on stderr: one line redrawn on a terminal, a line per step else."""

    WIDTH = 30

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.t0 = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, label: str) -> None:
        """Count one step done and draw the bar with ``label`` (what runs next)."""
        self.done = min(self.done + 1, self.total)
        self.show(label)

    def show(self, label: str) -> None:
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.t0
        line = (
            f"[{bar}] {self.done:>3}/{self.total} {int(elapsed) // 60:02d}:"
            f"{int(elapsed) % 60:02d} {label}"
        )
        if self.tty:
            self.stream.write("\r\x1b[2K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class Figure:
    """One ratio to a peer: samples per repeat, plus the raw values on both sides."""

    section: str
    name: str  # what is compared, e.g. "schedule+cancel N=1e6"
    peer: str  # what tickwheel is compared with
    unit: str  # unit of the raw values
    better: str  # "lower" (a cost) or "higher" (a rate) raw value is better
    ours: list[float] = field(default_factory=list)  # raw value per repeat
    theirs: list[float] = field(default_factory=list)

    def add(self, ours: float, theirs: float) -> None:
        self.ours.append(ours)
        self.theirs.append(theirs)

    def ratios(self) -> list[float]:
        out = []
        for a, b in zip(self.ours, self.theirs, strict=True):
            num, den = (b, a) if self.better == "lower" else (a, b)
            out.append(num / den if den else float("inf"))
        return out

    def as_dict(self) -> dict[str, Any]:
        r = self.ratios()
        return {
            "section": self.section,
            "name": self.name,
            "peer": self.peer,
            "unit": self.unit,
            "better": self.better,
            "ours": self.ours,
            "theirs": self.theirs,
            "ratios": r,
            "ratio_median": statistics.median(r) if r else None,
            "ratio_min": min(r) if r else None,
            "ratio_max": max(r) if r else None,
            "ours_median": statistics.median(self.ours) if self.ours else None,
            "theirs_median": statistics.median(self.theirs) if self.theirs else None,
        }


class Checks:
    """Correctness checks of a run: each failure makes ``python -m bench`` exit 1."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.passed: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        (self.passed if ok else self.failures).append(what)


def median_min_max(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p99, p99.9, max and min of ``samples`` (same unit)."""
    s = sorted(samples)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(len(s) * q))]

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": s[-1], "min": s[0]}


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def machine() -> dict[str, str]:
    """The machine and the versions the figures come from."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        if m:
            cpu = m.group(1).strip()
    except OSError:
        pass
    try:
        from tickwheel.durable.servers._redis import find_redis_server

        out = subprocess.run(
            [find_redis_server(), "--version"], capture_output=True, text=True, check=True
        ).stdout
        m2 = re.search(r"v=(\S+)", out)
        redis_server = m2.group(1) if m2 else out.strip()
    except Exception as exc:
        redis_server = f"unavailable ({exc})"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "redis-server": redis_server,
        "redis-py": _version("redis"),
        "hiredis": _version("hiredis"),
        "uvloop": _version("uvloop"),
        "arq": _version("arq"),
        "bullmq": _version("bullmq"),
        "saq": _version("saq"),
        "streaq": _version("streaq"),
        "tickwheel": _version("tickwheel"),
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


Section = Callable[["Plan", "Progress", "Checks"], Coroutine[Any, Any, dict[str, Any]]]


def run_async_section(
    section: Section, plan: Plan, progress: Progress, checks: Checks
) -> dict[str, Any]:
    """Run an async section on a loop of its own (closed after), its time in
    ``raw["seconds"]``: the ``run`` of the sections written as one coroutine."""
    loop = asyncio.new_event_loop()
    try:
        t = time.perf_counter()
        out = loop.run_until_complete(section(plan, progress, checks))
        out["raw"]["seconds"] = time.perf_counter() - t
        return out
    finally:
        loop.close()
