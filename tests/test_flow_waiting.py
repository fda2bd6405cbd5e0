"""A job waiting for a permit of its flow key (issue 35; docs/limits.md "How a limited job
runs"): in no index of its shard, its record flagged, one entry in its key's waiters.
Found by id (get, cancel, reschedule, inspect), woken by a release, rechecked by its
key's timer when the wake was lost, and cheaper in Redis than a pending job. Real
redis-server processes (and a Redis Cluster where parametrized)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from dashboard_support import api_client
from durable_support import check_all, client_of, open_scheduler, run, unique_ns
from spill_support import running_worker

from tickwheel.durable import (
    Job,
    JobSpec,
    JobState,
    Limits,
    Scheduler,
    TaskContext,
    TaskRegistry,
)
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of

pytestmark = pytest.mark.redis

ONE = Limits(concurrency=1)
HOLD_MS = 30_000


async def _claim_all(s: Scheduler, shards: int) -> dict[str, Job]:
    jobs: dict[str, Job] = {}
    for shard in range(shards):
        if shard not in s.ownership.owned:
            await s.take(shard)
        while got := (await s.claim(shard, lease=30.0, limit=1000)).jobs:
            jobs.update((job.id, job) for job in got)
    return jobs


async def _wait(s: Scheduler, jobs: list[Job], delay_ms: int) -> None:
    """What a worker does with jobs over their key's limit: waits.lua, per shard."""
    for shard in {j.shard for j in jobs}:
        mine = [(j, delay_ms, True) for j in jobs if j.shard == shard]
        await s.store.limits.wait_many(shard, mine)


def _holder(job: Job) -> str:
    return f"{job.epoch}:{job.attempt}"


def test_a_waiting_job_by_id_get_cancel_reschedule_inspect(redis_url: str) -> None:
    """get reports it WAITING (in no index: not counted due); a cancel removes it and
    the wake its stale waiters' entry gets finds nothing (the permit handed to it comes
    back, to the next waiter); a reschedule makes it an ordinary due job; a wake makes
    it due now with its priority."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=4) as s:
            calls = s.store.limits
            await calls.declare({"charge": ONE})
            await s.schedule("w0", "charge", key="k")
            for i in (1, 2, 3):
                await s.schedule(f"w{i}", "charge", key="k", priority=i)
            jobs = await _claim_all(s, 4)
            assert await calls.acquire(jobs["w0"], ONE, HOLD_MS) == (ACQUIRED, 0)
            for i in (1, 2, 3):
                assert await calls.acquire(jobs[f"w{i}"], ONE, HOLD_MS) == (PERMIT_WAIT, 0)
            await _wait(s, [jobs[f"w{i}"] for i in (1, 2, 3)], 60_000)
            for i in (1, 2, 3):
                info = await s.get(f"w{i}")
                assert info is not None and info.state is JobState.WAITING, info
                assert info.key == "k" and info.attempt == 1 and info.priority == i
            states = await check_all(s)  # the shards' invariants: in no index
            assert [states[f"w{i}"] for i in (1, 2, 3)] == [JobState.WAITING] * 3
            shards = await s.inspect()
            assert sum(i.waiting for i in shards) == 3 and sum(i.due for i in shards) == 0
            assert await s.limit_waiting() == {"charge": 3}
            assert (await s.key_state("charge", "k")).waiting == 3
            # Cancelled while it waits: gone, and no longer counted.
            assert await s.cancel("w2") is not None
            assert await s.get("w2") is None
            assert await s.limit_waiting() == {"charge": 2}
            # Rescheduled while it waits: an ordinary due job, out of its wait.
            assert await s.reschedule("w3", delay=3600)
            moved = await s.get("w3")
            assert moved is not None and moved.state is JobState.DUE
            assert await s.limit_waiting() == {"charge": 1}
            # w0 ends: its permit goes to w1, the first waiter: due now, its priority kept.
            m0 = member_of(jobs["w0"])
            handed = await calls.release(
                "charge", "k", m0, _holder(jobs["w0"]), lim=ONE, hold_ms=HOLD_MS
            )
            assert handed == [member_of(jobs["w1"])]
            assert await calls.wake("charge", handed[0]) == 1
            woken = await s.get("w1")
            assert woken is not None and woken.state is JobState.DUE
            assert woken.when_ms <= await s.now() and woken.priority == 1
            assert await s.limit_waiting() == {"charge": 0}
            assert sum(i.waiting for i in await s.inspect()) == 0
            again = (await _claim_all(s, 4))["w1"]
            assert await calls.acquire(again, ONE, HOLD_MS) == (ACQUIRED, 0)  # handed to it
            # w1 ends: the next entry is cancelled w2's: handed, its wake finds no job
            # (0), and the permit freed again goes to w3's stale entry the same way: the
            # key ends with nothing held and nothing waiting.
            m1 = member_of(again)
            handed = await calls.release(
                "charge", "k", m1, _holder(again), lim=ONE, hold_ms=HOLD_MS
            )
            assert handed == [member_of(jobs["w2"])]
            assert await calls.wake("charge", handed[0]) == 0
            handed = await calls.release("charge", "k", handed[0], "", lim=ONE, hold_ms=HOLD_MS)
            assert handed == [member_of(jobs["w3"])]
            assert await calls.wake("charge", handed[0]) == 0  # w3 waits for its time
            assert await calls.release("charge", "k", handed[0], "", lim=ONE, hold_ms=HOLD_MS) == []
            state = await s.key_state("charge", "k")
            assert (state.running, state.waiting, state.handed) == (0, 0, 0)
            still = await s.get("w3")
            assert still is not None and still.state is JobState.DUE
            await check_all(s)

    run(main())


def test_a_lost_wake_is_rechecked_by_the_keys_timer(redis_url: str) -> None:
    """A waiter's permit is handed to it by a release whose wake never comes (its worker
    killed between the two): a worker that owns the waiter's shard rechecks the key at
    the waiter's recheck time and starts it then, never before."""
    ran: list[tuple[str, float]] = []
    started = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="lw", concurrency=1)
    async def lw(ctx: TaskContext) -> None:
        ran.append((ctx.job_id, time.time() * 1000))
        started.set()

    async def main() -> None:
        recheck_ms = 2_000
        async with (
            open_scheduler(redis_url, shards=2) as s,
            open_scheduler(redis_url, s.keys.namespace, shards=2) as s2,
        ):
            calls = s.store.limits
            await calls.declare({"lw": ONE})
            await s.schedule_many([JobSpec("a", "lw", key="k"), JobSpec("b", "lw", key="k")])
            jobs = await _claim_all(s, 2)
            assert await calls.acquire(jobs["a"], ONE, HOLD_MS) == (ACQUIRED, 0)
            assert await calls.acquire(jobs["b"], ONE, HOLD_MS) == (PERMIT_WAIT, 0)
            waited_at = await s.now()
            await _wait(s, [jobs["b"]], recheck_ms)
            ma = member_of(jobs["a"])
            handed = await calls.release(
                "lw", "k", ma, _holder(jobs["a"]), lim=ONE, hold_ms=HOLD_MS
            )
            assert handed == [member_of(jobs["b"])]  # ... and no wake: the waker died
            assert await s.cancel("a") is not None  # its run is over
            await s.ownership.give_back_all()
            fast = {"lease": recheck_ms / 2000, "lookahead": 0.0, "poll_interval": 0.02}
            async with running_worker(s2, reg, **fast):
                await asyncio.wait_for(started.wait(), 30)
            assert [r[0] for r in ran] == ["b"]
            late = ran[0][1] - waited_at
            # Never before its recheck time (a ms of clock rounding), and within a few
            # seconds of it on a loaded machine (the recheck looks once a second).
            assert recheck_ms - 2 <= late < recheck_ms + 10_000, late

    run(main())


