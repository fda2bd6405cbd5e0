"""The cost of a task timeout per job: claim+run+ack throughput with ``timeout=`` set
against without, in one run (issue 34's target: at most 5 % slower).

    python -m bench.probes.timeout_cost [--jobs 20000] [--rounds 5] [--baseline DIR]

On one private redis-server: each round schedules ``--jobs`` due jobs (4 shards) and
runs them through a :class:`Worker` on a no-op ``async def`` task, registered without a
timeout and with ``timeout=30`` (a wheel timer per job, cancelled when the handler
returns), and the jobs scheduled with their own ``schedule(..., timeout=30)`` (the
task without one: a longer record and claim row per job, then the same timer).
``--baseline`` adds a row of the same run without a timeout on another checkout's
``durable/`` (``git archive <commit> durable | tar -x -C /tmp/old``, then
``/tmp/old/durable``): the cost of the new code on a job without a timeout; and a row
of jobs with their own timeout on it (the before of a change to that path). Every row of
every round runs in a fresh process, the rows in a rotating order (so a load spike of
the shared machine hits them all alike). Each row's figure is the median of its rounds'
jobs/s; the ratios are of the medians, and beside them the median of each round's own
ratio (steadier on a shared machine: a round's rows run one after the other).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import time


def _registry(limit: float | None) -> object:
    from tickwheel.durable import TaskContext, TaskRegistry

    reg = TaskRegistry()

    async def noop(ctx: TaskContext) -> None:
        return None

    if limit is None:
        reg.register(noop, name="noop")
    else:
        reg.register(noop, name="noop", timeout=limit)
    return reg


async def _round(url: str, jobs: int, limit: float | None, own: float | None = None) -> float:
    from tickwheel.durable import JobSpec, Scheduler, Worker
    from tickwheel.durable.store._connect import client_from_url

    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, "bench", shards=4, check=False)
        await sched.open()
        specs = [JobSpec(f"j{i}", "noop", timeout=own) for i in range(jobs)]
        for i in range(0, jobs, 5000):
            await sched.schedule_many(specs[i : i + 5000])
        worker = Worker(
            sched,
            _registry(limit),  # type: ignore[arg-type]
            lookahead=0.0,
            poll_interval=0.01,
            limit=1000,
        )
        gc.collect()
        start = time.perf_counter()
        task = asyncio.ensure_future(worker.run())
        while worker.loader is None or worker.loader.stats.succeeded < jobs:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        took = time.perf_counter() - start
        worker.stop()
        await task
        return jobs / took
    finally:
        await client.aclose()


def _one(args: argparse.Namespace) -> None:
    if args.durable_dir:
        from bench.probes._checkout import load_durable

        load_durable(args.durable_dir)
    if args.one.startswith("job:"):  # the job's own timeout, the task without one
        print(asyncio.run(_round(args.url, args.jobs, None, float(args.one[4:]))))
        return
    limit = None if args.one == "none" else float(args.one)
    print(asyncio.run(_round(args.url, args.jobs, limit)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="another checkout's durable/ folder")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row in this process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--durable-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args)
        return
    from bench.probes._checkout import redis_server_type

    rows: dict[str, list[str]] = {
        "without timeout": ["none"],
        "timeout=30": ["30"],
        "job timeout=30": ["job:30"],
    }
    if args.baseline:
        rows["baseline, no timeout"] = ["none", "--durable-dir", args.baseline]
        rows["baseline, job t=30"] = ["job:30", "--durable-dir", args.baseline]
    rates: dict[str, list[float]] = {name: [] for name in rows}
    server = redis_server_type()().start()
    try:
        names = list(rows)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                one, *extra = rows[name]
                argv = [sys.executable, "-m", "bench.probes.timeout_cost", "--one", one]
                argv += ["--url", server.url, "--jobs", str(args.jobs), *extra]
                out = subprocess.run(argv, capture_output=True, text=True, check=True)
                rates[name].append(float(out.stdout.split()[-1]))
    finally:
        server.stop()
    print(f"claim+run+ack of {args.jobs} due jobs, {args.rounds} rounds, jobs/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(
            f"  {name:22s} median {medians[name]:8.0f}"
            f"  min {min(values):8.0f}  max {max(values):8.0f}"
        )
    base = medians["without timeout"]
    for name in list(rates)[1:]:
        # and the median of each round's own ratio (its rows ran one after the other)
        paired = [r / b for r, b in zip(rates[name], rates["without timeout"], strict=True)]
        print(
            f"  {name} / without timeout: {medians[name] / base:.3f}"
            f"  (median of the rounds' ratios {statistics.median(paired):.3f})"
        )


if __name__ == "__main__":
    main()
