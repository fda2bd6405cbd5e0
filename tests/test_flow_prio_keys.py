"""Flow keys and priorities together (issue 35): a job with both keeps its key in the
claim and its priority through a permit wait (retry.lua mode 3) and the wake that
hands it a permit (wake.lua), so once woken it is claimed at its priority, not in due
order behind the jobs that waited less. Real redis-server and Redis Cluster."""

from __future__ import annotations

import pytest
from durable_support import client_of, open_scheduler, run

from tickwheel.durable import MAX_PRIORITY, JobState, Limits
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of

pytestmark = pytest.mark.redis

LIM = Limits(concurrency=1)
SPAN = 2**49  # the prio index's score per level (lua/_lib.lua: PRIO_SPAN)


def test_a_keyed_job_keeps_its_priority_through_a_permit_wait_and_its_wake(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            calls = s.store.limits
            await calls.declare({"charge": LIM})
            prio_key = s.keys.shard(0).prio
            await s.schedule("c0", "charge", key="m1", priority=3)
            await s.schedule("c1", "charge", key="m1", priority=7)
            await s.take(0)
            jobs = {job.id: job for job in (await s.claim(0, limit=10, lease=30.0)).jobs}
            assert {j.id: j.key for j in jobs.values()} == {"c0": "m1", "c1": "m1"}
            assert await calls.acquire(jobs["c0"], LIM, 30_000) == (ACQUIRED, 0)
            assert await calls.acquire(jobs["c1"], LIM, 30_000) == (PERMIT_WAIT, 0)
            status, due = await calls.wait(jobs["c1"], 60_000, permit=True)
            assert status == 3
            info = await s.get("c1")
            assert info is not None and (info.key, info.priority) == ("m1", 7)
            assert info.state is JobState.WAITING and info.attempt == 1  # spent nothing
            assert info.when_ms == info.nominal_ms < due  # in no index: its nominal due
            assert await client_of(s).zscore(prio_key, "c1") is None  # nor in the priorities
            # Due before c1 is woken: one of a lower priority, one without any.
            await s.schedule("mid", "other", priority=5)
            await s.schedule("plain", "other")
            member = member_of(jobs["c0"])
            holder = f"{jobs['c0'].epoch}:{jobs['c0'].attempt}"
            handed = await calls.release("charge", "m1", member, holder, lim=LIM, hold_ms=30_000)
            assert handed == [member_of(jobs["c1"])]
            assert await calls.wake("charge", handed[0]) == 1
            now = await s.now()
            score = await client_of(s).zscore(prio_key, "c1")  # its entry followed it
            assert score is not None
            level, woken_due = divmod(int(score), SPAN)
            assert level == MAX_PRIORITY - 7 and woken_due <= now
            batch = await s.claim(0, limit=2, lease=30.0)
            assert all(j.due_ms <= batch.now_ms for j in batch.jobs)  # never early
            assert [j.id for j in batch.jobs] == ["c1", "mid"]  # by priority, then due
            assert batch.jobs[0].key == "m1"

    run(main())
