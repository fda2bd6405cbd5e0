"""Callgrind instructions per request of the server scenario's servers, in one run.

    python -m bench.callgrind_server [--conns 200] [--rounds 4,24] [--modes a,b,...]

Each server (bench/server_scenario.py) runs under ``valgrind --tool=callgrind`` twice,
driven by this process through the same connections with the two round counts; the
difference of the two totals over the extra requests is the server's count per request,
free of start-up, connection set-up and the idle closes at the end. The floor modes
(``protocol/none``, ``stream/none``) are the same servers with no per-connection timer:
what any timer's cost sits on.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile

from bench import server_scenario as ss

DEFAULT_MODES = (
    "protocol/wheel",
    "protocol/call_later",
    "protocol/none",
    "stream/wheel.timeout",
    "stream/asyncio.timeout",
    "stream/none",
)
_TOTAL = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


def _total(mode: str, conns: int, rounds: int, idle: float, out: str) -> int:
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    ss.run_mode(mode, conns, rounds, idle, wrapper=wrapper)
    with open(out) as f:
        match = _TOTAL.search(f.read())
    if match is None:
        raise RuntimeError(f"no callgrind total in {out}")
    return int(match.group(1))


def per_request(mode: str, conns: int, small: int, large: int, idle: float) -> float:
    """Callgrind instructions the server in ``mode`` spends per request."""
    with tempfile.TemporaryDirectory() as tmp:
        a = _total(mode, conns, small, idle, os.path.join(tmp, "small.out"))
        b = _total(mode, conns, large, idle, os.path.join(tmp, "large.out"))
    return (b - a) / (conns * (large - small))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conns", type=int, default=200)
    parser.add_argument("--rounds", default="4,24", help="the two round counts, small,large")
    parser.add_argument("--idle", type=float, default=8.0, help="idle timeout (s)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES))
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
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


if __name__ == "__main__":
    raise SystemExit(main())
