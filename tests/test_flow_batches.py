"""The flow limits' batched calls (issue 35; docs/limits.md, "Costs"): permits taken
and released for many jobs over many keys in limits.lua calls of many jobs (one per
key on a cluster), waits and wakes in waits.lua calls of many jobs per shard. They
decide exactly what one call per job decides, and reply in the order asked. Real
redis-server processes and a Redis Cluster (``redis_url`` is parametrized)."""

from __future__ import annotations

import pytest
from durable_support import open_scheduler, run

from tickwheel.durable import Fenced, Job, JobState, Limits
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, RATE_WAIT, member_of

pytestmark = pytest.mark.redis

ONE = Limits(concurrency=1)
HOLD = 30_000


def _holder(job: Job) -> str:
    return f"{job.epoch}:{job.attempt}"


def test_a_batch_decides_as_one_call_per_job_in_order(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=4) as s:
            calls = s.store.limits
            await calls.declare({"charge": ONE})  # what the metrics' totals count
            # Three keys, their jobs interleaved, in every shard.
            ids = ["a0", "b0", "a1", "c0", "b1", "a2"]
            for job_id in ids:
                await s.schedule(job_id, "charge", key=job_id[0])
            jobs: dict[str, Job] = {}
            for shard in range(4):
                await s.take(shard)
                for job in (await s.claim(shard, lease=30.0)).jobs:
                    jobs[job.id] = job
            two = Limits(concurrency=2)
            lims = {"a": ONE, "b": two, "c": ONE}
            batch = [(jobs[i], lims[i[0]]) for i in ids]
            codes = await calls.acquire_many(batch, HOLD)
            # In the order asked: the first of each key up to its limit is granted.
            assert codes == [
                (ACQUIRED, 0),
                (ACQUIRED, 0),
                (PERMIT_WAIT, 0),
                (ACQUIRED, 0),
                (ACQUIRED, 0),
                (PERMIT_WAIT, 0),
            ]
            for key, running, waiting in (("a", 1, 2), ("b", 2, 0), ("c", 1, 0)):
                state = await s.key_state("charge", key)
                assert (state.running, state.waiting) == (running, waiting), key
            # The waiters go back to due, unspent, one waits.lua call per shard.
            for shard in {jobs[i].shard for i in ("a1", "a2")}:
                waits = [(jobs[i], 60_000, True) for i in ("a1", "a2") if jobs[i].shard == shard]
                await calls.wait_many(shard, waits)
            for waiter in ("a1", "a2"):
                info = await s.get(waiter)
                assert info is not None and info.state is JobState.WAITING
                assert info.when_ms == info.nominal_ms and info.attempt == 1  # in no index
            assert await s.limit_waiting() == {"charge": 2}
            # Releases in one batch: a0's permit goes to a1 (the first waiter); b0's and
            # c0's to nobody. The replies keep the order asked.
            releases = [
                ("charge", "b", member_of(jobs["b0"]), _holder(jobs["b0"]), two),
                ("charge", "a", member_of(jobs["a0"]), _holder(jobs["a0"]), ONE),
                ("charge", "c", member_of(jobs["c0"]), _holder(jobs["c0"]), ONE),
            ]
            handed = await calls.release_many(releases, HOLD)
            assert handed == [[], [member_of(jobs["a1"])], []]
            # a2 is cancelled while it waits: a wake finds it gone (0).
            assert await s.cancel("a2")
            woken = await calls.wake_many([("charge", member_of(jobs["a1"])),
                                           ("charge", member_of(jobs["a2"]))])  # fmt: skip
            assert woken == [1, 0]
            info = await s.get("a1")
            assert info is not None and info.when_ms <= await s.now()
            # Woken, then claimed: the handed permit is its own at its acquire.
            job = next(j for j in (await s.claim(jobs["a1"].shard)).jobs if j.id == "a1")
            assert await calls.acquire_many([(job, ONE)], HOLD) == [(ACQUIRED, 0)]
            state = await s.key_state("charge", "a")
            # a2, cancelled, stays in the waiters until a release hands it a permit (its
            # wake then finds it gone, and the permit goes on).
            assert (state.running, state.waiting, state.handed) == (1, 1, 0)

    run(main())


def test_a_batch_of_rate_waits_books_each_start(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            calls = s.store.limits
            rate = Limits(rate_n=2, rate_ms=60_000)
            for i in range(4):
                await s.schedule(f"r{i}", "hook", key="ep")
            jobs: list[Job] = []
            for shard in range(2):
                await s.take(shard)
                jobs += (await s.claim(shard, lease=30.0)).jobs
            jobs.sort(key=lambda j: j.id)
            codes = await calls.acquire_many([(j, rate) for j in jobs], HOLD)
            assert [c for c, _ in codes] == [ACQUIRED, ACQUIRED, RATE_WAIT, RATE_WAIT]
            # Each waiter has its own start booked, a window after the starts.
            assert all(50_000 < d <= 60_001 for _, d in codes[2:])

    run(main())


def test_a_batch_of_waits_under_a_stale_epoch_is_fenced_and_writes_nothing(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("w", "charge", key="k")
            await s.take(0)
            (job,) = (await s.claim(0, lease=30.0)).jobs
            await s.store.raise_epoch(0, job.epoch + 1)
            with pytest.raises(Fenced):
                await s.store.limits.wait_many(0, [(job, 60_000, True)])
            info = await s.get("w")
            assert info is not None and info.state is JobState.LEASED

    run(main())


def test_batches_load_their_scripts_again_after_a_script_flush(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            calls = s.store.limits
            for i in range(4):
                await s.schedule(f"f{i}", "charge", key="k")
            jobs: list[Job] = []
            for shard in range(2):
                await s.take(shard)
                jobs += (await s.claim(shard, lease=30.0)).jobs
            jobs.sort(key=lambda j: j.id)
            await s.store.client.script_flush()  # as after a restart or a failover
            codes = await calls.acquire_many([(j, ONE) for j in jobs], HOLD)
            assert [c for c, _ in codes] == [ACQUIRED] + [PERMIT_WAIT] * 3
            await s.store.client.script_flush()
            for shard in {j.shard for j in jobs[1:]}:
                await calls.wait_many(
                    shard, [(j, 60_000, True) for j in jobs[1:] if j.shard == shard]
                )
            await s.store.client.script_flush()
            first = jobs[0]
            release = ("charge", "k", member_of(first), _holder(first), ONE)
            assert await calls.release_many([release], HOLD) == [[member_of(jobs[1])]]
            await s.store.client.script_flush()
            assert await calls.wake_many([("charge", member_of(jobs[1]))]) == [1]

    run(main())
