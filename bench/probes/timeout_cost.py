"""The cost of a task timeout per job: claim+run+ack throughput with ``timeout=`` set
against without, in one run (issue 34's target: at most 5 % slower).

    python -m bench.probes.timeout_cost [--jobs 20000] [--rounds 5]

On one private redis-server: each round schedules ``--jobs`` due jobs (4 shards) and
runs them through a :class:`Worker` on a no-op ``async def`` task, once registered
without a timeout and once with ``timeout=30`` (a wheel timer per job, cancelled when
the handler returns), in alternating order (so a load spike of the shared machine hits
both alike). Each row's figure is the median of its rounds' jobs/s; the ratio is of
the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SHARDS = 4


def _registry(timeout: float | None) -> TaskRegistry:
    reg = TaskRegistry()

    @reg.task(name="noop", timeout=timeout)
    async def noop(ctx: TaskContext) -> None:
        return None

    return reg


async def _round(url: str, jobs: int, limit: float | None, ns: str) -> float:
    client = client_from_url(url)
    try:
        await client.flushall()
        sched = Scheduler(client, ns, shards=SHARDS, check=False)
        await sched.open()
        specs = [JobSpec(f"j{i}", "noop") for i in range(jobs)]
        for i in range(0, jobs, 5000):
            await sched.schedule_many(specs[i : i + 5000])
        worker = Worker(sched, _registry(limit), lookahead=0.0, poll_interval=0.01, limit=1000)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = RedisServer().start()
    rows: dict[str, list[float]] = {"without timeout": [], "timeout=30": []}
    try:
        for r in range(args.rounds):
            order = [None, 30.0] if r % 2 == 0 else [30.0, None]
            for limit in order:
                rate = asyncio.run(_round(server.url, args.jobs, limit, f"b{r}"))
                rows["without timeout" if limit is None else "timeout=30"].append(rate)
    finally:
        server.stop()
    print(f"claim+run+ack of {args.jobs} due jobs, {args.rounds} rounds, jobs/s")
    medians = {}
    for name, rates in rows.items():
        medians[name] = statistics.median(rates)
        print(
            f"  {name:16s} median {medians[name]:8.0f}"
            f"  min {min(rates):8.0f}  max {max(rates):8.0f}"
        )
    ratio = medians["timeout=30"] / medians["without timeout"]
    print(f"  with timeout / without: {ratio:.3f} ({(1 - ratio) * 100:+.1f} % slower)")


if __name__ == "__main__":
    main()
