"""Durable calls through a fault proxy: a reply lost after Redis applied the script, and
a Redis that stops answering while its socket stays open.

Each lost-reply test drops the reply of one script call (matched by the script's SHA in
the request, so the handshake and other commands pass), then lets the caller recover
the way the library does, and checks the end state against what a single run leaves:
nothing stuck leased, no attempt consumed without a run, nothing lost or doubled.

One redis-server here; test_faults_cluster.py runs the lost claim and ack replies and the
black hole on a Redis Cluster whose nodes announce their proxies' ports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio
from durable_support import check_shard, run, unique_ns
from faultproxy import FaultProxy, ThreadedFaultProxy

from tickwheel.durable import JobState, LeaseLost, RedisUnavailable, Scheduler
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url
from tickwheel.durable.store._scripts import SCRIPT_NAMES

# A bound on a fault's error for a loaded machine (the configured bound is 1 s).
BOUND = 8.0


@asynccontextmanager
async def proxied(
    server: RedisServer, *, resending: bool = False, take: bool = True, **kwargs: Any
) -> AsyncIterator[tuple[FaultProxy, Scheduler]]:
    """A proxy in front of ``server`` and a one-shard Scheduler whose client uses it:
    the library's client (no re-sends), or with ``resending`` one with redis-py's
    default retry, which re-sends a command whose reply was lost. With ``take`` it owns
    the shard."""
    async with FaultProxy("127.0.0.1", server.port) as proxy:
        c = redis.asyncio.Redis(port=proxy.port) if resending else client_from_url(proxy.url)
        kwargs.setdefault("check", False)
        s = Scheduler(c, unique_ns(), shards=1, **kwargs)
        try:
            await s.open()
            await load_scripts(s)
            assert not take or await s.ownership.take(0)
            yield proxy, s
        finally:
            proxy.heal()
            await s.ownership.give_back_all()
            await c.aclose()


async def load_scripts(s: Scheduler) -> None:
    """Load every script, so a dropped reply is the script's, not a NOSCRIPT."""
    for name in SCRIPT_NAMES:
        await s.store.client.script_load(getattr(s.store._scripts, name).script)


def sha(s: Scheduler, name: str) -> bytes:
    return str(getattr(s.store._scripts, name).sha).encode()


def test_lost_claim_reply_is_recovered_with_the_same_batch(private_redis: RedisServer) -> None:
    async def main() -> None:
        async with proxied(private_redis) as (proxy, s):
            for i in range(3):
                await s.schedule(f"j{i}", "t", b"x", delay=0, max_attempts=1)
            proxy.drop_next_reply(sha(s, "claim"))
            with pytest.raises(RedisUnavailable):
                await s.claim(0, limit=2)
            await proxy.wait_dropped(BOUND)
            # The script ran: two jobs are leased, and the caller never saw them.
            assert sorted((await check_shard(s, 0)).values()).count(JobState.LEASED) == 2
            batch = await s.claim(0, limit=2)  # the loader's next round: same token
            assert sorted(j.id for j in batch.jobs) == ["j0", "j1"]
            assert all(j.attempt == 1 for j in batch.jobs)
            for job in batch.jobs:
                await s.ack(job)
            rest = await s.claim(0, limit=2)  # a new claim: the third job, once
            assert [j.id for j in rest.jobs] == ["j2"]
            await s.ack(rest.jobs[0])
            assert await check_shard(s, 0) == {}

    run(main())


def test_a_client_that_resends_gets_the_first_claims_batch(private_redis: RedisServer) -> None:
    """redis-py's default retry re-sends EVALSHA after a lost reply: the claim's token
    makes the second run return the first run's batch instead of leasing another."""

    async def main() -> None:
        async with proxied(private_redis, resending=True) as (proxy, s):
            for i in range(2):
                await s.schedule(f"j{i}", "t", b"x", delay=0, max_attempts=1)
            proxy.drop_next_reply(sha(s, "claim"))
            batch = await s.claim(0, limit=1)  # redis-py re-sends it by itself
            assert proxy.dropped_replies == 1
            assert [j.id for j in batch.jobs] == ["j0"]
            states = await check_shard(s, 0)
            assert states == {"j0": JobState.LEASED, "j1": JobState.DUE}

    run(main())


def test_lost_ack_reply_then_ack_again_completes_once(private_redis: RedisServer) -> None:
    async def main() -> None:
        async with proxied(private_redis) as (proxy, s):
            await lost_ack_then_ack_again(s, proxy)

    run(main())


async def lost_ack_then_ack_again(s: Scheduler, proxy: FaultProxy | ThreadedFaultProxy) -> None:
    """Shard 0's ack reply is lost; the ack sent again completes the job once."""
    await s.schedule("j", "t", b"x", delay=0, max_attempts=1)
    (job,) = (await s.claim(0)).jobs
    proxy.drop_next_reply(sha(s, "ack"))
    with pytest.raises(RedisUnavailable):
        await s.ack(job)
    await s.ack(job)  # the retry sees the done entry: acked, no LeaseLost
    assert await check_shard(s, 0) == {}
    assert (await s.claim(0)).jobs == []


