"""The wheel-timed loops against the stdlib loop and uvloop, in one run (issue 41).

    python -m bench.probes.loop_servers [--connections 1000] [--seconds 8] [--idle 5000]
                                        [--rounds 1] [--servers uvicorn,aiohttp]
                                        [--timers-only | --no-timers]

Servers: uvicorn (h11) with a trivial ASGI app, and aiohttp, each in its own process on
each loop (``stdlib``, ``uvloop``, ``wheel`` = ``tickwheel.wheel.new_event_loop``,
``wheel-uvloop`` = ``new_uvloop_event_loop``), in a rotating order per round, measured
as the ``loop`` section of ``python -m bench`` measures them
(bench/workloads/loop_servers.py): memory per idle connection (``--idle`` of them: RSS
growth, then tracemalloc), then requests/s and the server's CPU per request under
``wrk -t2 -c CONNECTIONS -d SECONDS`` (a Python client without wrk).

Timers: per loop, ``call_later(d, f)`` then ``cancel()`` with 10^5 and 10^6 other timers
pending (ns per pair, median of 5 batches of 20,000), and the bytes one pending
``call_later`` holds (tracemalloc, 10^5 timers with distinct delays).

Every figure is one machine's, beside its peers of the same run; the shared 2-core
machine carries about ±5 % of noise on wall-clock ratios (far more at a load of 4-8).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
import tracemalloc
from typing import Any

from bench.workloads import loop_servers as ls

sys.path.insert(0, str(ls.ROOT / "tests"))

from loop_servers_support import loop_factory  # the tests' support module

LOOPS = ls.LOOPS


def _noop() -> None:
    pass


def timer_figures(loop_name: str, pending: int) -> dict[str, Any]:
    """ns per call_later+cancel with ``pending`` others, and bytes per pending timer."""
    loop = loop_factory(loop_name)()
    try:
        gc.collect()
        tracemalloc.start()
        snap0 = tracemalloc.get_traced_memory()[0]
        held = [loop.call_later(1000 + i * 1e-4, _noop) for i in range(100_000)]
        per_timer = (tracemalloc.get_traced_memory()[0] - snap0 - 100_000 * 8) / 100_000
        tracemalloc.stop()
        held += [loop.call_later(1000 + i * 1e-4, _noop) for i in range(pending - len(held))]
        call_later = loop.call_later
        batches = []
        gc.disable()  # as timeit does: a full collection over 10^6 handles is not the op
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for i in range(20_000):
                call_later(500 + i * 1e-3, _noop).cancel()
            batches.append((time.perf_counter_ns() - t0) / 20_000)
            # Let the loop run once, as a server's would (the stdlib loop drops its
            # cancelled heap entries there).
            loop.run_until_complete(asyncio.sleep(0))
        gc.enable()
        for h in held:
            h.cancel()
        return {
            "loop": loop_name,
            "pending": pending,
            "ns_per_later_cancel": statistics.median(batches),
            "bytes_per_pending_timer": per_timer,
        }
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--idle", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--servers", default="uvicorn,aiohttp")
    parser.add_argument("--timers-only", action="store_true")
    parser.add_argument("--no-timers", action="store_true")
    args = parser.parse_args(argv)
    ls.raise_fd_limit()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    if not args.no_timers:
        print(f"{'loop':<14}{'pending':>9}{'ns/later+cancel':>17}{'B/pending timer':>17}")
        for pending in (100_000, 1_000_000):
            for loop in LOOPS:
                r = timer_figures(loop, pending)
                print(
                    f"{loop:<14}{pending:>9}{r['ns_per_later_cancel']:>17.0f}"
                    f"{r['bytes_per_pending_timer']:>17.0f}"
                )
    if args.timers_only:
        return
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = LOOPS[rnd % len(LOOPS) :] + LOOPS[: rnd % len(LOOPS)]
        for kind in args.servers.split(","):
            for loop in order:
                rows.append(
                    ls.measure(
                        kind,
                        loop,
                        (args.connections,),
                        args.seconds,
                        args.idle,
                        use_wrk=ls.have_wrk(),
                    )
                )
    key = f"c{args.connections}"
    print(
        f"\n{args.connections} keep-alive connections ({rows[0]['load']}, {args.seconds} s), "
        f"{args.idle} idle; medians of {args.rounds} round(s)"
    )
    print(
        f"{'server':<9}{'loop':<14}{'req/s':>9}{'CPU us/req':>12}"
        f"{'B/idle RSS':>12}{'B/idle traced':>15}"
    )
    for kind in args.servers.split(","):
        for loop in LOOPS:
            mine = [r for r in rows if r["server"] == kind and r["loop"] == loop]

            def med(name: str, mine: list[dict[str, Any]] = mine) -> float:
                return statistics.median(r.get(name, float("nan")) for r in mine)

            print(
                f"{kind:<9}{loop:<14}"
                f"{statistics.median(r[key]['requests_per_s'] for r in mine):>9.0f}"
                f"{statistics.median(r[key]['cpu_us_per_request'] for r in mine):>12.1f}"
                f"{med('rss_bytes_per_idle'):>12.0f}{med('traced_bytes_per_idle'):>15.0f}"
            )


if __name__ == "__main__":
    main()
