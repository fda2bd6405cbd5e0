"""Callgrind instructions per request of the server scenario's servers, in one run.

    python -m bench.probes.callgrind server [--conns 200] [--rounds 4,24] [--modes a,b,...]

Each server (bench/workloads/server_scenario.py) runs under ``valgrind --tool=callgrind``
twice, driven by this process through the same connections with the two round counts;
the difference of the two totals over the extra requests is the server's count per
request, free of start-up, connection set-up and the idle closes at the end. The floor
modes (``protocol/none``, ``stream/none``) are the same servers with no per-connection
timer: what any timer's cost sits on.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from bench.probes.callgrind._tools import total_in
from bench.workloads import server_scenario as ss

DEFAULT_MODES = (
    "protocol/wheel",
    "protocol/call_later",
    "protocol/none",
    "stream/wheel.timeout",
    "stream/asyncio.timeout",
    "stream/none",
)


def _total(mode: str, conns: int, rounds: int, idle: float, out: str) -> int:
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    ss.run_mode(mode, conns, rounds, idle, wrapper=wrapper)
    return total_in(out)


def per_request(mode: str, conns: int, small: int, large: int, idle: float) -> float:
    """Callgrind instructions the server in ``mode`` spends per request."""
    with tempfile.TemporaryDirectory() as tmp:
        a = _total(mode, conns, small, idle, os.path.join(tmp, "small.out"))
        b = _total(mode, conns, large, idle, os.path.join(tmp, "large.out"))
    return (b - a) / (conns * (large - small))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conns", type=int, default=200)
    parser.add_argument("--rounds", default="4,24", help="the two round counts, small,large")
    parser.add_argument("--idle", type=float, default=8.0, help="idle timeout (s)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES))


def run(args: argparse.Namespace) -> int:
    small, large = (int(x) for x in args.rounds.split(","))
    print(f"callgrind instructions per request, server side ({args.conns} connections)")
    counts: dict[str, float] = {}
    for mode in args.modes.split(","):
        counts[mode] = per_request(mode, args.conns, small, large, args.idle)
        print(f"  {mode:24} {counts[mode]:9.0f}", flush=True)
    for ours, theirs in (
        ("protocol/wheel", "protocol/call_later"),
        ("stream/wheel.timeout", "stream/asyncio.timeout"),
    ):
        if ours in counts and theirs in counts:
            print(f"  {theirs} / {ours}: {counts[theirs] / counts[ours]:.3f}")
    return 0
