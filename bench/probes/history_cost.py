"""What the history of finished attempts costs a worker (issue 40):
``python -m bench.probes.history_cost``.

One in-process Worker runs N jobs of a no-op task (the worst case: nothing but claims
and acks, so the history's share is the largest) on a private redis-server, with
``history=True`` (opt-in) and ``history=False`` (the default), interleaved, fresh namespace each
run. Prints each run's seconds, the worker process's CPU seconds (``process_time``: far
less noisy than the wall clock on a loaded machine) and the Redis server's CPU time
(used_cpu_sys + used_cpu_user, INFO), and the median ratios (on / off).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store import client_from_url

registry = TaskRegistry()
_done = {"n": 0}


@registry.task(name="t")
async def _task(ctx: TaskContext) -> None:
    _done["n"] += 1


async def _cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _one(url: str, n: int, history: bool) -> tuple[float, float, float]:
    client = client_from_url(url)
    s = Scheduler(client, f"h{uuid.uuid4().hex[:8]}", shards=4, check=False)
    await s.schedule_many([JobSpec(f"j{i}", "t") for i in range(n)])
    _done["n"] = 0
    worker = Worker(s, registry, history=history)
    cpu0 = await _cpu(client)
    p0 = time.process_time()
    t0 = time.monotonic()
    task: asyncio.Future[Any] = asyncio.ensure_future(worker.run())
    while _done["n"] < n:  # noqa: ASYNC110  (a probe: polling is what it measures by)
        await asyncio.sleep(0.005)
    seconds = time.monotonic() - t0
    worker.stop()
    await task  # the last history batch is written at shutdown
    own = time.process_time() - p0
    cpu = await _cpu(client) - cpu0
    await client.aclose()
    return seconds, own, cpu


async def main(n: int, repeats: int) -> None:
    with RedisServer() as server:
        ratios, own_ratios, cpu_ratios = [], [], []
        for i in range(repeats):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {h: await _one(server.url, n, h) for h in order}
            on, off = got[True], got[False]
            print(
                f"history on {on[0]:.3f} s (worker cpu {on[1]:.2f} s, redis cpu {on[2]:.2f} s),"
                f" off {off[0]:.3f} s (worker cpu {off[1]:.2f} s, redis cpu {off[2]:.2f} s)",
                flush=True,
            )
            ratios.append(off[0] / on[0])
            own_ratios.append(on[1] / off[1])
            cpu_ratios.append(on[2] / off[2] if off[2] else float("nan"))
        print(f"jobs/s on / off: median {statistics.median(ratios):.3f} (of {repeats})")
        own = statistics.median(own_ratios)
        print(f"worker cpu on / off (shutdown included): median {own:.3f}")
        cpu = statistics.median(cpu_ratios)
        print(f"redis cpu on / off (whole run, shutdown included): median {cpu:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.repeats))
