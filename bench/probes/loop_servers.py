"""The wheel-timed loops against the stdlib loop and uvloop, in one run (issue 41).

    python -m bench.probes.loop_servers [--connections 1000] [--seconds 8] [--idle 5000]
                                        [--rounds 1] [--servers uvicorn,aiohttp]
                                        [--timers-only | --no-timers]

Servers: uvicorn (h11) with a trivial ASGI app, and aiohttp, each in its own process on
each loop (``stdlib``, ``uvloop``, ``wheel`` = ``tickwheel.wheel.new_event_loop``,
``wheel-uvloop`` = ``new_uvloop_event_loop``), in a rotating order per round:

* throughput: ``wrk -t2 -c CONNECTIONS -d SECONDS`` on keep-alive connections
  (requests/s as wrk counts them);
* CPU per request: the server process's user+system CPU time over the wrk run
  (/proc/PID/stat), divided by the requests wrk counted;
* memory per idle connection: the server's RSS (/proc/PID/status) before and after
  ``--idle`` keep-alive connections have each made one request and gone quiet, divided by
  their number (every such connection holds a keep-alive timer).

Timers: per loop, ``call_later(d, f)`` then ``cancel()`` with 10^5 and 10^6 other timers
pending (ns per pair, median of 5 batches of 20,000), and the bytes one pending
``call_later`` holds (tracemalloc, 10^5 timers with distinct delays).

Every figure is one machine's, beside its peers of the same run; the shared 2-core
machine carries about ±5 % of noise on wall-clock ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from loop_servers_support import (  # noqa: E402  (the tests' support module)
    loop_factory,
    request_then_idle,
    start_server,
)

from tickwheel.durable.servers import free_port  # noqa: E402

LOOPS = ("stdlib", "uvloop", "wheel", "wheel-uvloop")
_CLK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def _rss_bytes(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert m is not None
    return int(m.group(1)) * 1024


def _wrk(port: int, connections: int, seconds: int) -> int:
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{connections}",
            f"-d{seconds}s",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"(\d+) requests in", out)
    assert m is not None, out
    return int(m.group(1))


async def _hold_idle(port: int, n: int, pid: int) -> int:
    """Open ``n`` keep-alive connections, one request each; the server's RSS growth."""
    before = _rss_bytes(pid)
    loop = asyncio.get_running_loop()
    tasks = []
    for i in range(0, n, 500):
        tasks += [loop.create_task(request_then_idle(port)) for _ in range(min(500, n - i))]
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # all answered, all idle on their keep-alive timers
    after = _rss_bytes(pid)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return after - before


def measure_server(kind: str, loop: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    proc = start_server(kind, loop, port, keepalive=600)
    try:
        _wrk(port, 50, 1)  # warm up
        cpu0 = _cpu_seconds(proc.pid)
        requests = _wrk(port, args.connections, args.seconds)
        cpu = _cpu_seconds(proc.pid) - cpu0
        grown = asyncio.run(_hold_idle(port, args.idle, proc.pid)) if args.idle else 0
        return {
            "server": kind,
            "loop": loop,
            "rps": requests / args.seconds,
            "cpu_us_per_req": cpu / requests * 1e6,
            "bytes_per_idle_conn": grown / args.idle if args.idle else float("nan"),
        }
    finally:
        proc.terminate()
        proc.wait(10)


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
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
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
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not on PATH (apt-get install wrk)")
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = LOOPS[rnd % len(LOOPS) :] + LOOPS[: rnd % len(LOOPS)]
        for kind in args.servers.split(","):
            for loop in order:
                rows.append(measure_server(kind, loop, args))
    print(
        f"\n{args.connections} keep-alive connections (wrk -t2, {args.seconds} s), "
        f"{args.idle} idle; medians of {args.rounds} round(s)"
    )
    print(f"{'server':<9}{'loop':<14}{'req/s':>9}{'CPU us/req':>12}{'B/idle conn':>13}")
    for kind in args.servers.split(","):
        for loop in LOOPS:
            mine = [r for r in rows if r["server"] == kind and r["loop"] == loop]
            print(
                f"{kind:<9}{loop:<14}"
                f"{statistics.median(r['rps'] for r in mine):>9.0f}"
                f"{statistics.median(r['cpu_us_per_req'] for r in mine):>12.1f}"
                f"{statistics.median(r['bytes_per_idle_conn'] for r in mine):>13.0f}"
            )


if __name__ == "__main__":
    main()
