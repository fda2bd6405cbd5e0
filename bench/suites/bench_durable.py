"""Benchmarks of ``tickwheel.durable`` against a real redis-server (and arq as the peer).

How to run::

    .venv/bin/pytest bench/suites/bench_durable.py --benchmark-only -p no:cacheprovider

pytest-benchmark has no asyncio support: one event loop lives for the module and every
measured function drives it with ``loop.run_until_complete`` (never ``asyncio.run``).
The server is a private ``redis-server`` (no AOF: the figures are the scheduler's, not
the disk's) started by a module fixture. ``bench/suites/conftest.py`` prints ratios per group.

Groups:

``durable batch schedule``   10^4 jobs per round through ``schedule_many`` (16 shards,
    32-byte payloads), JobSpec construction included. Target >= 100,000 jobs/s.
``durable claim+ack``        10^4 due jobs on one shard; claim 1000 at a time and
    ``ack_many`` them until none is left. Target >= 100,000 jobs/s per shard.
``durable single schedule vs arq``  1000 sequential awaited single schedules with a
    delay, against arq's ``enqueue_job`` through bench/peers/queues.py's adapter, due a
    minute ahead (base). Target >= 3x arq.
``durable claim at N pending``  N jobs pending in the future on one shard, 1000 due:
    one claim of 1000 + ack. Flat in N (the claim is a ZRANGEBYSCORE from the head).
    ``TICKWHEEL_BENCH_SIZES`` restricts N (default 10^4, 10^5, 10^6).
``durable memory``           Redis ``used_memory`` per pending job (32-byte payload,
    10^5 jobs, 16 shards, 64 record buckets per shard), as a report. Target <= 200.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest
import redis.asyncio

from bench.peers.queues import ArqPeer, now_ms
from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisServer

PAYLOAD = b"x" * 32
BATCH = 10_000
SINGLES = 1000
CLAIM_LIMIT = 1000
SIZES = [int(s) for s in os.environ.get("TICKWHEEL_BENCH_SIZES", "10000,100000,1000000").split(",")]
_ids = itertools.count()


def _flush(loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis) -> None:
    loop.run_until_complete(client.flushall())


def _scheduler(client: redis.asyncio.Redis, shards: int) -> Scheduler:
    return Scheduler(client, f"b{next(_ids)}", shards=shards, check=False)


def test_batch_schedule(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "durable batch schedule"
    benchmark.extra_info.update(impl="schedule_many", ops_per_round=BATCH, base=True)
    state: dict[str, Scheduler] = {}

    def setup() -> None:
        _flush(loop, client)
        state["s"] = _scheduler(client, 16)
        loop.run_until_complete(state["s"].open())

    def run() -> None:
        base = next(_ids) * BATCH
        specs = [
            JobSpec(f"job:{base + i}", "send_email", PAYLOAD, delay=3600) for i in range(BATCH)
        ]
        loop.run_until_complete(state["s"].schedule_many(specs))

    benchmark.pedantic(run, setup=setup, rounds=8, iterations=1)
    benchmark.extra_info["jobs_per_s"] = round(BATCH / benchmark.stats.stats.median)


def test_claim_ack(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "durable claim+ack"
    benchmark.extra_info.update(impl="claim+ack_many", ops_per_round=BATCH, base=True)
    state: dict[str, Scheduler] = {}

    def setup() -> None:
        _flush(loop, client)
        s = state["s"] = _scheduler(client, 1)
        loop.run_until_complete(s.take(0))
        loop.run_until_complete(
            s.schedule_many(JobSpec(f"job:{i}", "send_email", PAYLOAD) for i in range(BATCH))
        )

    async def drain(s: Scheduler) -> int:
        n = 0
        while True:
            batch = await s.claim(0, limit=CLAIM_LIMIT)
            if not batch.jobs:
                return n
            await s.ack_many(batch.jobs)
            n += len(batch.jobs)

    def run() -> None:
        assert loop.run_until_complete(drain(state["s"])) == BATCH

    benchmark.pedantic(run, setup=setup, rounds=8, iterations=1)
    benchmark.extra_info["jobs_per_s"] = round(BATCH / benchmark.stats.stats.median)


def test_single_schedule(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "durable single schedule vs arq"
    benchmark.extra_info.update(impl="tickwheel schedule", ops_per_round=SINGLES)
    s = _scheduler(client, 16)
    loop.run_until_complete(s.open())

    async def singles() -> None:
        base = next(_ids) * SINGLES
        for i in range(SINGLES):
            await s.schedule(f"job:{base + i}", "send_email", PAYLOAD, delay=60)

    benchmark.pedantic(lambda: loop.run_until_complete(singles()), rounds=10, iterations=1)


def test_single_enqueue_arq(
    benchmark: Any, loop: asyncio.AbstractEventLoop, server: RedisServer
) -> None:
    benchmark.group = "durable single schedule vs arq"
    benchmark.extra_info.update(impl="arq enqueue_job", ops_per_round=SINGLES, base=True)
    arq = ArqPeer(server.url)
    loop.run_until_complete(arq.open())

    async def singles() -> None:
        base = next(_ids) * SINGLES
        due = now_ms() + 60_000
        for i in range(SINGLES):
            await arq.schedule_one(f"arq:{base + i}", due)

    benchmark.pedantic(lambda: loop.run_until_complete(singles()), rounds=10, iterations=1)
    loop.run_until_complete(arq.close())


@pytest.mark.parametrize("pending", SIZES)
def test_claim_flat_in_pending(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis, pending: int
) -> None:
    benchmark.group = "durable claim at N pending"
    benchmark.extra_info.update(
        impl=f"N={pending}", ops_per_round=CLAIM_LIMIT, base=pending == SIZES[0]
    )
    _flush(loop, client)
    s = _scheduler(client, 1)
    loop.run_until_complete(s.take(0))
    for start in range(0, pending, 50_000):
        n = min(50_000, pending - start)
        loop.run_until_complete(
            s.schedule_many(
                JobSpec(f"far:{start + i}", "t", PAYLOAD, delay=86_400) for i in range(n)
            )
        )

    def setup() -> None:
        base = next(_ids) * CLAIM_LIMIT
        loop.run_until_complete(
            s.schedule_many(JobSpec(f"due:{base + i}", "t", PAYLOAD) for i in range(CLAIM_LIMIT))
        )

    async def claim_ack() -> None:
        batch = await s.claim(0, limit=CLAIM_LIMIT)
        assert len(batch.jobs) == CLAIM_LIMIT
        await s.ack_many(batch.jobs)

    benchmark.pedantic(
        lambda: loop.run_until_complete(claim_ack()), setup=setup, rounds=10, iterations=1
    )


def test_memory_per_pending_job(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "durable memory"
    n = 100_000
    _flush(loop, client)
    s = _scheduler(client, 16)
    loop.run_until_complete(s.open())
    before = loop.run_until_complete(client.info("memory"))["used_memory"]
    for start in range(0, n, BATCH):
        loop.run_until_complete(
            s.schedule_many(
                JobSpec(f"job:{start + i:08d}", "send_email", PAYLOAD, delay=3600)
                for i in range(BATCH)
            )
        )
    after = loop.run_until_complete(client.info("memory"))["used_memory"]
    per_job = (after - before) / n
    benchmark.extra_info["report"] = (
        f"durable memory: {per_job:.1f} bytes of Redis used_memory per pending job "
        f"({n} jobs, 16 shards, 12-byte ids, 10-byte task name, 32-byte payload; target <= 200)"
    )
    benchmark.extra_info["bytes_per_job"] = round(per_job, 1)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
