"""What pre-start leases cost a worker (issue 40): ``python -m bench.probes.prestart_cost``.

One in-process Worker runs 3,000 jobs of a task that awaits 2 ms, on a private
redis-server, with the default start margin and with ``start_margin=None`` (claims
lease the whole lease outright, as before issue 40), interleaved. Prints the seconds
and lease extensions of each run and the median ratio of jobs/s (pre-start / none).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.runtime import DEFAULT_START_MARGIN
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store import client_from_url

registry = TaskRegistry()
_done = {"n": 0}


@registry.task(name="t")
async def _task(ctx: TaskContext) -> None:
    await asyncio.sleep(0.002)
    _done["n"] += 1


async def _one(url: str, n: int, margin: float | None) -> tuple[float, int]:
    client = client_from_url(url)
    s = Scheduler(client, f"p{uuid.uuid4().hex[:8]}", shards=4, check=False)
    await s.schedule_many([JobSpec(f"j{i}", "t") for i in range(n)])
    _done["n"] = 0
    worker = Worker(s, registry, start_margin=margin)
    t0 = time.monotonic()
    task: asyncio.Future[Any] = asyncio.ensure_future(worker.run())
    while _done["n"] < n:  # noqa: ASYNC110  (a probe: polling is what it measures by)
        await asyncio.sleep(0.01)
    seconds = time.monotonic() - t0
    extended = worker.loader.stats.extended if worker.loader is not None else -1
    worker.stop()
    await task
    await client.aclose()
    return seconds, extended


async def main(n: int, repeats: int) -> None:
    with RedisServer() as server:
        ratios = []
        for _ in range(repeats):
            on = await _one(server.url, n, DEFAULT_START_MARGIN)
            off = await _one(server.url, n, None)
            print(f"pre-start {on[0]:.3f} s ({on[1]} extended), none {off[0]:.3f} s", flush=True)
            ratios.append(off[0] / on[0])
        print(f"jobs/s pre-start / none: median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.repeats))
