"""``python -m bench.peers kill-worker LIB REDIS_URL SINK_URL``: one worker, to be killed.

The SIGKILL row of ``python -m bench`` (bench/runner/durable.py) starts this as a
subprocess for tickwheel or for one of the Redis peers of :mod:`bench.peers.queues`,
with the row's task: it adds 1 to the job's field in the sink hash ``effects`` of a
second Redis (``SINK_URL``), then sleeps 20 ms. It runs until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio

from bench.peers.queues import EFFECTS, KILL_CONCURRENCY, PEERS, quiet


async def _kill_worker(lib: str, url: str, sink_url: str) -> None:
    sink = redis.asyncio.Redis.from_url(sink_url)

    async def effect(key: str, due_ms: int) -> None:
        await sink.hincrby(EFFECTS, key, 1)
        await asyncio.sleep(0.02)

    if lib == "tickwheel":
        from tickwheel.durable import Scheduler, TaskContext, TaskRegistry, Worker

        reg = TaskRegistry()

        @reg.task(name="job")
        async def job(ctx: TaskContext) -> None:
            await effect(ctx.job_id, 0)

        client = redis.asyncio.Redis.from_url(url)
        sched = Scheduler(client, "kill", shards=1, owner_ttl=2.0, check=False)
        await Worker(sched, reg, lease=3.0, max_running=KILL_CONCURRENCY).run()
        return
    peer = PEERS[lib](url)
    await peer.open()
    async with peer.worker(effect, concurrency=KILL_CONCURRENCY, kill_row=True):
        await asyncio.Event().wait()  # until killed


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "kill-worker":
        print("usage: python -m bench.peers kill-worker LIB REDIS_URL SINK_URL", file=sys.stderr)
        return 2
    quiet()
    asyncio.run(_kill_worker(argv[1], argv[2], argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
