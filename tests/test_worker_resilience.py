"""A worker under pressure: a backlog larger than its task slots, a Redis that refuses
writes for a while, a shard given back while a long task drains, and a late refusal of
an old epoch. Each test is a failure a review reproduced against the code before the fix.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.durable_support import client_of, open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import Fenced, RedisUnavailable, TaskContext, TaskRegistry, Worker
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import translate

pytestmark = pytest.mark.redis


def test_a_backlog_waits_for_slots_and_is_never_dead_lettered_unrun(
    private_redis: RedisServer,
) -> None:
    """More due jobs than one task slot can run within a lease: they wait, the surplus
    is released (same attempt) and claimed again; none dies without having run."""
    runs: collections.Counter[str] = collections.Counter()
    reg = TaskRegistry()

    @reg.task(name="slow")
    async def slow(ctx: TaskContext) -> None:
        runs[ctx.job_id] += 1
        await asyncio.sleep(0.1)

    async def main() -> None:
        async with open_scheduler(private_redis.url, shards=1, owner_ttl=2.0) as s:
            ids = [f"j{i}" for i in range(20)]
            for job_id in ids:
                await s.schedule(job_id, "slow", delay=0, max_attempts=2)
            opts = {"lookahead": 0.1, "lease": 0.4, "poll_interval": 0.02}
            async with running_worker(s, reg, reap_interval=0.05, max_running=1, **opts) as w:
                # 20 x 0.1 s of work, behind one slot, with leases of 0.5 s.
                assert await until(lambda: len(runs) == len(ids), 15), dict(runs)
                assert w.loader is not None
                stats = w.loader.stats
            dead = await s.dead_letters(0)
            assert dead.total == 0, [(j.id, j.attempt, j.last_error) for j in dead.jobs]
            assert stats.dead == stats.expired == 0, stats
            assert stats.shed > 0, stats  # the backlog did outlast half a lease
            assert stats.succeeded == len(ids), stats
            assert [await s.get(job_id) for job_id in ids] == [None] * len(ids)  # all acked

    run(main())


def test_refusals_a_server_recovers_from_are_transient() -> None:
    import redis.exceptions as r

    for exc in (
        r.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        r.BusyLoadingError("Redis is loading the dataset in memory"),
        r.ResponseError("BUSY Redis is busy running a script."),
        r.ResponseError("NOREPLICAS Not enough good replicas to write."),
    ):
        assert isinstance(translate(exc), RedisUnavailable), exc
    plain = r.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    assert translate(plain) is plain


def test_worker_survives_a_redis_out_of_memory_and_reaps_after(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses writes (maxmemory, noeviction) for a second: the worker's
    balancer and reaper wait it out, then reap a crashed owner's lease and run it."""
    runs: collections.Counter[str] = collections.Counter()
    reg = TaskRegistry()

    @reg.task(name="t")
    async def t(ctx: TaskContext) -> None:
        runs[ctx.job_id] += 1

    async def main() -> None:
        url = private_redis.url
        async with (
            open_scheduler(url, "oom", shards=1, owner_ttl=1.0) as crashed,
            open_scheduler(url, "oom", shards=1, owner_ttl=1.0) as s,
        ):
            await crashed.schedule("j", "t", delay=0)
            assert await crashed.take(0)
            assert [j.id for j in (await crashed.claim(0, lease=2.5)).jobs] == ["j"]
            # `crashed` is never heard from again: its token expires in 1 s.
            client = client_of(s)
            opts = {"lookahead": 0.1, "lease": 1.0, "poll_interval": 0.05}
            async with running_worker(s, reg, reap_interval=0.1, **opts):
                assert await until(lambda: 0 in s.ownership.owned, 5)
                used = int((await client.info("memory"))["used_memory"])
                await client.config_set("maxmemory-policy", "noeviction")
                await client.config_set("maxmemory", str(max(used - 100_000, 1)))
                # Renewals and reaps are refused meanwhile: until one refusal is logged
                # (polled, not a fixed second, which a loaded machine can fill with
                # nothing but waiting), and for at least a second.
                refused_soon = asyncio.create_task(
                    until(lambda: any("maxmemory" in r.getMessage() for r in caplog.records), 20)
                )
                await asyncio.sleep(1.0)
                logged = await refused_soon
                await client.config_set("maxmemory", "0")
                assert logged, "no OOM refusal was logged while Redis refused writes"
                # The lease (2.5 s from the claim) expires; the reaper returns it.
                assert await until(lambda: runs["j"] == 1, 8), dict(runs)
            assert await s.get("j") is None
        refused = [r for r in caplog.records if "maxmemory" in r.getMessage()]
        assert refused, "the OOM refusals were not logged"
        assert not [r for r in caplog.records if r.exc_info], "a loop died with a traceback"

    with caplog.at_level(logging.WARNING, logger="tickwheel.durable"):
        run(main())


