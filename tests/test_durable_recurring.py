"""Recurring jobs: occurrences, missed-run policies after a downtime, no drift."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.durable_support import check_all, open_scheduler, run
from tickwheel.durable import JobState, MissedRun, Recurrence, Scheduler
from tickwheel.durable.model._recurrence import Plan

MIN = 60_000
HOUR = 3_600_000


def _ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def every(ms: int, missed: str, cap: int = 100, grace_ms: int = 60_000) -> Recurrence:
    return Recurrence.interval(
        ms / 1000, missed=missed, max_catch_up=cap, misfire_grace=grace_ms / 1000
    )


# (recurrence, nominal, now, expected plan)
PLANS = [
    # On time, or a little late within the grace: run it, next from the nominal due.
    (every(MIN, "skip"), 0, 0, Plan(True, MIN, 0)),
    (every(MIN, "skip"), 0, 30_000, Plan(True, MIN, 0)),
    (every(HOUR, "skip"), 0, 59_000, Plan(True, HOUR, 0)),
    # Claimed ahead of time by the lookahead.
    (every(MIN, "once"), 5_000, 0, Plan(True, 65_000, 0)),
    # Late beyond the grace, next one not yet due: missed.
    (every(HOUR, "skip"), 0, 61_000, Plan(False, 0, HOUR)),
    (every(HOUR, "once"), 0, 61_000, Plan(True, HOUR, 0)),
    (every(HOUR, "all"), 0, 61_000, Plan(True, HOUR, 0)),
    # Ten minutes down on a minutely job: 10 missed, the 11th (at 10 min) is on time.
    # skip: the 11th is current (due, within the grace): it runs now, as itself.
    (every(MIN, "skip"), 0, 10 * MIN + 5_000, Plan(True, 11 * MIN, 10 * MIN)),
    (every(MIN, "once"), 0, 10 * MIN + 5_000, Plan(True, 11 * MIN, 0)),
    (every(MIN, "all"), 0, 10 * MIN + 5_000, Plan(True, MIN, 0)),
    # 'all' capped at 3: skip ahead to the third-last missed occurrence, run now as it.
    (every(MIN, "all", cap=3), 0, 10 * MIN + 5_000, Plan(True, 8 * MIN, 7 * MIN)),
    (every(MIN, "all", cap=3), 7 * MIN, 10 * MIN + 5_000, Plan(True, 8 * MIN, 0)),
    # Grace above the period: missed once the next occurrence is due.
    (every(1_000, "skip"), 0, 30_500, Plan(True, 31_000, 30_000)),
    (every(1_000, "skip"), 30_000, 30_500, Plan(True, 31_000, 0)),
    # Cron, daily at 09:00 UTC.
    (
        Recurrence.cron_expr("0 9 * * *", missed="skip"),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 1, 9, 0, 30),
        Plan(True, _ms(2024, 1, 2, 9), 0),
    ),
    (
        Recurrence.cron_expr("0 9 * * *", missed="skip"),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 4, 10),
        Plan(False, 0, _ms(2024, 1, 5, 9)),
    ),
    (
        Recurrence.cron_expr("0 9 * * *", missed="once"),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 4, 10),
        Plan(True, _ms(2024, 1, 5, 9), 0),
    ),
    (
        Recurrence.cron_expr("0 9 * * *", missed="all", max_catch_up=2),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 4, 10),
        Plan(True, _ms(2024, 1, 4, 9), _ms(2024, 1, 3, 9)),
    ),
    (
        Recurrence.cron_expr("0 9 * * *", missed="all", max_catch_up=5),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 4, 10),
        Plan(True, _ms(2024, 1, 2, 9), 0),
    ),
    (
        Recurrence.cron_expr("*/10 * * * * *", missed="skip"),
        _ms(2024, 1, 1, 9),
        _ms(2024, 1, 1, 9, 5, 5),
        Plan(True, _ms(2024, 1, 1, 9, 5, 10), _ms(2024, 1, 1, 9, 5)),
    ),
]


@pytest.mark.parametrize(("rec", "nominal", "now", "expected"), PLANS)
def test_plan_table(rec: Recurrence, nominal: int, now: int, expected: Plan) -> None:
    assert rec.plan(nominal, now) == expected


def test_cron_occurrences_are_strict_and_inclusive() -> None:
    rec = Recurrence.cron_expr("0 9 * * *")
    nine = _ms(2024, 1, 1, 9)
    assert rec.next_after(nine, nine) == _ms(2024, 1, 2, 9)
    assert rec.next_after(nine - 1, nine) == nine
    assert rec.last_at_or_before(nine, 0) == nine
    assert rec.last_at_or_before(nine - 1, 0) == _ms(2023, 12, 31, 9)
    assert rec.prev(nine, 2) == _ms(2023, 12, 30, 9)


@pytest.mark.parametrize(
    "bad", ["", "* * *", "61 * * * *", "* * 31 2 *", "nope nope nope nope nope"]
)
def test_malformed_cron_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cron"):
        Recurrence.cron_expr(bad)


async def _claim_all(s: Scheduler) -> list[tuple[str, int]]:
    batch = await s.claim(0, limit=1000)
    for job in batch.jobs:
        await s.ack(job)
    return [(j.id, j.nominal_ms) for j in batch.jobs]


def test_interval_never_drifts(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            start = await s.now(0) + 10
            await s.schedule("tick", "t", at=start, every=60)
            runs = []
            for _ in range(5):
                # Each run happens 7 s late (within the grace): the next is still on the grid.
                info = await s.get("tick")
                assert info is not None
                await push_clock_to(s, info.when_ms + 7_000)
                runs += await _claim_all(s)
            assert [n for _, n in runs] == [start + i * MIN for i in range(5)]

    run(main())


async def push_clock_to(s: Scheduler, t: int) -> None:
    from tests.durable_support import client_of

    await client_of(s).set(s.keys.shard(0).clock, t)


@pytest.mark.parametrize(
    ("missed", "expected_runs", "resume_offset"),
    [
        # Down 10 min (the job is minutely, grace 1 s) then up at +10 min 30 s.
        (MissedRun.ONCE, [0], 11),
        (MissedRun.ALL, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 11),
        (MissedRun.SKIP, [], 11),
    ],
)
def test_missed_run_policies_after_downtime(
    redis_url: str, missed: MissedRun, expected_runs: list[int], resume_offset: int
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            start = await s.now(0) + 1
            await s.schedule("m", "t", at=start, every=60, missed=missed, misfire_grace=1)
            await push_clock_to(s, start + 10 * MIN + 30_000)  # the downtime
            runs: list[int] = []
            for _ in range(20):  # claim until nothing more is due now
                got = await _claim_all(s)
                runs += [(n - start) // MIN for _, n in got]
                info = await s.get("m")
                assert info is not None and info.state is JobState.DUE
                if not got and info.when_ms > await s.now(0):
                    break
            assert runs == expected_runs
            info = await s.get("m")
            assert info is not None
            assert info.when_ms == start + resume_offset * MIN
            assert await check_all(s) == {"m": JobState.DUE}

    run(main())


def test_all_policy_is_capped(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            start = await s.now(0) + 1
            await s.schedule(
                "c", "t", at=start, every=60, missed="all", max_catch_up=3, misfire_grace=1
            )
            await push_clock_to(s, start + 100 * MIN + 30_000)
            runs: list[int] = []
            for _ in range(10):
                runs += [(n - start) // MIN for _, n in await _claim_all(s)]
            assert runs == [98, 99, 100]  # the last three missed (100 is 30 s late: missed too)

    run(main())


def test_cron_job_runs_and_reinserts_next_occurrence(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            res = await s.schedule("cr", "t", cron="*/10 * * * * *", missed="skip")
            assert res.when_ms % 10_000 == 0
            assert res.when_ms > await s.now(0) - 1
            await push_clock_to(s, res.when_ms)
            runs = await _claim_all(s)
            assert runs == [("cr", res.when_ms)]
            info = await s.get("cr")
            assert info is not None and info.when_ms == res.when_ms + 10_000
            assert info.recurrence is not None and info.recurrence.cron == "*/10 * * * * *"
            # Down for a minute and a bit: skip drops the missed runs; the current one
            # (+70 s, 5 s late: within the grace) runs now, as itself.
            await push_clock_to(s, res.when_ms + 75_000)
            assert await _claim_all(s) == [("cr", res.when_ms + 70_000)]
            info = await s.get("cr")
            assert info is not None and info.when_ms == res.when_ms + 80_000
            assert await check_all(s) == {"cr": JobState.DUE}

    run(main())


def test_recurring_retry_keeps_the_occurrence(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, retry_base=0) as s:
            await s.take(0)
            start = await s.now(0)
            await s.schedule("rr", "t", at=start, every=60)
            (job,) = (await s.claim(0)).jobs
            await s.retry(job, "e")
            (job2,) = (await s.claim(0)).jobs
            assert job2.nominal_ms == start and job2.attempt == 2
            assert job2.next_due_ms == start + MIN
            await s.ack(job2)
            info = await s.get("rr")
            assert info is not None and info.when_ms == start + MIN and info.attempt == 1

    run(main())
