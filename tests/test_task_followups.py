"""Follow-up jobs from a handler: the TaskContext carries the worker's scheduler, a chain
runs with an id per occurrence, and re-scheduling the running job's own id is logged."""

from __future__ import annotations

import logging

import pytest
from durable_support import open_scheduler, run
from spill_support import running_worker, until

from tickwheel.durable import ScheduleResult, ScheduleStatus, TaskContext, TaskRegistry


def test_a_chain_with_an_id_per_occurrence_runs_to_its_end(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    seen: list[int] = []
    results: list[ScheduleResult] = []
    reg = TaskRegistry()

    async def main() -> None:
        async with open_scheduler(url, shards=2) as s:

            @reg.task(name="step")
            async def step(ctx: TaskContext) -> None:
                assert ctx.scheduler is s  # the worker's own producer, no global
                n = ctx.payload["n"]
                seen.append(n)
                if n < 3:
                    results.append(await ctx.schedule(f"chain:{n + 1}", "step", {"n": n + 1}))

            await s.schedule("chain:0", "step", {"n": 0})
            async with running_worker(s, reg):
                assert await until(lambda: len(seen) == 4, 10)

    run(main())
    assert seen == [0, 1, 2, 3]
    assert [r.status for r in results] == [ScheduleStatus.CREATED] * 3


def test_rescheduling_the_running_id_is_kept_and_logged_once(
    redis_server: object, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    statuses: list[ScheduleStatus] = []
    reg = TaskRegistry()

    async def main() -> None:
        async with open_scheduler(url, shards=2) as s:

            @reg.task(name="followups.loop")
            async def loop(ctx: TaskContext) -> None:
                # The mistake: the running job's own id. It is leased: nothing is written.
                result = await ctx.schedule(ctx.job_id, "followups.loop", delay=60)
                statuses.append(result.status)
                busy = await ctx.schedule(ctx.job_id, "followups.loop", delay=60, replace=True)
                statuses.append(busy.status)

            await s.schedule("a", "followups.loop")
            await s.schedule("b", "followups.loop")
            async with running_worker(s, reg):
                assert await until(lambda: len(statuses) == 4, 10)
            # Both ran once and the chain ended: nothing of them is left.
            assert await s.get("a") is None and await s.get("b") is None

    with caplog.at_level(logging.WARNING, logger="tickwheel.durable.tasks"):
        run(main())
    assert sorted(statuses) == sorted([ScheduleStatus.KEPT, ScheduleStatus.BUSY] * 2)
    warnings = [r for r in caplog.records if "its own job id" in r.getMessage()]
    assert len(warnings) == 1  # once per task name
    assert "give each occurrence its own id" in warnings[0].getMessage()


def test_a_context_without_a_scheduler_says_so() -> None:
    ctx = TaskContext("id", "t", b"", 1_000, 1, 0, False)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="no scheduler"):
            await ctx.schedule("next", "t")

    run(main())