def test_giving_a_shard_back_keeps_renewing_the_others(private_redis: RedisServer) -> None:
    """A long task drains on the shard worker A gives back to B; meanwhile A goes on
    renewing the shard it keeps (its owner TTL is shorter than the drain), so A loses
    nothing and B takes only the shard given to it."""
    reg = TaskRegistry()

    @reg.task(name="t")
    async def t(ctx: TaskContext) -> None:
        await asyncio.sleep(float(ctx.payload["d"]))

    async def main() -> None:
        url = private_redis.url
        async with (
            open_scheduler(url, "gb", shards=2, owner_ttl=1.0) as sa,
            open_scheduler(url, "gb", shards=2, owner_ttl=1.0) as sb,
        ):
            opts = {"lookahead": 0.3, "lease": 2.0, "poll_interval": 0.02, "reap_interval": 0.05}
            async with running_worker(sa, reg, drain_timeout=3.0, **opts) as wa:
                assert await until(lambda: len(sa.ownership.owned) == 2, 5)
                # A long task on each shard: whichever A gives back has one draining.
                by_shard = {sa.keys.shard_of(f"L{i}"): f"L{i}" for i in range(50)}
                assert sorted(by_shard) == [0, 1]
                for job_id in by_shard.values():
                    await sa.schedule(job_id, "t", {"d": 2.5}, delay=0)
                await asyncio.sleep(0.3)  # running now
                keep_log: list[dict[int, int]] = []
                async with running_worker(sb, reg, drain_timeout=3.0, **opts) as wb:
                    for _ in range(30):  # 3 s: longer than A's owner TTL
                        await asyncio.sleep(0.1)
                        keep_log.append(dict(sa.ownership.owned))
                    assert len(wb.ownership.owned) == 1
                assert wa.shards_lost == 0, keep_log
                # Once A is down to its share, it holds that shard, under that epoch, in
                # every later sample: not lost while the other one drained.
                first = next(i for i, owned in enumerate(keep_log) if len(owned) == 1)
                assert all(owned == keep_log[first] for owned in keep_log[first:]), keep_log

    run(main())


def test_a_late_refusal_of_an_old_epoch_keeps_the_shard_taken_again(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=5.0) as a:
            await a.schedule("old", "t", delay=0)
            assert await a.take(0) == 1
            old = (await a.claim(0, lease=30)).jobs[0]
            keys = a.keys.shard(0)
            client = client_of(a)
            # Another owner took the shard (epoch 2) and died; `a` finds out and takes it
            # again under epoch 3.
            await client.delete(keys.owner)
            await client.incr(keys.epoch)
            assert not await a.ownership.renew(0)
            assert await a.take(0) == 3
            with pytest.raises(Fenced):
                await a.ack(old)  # the epoch-1 lease: refused
            assert a.ownership.owned == {0: 3}  # the refusal was of epoch 1, not of 3
            await a.claim(0)  # still the owner

    run(main())


