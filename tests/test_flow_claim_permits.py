"""The claim takes its limited jobs' permits (issue 35; docs/limits.md, "How a limited
job runs"): on one Redis in the Redis-only mode, claim.lua decides each limited
one-shot job's permit with limits.lua's own acquire, leases the granted ones marked as
holding it, and leaves the others waiting as waits.lua does. A cluster and the Postgres
mode keep the worker's gate (their own tests, test_flow_limits.py and the *_pg ones,
run it as before). Real redis-server processes, a Redis Cluster and a PostgreSQL where
named: the one-Redis cases take the session's redis-server, not the cluster."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from durable_support import client_of, open_scheduler, run
from limits_support import peaks_by_key, runs
from pg_support import migrated, pg_scheduler
from spill_support import SINK_ENV, running_worker, until

from tickwheel.durable import (
    Job,
    JobSpec,
    JobState,
    Limits,
    Scheduler,
    TaskContext,
    TaskRegistry,
    Worker,
)
from tickwheel.durable.runtime._limiter import Limiter
from tickwheel.durable.servers._redis import RedisClusterServer, RedisServer
from tickwheel.durable.store import ClaimLimits, LimitCalls, member_of

pytestmark = pytest.mark.redis

FAST = {"lease": 2.0, "lookahead": 0.1, "poll_interval": 0.02, "reap_interval": 0.2}
TWO = Limits(concurrency=2)


def _limits(**tasks: Limits) -> ClaimLimits:
    return ClaimLimits(30_000, 60_000, tasks)


def _holder(job: Any) -> str:
    return f"{job.epoch}:{job.attempt}"


async def _key_counts(s: Scheduler, task: str, key: str) -> tuple[int, int, int]:
    state = await s.key_state(task, key)
    return state.running, state.handed, state.waiting


def test_a_claim_takes_permits_and_leaves_the_rest_waiting(redis_server: RedisServer) -> None:
    """Three jobs of one key at concurrency 2 in one claim: two leased holding their
    permits (held by "<epoch>:<attempt>"), the third not leased, WAITING in its key's
    waiters, woken by a release and then claimed on the permit handed to it."""

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.store.limits.declare({"charge": TWO})
            for i in range(3):
                await s.schedule(f"c{i}", "charge", key="m")
            await s.take(0)
            batch = await s.leases.claim(0, limit=10, lease=30.0, limits=_limits(charge=TWO))
            assert [j.id for j in batch.jobs] == ["c0", "c1"]
            assert [j.id for j in batch.held] == ["c0", "c1"] and batch.waited == 1
            assert await _key_counts(s, "charge", "m") == (2, 0, 1)
            client = client_of(s)
            holders = s.keys.limit_keys("charge", "m")[1]
            c0, c1 = batch.jobs
            assert await client.hget(holders, member_of(c0)) == _holder(c0).encode()
            info = await s.get("c2")
            assert info is not None and info.state is JobState.WAITING
            k = s.keys.shard(0)
            assert await client.zscore(k.leased, "c2") is None
            assert await client.zscore(k.due, "c2") is None
            assert await client.zscore(k.rechecks, "charge\0m") is not None
            assert await s.store.limits.waiting(["charge"]) == {"charge": 1}
            # c0's run ends: its permit goes to c2, woken (due now), claimed on it.
            handed = await s.store.limits.release_many(
                [("charge", "m", member_of(c0), _holder(c0), TWO)], 30_000
            )
            assert handed == [["0|c2"]]
            assert await s.store.limits.wake_many([("charge", "0|c2")]) == [1]
            again = await s.leases.claim(0, limit=10, lease=30.0, limits=_limits(charge=TWO))
            assert [j.id for j in again.held] == ["c2"] and again.waited == 0
            assert await _key_counts(s, "charge", "m") == (2, 0, 0)
            assert await s.store.limits.waiting(["charge"]) == {"charge": 0}
            c2 = again.jobs[0]
            assert c2.attempt == 1 and c1.attempt == 1  # the wait spent no attempt
            assert await client.hget(holders, member_of(c2)) == _holder(c2).encode()

    run(main())


def test_a_mixed_claim_takes_only_what_it_leases(redis_server: RedisServer) -> None:
    """Limited jobs of two keys, unlimited ones, a recurring limited job (its missed-run
    policy may move it unrun: the gate's) and a paused task's job: permits are taken
    for the limited one-shot jobs the claim leases, per key, in claim order."""

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            one = Limits(concurrency=1)
            await s.store.limits.declare({"charge": one, "held": one})
            base = await s.now()
            specs = [JobSpec(f"a{i}", "charge", key="a", at=base - 100 + i) for i in range(3)]
            specs += [JobSpec(f"b{i}", "charge", key="b", at=base - 90 + i) for i in range(2)]
            specs += [JobSpec(f"p{i}", "plain", at=base - 80 + i) for i in range(2)]
            specs += [JobSpec("h0", "held", key="a", at=base - 70)]
            await s.schedule_many(specs)
            await s.schedule("r0", "charge", key="b", every=60.0, at=base - 60)
            await s.pause("held")
            await s.take(0)
            lims = _limits(charge=one, held=one)
            batch = await s.leases.claim(0, limit=20, lease=30.0, limits=lims)
            ids = sorted(j.id for j in batch.jobs)
            assert "r0" in ids and "h0" not in ids and batch.parked == 1
            assert sorted(j.id for j in batch.held) == ["a0", "b0"]
            assert ids == ["a0", "b0", "p0", "p1", "r0"] and batch.waited == 3
            assert await _key_counts(s, "charge", "a") == (1, 0, 2)
            assert await _key_counts(s, "charge", "b") == (1, 0, 1)
            assert await _key_counts(s, "held", "a") == (0, 0, 0)  # parked: no permit
            for job_id in ("a1", "a2", "b1"):
                info = await s.get(job_id)
                assert info is not None and info.state is JobState.WAITING, job_id

    run(main())


def test_a_cluster_claim_takes_no_permit(redis_cluster: RedisClusterServer) -> None:
    """On a Redis Cluster the claim ignores the limits: every job is leased, none holds a
    permit, and the worker's gate takes them (limits.lua, in each key's slot)."""

    async def main() -> None:
        async with open_scheduler(redis_cluster.url, shards=1) as s:
            assert s.store.transport.cluster
            await s.store.limits.declare({"charge": TWO})
            for i in range(3):
                await s.schedule(f"c{i}", "charge", key="m")
            await s.take(0)
            batch = await s.leases.claim(0, limit=10, lease=30.0, limits=_limits(charge=TWO))
            assert len(batch.jobs) == 3 and not batch.held and batch.waited == 0
            assert await _key_counts(s, "charge", "m") == (0, 0, 0)

    run(main())


@pytest.mark.postgres
def test_the_postgres_mode_claim_takes_no_permit(private_redis: RedisServer, pg_url: str) -> None:
    """In the Postgres mode the PostgreSQL check follows the claim (it may drop jobs): the
    claim takes no permit, the gate does."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.store.limits.declare({"charge": TWO})
            for i in range(3):
                await s.schedule(f"c{i}", "charge", b"", key="m")
            await s.take(0)
            batch = await s.leases.claim(0, limit=10, lease=30.0, limits=_limits(charge=TWO))
            assert len(batch.jobs) == 3 and not batch.held and batch.waited == 0
            assert await _key_counts(s, "charge", "m") == (0, 0, 0)

    run(main())


