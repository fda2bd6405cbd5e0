"""Callgrind instructions per request of uvicorn and aiohttp on each event loop (issue 41).

    python -m bench.probes.callgrind loop [--servers uvicorn,aiohttp]
                                          [--loops stdlib,wheel,uvloop,wheel-uvloop]
                                          [--conns 200] [--warm 3] [--rounds 20]
                                          [--storm] [--keep DIR]

Why: the wheel-timed loop's CPU per request under wrk moves by 10-20 % from run to run
on this shared machine, more than the difference it is asked about. Instructions do not.

How: each server (tests/loop_servers_support.py: uvicorn with a trivial ASGI app, and
aiohttp) runs under ``valgrind --tool=callgrind`` on one loop. This process opens
``--conns`` keep-alive connections and drives every one of them through ``--warm``
requests, one after the other per connection, all connections at once (so the server
always has requests waiting, as under wrk); the server makes a full collection
(``GET /gc``), its counters are zeroed, every connection makes ``--rounds`` more
requests, and the counters are dumped: the figure is that dump over ``conns x rounds``.
Each request ends one keep-alive timer and starts another, as under wrk (aiohttp 3.10+
re-arms its keep-alive timer lazily, once per keep-alive period).

``--storm`` counts the connecting too, as wrk's start is: the connections open in waves
of 1,000 at once (``WAVE``), one request each (instead of one by one, then ``--warm``),
within their own counted window; the figures are then per connection (connect phase,
collector included and left out) beside the per-request ones. At 10,000 connections
this is how the wrk figures' "accept storm" is told apart from the established requests.

A second figure leaves out the cyclic collector (``gc_collect_main`` and what it calls):
a full collection costs tens of millions of instructions at 1,000 connections, and
whether one more falls inside the counted window moved aiohttp's total by 4 % between
two loops whose collections per request are the same (gc callbacks, 5 s of wrk).
``--keep DIR`` keeps the dumps for ``callgrind_annotate``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.probes.callgrind._tools import ROOT, free_port, total_in
from bench.workloads.loop_servers import exchange, raise_fd_limit

sys.path.insert(0, str(ROOT / "tests"))

from loop_servers_support import LOOPS, start_server  # the tests' support module

# The collector's entry in CPython 3.11-3.13 (gcmodule.c, gc.c): what "without the
# collector" leaves out.
COLLECTOR = "gc_collect_main"
# Seconds a server under callgrind may take to start (uvicorn's imports: about 20 s).
START_TIMEOUT = 300.0
# --storm: connections opened at once (well inside the servers' backlog of 4,096).
WAVE = 1_000


async def _connect(port: int, conns: int) -> list[tuple[asyncio.StreamReader, Any]]:
    pairs = []
    for _ in range(conns):
        pairs.append(await asyncio.open_connection("127.0.0.1", port))
    return pairs


async def _requests(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int, path: bytes = b"/"
) -> None:
    for _ in range(n):
        await exchange(reader, writer, path)


async def _storm(port: int, conns: int) -> list[tuple[asyncio.StreamReader, Any]]:
    async def one() -> tuple[asyncio.StreamReader, Any]:
        pair = await asyncio.open_connection("127.0.0.1", port)
        await _requests(*pair, 1)
        return pair

    pairs: list[tuple[asyncio.StreamReader, Any]] = []
    for i in range(0, conns, WAVE):
        pairs += await asyncio.gather(*(one() for _ in range(min(WAVE, conns - i))))
    return pairs


async def _drive(port: int, args: argparse.Namespace, control: Any) -> None:
    if args.storm:  # the connecting in a counted window of its own (dump 1)
        await _requests(*await asyncio.open_connection("127.0.0.1", port), 1, b"/gc")
        control("-z")
        pairs = await _storm(port, args.conns)
        control("-d")
    else:
        pairs = await _connect(port, args.conns)
        await asyncio.gather(*(_requests(r, w, args.warm) for r, w in pairs))
    await _requests(*pairs[0], 1, b"/gc")
    control("-z")
    await asyncio.gather(*(_requests(r, w, args.rounds) for r, w in pairs))
    control("-d")
    for _, w in pairs:
        w.close()


def collector_total(path: str) -> int:
    """Instructions spent in the cyclic collector (inclusive) in a callgrind dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        if f":{COLLECTOR} " in line:
            return int(line.split()[0].replace(",", ""))
    return 0