async def _bytes(client: Any, pattern: str) -> int:
    total = 0
    async for name in client.scan_iter(match=pattern, count=1000):
        if b":claim:" not in name:  # a claim's reply, kept for its lease: not the jobs'
            total += int(await client.memory_usage(name, samples=0) or 0)
    return total


def test_a_waiting_job_costs_redis_no_more_than_a_pending_one(
    redis_server: RedisServer,
) -> None:
    """MEMORY USAGE (every key of the namespace, SAMPLES 0) of 2,000 jobs waiting for
    one key's permit against the same jobs pending (due in a minute): a waiting job is
    its record and a waiters' list entry, a pending one its record and a due entry."""
    n = 2_000

    async def main() -> None:
        async with (
            open_scheduler(redis_server.url, shards=4) as p,
            open_scheduler(redis_server.url, shards=4) as s,
        ):
            client = client_of(s)
            await p.schedule_many([JobSpec(f"m{i}", "mem", key="one", delay=60) for i in range(n)])
            pending = await _bytes(client, f"{{{p.keys.namespace}*")
            # Waiting: the same jobs due now, all claimed; the first takes the permit and
            # the rest wait (the permits' keys carry the tag {ns:L:...}: counted too).
            await s.store.limits.declare({"mem": ONE})
            await s.schedule_many([JobSpec(f"m{i}", "mem", key="one") for i in range(n)])
            jobs = await _claim_all(s, 4)
            assert len(jobs) == n
            first = jobs.pop("m0")
            assert await s.store.limits.acquire(first, ONE, HOLD_MS) == (ACQUIRED, 0)
            codes = await s.store.limits.acquire_many([(j, ONE) for j in jobs.values()], HOLD_MS)
            assert {c for c, _ in codes} == {PERMIT_WAIT}
            await _wait(s, list(jobs.values()), 60_000)
            assert await s.cancel("m0") is not None  # the runner: only waiters are left
            assert sum(i.waiting for i in await s.inspect()) == n - 1
            waiting = await _bytes(client, f"{{{s.keys.namespace}*")
            assert waiting <= pending, (waiting / (n - 1), pending / n)

    run(main())


