"""Issue 42, findings 5 and 7: a recurring series faster than the claim cycle runs under
every missed-run policy; catch-up is capped and cheap; cron text is bounded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run
from tests.spill_support import running_worker
from tickwheel.durable import Recurrence, TaskContext, TaskRegistry
from tickwheel.durable.model import _recurrence
from tickwheel.durable.model._recurrence import MAX_CATCH_UP, MAX_CRON_CHARS

NOW = 1_700_000_000_000  # ms, a round second
DAY = 86_400_000


@pytest.mark.redis
@pytest.mark.parametrize(
    ("every", "missed"), [(0.1, "skip"), (0.001, "all"), (0.001, "skip"), (0.01, "once")]
)
def test_a_series_faster_than_the_claim_cycle_runs(
    redis_url: str, every: float, missed: str
) -> None:
    runs: list[tuple[str, int, float]] = []  # (job id, nominal ms, wall ms at the run)
    reg = TaskRegistry()

    @reg.task(name="tick")
    async def tick(ctx: TaskContext) -> None:
        runs.append((ctx.job_id, ctx.nominal_ms, time.time() * 1000))

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            async with running_worker(s, reg):  # the default claim cycle (0.1 s polls)
                await s.schedule("series", "tick", every=every, missed=missed)
                await asyncio.sleep(3)
            await s.cancel("series")

    run(main())
    assert len(runs) >= 5, runs  # it ran 0 times in 8 s before
    keys = [(job_id, nominal) for job_id, nominal, _ in runs]
    assert len(set(keys)) == len(keys), keys  # each run a distinct occurrence
    nominals = [nominal for _, nominal, _ in runs]
    assert nominals == sorted(nominals)
    # never early: Redis and this process share the host's clock (1 ms of rounding)
    assert all(at >= nominal - 1 for _, nominal, at in runs), runs


def test_max_catch_up_has_a_ceiling() -> None:
    Recurrence.interval(1, missed="all", max_catch_up=MAX_CATCH_UP)
    with pytest.raises(ValueError, match="max_catch_up"):
        Recurrence.interval(1, missed="all", max_catch_up=MAX_CATCH_UP + 1)
    with pytest.raises(ValueError, match="max_catch_up"):
        Recurrence.cron_expr("* * * * *", missed="all", max_catch_up=10**9)


def test_cron_text_has_a_length_limit() -> None:
    minutes = ",".join(str(i % 60) for i in range(400))  # valid, 1,089 characters
    expr = f"{minutes} * * * *"
    assert len(expr) > MAX_CRON_CHARS
    with pytest.raises(ValueError, match="cron must be at most 1000 characters"):
        Recurrence.cron_expr(expr)
    short = ",".join(str(i) for i in range(60)) + " * * * *"
    assert Recurrence.cron_expr(short).cron == short


class _Counting:
    """CronSim, counting the steps taken through every instance."""

    steps = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._it = _REAL_CRONSIM(*args, **kwargs)

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        _Counting.steps += 1
        return next(self._it)


_REAL_CRONSIM = _recurrence.CronSim


def _catch_up_steps(monkeypatch: pytest.MonkeyPatch, rec: Recurrence, behind_ms: int) -> list[int]:
    """Claim after claim of a series ``behind_ms`` behind at a fixed now, as a worker
    would while it catches up: the cron steps each claim took."""
    monkeypatch.setattr(_recurrence, "CronSim", _Counting)
    steps: list[int] = []
    nominal = NOW - behind_ms
    for _ in range(200):
        before = _Counting.steps
        plan = rec.plan(nominal, NOW)
        steps.append(_Counting.steps - before)
        assert plan.deliver
        nominal = plan.next_due_ms
    return steps


def test_catch_up_of_a_dense_cron_within_its_cap_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    # A run a second, 9,000 behind, cap 10,000: every claim runs one; it cost ~9,000
    # steps a claim (the missed runs counted again from the start), O(n^2) in all.
    rec = Recurrence.cron_expr("* * * * * *", missed="all", max_catch_up=MAX_CATCH_UP)
    steps = _catch_up_steps(monkeypatch, rec, 9_000_000)
    assert max(steps) <= 10, steps[:5]


def test_a_dense_cron_days_behind_costs_at_most_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two days behind (172,800 runs), capped: the first claim jumps, the rest are O(1).
    rec = Recurrence.cron_expr("* * * * * *", missed="all", max_catch_up=MAX_CATCH_UP)
    steps = _catch_up_steps(monkeypatch, rec, 2 * DAY)
    assert steps[0] <= 2 * MAX_CATCH_UP + 10
    assert max(steps[1:]) <= 10, steps[:5]
