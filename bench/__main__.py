"""python -m bench: tickwheel side by side with its peers, in one go.

Run from the repository root after ``pip install -e '.[dev,bench]'``. Sections:

  wheel    the wheel against asyncio's loop and uvloop: schedule+cancel, reschedule,
           fire, memory per pending timer, lateness, idle wake-ups, N = 10^3..10^6
  server   10,000 loopback connections, idle timeouts reset per request: server CPU
           per request, requests/s, close lateness, for each timer style
  durable  against arq, BullMQ, saq and streaq with 10^5 jobs pending: schedule,
           claim+run+ack, lateness at 1,000 and 5,000 jobs/s, Redis memory per
           pending job; jobs lost or run twice when a worker is SIGKILLed
  example  the source document's worked example (docs/design.md): 16 shards,
           10^6 pending, 2,900 jobs/s
           for a minute through a Worker; claim capacity of one shard at LIMIT 500
  postgres the Postgres mode against procrastinate and pgqueuer (a venv of its own):
           schedule, schedule_many, claim+ack; lateness of both modes
  brokers  the publish handoff on NATS JetStream and RabbitMQ against the Redis Streams
           publisher, and taskiq on RabbitMQ with a countdown: handoff throughput,
           lateness p50/p99 at 1,000 and 5,000 jobs/s
  limits   per-key flow limits: claim+run+ack with concurrency=4 against no limits,
           release latency p50/p99, Redis memory per waiting against pending job;
           rate=(10, 1.0) on one key against BullMQ's global limiter
  loop     uvicorn and aiohttp on the wheel-timed event loops against the stdlib loop
           and uvloop: requests/s and CPU per request at 1,000 and 10,000 keep-alive
           connections (wrk, or a Python client without it), memory per idle connection

Each section is a module of bench/runner/ with ``steps(plan)`` and ``run(plan,
progress, checks)``.

Writes report.md, results.json, summary.md and PNG plots to --out (bench/results/).
Every figure is a ratio to its peer from the same run: the median of the per-repeat
ratios, with min and max. Exits 1 if a measurement crashed or a correctness check
failed (a timer or job early, an idle connection closed early, a job lost); it never
asserts on speed.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.runner import brokers, durable, example, limits, loop, postgres, server, wheel
from bench.runner.harness import Checks, Plan, Progress, machine
from bench.runner.report import write

SECTIONS = {
    "wheel": wheel,
    "server": server,
    "durable": durable,
    "example": example,
    "postgres": postgres,
    "brokers": brokers,
    "limits": limits,
    "loop": loop,
}
# Seconds before a hung run is ended (faulthandler dumps every thread, exit status 1).
WATCHDOG = {True: 300, False: 3600}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n", 1)[0],
        epilog="Sections: " + ", ".join(SECTIONS) + ". See bench/README.md.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="cut-down sizes, one repeat, short scenarios (under a minute): the CI smoke "
        "test; still fails on a crash or a failed correctness check",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=list(SECTIONS),
        metavar="SECTION",
        help="run only this section (repeatable): " + ", ".join(SECTIONS),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        metavar="DIR",
        help="where to write report.md, results.json, summary.md and the plots "
        "(default: bench/results/)",
    )
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(WATCHDOG[args.quick], exit=True)
    plan = Plan.make(args.quick)
    chosen = args.only or list(SECTIONS)
    progress = Progress(sum(SECTIONS[s].steps(plan) for s in chosen))
    checks = Checks()
    t0 = time.monotonic()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "quick": plan.quick,
        "repeats": plan.repeats,
        "plan": vars(plan),
        "machine": machine(),
        "sections": chosen,
        "figures": [],
        "raw": {},
        "errors": {},
    }
    for name in chosen:
        try:
            out = SECTIONS[name].run(plan, progress, checks)
        except Exception as exc:
            traceback.print_exc()
            results["errors"][name] = repr(exc)
            checks.expect(False, f"{name}: the measurement crashed: {exc!r}")
            continue
        results["figures"] += [f.as_dict() for f in out["figures"]]
        results["raw"][name] = out["raw"]
    progress.close()
    results["elapsed_s"] = time.monotonic() - t0
    results["checks"] = {"failures": checks.failures, "passed": checks.passed}
    written = write(args.out, results)
    faulthandler.cancel_dump_traceback_later()
    print(f"wrote {args.out}/report.md, results.json, summary.md, {len(written)} plots")
    print(Path(args.out, "summary.md").read_text())
    for failure in checks.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"python -m bench took {results['elapsed_s']:.0f} s")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
