"""CPU per job of claim+run+ack with flow limits on and off (issue 35), the worker's
and Redis's apart, for two versions of ``durable/``:

    python -m bench.probes.flow_limits_cpu [--jobs 10000] [--keys 1000] [--rounds 5]
        [--durable-dir OLD/durable] [--this-dir NEW/durable]

Why: on a shared machine the wall-clock rate of ``python -m bench.probes.flow_limits``
moves by 2x from one round to the next (other processes take the cores), while the CPU
each process spends on a job moves far less. The throughput is bound by the busier of
the two processes (the worker's Python and redis-server each run on one core), so the
two figures say where a limited job's cost is and how far it is from the unlimited
one's.

Each row is a fresh process with a fresh redis-server: ``--jobs`` due jobs over
``--keys`` flow keys (10 a key by default, as the bench), a no-op task without limits
(off) or with ``concurrency=4`` (on), one :class:`Worker` (bench/workloads/flow_limits.py's
settings). Counted from the worker's start to the last ack, after a warm-up run: the
worker process's CPU (``time.process_time``) and redis-server's (``/proc/<pid>/stat``,
user + system) per job, and the rate. The rows of a round go in a rotating order; the
figures are medians over the rounds, and the on/off ratios the medians of each round's
ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(url: str, pid: int, jobs: int, keys: int, limited: bool) -> dict[str, float]:
    from bench.workloads import flow_limits as fl
    from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
    from tickwheel.durable.store._connect import client_from_url

    reg = TaskRegistry()

    @reg.task(name="noop", concurrency=fl.CONCURRENCY if limited else None)
    async def noop(ctx: TaskContext) -> None:
        return None

    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        specs = [JobSpec(f"j{i}", "noop", key=f"k{i % keys}") for i in range(jobs)]
        for i in range(0, jobs, fl.CHUNK):
            await sched.schedule_many(specs[i : i + fl.CHUNK])
        worker = Worker(sched, reg, **fl.FAST)
        gc.collect()
        r0, p0, w0 = _cpu_of(pid), time.process_time(), time.perf_counter()
        task = asyncio.ensure_future(worker.run())
        try:
            deadline = w0 + fl.TIMEOUT
            while worker.loader is None or worker.loader.stats.succeeded < jobs:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{jobs} jobs did not run within {fl.TIMEOUT} s")
                await asyncio.sleep(0.005)
            r1, p1, w1 = _cpu_of(pid), time.process_time(), time.perf_counter()
        finally:
            worker.stop()
            await task
    finally:
        await client.aclose()
    return {
        "rate": jobs / (w1 - w0),
        "worker_us": (p1 - p0) / jobs * 1e6,
        "redis_us": (r1 - r0) / jobs * 1e6,
    }


def _one(args: argparse.Namespace) -> None:
    """One row in this process (``--one on|off``): its figures as JSON on the last line."""
    if args.dir:
        from bench.probes._checkout import load_durable

        load_durable(args.dir)
    from tickwheel.durable.servers import RedisServer

    with RedisServer() as server:
        pid = server.process.pid
        limited = args.one == "on"
        asyncio.run(_run(server.url, pid, 400, 40, limited))  # warm-up: scripts, imports
        print(json.dumps(asyncio.run(_run(server.url, pid, args.jobs, args.keys, limited))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")
    parser.add_argument("--this-dir", default="", help="this side's durable/ (a snapshot)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args)
        return
    versions = {"this": args.this_dir}
    if args.durable_dir:
        versions["before"] = args.durable_dir
    rows = [(v, n) for v in versions for n in ("off", "on")]
    got: dict[tuple[str, str], list[dict[str, float]]] = {row: [] for row in rows}
    for r in range(args.rounds):
        shift = r % len(rows)
        for v, n in rows[shift:] + rows[:shift]:
            argv = [sys.executable, "-m", "bench.probes.flow_limits_cpu", "--one", n]
            argv += ["--jobs", str(args.jobs), "--keys", str(args.keys), "--dir", versions[v]]
            out = subprocess.run(argv, capture_output=True, text=True, check=True)
            got[(v, n)].append(json.loads(out.stdout.splitlines()[-1]))
    print(f"{args.rounds} rounds of {args.jobs} jobs over {args.keys} keys, each row a fresh"
          " process and redis-server, rotated; medians (per job: us of CPU)")  # fmt: skip
    med: dict[tuple[str, str], dict[str, float]] = {}
    for row, values in got.items():
        med[row] = {k: statistics.median(x[k] for x in values) for k in values[0]}
        m = med[row]
        print(f"  {row[0]:6s} {row[1]:3s} {m['rate']:8.0f} jobs/s  worker {m['worker_us']:6.1f}"
              f"  redis {m['redis_us']:6.1f}")  # fmt: skip
    for v in versions:
        on, off = got[(v, "on")], got[(v, "off")]

        def ratio(key: str, on: Any = on, off: Any = off) -> float:
            return statistics.median(a[key] / b[key] for a, b in zip(on, off, strict=True))

        print(f"  {v:6s} on/off: rate {ratio('rate'):.3f}, worker CPU {ratio('worker_us'):.2f}x,"
              f" redis CPU {ratio('redis_us'):.2f}x (medians of the rounds' ratios)")  # fmt: skip
    if "before" in versions:
        for key in ("worker_us", "redis_us"):
            paired = [
                a[key] / b[key]
                for a, b in zip(got[("this", "on")], got[("before", "on")], strict=True)
            ]
            print(f"  this / before, limits on, {key}: {statistics.median(paired):.2f}x")


if __name__ == "__main__":
    main()