class _CountedCalls(LimitCalls):
    """The limit calls, sent as ever, counting the jobs of its acquire batches."""

    __slots__ = ("acquired",)

    def __init__(self, calls: LimitCalls) -> None:
        super().__init__(calls.transport, calls._scripts, calls.keys)
        self.acquired = 0

    async def acquire_many(
        self, jobs: Sequence[tuple[Job, Limits]], hold_ms: int
    ) -> list[tuple[int, int]]:
        self.acquired += len(jobs)
        return await super().acquire_many(jobs, hold_ms)


def _count_acquires(limiter: Limiter) -> _CountedCalls:
    """Count the limiter's limits.lua acquires from now on."""
    counted = _CountedCalls(limiter.calls)
    limiter.calls = counted
    return counted


async def _started(worker: Worker) -> Limiter:
    assert await until(lambda: worker.loader is not None, 10)
    assert worker.loader is not None
    return worker.loader.limiter


def test_a_worker_runs_limited_jobs_with_no_permit_call(redis_server: RedisServer) -> None:
    """A worker on one Redis: its limited jobs take their permits in their claims (no
    limits.lua acquire), the ones over the limit wait and are woken, concurrency 2 per
    key holds and every job runs once."""

    async def main() -> None:
        os.environ[SINK_ENV] = redis_server.url
        from limits_support import registry

        async with (
            open_scheduler(redis_server.url, shards=2) as s,
            running_worker(s, registry, **FAST) as w,
        ):
            limiter = await _started(w)
            sent = _count_acquires(limiter)
            prefix = s.keys.namespace
            await s.schedule_many(
                JobSpec(f"j{i}", "keyed", {"sink": prefix, "ms": 20}, key=f"k{i % 3}")
                for i in range(60)
            )
            client = client_of(s)
            assert await _until_count(client, prefix, 60, 30)
            done = await runs(client, prefix)
            assert sorted(r[0] for r in done) == sorted(f"j{i}" for i in range(60))
            assert max(peaks_by_key(done).values()) <= 2
            assert sent.acquired == 0  # no permit call: the claims took them
            assert w.loader is not None and w.loader.stats.limit_waits > 0

    run(main())


