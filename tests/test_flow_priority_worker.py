"""Priorities through a running worker (issue 35): a backlog of low-priority jobs is
being worked through when high-priority ones become due; the high ones start before
the rest of the backlog, after at most the jobs the worker already held (docs/durable.md,
"Inside a worker": its ``max_running`` claimed-but-waiting jobs and one claim's
``limit``). Every job runs once. Real redis-server and Redis Cluster."""

from __future__ import annotations

import asyncio

import pytest
from durable_support import open_scheduler, run

from tickwheel.durable import JobSpec, TaskContext, TaskRegistry, Worker

pytestmark = pytest.mark.redis

LOW = 60
HIGH = 5
MAX_RUNNING = 2
LIMIT = 4
FAST = {"lease": 5.0, "lookahead": 0.2, "poll_interval": 0.05, "reap_interval": 0.5}


def test_high_priorities_due_mid_backlog_start_before_the_rest_of_it(redis_url: str) -> None:
    async def main() -> None:
        starts: list[str] = []
        three_started = asyncio.Event()
        all_ran = asyncio.Event()
        reg = TaskRegistry()

        @reg.task(name="job")
        async def job(ctx: TaskContext) -> None:
            starts.append(ctx.job_id)
            if len(starts) == 3:
                three_started.set()
            await asyncio.sleep(0.02)
            if len(starts) == LOW + HIGH:
                all_ran.set()

        async with open_scheduler(redis_url, shards=1) as s:
            now = await s.now(0)
            await s.schedule_many(
                JobSpec(f"low{i:02}", "job", at=now - 1000 + i) for i in range(LOW)
            )
            worker = Worker(s, reg, max_running=MAX_RUNNING, limit=LIMIT, **FAST)
            task = asyncio.ensure_future(worker.run())
            try:
                await asyncio.wait_for(three_started.wait(), 30)
                before = len(starts)
                await s.schedule_many(JobSpec(f"high{i}", "job", priority=9) for i in range(HIGH))
                await asyncio.wait_for(all_ran.wait(), 60)
            finally:
                worker.stop()
                await asyncio.wait_for(task, 30)

        assert sorted(starts) == sorted(
            [f"low{i:02}" for i in range(LOW)] + [f"high{i}" for i in range(HIGH)]
        )
        last_high = max(starts.index(f"high{i}") for i in range(HIGH))
        # Low jobs that started after the high ones were scheduled and before the last
        # high one: only those the worker already held (running, claimed and waiting for
        # a slot, one claim in flight), never the rest of the backlog.
        held = [j for j in starts[before:last_high] if j.startswith("low")]
        assert len(held) <= 2 * MAX_RUNNING + LIMIT, (held, starts)
        lows = [j for j in starts if j.startswith("low")]
        # The backlog itself ran in due order around them.
        assert lows == sorted(lows)

    run(main())