def test_lost_retry_reply_consumes_one_attempt(private_redis: RedisServer) -> None:
    async def main() -> None:
        async with proxied(private_redis) as (proxy, s):
            await s.schedule("j", "t", b"x", delay=0, max_attempts=3)
            (job,) = (await s.claim(0)).jobs
            proxy.drop_next_reply(sha(s, "retry"))
            with pytest.raises(RedisUnavailable):
                await s.retry(job, "boom", delay=0)
            with pytest.raises(LeaseLost):  # a re-send finds it due again: nothing more
                await s.retry(job, "boom", delay=0)
            (again,) = (await s.claim(0)).jobs
            assert again.attempt == 2  # one retry, not two
            await s.ack(again)
            assert await check_shard(s, 0) == {}

    run(main())


def test_lost_schedule_reply_then_schedule_again_keeps_one_job(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        async with proxied(private_redis) as (proxy, s):
            at = int(time.time() * 1000) + 60_000
            proxy.drop_next_reply(sha(s, "schedule_one"))
            with pytest.raises(RedisUnavailable):
                await s.schedule("j", "t", b"x", at=at)
            await s.schedule("j", "t", b"x", at=at)  # the producer's retry: kept
            assert await check_shard(s, 0) == {"j": JobState.DUE}

    run(main())


def test_lost_take_reply_then_take_again_keeps_one_epoch(private_redis: RedisServer) -> None:
    async def main() -> None:
        async with proxied(private_redis, take=False) as (proxy, s):
            proxy.drop_next_reply(sha(s, "take"))
            with pytest.raises(RedisUnavailable):
                await s.ownership.take(0)
            epoch = await s.ownership.take(0)
            assert epoch == 1  # the lost take's epoch, not a second one
            await s.schedule("j", "t", b"x", delay=0)
            (job,) = (await s.claim(0)).jobs
            await s.ack(job)

    run(main())


def test_black_hole_gives_a_bounded_error_then_the_same_objects_work(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        async with proxied(private_redis, call_timeout=1.0) as (proxy, s):
            await black_hole_then_recover(s, proxy)

    run(main())


async def black_hole_then_recover(s: Scheduler, proxy: FaultProxy | ThreadedFaultProxy) -> None:
    """Shard 0's Redis stops answering: each call fails within the bound; once it
    answers again, the same objects work and nothing scheduled before was lost."""
    await s.schedule("before", "t", b"x", delay=0)
    proxy.black_hole()
    for call in (s.schedule("during", "t", b"x", delay=0), s.claim(0), s.get("x")):
        t0 = time.monotonic()
        with pytest.raises(RedisUnavailable):
            await call
        assert time.monotonic() - t0 < BOUND
    proxy.reset_all()  # the held requests are lost with their connections
    proxy.heal()
    await s.schedule("after", "t", b"x", delay=0)
    ids = sorted(j.id for j in (await s.claim(0)).jobs)
    assert "before" in ids and "after" in ids


def test_a_worker_rides_out_a_black_hole_and_runs_every_job_once(
    private_redis: RedisServer,
) -> None:
    """A black hole longer than every bound (call, owner TTL): the worker's loops get
    bounded errors, keep going, and once Redis answers again every job runs once."""
    from spill_support import running_worker, until

    from tickwheel.durable import TaskContext, TaskRegistry

    runs: list[str] = []
    reg = TaskRegistry()

    @reg.task(name="t")
    async def record(ctx: TaskContext) -> None:
        runs.append(ctx.job_id)

    async def main() -> None:
        async with (
            proxied(private_redis, call_timeout=0.5, owner_ttl=1.0) as (proxy, s),
            running_worker(s, reg, lookahead=0.2, poll_interval=0.02, reap_interval=0.1),
        ):
            for i in range(5):
                await s.schedule(f"a{i}", "t", b"x", delay=0)
            assert await until(lambda: len(runs) == 5, 20)
            proxy.black_hole()
            # Scheduled behind the proxy's back, straight into Redis, while it is dark.
            async with open_scheduler_direct(private_redis, s.keys.namespace) as direct:
                for i in range(5):
                    await direct.schedule(f"b{i}", "t", b"x", delay=0)
                await asyncio.sleep(3.0)  # past the owner TTL and many call bounds
                assert len(runs) == 5  # nothing ran in the dark
                proxy.reset_all()
                proxy.heal()
                assert await until(lambda: len(runs) == 10, 30)
        assert sorted(runs) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])

    run(main())


@asynccontextmanager
async def open_scheduler_direct(server: RedisServer, namespace: str) -> AsyncIterator[Scheduler]:
    """A second scheduler on the same namespace that talks to Redis without the proxy."""
    client = client_from_url(server.url)
    try:
        yield Scheduler(client, namespace, shards=1, check=False)
    finally:
        await client.aclose()
