"""Callgrind instructions per schedule+cancel pair: the wheel, uvloop, asyncio's loop.

    python -m bench.callgrind_pairs [--pending N]

Each implementation runs in a child under ``valgrind --tool=callgrind`` twice, with
``SMALL`` and ``LARGE`` pairs after the same setup (a loop with ``--pending`` far timers);
the difference of the two totals over ``LARGE - SMALL`` is the count per pair, free of
interpreter start-up and imports. Instruction counts hardly depend on machine load, which
is why this complements the timed sections. The wheel runs as the current
``tickwheel.wheel.IMPLEMENTATION`` (set ``TICKWHEEL_PURE=1`` to force pure Python).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

SMALL = 2_000
LARGE = 22_000
IMPLS = ("wheel", "uvloop", "asyncio")

_CHILD = """
import asyncio, sys
impl, pending, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def noop(): pass
if impl == "uvloop":
    import uvloop
    loop = uvloop.new_event_loop()
else:
    loop = asyncio.new_event_loop()
if impl == "wheel":
    from tickwheel.wheel import TimingWheel
    wheel = TimingWheel(loop=loop)
    schedule = wheel.schedule
else:
    schedule = loop.call_later
keep = [schedule(3600.0 + i * 1e-3, noop) for i in range(pending)]
delays = [0.001 * (1 + i % 50) for i in range(pairs)]
for d in delays:
    schedule(d, noop).cancel()
"""

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _instructions(impl: str, pending: int, pairs: int) -> int:
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            _CHILD,
            impl,
            str(pending),
            str(pairs),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    )
    match = _COLLECTED.search(proc.stderr)
    if match is None:
        raise RuntimeError(f"no callgrind total in:\n{proc.stderr[-2000:]}")
    return int(match.group(1))


def per_pair(impl: str, pending: int) -> float:
    """Callgrind instructions per schedule+cancel pair of ``impl``."""
    small = _instructions(impl, pending, SMALL)
    large = _instructions(impl, pending, LARGE)
    return (large - small) / (LARGE - SMALL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=1000, help="far timers pending")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    from tickwheel.wheel import IMPLEMENTATION

    counts = {impl: per_pair(impl, args.pending) for impl in IMPLS}
    print(f"callgrind instructions per schedule+cancel pair ({args.pending} pending)")
    for impl, count in counts.items():
        name = f"wheel ({IMPLEMENTATION})" if impl == "wheel" else impl
        ratio = counts["wheel"] / count
        print(f"  {name:16} {count:9.0f}   wheel/this {ratio:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
