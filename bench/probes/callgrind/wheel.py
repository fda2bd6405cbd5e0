"""Callgrind instructions per operation: the compiled wheel, the pure-Python wheel,
uvloop and asyncio's loop, in one run.

    python -m bench.probes.callgrind wheel [--pending N] [--ops pair,reschedule,fire]

Each implementation runs in a child under ``valgrind --tool=callgrind`` twice, with
``SMALL`` and ``LARGE`` operations after the same setup (a loop with ``--pending`` far
timers); the difference of the two totals over ``LARGE - SMALL`` is the count per
operation, free of interpreter start-up and imports. Instruction counts hardly depend
on machine load, which is why this complements the timed sections.

Operations:

* ``pair``: ``schedule`` + ``cancel`` of a near timer (``call_later`` + ``cancel``).
* ``reschedule``: moving one pending deadline later: ``Timer.reschedule`` (wheel),
  ``wheel.Timeout.reschedule`` (``wheel-timeout``), ``asyncio.Timeout.reschedule``.
* ``fire``: scheduling a timer that is due and running the loop until it has fired,
  per timer (``schedule_at``/``call_at`` plus the firing; the due timers fire together).
* ``block``: entering and leaving ``async with timeout(30)`` (``wheel.timeout`` on the
  wheels, ``asyncio.timeout`` on the loops), in one task.
* ``bare-call``: a call of an empty Python function, for scale.

The compiled wheel is ``wheel-c``, the pure-Python one ``wheel-py`` (both in the same
run, whatever ``TICKWHEEL_PURE`` says). ``loop-wheel`` and ``loop-wheel-uvloop`` are the
event loops whose ``call_later``/``call_at`` are the wheel (``tickwheel.wheel.
new_event_loop``, ``new_uvloop_event_loop``), measured through ``call_later`` as the
stdlib loop and uvloop are.
"""

from __future__ import annotations

import argparse
import sys

from bench.probes.callgrind._tools import count

SMALL = 2_000
LARGE = 22_000
IMPLS = ("wheel-c", "wheel-py", "uvloop", "asyncio", "loop-wheel", "loop-wheel-uvloop")
OPS = ("pair", "reschedule", "fire", "block", "bare-call")

_CHILD = """
import asyncio, sys
impl, op, pending, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def noop(): pass
if op == "bare-call":
    for _ in range(count):
        noop()
    raise SystemExit(0)
if impl == "uvloop":  # the peers' module only where it is needed: the others count as before
    from bench.peers.loops import new_loop
    loop = new_loop("uvloop")
elif impl == "loop-wheel":  # tickwheel.wheel.new_event_loop: call_later on the wheel
    from tickwheel.wheel import new_event_loop
    loop = new_event_loop()
elif impl == "loop-wheel-uvloop":
    from tickwheel.wheel import new_uvloop_event_loop
    loop = new_uvloop_event_loop()
else:
    loop = asyncio.new_event_loop()
wheel = None
if impl.startswith("wheel"):
    from tickwheel.wheel import _cdriver, _driver
    cls = _cdriver.TimingWheel if impl.startswith("wheel-c") else _driver.TimingWheel
    wheel = cls(loop=loop)
    schedule, schedule_at = wheel.schedule, wheel.schedule_at
else:
    schedule, schedule_at = loop.call_later, loop.call_at
keep = [schedule(3600.0 + i * 1e-3, noop) for i in range(pending)]
if op == "pair":
    delays = [0.001 * (1 + i % 50) for i in range(count)]
    for d in delays:
        schedule(d, noop).cancel()
elif op == "reschedule":
    ladder = [30.0 + i * 1e-3 for i in range(count)]
    if impl in ("wheel-c", "wheel-py"):
        timer = schedule(30.0, noop)
        move = timer.reschedule
        for d in ladder:
            move(d)
    else:
        async def main():
            cm = wheel.timeout(30.0) if wheel is not None else asyncio.timeout(30.0)
            async with cm:
                move_to = cm.reschedule
                base = loop.time()
                for d in ladder:
                    move_to(base + d)
        loop.run_until_complete(main())
elif op == "block":
    async def main():
        make = wheel.timeout if wheel is not None else asyncio.timeout
        for _ in range(count):
            async with make(30.0):
                pass
    loop.run_until_complete(main())
elif op == "fire":
    left = [count]
    done = loop.create_future()
    def hit():
        left[0] -= 1
        if not left[0]:
            done.set_result(None)
    now = loop.time()
    for _ in range(count):
        schedule_at(now, hit)
    loop.run_until_complete(done)
"""


def per_op(impl: str, op: str, pending: int) -> float:
    """Callgrind instructions per operation ``op`` of ``impl``."""
    small, large = (
        count([sys.executable, "-c", _CHILD, impl, op, str(pending), str(n)])
        for n in (SMALL, LARGE)
    )
    return (large - small) / (LARGE - SMALL)


def impls_for(op: str) -> tuple[str, ...]:
    if op == "bare-call":
        return ("python",)
    if op == "reschedule":
        return (
            "wheel-c",
            "wheel-py",
            "wheel-c-timeout",
            "wheel-py-timeout",
            "uvloop",
            "asyncio",
            "loop-wheel",
            "loop-wheel-uvloop",
        )
    return IMPLS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pending", type=int, default=1000, help="far timers pending")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated operations")
    parser.add_argument("--impls", default="", help="comma-separated implementations (all)")


def run(args: argparse.Namespace) -> int:
    for op in args.ops.split(","):
        chosen = [i for i in impls_for(op) if not args.impls or i in args.impls.split(",")]
        counts = {impl: per_op(impl, op, args.pending) for impl in chosen}
        print(f"callgrind instructions per {op} ({args.pending} pending)")
        base = counts.get("wheel-c", next(iter(counts.values())))
        for impl, n in counts.items():
            print(f"  {impl:18} {n:9.0f}   this/wheel-c {n / base:6.2f}")
    return 0
