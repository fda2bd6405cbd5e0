"""Claim + ack throughput on a Redis Cluster against one Redis, in the same run.

How to run::

    .venv/bin/pytest bench/suites/bench_cluster.py --benchmark-only -p no:cacheprovider

Groups:

``cluster claim+ack``  10^4 due jobs over 16 shards; every shard claimed 500 at a time
    and acked with ``ack_many`` until none is left. One Redis is the base row; the
    cluster (3 masters, 3 replicas, all on this machine) is measured beside it. The
    shards are driven concurrently (one task per shard), as 16 shard owners would.
``cluster schedule_many``  10^4 jobs through ``schedule_many``: MULTI on one Redis,
    one pipeline per master on the cluster.
``cluster schedule replicas=1``  1000 sequential single schedules with ``WAIT 1`` on
    the cluster, against the same without WAIT (base): the price of durability.
``test_price_of_replicated_acks`` (a report)  the claim+ack drain above with
    ``replicas=1`` (every ack_many also WAITs for one replica) against ``replicas=0``,
    and the same with 2000 jobs each acked by its own ``ack`` (one WAIT per job), on one
    Redis with a replica this bench starts and on the cluster; rounds interleaved, the
    median of the per-round ratios reported.

On a 2-core machine the cluster's six processes share the cores with the client, so the
ratio is a floor for what a cluster of real machines gives.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisClusterServer, RedisServer
from tickwheel.durable.store._connect import client_from_url

JOBS = 10_000
SHARDS = 16
_ns = itertools.count()


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with RedisServer() as single, RedisClusterServer(masters=3, replicas=1) as cluster:
        yield {"redis": single.url, "cluster": cluster.url}


@pytest.fixture(scope="module")
def replicated(urls: dict[str, str]) -> Iterator[dict[str, str]]:
    """One Redis with one replica of its own (started here), and the cluster."""
    with RedisServer() as master:
        args = ["--replicaof", "127.0.0.1", str(master.port)]
        with RedisServer(extra_args=args) as replica:
            client = redis.Redis(port=replica.port, socket_timeout=5)
            deadline = time.monotonic() + 30
            while client.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not sync in 30 s"
                time.sleep(0.05)
            client.close()
            yield {"redis+replica": master.url, "cluster": urls["cluster"]}


def _scheduler(url: str, **kwargs: Any) -> Scheduler:
    return Scheduler(client_from_url(url), f"b{next(_ns)}", shards=SHARDS, check=False, **kwargs)


async def _fill(s: Scheduler) -> None:
    await s.open()
    await s.schedule_many([JobSpec(f"j{i}", "t", b"x" * 32) for i in range(JOBS)])
    for shard in range(SHARDS):
        await s.take(shard)


async def _drain_shard(s: Scheduler, shard: int) -> int:
    n = 0
    while True:
        batch = await s.claim(shard, limit=500)
        if not batch.jobs:
            return n
        await s.ack_many(batch.jobs)
        n += len(batch.jobs)


async def _drain(s: Scheduler) -> int:
    return sum(await asyncio.gather(*(_drain_shard(s, sh) for sh in range(SHARDS))))


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_claim_ack(
    benchmark: Any, loop: asyncio.AbstractEventLoop, urls: dict[str, str], backend: str
) -> None:
    benchmark.group = "cluster claim+ack"
    benchmark.extra_info.update(impl=backend, base=backend == "redis", ops_per_round=JOBS)
    schedulers: list[Scheduler] = []

    def setup() -> tuple[tuple[Scheduler], dict[str, Any]]:
        s = _scheduler(urls[backend])
        schedulers.append(s)
        loop.run_until_complete(_fill(s))
        return (s,), {}

    def drain(s: Scheduler) -> None:
        assert loop.run_until_complete(_drain(s)) == JOBS

    benchmark.pedantic(drain, setup=setup, rounds=5)
    for s in schedulers:
        loop.run_until_complete(s.store.client.aclose())


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_schedule_many(
    benchmark: Any, loop: asyncio.AbstractEventLoop, urls: dict[str, str], backend: str
) -> None:
    benchmark.group = "cluster schedule_many"
    benchmark.extra_info.update(impl=backend, base=backend == "redis", ops_per_round=JOBS)
    s = _scheduler(urls[backend])
    loop.run_until_complete(s.open())
    rounds = itertools.count()

    def batch() -> None:
        r = next(rounds)
        specs = [JobSpec(f"r{r}:{i}", "t", b"x" * 32, delay=3600) for i in range(JOBS)]
        loop.run_until_complete(s.schedule_many(specs))

    benchmark.pedantic(batch, rounds=5)
    loop.run_until_complete(s.store.client.aclose())


@pytest.mark.parametrize("replicas", [0, 1])
def test_single_schedule_with_wait(
    benchmark: Any, loop: asyncio.AbstractEventLoop, urls: dict[str, str], replicas: int
) -> None:
    benchmark.group = "cluster schedule replicas=1"
    benchmark.extra_info.update(impl=f"replicas={replicas}", base=replicas == 0, ops_per_round=1000)
    s = _scheduler(urls["cluster"], replicas=replicas)
    loop.run_until_complete(s.open())
    rounds = itertools.count()

    async def thousand(r: int) -> None:
        for i in range(1000):
            await s.schedule(f"w{r}:{i}", "t", delay=3600)

    benchmark.pedantic(lambda: loop.run_until_complete(thousand(next(rounds))), rounds=5)
    loop.run_until_complete(s.close())
    loop.run_until_complete(s.store.client.aclose())


EACH_JOBS = 2000
PRICE_ROUNDS = 7


async def _drain_each(s: Scheduler) -> int:
    """Claim 100 at a time per shard and ack each job on its own (one WAIT each)."""

    async def shard_each(shard: int) -> int:
        n = 0
        while True:
            batch = await s.claim(shard, limit=100)
            if not batch.jobs:
                return n
            for job in batch.jobs:
                await s.ack(job)
            n += len(batch.jobs)

    return sum(await asyncio.gather(*(shard_each(sh) for sh in range(SHARDS))))


async def _timed_drain(url: str, replicas: int, each: bool) -> float:
    s = _scheduler(url, replicas=replicas)
    jobs = EACH_JOBS if each else JOBS
    try:
        await s.open()
        await s.schedule_many([JobSpec(f"j{i}", "t", b"x" * 32) for i in range(jobs)])
        for shard in range(SHARDS):
            await s.take(shard)
        # Let the replicas apply the fill first: with replicas=0 they would still be
        # replaying it during the drain (with replicas=1 the fill's WAIT saw to that).
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        done = await (_drain_each(s) if each else _drain(s))
        elapsed = time.perf_counter() - t0
        assert done == jobs, (done, jobs)
        return elapsed
    finally:
        await s.store.client.aclose()


@pytest.mark.parametrize("each", [False, True], ids=["ack_many", "ack-each"])
@pytest.mark.parametrize("backend", ["redis+replica", "cluster"])
def test_price_of_replicated_acks(
    benchmark: Any,
    loop: asyncio.AbstractEventLoop,
    replicated: dict[str, str],
    backend: str,
    each: bool,
) -> None:
    """claim+ack with replicas=1 (ack_many, or each ack, WAITs for one replica) against
    replicas=0, interleaved round by round (the order alternates), so a machine that
    gets busier during the run slows both alike. Reported: the median of the per-round
    time ratios (replicas=1 / replicas=0), with min and max."""
    url = replicated[backend]
    ratios: list[float] = []
    times: dict[int, list[float]] = {0: [], 1: []}

    def measure() -> None:
        for r in range(PRICE_ROUNDS):
            for replicas in (0, 1) if r % 2 == 0 else (1, 0):
                times[replicas].append(loop.run_until_complete(_timed_drain(url, replicas, each)))
            ratios.append(times[1][-1] / times[0][-1])

    benchmark.pedantic(measure, rounds=1, iterations=1)
    jobs = EACH_JOBS if each else JOBS
    how = "each job acked alone" if each else "ack_many of 500"
    benchmark.extra_info["report"] = (
        f"claim+ack, {how}, {backend}: replicas=1 takes {statistics.median(ratios):.2f}x "
        f"the time of replicas=0 (median of {PRICE_ROUNDS} interleaved rounds, min "
        f"{min(ratios):.2f}x, max {max(ratios):.2f}x); per job "
        f"{statistics.median(times[1]) / jobs * 1e6:.0f} us vs "
        f"{statistics.median(times[0]) / jobs * 1e6:.0f} us"
    )
