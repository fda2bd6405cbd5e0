"""A bounded subset of CPython's own asyncio tests on WheelEventLoop (bench/probes/
cpython_asyncio.py runs the whole of issue 41's list and reports it in docs/wheel-loop.md).

The modules that exercise timers the most and run in a few seconds: test_timeouts,
test_waitfor, test_locks, test_queues, the selector loop's base-event tests and the
epoll variant of test_events, from the running interpreter's own test package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBSET = [
    "test_timeouts",
    "test_waitfor",
    "test_locks",
    "test_queues",
    "test_base_events.BaseEventLoopWithSelectorTests",
    "test_events.EPollEventLoopTests",
]


def test_cpython_asyncio_subset_passes_on_the_wheel_loop() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.probes.cpython_asyncio", "--json", *SUBSET],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    reports = json.loads(proc.stdout)
    for r in reports:
        assert r["failures"] == r["errors"] == 0, r
        assert r["skipped"] == 0, r
        # Every test of these modules made its loops through the swap (none bypasses it).
        assert r["on_wheel_loop"] == r["run"] > 0, r
