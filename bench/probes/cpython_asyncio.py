"""CPython's own asyncio test suites with the wheel-timed loop as the loop under test.

    python -m bench.probes.cpython_asyncio [--loop stdlib|none] [--json] [MODULE ...]

MODULE names a module of the running interpreter's ``test.test_asyncio`` package
(default: test_base_events test_events test_tasks test_timeouts test_waitfor test_locks
test_queues); ``MODULE.Class`` or ``MODULE.Class.test`` narrows it. The interpreter must
ship its test package (pyenv builds do: ``$(pyenv prefix 3.12.1)/lib/python3.12/test``).

The swap: before the tests are imported, ``asyncio.SelectorEventLoop`` (and its
``unix_events`` binding) becomes :class:`tickwheel.wheel.WheelEventLoop`, and the
default policy's loop factory with it, so every loop a test makes through
``asyncio.new_event_loop()``, ``asyncio.run()``, ``asyncio.Runner`` or
``asyncio.SelectorEventLoop(selector)`` is ours. Tests that build a ``BaseEventLoop`` or
``test_utils.TestLoop`` directly (a fake clock, mocked selectors) do not run on it; the
report counts the tests that made at least one wheel-timed loop. ``--loop none`` runs
the same selection on the stdlib loop, for the baseline.

Prints per module: run, failures, errors, skipped, and tests on the wheel loop; and every
failure's test id and the last line of its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
import unittest
from typing import Any

DEFAULT = (
    "test_base_events",
    "test_events",
    "test_tasks",
    "test_timeouts",
    "test_waitfor",
    "test_locks",
    "test_queues",
)


class _Counting:
    """Counts the wheel-timed loops made, so a result can tell which tests used one."""

    made = 0


def install_wheel_loop() -> None:
    """Make ``WheelEventLoop`` the loop asyncio creates (see the module docstring)."""
    from asyncio import unix_events

    from tickwheel.wheel import WheelEventLoop

    class CountedWheelEventLoop(WheelEventLoop):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _Counting.made += 1
            super().__init__(*args, **kwargs)

    CountedWheelEventLoop.__name__ = "WheelEventLoop"
    asyncio.SelectorEventLoop = CountedWheelEventLoop  # type: ignore[misc]
    unix_events.SelectorEventLoop = CountedWheelEventLoop  # type: ignore[misc]
    policy = unix_events.DefaultEventLoopPolicy
    policy._loop_factory = CountedWheelEventLoop  # type: ignore[attr-defined]


class _Result(unittest.TextTestResult):
    """A result that records, per test, whether a wheel-timed loop was made."""

    on_wheel: set[str]

    def startTest(self, test: unittest.TestCase) -> None:
        self._made_before = _Counting.made
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        if _Counting.made > self._made_before:
            self.on_wheel.add(test.id())


def run_module(name: str, verbosity: int) -> dict[str, Any]:
    """Run one module (or ``module.Class[.test]``) of test.test_asyncio; its counts."""
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromName(f"test.test_asyncio.{name}")
    _Result.on_wheel = set()
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=verbosity, resultclass=_Result)
    t0 = time.perf_counter()
    result = runner.run(suite)
    assert isinstance(result, _Result)
    bad = [(t.id(), tb.strip().splitlines()[-1]) for t, tb in result.failures + result.errors]
    return {
        "module": name,
        "run": result.testsRun,
        "failures": len(result.failures),
        "errors": len(result.errors),
        "skipped": len(result.skipped),
        "on_wheel_loop": len(result.on_wheel),
        "seconds": round(time.perf_counter() - t0, 1),
        "failed": bad,
        "skips": sorted({reason for _t, reason in result.skipped}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(DEFAULT))
    parser.add_argument("--loop", choices=("stdlib", "none"), default="stdlib")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
    if args.loop == "stdlib":
        install_wheel_loop()
    importlib.import_module("test.test_asyncio")
    reports = [run_module(m, args.verbose) for m in args.modules]
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        print(f"python {sys.version.split()[0]}, loop: {args.loop}")
        for r in reports:
            print(
                f"{r['module']:<20} run {r['run']:>4}  fail {r['failures']:>2}  "
                f"err {r['errors']:>2}  skip {r['skipped']:>3}  "
                f"on wheel loop {r['on_wheel_loop']:>4}  {r['seconds']} s"
            )
            for test_id, last in r["failed"]:
                print(f"    {test_id}: {last}")
    failed = sum(r["failures"] + r["errors"] for r in reports)
    return 1 if failed else 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
