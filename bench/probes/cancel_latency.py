"""Time from ``Scheduler.cancel_job()`` to the running handler's ``CancelledError``.

    python -m bench.probes.cancel_latency [--cancels 200]

On one private redis-server, one :class:`Worker` (lease 30 s, so the lease extension,
the fallback path, plays no part) runs a handler that waits forever; the probe cancels
it once it started, measures from just before the ``cancel_job`` call to the handler's
``CancelledError``, and repeats. The path measured: cancel.lua removes the record and
publishes the id; the worker's pub/sub listener stops the handler's task.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from tickwheel.durable import CancelResult, Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url


async def _measure(url: str, cancels: int) -> list[float]:
    started: asyncio.Queue[str] = asyncio.Queue()
    stopped: dict[str, float] = {}
    reg = TaskRegistry()

    @reg.task(name="wait")
    async def wait(ctx: TaskContext) -> None:
        started.put_nowait(ctx.job_id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped[ctx.job_id] = time.perf_counter()
            raise

    client = client_from_url(url)
    sched = Scheduler(client, "cancels", shards=4, check=False)
    worker = Worker(sched, reg, lease=30.0, lookahead=0.0, poll_interval=0.01)
    task = asyncio.ensure_future(worker.run())
    out = []
    try:
        for i in range(cancels):
            job_id = f"c{i}"
            await sched.schedule(job_id, "wait")
            assert await asyncio.wait_for(started.get(), 10) == job_id
            t0 = time.perf_counter()
            assert await sched.cancel_job(job_id) is CancelResult.STOPPED
            while job_id not in stopped:  # noqa: ASYNC110
                await asyncio.sleep(0.0005)
            out.append(stopped[job_id] - t0)
    finally:
        worker.stop()
        await task
        await client.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cancels", type=int, default=200)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        samples = asyncio.run(_measure(server.url, args.cancels))
    finally:
        server.stop()
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"cancel_job -> CancelledError over {len(ms)} cancels: median {statistics.median(ms):.2f}"
        f" ms, p99 {p99:.2f} ms, max {ms[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