def test_a_gate_worker_and_a_claim_worker_share_the_limit(redis_server: RedisServer) -> None:
    """Two workers on one namespace, one on the gate (as a worker of the previous
    release, whose claim takes no permit), one taking permits in its claims: the same
    permits and waiters, never more than 2 runs of a key at once, every job once."""

    async def main() -> None:
        os.environ[SINK_ENV] = redis_server.url
        from limits_support import registry

        async with (
            open_scheduler(redis_server.url, shards=4) as s,
            open_scheduler(redis_server.url, s.keys.namespace, shards=4) as s2,
            running_worker(s, registry, **FAST) as new,
            running_worker(s2, registry, **FAST) as old,
        ):
            new_limiter, old_limiter = await _started(new), await _started(old)
            old_limiter.in_claim = False  # the previous release's claim
            new_sent, old_sent = _count_acquires(new_limiter), _count_acquires(old_limiter)
            both: Callable[[], bool] = lambda: bool(  # noqa: E731
                s.ownership.owned and s2.ownership.owned
            )
            assert await until(both, 20)
            prefix = s.keys.namespace
            await s.schedule_many(
                JobSpec(f"j{i}", "keyed", {"sink": prefix, "ms": 15}, key=f"k{i % 6}")
                for i in range(160)
            )
            client = client_of(s)
            assert await _until_count(client, prefix, 160, 40)
            done = await runs(client, prefix)
            assert sorted(r[0] for r in done) == sorted(f"j{i}" for i in range(160))
            assert max(peaks_by_key(done).values()) == 2  # reached, never passed
            assert old_sent.acquired > 0 and new_sent.acquired == 0
            for key in range(6):
                assert await _key_counts(s, "keyed", f"k{key}") == (0, 0, 0)

    run(main())


async def _until_count(client: Any, prefix: str, n: int, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while int(await client.llen(f"{prefix}:runs")) < n:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_a_worker_hands_back_its_unstarted_jobs_with_their_permits(
    redis_server: RedisServer,
) -> None:
    """Three jobs of one key at concurrency 2, due now, on a worker with one slot: the
    claim leases two holding their permits (one runs, one waits for the slot) and leaves
    the third waiting for a permit. A worker that stops hands the unstarted one back to
    due and frees its permit at once (not at its deadline, a lease later): the key's
    waiter is handed it. The run in progress keeps its permit until it ends."""

    async def main() -> None:
        go = asyncio.Event()
        started: list[str] = []
        reg = TaskRegistry()

        @reg.task(name="keyed", concurrency=2)
        async def keyed(ctx: TaskContext) -> None:
            started.append(ctx.job_id)
            await go.wait()

        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.schedule_many(JobSpec(f"j{i}", "keyed", key="m") for i in range(3))
            settings = {**FAST, "lease": 30.0, "max_running": 1}
            worker = Worker(s, reg, **settings)
            task = asyncio.ensure_future(worker.run())
            try:
                assert await until(lambda: len(started) == 1, 10)
                assert await _key_counts(s, "keyed", "m") == (2, 0, 1)
                worker.stop()  # the running handler is waited for; j-unstarted goes back
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while await _key_counts(s, "keyed", "m") != (1, 1, 0):
                    assert loop.time() < deadline, await _key_counts(s, "keyed", "m")
                    await asyncio.sleep(0.02)
                states = {i: await s.get(f"j{i}") for i in range(3)}
                others = [info for i, info in states.items() if f"j{i}" not in started]
                assert [info is not None and info.state for info in others] == [
                    JobState.DUE,
                    JobState.DUE,
                ]
            finally:
                go.set()
                await task
            assert len(started) == 1  # nothing else started meanwhile

    run(main())


def test_a_claim_grants_its_permits_in_priority_order(redis_server: RedisServer) -> None:
    """Among due jobs a higher priority is claimed first, so it takes the key's permit
    first; the lower one, due earlier, waits for it."""

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            one = Limits(concurrency=1)
            await s.store.limits.declare({"charge": one})
            base = await s.now()
            await s.schedule_many(
                [
                    JobSpec("low", "charge", key="m", at=base - 50),
                    JobSpec("high", "charge", key="m", at=base - 10, priority=5),
                ]
            )
            await s.take(0)
            batch = await s.leases.claim(0, limit=10, lease=30.0, limits=_limits(charge=one))
            assert [j.id for j in batch.held] == ["high"] and batch.waited == 1
            info = await s.get("low")
            assert info is not None and info.state is JobState.WAITING

    run(main())