def test_the_dashboard_shows_a_waiting_job(redis_url: str) -> None:
    """The job page and its API say "waiting" (the page renders its time and actions);
    the key page counts it."""

    async def prepare(ns: str) -> None:
        async with open_scheduler(redis_url, ns, shards=2) as s:
            await s.store.limits.declare({"charge": ONE})
            await s.schedule_many([JobSpec(f"d{i}", "charge", key="k") for i in (0, 1)])
            jobs = await _claim_all(s, 2)
            assert await s.store.limits.acquire(jobs["d0"], ONE, HOLD_MS) == (ACQUIRED, 0)
            assert await s.store.limits.acquire(jobs["d1"], ONE, HOLD_MS) == (PERMIT_WAIT, 0)
            await _wait(s, [jobs["d1"]], 60_000)

    ns = unique_ns()
    run(prepare(ns))
    with api_client(redis_url, ns) as client:
        data = client.get("/api/job", params={"id": "d1"}).json()["job"]
        assert data["state"] == "waiting" and data["key"] == "k", data
        page = client.get("/job", params={"id": "d1"})
        assert page.status_code == 200 and 'id="job-state">waiting<' in page.text
        key = client.get("/api/key", params={"task": "charge", "key": "k"}).json()
        assert key["running"] == 1 and key["waiting"] == 1, key


def test_the_recheck_of_a_key(redis_url: str) -> None:
    """limits.lua 'K' and the shard's timers, step by step: a timer is due at the wait's
    recheck time; a permit handed to a waiter whose wake was lost and that passed its
    deadline puts that waiter back at the head and hands it the permit again; one still
    handed is named again (to be woken again); with no limits of record every waiter
    is handed one; a timer is set again while its key has waiters."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            calls = s.store.limits
            await calls.declare({"t": ONE})
            await s.schedule_many([JobSpec(f"r{i}", "t", key="k") for i in range(3)])
            jobs = await _claim_all(s, 2)
            assert await calls.acquire(jobs["r0"], ONE, HOLD_MS) == (ACQUIRED, 0)
            for i in (1, 2):
                assert await calls.acquire(jobs[f"r{i}"], ONE, HOLD_MS) == (PERMIT_WAIT, 0)
            await _wait(s, [jobs["r1"], jobs["r2"]], 300)
            shards = sorted({jobs["r1"].shard, jobs["r2"].shard})
            assert await calls.rechecks_due(shards, 10) == {}  # not before its time
            m0, m1, m2 = (member_of(jobs[f"r{i}"]) for i in range(3))
            handed = await calls.release("t", "k", m0, _holder(jobs["r0"]), lim=ONE, hold_ms=100)
            assert handed == [m1]  # ... and its wake is lost
            await asyncio.sleep(0.4)  # the timers are due, r1's handed permit expired
            due = await calls.rechecks_due(shards, 10)
            assert sorted(due) == shards
            assert all(d[:2] == ("t", "k") for ds in due.values() for d in ds)
            # r1 back at the head and handed the permit again; r2 still waits.
            assert await calls.recheck_many([("t", "k", ONE)], HOLD_MS) == [(1, [m1], [])]
            assert await calls.wake_many([("t", m1)]) == [1]
            # Still handed, not taken: named again (a wake again is harmless: 0 now).
            assert await calls.recheck_many([("t", "k", ONE)], HOLD_MS) == [(1, [], [m1])]
            for shard, ds in due.items():
                left = [(t, k, when, 1) for t, k, when in ds]
                assert await calls.rechecked(shard, 60_000, left) == len(ds)
            assert await calls.rechecks_due(shards, 10) == {}  # set a minute ahead
            # No limits of record any more: the other waiter is handed one too.
            assert await calls.recheck_many([("t", "k", None)], HOLD_MS) == [(0, [m2], [m1])]
            assert await calls.wake_many([("t", m2)]) == [1]
            assert await s.limit_waiting() == {"t": 0}
            client = client_of(s)
            for shard in shards:  # no waiters left: the timers go
                timers = s.keys.shard(shard).rechecks
                ((member, when),) = await client.zrange(timers, 0, -1, withscores=True)
                assert member == b"t\0k"
                assert await calls.rechecked(shard, 60_000, [("t", "k", int(when), 0)]) == 0
                assert await client.zcard(timers) == 0

    run(main())