def test_an_ack_waits_out_a_redis_restart_shorter_than_the_lease(tmp_path: Path) -> None:
    """Redis dies while a task runs and is back 2 s later (same data, same port): the
    finished task's ack is tried again until Redis answers, within the lease, so the
    job is acked once and does not run a second time after its lease expires. (Found by
    the chaos test: the ack gave up after ~0.75 s, and every job finishing in a longer
    outage ran twice.)"""
    server = RedisServer(appendonly=True, appendfsync="always", data_dir=tmp_path)
    server.start()
    runs: collections.Counter[str] = collections.Counter()
    started = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="t")
    async def t(ctx: TaskContext) -> None:
        runs[ctx.job_id] += 1
        started.set()
        await asyncio.sleep(0.3)

    async def main() -> None:
        async with open_scheduler(server.url, shards=1, owner_ttl=10.0) as s:
            opts = {"lookahead": 0.1, "lease": 10.0, "poll_interval": 0.02}
            async with running_worker(s, reg, reap_interval=0.1, **opts) as w:
                await s.schedule("j", "t", delay=0)
                await asyncio.wait_for(started.wait(), 10)
                server.kill()
                await asyncio.sleep(2.0)  # the task ends and acks meanwhile, in vain
                server.start()
                deadline = asyncio.get_running_loop().time() + 15
                while await persist(lambda: s.get("j")) is not None:
                    assert asyncio.get_running_loop().time() < deadline, "never acked"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)  # a rerun would have started by now (reap 0.1 s)
                assert w.loader is not None
                stats = w.loader.stats
            assert runs["j"] == 1, dict(runs)
            assert stats.succeeded == 1, stats  # (unavailable counts the claim rounds too)

    try:
        run(main())
    finally:
        server.stop()


async def persist(call: Any, within: float = 15.0) -> Any:
    """``call()`` until Redis answers."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await call()
        except RedisUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_a_worker_started_while_redis_is_down_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis does not answer when the worker starts (found under load in the suite: one
    connect timeout in ``Scheduler.open`` ended ``Worker.run``, and nothing ran after):
    the worker waits for it, says so once, and runs the job once Redis is back. A stop
    while it waits ends the run at once."""
    server = RedisServer(appendonly=True, appendfsync="always", data_dir=tmp_path)
    server.start()
    runs: collections.Counter[str] = collections.Counter()
    reg = TaskRegistry()

    @reg.task(name="t")
    def t(ctx: TaskContext) -> None:
        runs[ctx.job_id] += 1

    async def main() -> None:
        async with open_scheduler(server.url, shards=1, owner_ttl=2.0) as producer:
            await producer.schedule("j", "t", delay=0)
        ns = producer.keys.namespace
        server.kill()
        # A scheduler of its own, not opened yet: the worker's run opens it.
        async with open_scheduler(server.url, ns, shards=1, owner_ttl=2.0) as s:
            opts = {"lookahead": 0.1, "lease": 5.0, "poll_interval": 0.02}
            async with running_worker(s, reg, reap_interval=0.1, **opts) as w:
                await asyncio.sleep(1.5)  # it tries, fails and waits meanwhile
                assert w.loader is None and runs["j"] == 0
                server.start()
                assert await until(lambda: runs["j"] == 1, 20), dict(runs)
        # Stopped while waiting: run() returns without having opened anything.
        server.kill()
        async with open_scheduler(server.url, ns, shards=1, owner_ttl=2.0) as s:
            stopped = Worker(s, reg, **opts)
            task = asyncio.ensure_future(stopped.run())
            await asyncio.sleep(0.5)
            stopped.stop()
            stats = await asyncio.wait_for(task, 10)
            assert stats.claimed == 0 and stopped.loader is None

    caplog.set_level(logging.WARNING, logger="tickwheel.durable")
    try:
        run(main())
    finally:
        server.stop()
    assert runs["j"] == 1, dict(runs)
    started = [r for r in caplog.records if "start" in r.getMessage()]
    assert started, [r.getMessage() for r in caplog.records]
