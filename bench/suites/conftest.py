"""The pytest-benchmark suites' shared parts: their collection, fixtures and summary.

Run from the repository root, ``pytest bench/suites`` collects every ``bench_*.py`` here
(or name one file); the root goes on ``sys.path`` so that the suites import ``bench``
(pytest's importlib mode does not put it there).

Summary: ratios of medians within each pytest-benchmark group. Generic: a benchmark
that sets ``extra_info["base"] = True`` is the reference of its group, and every row of
the group is shown as ``median / reference median`` (above 1: slower than the
reference), with the ratio of the minimums beside it (steadier on a noisy machine; when
the two disagree, trust neither). ``extra_info["ops_per_round"]``
adds a per-operation time. A string in ``extra_info["report"]`` is printed as is (for
figures that are not times).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from tickwheel.durable.servers._redis import RedisServer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` when pytest is given this folder (a file named on the
    command line is collected by pytest itself, whatever its name)."""
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _fmt_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3f} {unit}"
    return f"{s / 1e-9:.1f} ns"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = getattr(config, "_benchmarksession", None)  # pytest-benchmark's own state
    benchmarks = [b for b in getattr(session, "benchmarks", []) if b]
    if not benchmarks:
        return
    groups: dict[str, list[Any]] = {}
    for bench in benchmarks:
        groups.setdefault(bench.group or "", []).append(bench)
    write = terminalreporter.write_line
    terminalreporter.section("ratios to the base row of each group (median, and min)")
    for group, rows in sorted(groups.items()):
        if any("report" in b.extra_info for b in rows):
            continue
        base = next((b for b in rows if b.extra_info.get("base")), None)
        write(f"{group}:")
        for bench in sorted(rows, key=lambda b: b.stats.median):
            median = bench.stats.median
            ops = bench.extra_info.get("ops_per_round")
            per_op = f"{_fmt_seconds(median / ops):>11}/op" if ops else ""
            ratio = (
                f"{median / base.stats.median:6.2f}x (min {bench.stats.min / base.stats.min:.2f}x)"
                if base
                else ""
            )
            mark = " (base)" if bench is base else ""
            name = bench.extra_info.get("impl", bench.name)
            write(f"  {name:<18} {_fmt_seconds(median):>11} {per_op} {ratio}{mark}")
    reports = [b.extra_info["report"] for b in benchmarks if "report" in b.extra_info]
    if reports:
        terminalreporter.section("reports")
        for report in reports:
            write(report)
            write("")


# -- shared by the Redis suites (bench_durable.py, bench_spill.py, bench_cluster.py) ---


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop per module, driven with run_until_complete by each benchmark."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A private redis-server for the module."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def client(loop: asyncio.AbstractEventLoop, server: RedisServer) -> Iterator[redis.asyncio.Redis]:
    """A client of that server, made on the module's loop."""
    c = loop.run_until_complete(_client(server.url))
    yield c
    loop.run_until_complete(c.aclose())


async def _client(url: str) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(url)