def per_request(kind: str, loop: str, args: argparse.Namespace, out_dir: str) -> tuple[float, ...]:
    """Instructions the ``kind`` server on ``loop`` spends per keep-alive request: in
    all, and without the cyclic collector; with ``--storm``, then the same two per
    connection of the connect phase."""
    out = os.path.join(out_dir, f"{kind}-{loop}.%p")
    wrapper = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={out}"]
    os.environ.setdefault("PYTHONHASHSEED", "0")  # dict layouts alike from run to run
    port = free_port()
    proc = start_server(
        kind, loop, port, keepalive=600, wrapper=wrapper, start_timeout=START_TIMEOUT
    )
    dumps = [out.replace("%p", str(proc.pid)) + f".{i}" for i in ((1, 2) if args.storm else (1,))]
    dump = dumps[-1]

    def control(flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(proc.pid)], check=True, capture_output=True)

    try:
        asyncio.run(_drive(port, args, control))
        deadline = time.monotonic() + 60
        while not os.path.exists(dump) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # written whole
        n = args.conns * args.rounds
        total = total_in(dump)
        out_figures: tuple[float, ...] = (total / n, (total - collector_total(dump)) / n)
        if args.storm:
            storm = total_in(dumps[0])
            out_figures += (storm / args.conns, (storm - collector_total(dumps[0])) / args.conns)
        return out_figures
    finally:
        proc.terminate()
        proc.wait(120)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", default="uvicorn,aiohttp")
    parser.add_argument("--loops", default=",".join(LOOPS))
    parser.add_argument("--conns", type=int, default=200)
    parser.add_argument("--warm", type=int, default=3, help="requests per connection first")
    parser.add_argument("--rounds", type=int, default=20, help="counted requests per connection")
    parser.add_argument(
        "--storm", action="store_true", help="count the connecting too (in waves of 1,000)"
    )
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the dumps here")


def run(args: argparse.Namespace) -> int:
    if shutil.which("callgrind_control") is None:
        print("callgrind_control is not installed", file=sys.stderr)
        return 1
    raise_fd_limit()  # thousands of connections on both sides
    print(f"callgrind instructions per request, server side ({args.conns} connections)")
    storm_head = f" {'connect, per conn':>18} {'w/o collector':>14}" if args.storm else ""
    print(f"  {'server':8} {'loop':13} {'in all':>10} {'w/o collector':>14}{storm_head}")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        for kind in args.servers.split(","):
            counts = {}
            for loop in args.loops.split(","):
                counts[loop] = per_request(kind, loop, args, out_dir)
                total, rest, *storm = counts[loop]
                cells = "".join(
                    f" {x:18.0f}" if i == 0 else f" {x:14.0f}" for i, x in enumerate(storm)
                )
                print(f"  {kind:8} {loop:13} {total:10.0f} {rest:14.0f}{cells}", flush=True)
            for ours, theirs in (("wheel", "stdlib"), ("wheel-uvloop", "uvloop")):
                if ours in counts and theirs in counts:
                    a, b = counts[ours], counts[theirs]
                    print(
                        f"  {kind:8} {ours} / {theirs}: {a[0] / b[0]:.3f} in all, "
                        f"{a[1] / b[1]:.3f} without the collector"
                        + (
                            f"; connecting {a[2] / b[2]:.3f}, {a[3] / b[3]:.3f}"
                            if args.storm
                            else ""
                        )
                    )
    return 0
