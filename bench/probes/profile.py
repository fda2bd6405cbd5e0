"""Where the time goes: cProfile of the durable hot paths, and the wheel's hot paths
looped for a sampling profiler (py-spy), whose output ``top`` sums by line.

    python -m bench.probes.profile durable [--op claim_ack|schedule_many|single|bare]
    python -m bench.probes.profile wheel schedule+cancel|reschedule|fire [SECONDS] [N]
    python -m bench.probes.profile top PYSPY_RAW_FILE [FRAME_TEXT]

``durable``: the top functions by own time of one hot path (bench/workloads/
durable_ops.py) over ``--count`` jobs on a private redis-server, and the server's
EVALSHA time per job (``INFO commandstats``). ``wheel``: loops one of the wheel's hot
paths for SECONDS (10) with N (10^5) far timers pending, to run under ``py-spy record
-f raw`` (or ``pyinstrument``). ``top``: sums a py-spy ``raw`` file by leaf frame (own
time), only the stacks through FRAME_TEXT if given (``TimingWheel._run``: the firing).
Instruction counts of the same paths: ``python -m bench.probes.callgrind``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import linecache
import os
import pstats
import time
from collections import Counter
from pathlib import Path

from bench.workloads.durable_ops import (
    HOT_PATH_JOBS,
    HOT_PATHS,
    hot_path,
    hot_path_setup,
    warm_hot_path,
)
from bench.workloads.wheel_ops import (
    FIRE_WINDOW,
    TICK,
    countdown,
    far_delays,
    near_delays,
    noop,
    sleep_until,
)
from tickwheel.durable.servers import RedisServer
from tickwheel.wheel import TimingWheel

ROOT = Path(__file__).resolve().parents[2]  # py-spy names files relative to it


def durable(op: str, count: int) -> None:
    """cProfile of ``op`` over ``count`` jobs, and Redis's script time per job."""
    server = RedisServer().start()
    try:
        asyncio.run(_durable(server.port, op, count))
    finally:
        server.stop()


async def _durable(port: int, op: str, count: int) -> None:
    s, client = await hot_path_setup(port, op)
    await warm_hot_path(s, op)
    await client.config_resetstat()
    prof = cProfile.Profile()
    prof.enable()
    await hot_path(s, op, count)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    stats = await client.info("commandstats")
    for name, row in stats.items():
        if "eval" in name:
            print(
                f"server {name}: {row['calls']} calls, {row['usec']} us, "
                f"{row['usec'] / count:.2f} us per job"
            )
    await client.aclose()


def wheel_loop(path: str, seconds: float, n: int) -> None:
    """Loop one of the wheel's hot paths for ``seconds`` (run under py-spy/pyinstrument)."""
    loop = asyncio.new_event_loop()
    wheel = TimingWheel(TICK, loop=loop)
    if path != "fire":
        for d in far_delays(n):
            wheel.schedule(d, noop)
    delays = near_delays()
    schedule = wheel.schedule
    deadline = time.perf_counter() + seconds
    rounds = 0
    if path == "schedule+cancel":
        while time.perf_counter() < deadline:
            for d in delays:
                schedule(d, noop).cancel()
            rounds += 1
    elif path == "reschedule":
        move = schedule(30.0, noop).reschedule
        while time.perf_counter() < deadline:
            for d in delays:
                move(d)
            rounds += 1
    elif path == "fire":  # as test_fire; the samples include the scheduling, apart
        step = FIRE_WINDOW / n
        offsets = [i * step for i in range(n)]
        schedule_at = wheel.schedule_at
        while time.perf_counter() < deadline:
            hit, done = countdown(loop, n)
            start = loop.time()
            for offset in offsets:
                schedule_at(start + offset, hit)
            sleep_until(loop, start + FIRE_WINDOW + 2 * TICK)
            loop.run_until_complete(done)
            rounds += 1
    else:
        raise SystemExit(f"unknown path {path!r}")
    print(f"{path}: {rounds} rounds in {seconds} s (N={n})")
    wheel.close()
    loop.close()


def top(raw_file: str, under: str = "", limit: int = 15) -> None:
    """Sum a ``py-spy record --format raw`` file by leaf frame (own time), print the top.

    With ``under``, only the stacks with a frame containing that text count (e.g.
    ``TimingWheel._run`` for the firing alone); percentages are of those stacks.
    """
    own: Counter[str] = Counter()
    total = 0
    with open(raw_file) as f:
        for line in f:
            stack, _, samples = line.rstrip("\n").rpartition(" ")
            if not stack or under not in stack:
                continue
            own[stack.rsplit(";", 1)[-1]] += int(samples)
            total += int(samples)
    for frame, count in own.most_common(limit):
        print(f"{100 * count / total:6.1f}%  {frame:<48} {_source_line(frame)}")


def _source_line(frame: str) -> str:
    """The source text of a py-spy frame ``func (path:line)``, read now (best effort)."""
    where = frame.rpartition("(")[2].rstrip(")")
    path, _, line = where.rpartition(":")
    if not line.isdigit():
        return ""
    for candidate in (path, os.path.join(ROOT, path)):
        text = linecache.getline(candidate, int(line)).strip()
        if text:
            return text
    return ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("durable", help="cProfile of one durable hot path")
    d.add_argument("--op", default="claim_ack", choices=HOT_PATHS)
    d.add_argument("--count", type=int, default=HOT_PATH_JOBS)
    w = sub.add_parser("wheel", help="loop one of the wheel's hot paths (for py-spy)")
    w.add_argument("path", choices=("schedule+cancel", "reschedule", "fire"))
    w.add_argument("seconds", type=float, nargs="?", default=10.0)
    w.add_argument("n", type=lambda x: int(float(x)), nargs="?", default=10**5)
    t = sub.add_parser("top", help="sum a py-spy raw file by own time per line")
    t.add_argument("raw_file")
    t.add_argument("under", nargs="?", default="", help="only stacks through this frame")
    args = parser.parse_args(argv)
    if args.what == "durable":
        durable(args.op, args.count)
    elif args.what == "wheel":
        wheel_loop(args.path, args.seconds, args.n)
    else:
        top(args.raw_file, args.under)


if __name__ == "__main__":
    main()
