"""The cost of per-key flow limits (issue 35), in one run on one private redis-server:

    python -m bench.probes.flow_limits [--jobs 5000] [--keys 500] [--rounds 5]
        [--durable-dir OLD/durable]

The measurements are bench/workloads/flow_limits.py's, as ``python -m bench --only
limits`` runs them; here the throughput rows run more rounds, each row of each round
in a fresh process, the rows in a rotating order:

- **claim+run+ack**: ``--jobs`` due jobs over ``--keys`` flow keys, one
  :class:`Worker`, a no-op task without limits, then with ``concurrency=4``. Figures:
  the median jobs/s of each row, and the ratio of the medians (target: limits at least
  50 % of the unlimited rate).
- **release latency**: one key with ``concurrency=1`` and 300 jobs due at once: from a
  run's end to the next run's start, p50 and p99 (target: p99 at most 5 ms).
- **memory**: Redis memory per job, 20,000 jobs pending against the same jobs waiting
  for one key's permit.
- **rate**: 40 jobs of one key under ``rate=(10, 1.0)``, and BullMQ's global
  ``limiter`` on one queue when ``bullmq`` is installed (bench/peers/bullmq_limiter.py).

``--durable-dir`` (another checkout's ``durable/``, e.g. main's from ``git archive``;
bench/probes/_checkout.py) runs the throughput and release rows of both versions, each
row a fresh process, the rows of a round in a rotating order, and prints each
version's figures and the ratios of this one to the other (the memory and rate rows
are this version's only). ``--this-dir`` loads this side from a ``durable/`` too (a
snapshot: the checkout can change while the rounds run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from typing import Any

RELEASE_JOBS = 300  # the release row's jobs (one key, concurrency=1)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _one(args: argparse.Namespace) -> None:
    """One row in this process (``--one``): its figure as JSON on the last line."""
    if args.durable_dir:
        from bench.probes._checkout import load_durable

        load_durable(args.durable_dir)
    from bench.workloads import flow_limits as fl

    if args.one == "release":
        gaps = asyncio.run(fl.release_gaps(args.url, RELEASE_JOBS))
        print(json.dumps({"p50": _pct(gaps, 0.5), "p99": _pct(gaps, 0.99), "max": max(gaps)}))
    else:
        print(json.dumps(asyncio.run(fl.throughput(args.url, args.jobs, args.keys,
                                                   args.one == "on"))))  # fmt: skip


def _row(args: argparse.Namespace, url: str, name: str, durable_dir: str) -> Any:
    argv = [sys.executable, "-m", "bench.probes.flow_limits", "--one", name, "--url", url]
    argv += ["--jobs", str(args.jobs), "--keys", str(args.keys)]
    if durable_dir:
        argv += ["--durable-dir", durable_dir]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def _compare(args: argparse.Namespace) -> None:
    """This version against ``--durable-dir``'s, rows alternated (see the module's
    docstring)."""
    from bench.probes._checkout import redis_server_type

    versions = {"this": args.this_dir, "before": args.durable_dir}
    rows = [(v, n) for v in versions for n in ("off", "on", "release")]
    got: dict[tuple[str, str], list[Any]] = {row: [] for row in rows}
    with redis_server_type()() as server:
        for r in range(args.rounds):
            shift = r % len(rows)
            for v, n in rows[shift:] + rows[:shift]:
                got[(v, n)].append(_row(args, server.url, n, versions[v]))
    print(f"{args.rounds} rounds, each row a fresh process, rows rotated each round")
    ratio: dict[str, list[float]] = {}
    for v in versions:
        on, off = got[(v, "on")], got[(v, "off")]
        ratio[v] = [a / b for a, b in zip(on, off, strict=True)]
        rel = got[(v, "release")]
        each = " ".join(f"{x:.3f}" for x in ratio[v])
        p99s = " ".join(f"{x['p99']:.1f}" for x in rel)
        print(f"  {v:6s} limits off median {statistics.median(off):8.0f} jobs/s, on"
              f" {statistics.median(on):8.0f}; on/off median of the rounds' ratios"
              f" {statistics.median(ratio[v]):.3f} (each: {each}); release p50"
              f" {statistics.median(x['p50'] for x in rel):.2f} ms, p99"
              f" {statistics.median(x['p99'] for x in rel):.2f} ms (medians; p99 each:"
              f" {p99s})")  # fmt: skip
    paired = [a / b for a, b in zip(ratio["this"], ratio["before"], strict=True)]
    print(f"  this / before: on/off ratio x{statistics.median(paired):.2f} (median of rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")
    parser.add_argument(
        "--this-dir", default="", help="with --durable-dir: this side's durable/ (a snapshot)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row here
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args)
        return
    if args.durable_dir:
        _compare(args)
        return
    from bench.peers.bullmq_limiter import available, bullmq_rate
    from bench.workloads import flow_limits as fl
    from tickwheel.durable.servers import RedisServer

    rates: dict[str, list[float]] = {"off": [], "on": []}
    with RedisServer() as server:
        names = list(rates)
        for r in range(args.rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                rates[name].append(float(_row(args, server.url, name, "")))
        gaps = asyncio.run(fl.release_gaps(server.url, RELEASE_JOBS))
        pending, waiting = asyncio.run(fl.memory_per_job(server.url, 20_000))
        many = asyncio.run(fl.memory_per_job(server.url, 20_000, 500))
        t0, runs = asyncio.run(fl.rate_runs(server.url, 40))
        bull = asyncio.run(bullmq_rate(server.url, 40, *fl.RATE)) if available() else None
    med = {name: statistics.median(v) for name, v in rates.items()}
    paired = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    print(f"claim+run+ack of {args.jobs} due jobs over {args.keys} keys, {args.rounds} rounds")
    for name, values in rates.items():
        print(f"  limits {name:3s} median {med[name]:8.0f} jobs/s  (min {min(values):.0f}"
              f" max {max(values):.0f})")  # fmt: skip
    print(f"  on / off: {med['on'] / med['off']:.3f} (median of the rounds' ratios"
          f" {statistics.median(paired):.3f})")  # fmt: skip
    print(f"release latency, one key, concurrency=1, {len(gaps) + 1} jobs:"
          f" p50 {_pct(gaps, 0.5):.2f} ms  p99 {_pct(gaps, 0.99):.2f} ms"
          f"  max {max(gaps):.2f} ms")  # fmt: skip
    print(f"Redis memory per job: pending {pending:.0f} B, waiting for a permit {waiting:.0f} B"
          f" ({waiting / pending:.2f}x), 20,000 on one key; over 500 keys: pending"
          f" {many[0]:.0f} B, waiting {many[1]:.0f} B ({many[1] / many[0]:.2f}x)")  # fmt: skip
    starts = [s for _, s in runs]
    print(f"rate (10 per 1 s), 40 jobs at once: tickwheel per key: the last start at"
          f" {(max(starts) - t0) / 1000:.2f} s; most in a 1 s window by the handlers'"
          f" clock {fl.most_in_window(starts, 1000)}, surely by the grants'"
          f" {fl.most_surely_in_window(runs, 1000)}")  # fmt: skip
    if bull is None:
        print("  bullmq: not installed (the bench extra)")
    else:
        b0, bstarts = bull
        print(f"  bullmq limiter (per queue, no key): {len(bstarts)} of 40 ran, the last at"
              f" {(max(bstarts) - b0) / 1000:.2f} s, most in a 1 s window"
              f" {fl.most_in_window(bstarts, 1000)}")  # fmt: skip


if __name__ == "__main__":
    main()
