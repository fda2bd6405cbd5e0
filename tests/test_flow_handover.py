"""A released permit handed over to the next waiter (issue 35; docs/limits.md, "How a
limited job runs"): woken.lua wakes the waiter and leases it to the releasing worker in
one call, and the worker starts it on the permit the release handed it, with no second
acquire. The grant is the job's, under a deadline: counted once, freed once, asked
again when it is too old, and left by a worker killed between the release and the
claim for one permit's length at most. Real redis-server and Redis Cluster."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from durable_support import open_scheduler, run

from tickwheel.durable import (
    Fenced,
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
from tickwheel.durable.runtime._loader_stats import LoaderStats
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of

pytestmark = pytest.mark.redis

ONE = Limits(concurrency=1)
FAR = 1e12  # a lease end (loop time) that never comes in a test


def _holder(job: Job) -> str:
    return f"{job.epoch}:{job.attempt}"


async def _one_key(s: Scheduler, n: int) -> dict[str, Job]:
    """``n`` jobs of task ``charge`` on key ``m`` in a one-shard namespace: c0 holds the
    permit, the others wait for it (queued in that order, given back to due)."""
    calls = s.store.limits
    await calls.declare({"charge": ONE})
    for i in range(n):
        await s.schedule(f"c{i}", "charge", key="m")
    await s.take(0)
    jobs = {j.id: j for j in (await s.claim(0, limit=n, lease=30.0)).jobs}
    codes = await calls.acquire_many([(jobs[f"c{i}"], ONE) for i in range(n)], 30_000)
    assert codes == [(ACQUIRED, 0)] + [(PERMIT_WAIT, 0)] * (n - 1)
    await calls.wait_many(0, [(jobs[f"c{i}"], 60_000, True) for i in range(1, n)])
    return jobs


def test_woken_leases_the_handed_waiter_here_and_leaves_the_others(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            calls = s.store.limits
            jobs = await _one_key(s, 4)
            c0 = jobs["c0"]
            handed = await calls.release_many(
                [("charge", "m", member_of(c0), _holder(c0), ONE)], 30_000
            )
            assert handed == [[member_of(jobs["c1"])]]
            epoch = c0.epoch
            with pytest.raises(Fenced):  # a stale epoch writes nothing
                await calls.claim_woken(0, epoch - 1, [("charge", "c1")], 6000, token="t0")
            info = await s.get("c1")  # handed its permit, still waiting: in no index
            assert info is not None and info.state is JobState.WAITING
            assert await calls.waiting(["charge"]) == {"charge": 3}
            codes, batch = await calls.claim_woken(0, epoch, [("charge", "c1")], 6000, token="t1")
            assert codes == [1]
            (job,) = batch.jobs
            assert (job.id, job.key, job.attempt, job.epoch) == ("c1", "m", 1, epoch)
            assert job.due_ms <= batch.now_ms < job.deadline_ms  # never early
            info = await s.get("c1")
            assert info is not None and info.state is JobState.LEASED and info.attempt == 1
            # Sent again with its token (a lost reply): the same lease, nothing more.
            again = await calls.claim_woken(0, epoch, [("charge", "c1")], 6000, token="t1")
            assert again[0] == [1] and [j.id for j in again[1].jobs] == ["c1"]
            state = await s.key_state("charge", "m")
            assert (state.running, state.waiting, state.handed) == (0, 2, 1)
            assert await calls.waiting(["charge"]) == {"charge": 2}  # its wait ended once
            # c1 runs on its grant (holder ""), and its release frees it once: the
            # next waiter gets it. c2 is cancelled meanwhile: woken.lua says 0.
            assert await s.cancel("c2")
            handed = await calls.release_many([("charge", "m", member_of(job), "", ONE)], 30_000)
            assert handed == [[member_of(jobs["c2"])]]
            codes, batch = await calls.claim_woken(
                0, epoch, [("charge", "c2")], 6000, token="t2", forget="t1"
            )
            assert codes == [0] and batch.jobs == []  # a tombstone of the waiters' list
            assert await calls.waiting(["charge"]) == {"charge": 1}
            # Its permit goes on to c3, of a paused task: made due, not leased here (3).
            await s.pause("charge")
            handed = await calls.release_many(
                [("charge", "m", member_of(jobs["c2"]), "", ONE)], 30_000
            )
            assert handed == [[member_of(jobs["c3"])]]
            codes, batch = await calls.claim_woken(0, epoch, [("charge", "c3")], 6000, token="t3")
            assert codes == [3] and batch.jobs == []
            info = await s.get("c3")
            assert info is not None and info.state is JobState.DUE
            assert info.when_ms <= await s.now()
            assert await calls.waiting(["charge"]) == {"charge": 0}

    run(main())


def _registry() -> TaskRegistry:
    reg = TaskRegistry()

    @reg.task(name="charge", concurrency=1)
    async def charge(ctx: TaskContext) -> None:
        return None

    return reg


async def _limiter(s: Scheduler, lease_ms: int) -> tuple[Limiter, list[str], list[set[int]]]:
    """A Limiter of ``charge`` (concurrency 1): the jobs it lets through, and the shards
    it asks to claim at once (its wakes' claims)."""
    lim = Limiter(s, _registry(), LoaderStats(), lease_ms=lease_ms)
    fired: list[str] = []
    claims: list[set[int]] = []
    lim.admit = lambda key, job, end, due: fired.append(job.id)
    lim.claim_now = claims.append
    await lim.start()
    return lim, fired, claims


async def _settle(lim: Limiter) -> None:
    for _ in range(3):  # the gates, then the waits and releases, then the wakes
        await asyncio.sleep(0.05)
        await lim.settle()


def test_a_woken_job_starts_on_its_grant_and_asks_again_once_it_is_old(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            lim, fired, claims = await _limiter(s, lease_ms=2000)
            for i in range(3):
                await s.schedule(f"c{i}", "charge", key="m")
            jobs = {j.id: j for j in (await s.claim(0, limit=3, lease=30.0)).jobs}
            for i in range(3):
                assert lim.gated((0, f"c{i}"), jobs[f"c{i}"], FAR, None)
            await _settle(lim)
            assert fired == ["c0"]  # c1 and c2 wait (their waits written)
            lim.finished(jobs["c0"])  # its permit goes to c1, woken
            await _settle(lim)
            assert claims == [{0}] and (0, "c1") in lim.granted
            (c1,) = [j for j in (await s.claim(0, lease=30.0)).jobs if j.id == "c1"]
            assert not lim.gated((0, "c1"), c1, FAR, None)  # starts now, on its grant
            assert lim.held[(0, "c1")][2] == ""
            state = await s.key_state("charge", "m")
            assert (state.running + state.handed, state.waiting) == (1, 1)  # counted once
            lim.finished(c1)  # frees the grant once: c2 has it
            await _settle(lim)
            state = await s.key_state("charge", "m")
            assert (state.running, state.handed, state.waiting) == (0, 1, 0)
            # c2's grant is older than half a permit (its permit may have run out): it
            # asks again, and its acquire takes the permit under its own holder.
            task, key, _ = lim.granted[(0, "c2")]
            lim.granted[(0, "c2")] = (task, key, asyncio.get_running_loop().time() - 1.0)
            (c2,) = [j for j in (await s.claim(0, lease=30.0)).jobs if j.id == "c2"]
            assert lim.gated((0, "c2"), c2, FAR, None)
            await _settle(lim)
            assert fired == ["c0", "c2"]
            assert lim.held[(0, "c2")][2] == _holder(c2)
            state = await s.key_state("charge", "m")
            assert (state.running, state.handed, state.waiting) == (1, 0, 0)

    run(main())


def test_a_worker_killed_between_release_and_claim_leaks_no_permit_past_its_length(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            calls = s.store.limits
            jobs = await _one_key(s, 3)
            c0 = jobs["c0"]
            hold = 300  # ms: the permit's length (the run's lease)
            await calls.release_many([("charge", "m", member_of(c0), _holder(c0), ONE)], hold)
            # Woken and leased to the releasing worker, which dies there (SIGKILL: no
            # run, no release, no extension): c1 holds a grant and a pre-start lease.
            codes, _ = await calls.claim_woken(
                0, c0.epoch, [("charge", "c1")], hold, token="k", prestart=True
            )
            assert codes == [1]
            c2 = jobs["c2"]
            assert await calls.acquire(c2, ONE, hold) == (PERMIT_WAIT, 0)  # still held
            await asyncio.sleep(hold / 1000 + 0.1)
            # One permit's length later the grant is gone: c2 gets the permit, and c1
            # comes back unspent from its pre-start lease.
            assert await calls.acquire(c2, ONE, hold) == (ACQUIRED, 0)
            await s.reap(0)
            info = await s.get("c1")
            assert info is not None and info.state is JobState.DUE and info.attempt == 1
            state = await s.key_state("charge", "m")
            assert (state.running, state.handed) == (1, 0)
            # The key's slot took the expired grant for one never taken: c1's entry is
            # back at the head of the waiters (before c2's two entries, one from each of
            # its permit calls that queued it: tombstones now). Handed c2's permit, c1
            # is found not waiting (due, unspent): its wake says 0 (the permit goes on).
            assert state.waiting == 3
            out = await calls.release_many([("charge", "m", member_of(c2), _holder(c2), ONE)], hold)
            assert out == [[member_of(jobs["c1"])]]
            assert await calls.wake_many([("charge", member_of(jobs["c1"]))]) == [0]

    run(main())


def test_one_key_runs_one_at_a_time_through_handovers(redis_url: str) -> None:
    """A worker runs 30 jobs of one key at ``concurrency=1``: each run after the first
    starts on the permit the run before it handed over (no acquire of its own), never
    two at once, each once, and no permit is left after the last."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            spans: list[tuple[float, float]] = []
            seen: list[int] = []
            reg = TaskRegistry()

            @reg.task(name="one", concurrency=1)
            async def one(ctx: TaskContext) -> None:
                start = asyncio.get_running_loop().time()
                st = await s.key_state("one", "k")
                seen.append(st.running + st.handed)
                await asyncio.sleep(0.002)
                spans.append((start, asyncio.get_running_loop().time()))

            await s.schedule_many([JobSpec(f"o{i}", "one", key="k") for i in range(30)])
            worker = Worker(s, reg, lookahead=0.0, poll_interval=0.05)
            task = asyncio.ensure_future(worker.run())
            try:
                for _ in range(600):
                    if len(spans) >= 30:
                        break
                    await asyncio.sleep(0.05)
            finally:
                worker.stop()
                await task
            assert len(spans) == 30
            spans.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
            assert seen == [1] * 30  # the permit is counted once, handed or held
            assert worker.loader is not None and worker.loader.stats.limit_wakes == 29
            state = await s.key_state("one", "k")
            assert (state.running, state.handed, state.waiting) == (0, 0, 0)

    run(main())


def test_woken_ends_each_kind_of_wait_as_the_wake_does(redis_url: str) -> None:
    """woken.lua on h-kmem's waiting: a permit waiter with a priority leased here has no
    due or priority entry; one of a paused task goes to due with its priority entry; one
    still leased (its wait in flight) gets the wake its wait then finds; the counts of
    waiting jobs end at zero."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            calls = s.store.limits
            k = s.store.keys.shard(0)
            client = s.store.transport.client
            await calls.declare({"charge": ONE, "other": ONE})
            await s.schedule("c0", "charge", key="m")
            await s.schedule("c1", "charge", key="m", priority=5)
            await s.schedule("o0", "other", key="m")
            await s.schedule("o1", "other", key="m", priority=3)
            await s.schedule("o2", "other", key="m")
            await s.take(0)
            jobs = {j.id: j for j in (await s.claim(0, limit=9, lease=30.0)).jobs}
            order = [("c0", ONE), ("c1", ONE), ("o0", ONE), ("o1", ONE), ("o2", ONE)]
            codes = await calls.acquire_many([(jobs[i], lim) for i, lim in order], 30_000)
            granted = [ACQUIRED, PERMIT_WAIT]
            assert [c for c, _ in codes] == [*granted, *granted, PERMIT_WAIT]
            # c1 and o1 wait (in no index); o2's wait is still in flight (leased).
            await calls.wait_many(0, [(jobs["c1"], 60_000, True), (jobs["o1"], 60_000, True)])
            assert await calls.waiting(["charge", "other"]) == {"charge": 1, "other": 1}
            c0, o0 = jobs["c0"], jobs["o0"]
            handed = await calls.release_many(
                [
                    ("charge", "m", member_of(c0), _holder(c0), ONE),
                    ("other", "m", member_of(o0), _holder(o0), ONE),
                ],
                30_000,
            )
            assert handed == [[member_of(jobs["c1"])], [member_of(jobs["o1"])]]
            await s.pause("other")
            codes, batch = await calls.claim_woken(
                0, c0.epoch, [("charge", "c1"), ("other", "o1")], 6000, token="e1"
            )
            assert codes == [1, 3] and [j.id for j in batch.jobs] == ["c1"]
            assert await client.zscore(k.due, "c1") is None
            assert await client.zscore(k.prio, "c1") is None
            assert await client.zscore(k.due, "o1") is not None  # due now, for a claim
            assert await client.zscore(k.prio, "o1") is not None  # at its priority
            assert await calls.waiting(["charge", "other"]) == {"charge": 0, "other": 0}
            # o2 (still leased) is handed o1's permit: woken.lua says 2, and o2's wait,
            # landing then, makes it due now, not waiting.
            await s.resume("other")
            handed = await calls.release_many(
                [("other", "m", member_of(jobs["o1"]), "", ONE)], 30_000
            )
            assert handed == [[member_of(jobs["o2"])]]
            codes, batch = await calls.claim_woken(
                0, c0.epoch, [("other", "o2")], 6000, token="e2", forget="e1"
            )
            assert codes == [2] and batch.jobs == []
            await calls.wait_many(0, [(jobs["o2"], 60_000, True)])
            info = await s.get("o2")
            assert info is not None and info.state is JobState.DUE
            assert await calls.waiting(["charge", "other"]) == {"charge": 0, "other": 0}

    run(main())


def test_woken_leases_a_waiter_named_twice_once_and_gives_whole_jobs(redis_url: str) -> None:
    """woken.lua writes its leases at the end of the call: a waiter named twice in one
    call (queued twice) is leased once, the second naming finding it leased (2, as a
    wake of a leased job); its rows carry the record as stored (the trailing defaults
    left out: a job without a key, its payload, attempts and timeout) and the jobs are
    the ones a claim would give."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            calls = s.store.limits
            await calls.declare({"charge": ONE})
            await s.schedule("c0", "charge")
            await s.schedule("c1", "charge", {"n": 1}, max_attempts=3)
            await s.schedule("c2", "charge", b"raw", timeout=7.5)
            await s.schedule("c3", "charge", key="m")
            await s.take(0)
            jobs = {j.id: j for j in (await s.claim(0, limit=9, lease=30.0)).jobs}
            codes = await calls.acquire_many([(jobs[f"c{i}"], ONE) for i in range(3)], 30_000)
            assert [c for c, _ in codes] == [ACQUIRED, PERMIT_WAIT, PERMIT_WAIT]
            await calls.wait_many(0, [(jobs["c1"], 60_000, True), (jobs["c2"], 60_000, True)])
            assert await calls.waiting(["charge"]) == {"charge": 2}
            woken = [("charge", "c1"), ("charge", "c1"), ("charge", "c2"), ("charge", "gone")]
            codes, batch = await calls.claim_woken(0, jobs["c0"].epoch, woken, 6000, token="d1")
            assert codes == [1, 2, 1, 0]
            assert [j.id for j in batch.jobs] == ["c1", "c2"]
            assert await calls.waiting(["charge"]) == {"charge": 0}
            for job in batch.jobs:
                was = jobs[job.id]
                assert (job.payload, job.max_attempts, job.attempt) == (
                    was.payload,
                    was.max_attempts,
                    was.attempt,
                )
                assert (job.key, job.timeout_ms, job.bucket) == (
                    was.key,
                    was.timeout_ms,
                    was.bucket,
                )
                assert job.nominal_ms == was.nominal_ms and job.epoch == was.epoch
                info = await s.get(job.id)
                assert info is not None and info.state is JobState.LEASED
            # Sent again with its token: the same reply.
            again = await calls.claim_woken(0, jobs["c0"].epoch, woken, 6000, token="d1")
            assert again[0] == [1, 2, 1, 0] and [j.id for j in again[1].jobs] == ["c1", "c2"]
            assert [j.payload for j in again[1].jobs] == [{"n": 1}, b"raw"]

    run(main())
