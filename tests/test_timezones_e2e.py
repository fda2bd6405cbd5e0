"""Zoned cron series end to end on real Redis: the missed-run policies across a DST
change, replace=True at run time, and worker processes killed (kill -9) across a
transition. The shard's clock is placed at a real transition (now = max(TIME, clock)),
so no test waits for one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from durable_support import check_all, client_of, open_scheduler, run
from spill_support import worker_processes

from tickwheel.durable import JobState, MissedRun, Recurrence, Scheduler, ScheduleStatus

pytestmark = pytest.mark.redis

MIN = 60_000
PARIS = "Europe/Paris"
# Paris springs forward at 2030-03-31 01:00Z (02:00 -> 03:00 local) and falls back at
# 2030-10-27 01:00Z (03:00 -> 02:00 local).
FIXED = "0,30 1-3 * * *"


def z(*a: int) -> int:
    """A UTC instant in ms."""
    return round(datetime(*a, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


async def _set_clock(s: Scheduler, t: int) -> None:
    await client_of(s).set(s.keys.shard(0).clock, t)


async def _drain(s: Scheduler, job_id: str) -> list[int]:
    """Claim and ack until nothing more is due at the shard's now: the nominals run."""
    runs: list[int] = []
    for _ in range(50):
        batch = await s.claim(0, limit=100)
        for job in batch.jobs:
            await s.ack(job)
        runs += [j.nominal_ms for j in batch.jobs]
        info = await s.get(job_id)
        assert info is not None and info.state is JobState.DUE
        if not batch.jobs and info.when_ms > await s.now(0):
            return runs
    raise AssertionError(f"{job_id} never settled: {runs}")


# (name, last run before the downtime, back at, occurrences in between by the rules,
# the next occurrence after the downtime)
SPANS = {
    # Spring forward: 02:00, 02:30 and 03:00 are one run at 03:00+02 (01:00Z).
    "spring": (
        z(2030, 3, 30, 23, 30),
        z(2030, 3, 31, 1, 40),
        [z(2030, 3, 31, 0), z(2030, 3, 31, 0, 30), z(2030, 3, 31, 1), z(2030, 3, 31, 1, 30)],
        z(2030, 3, 31, 23),
    ),
    # Fall back: the repeated 02:00+01 and 02:30+01 (01:00Z, 01:30Z) are not occurrences.
    "fall": (
        z(2030, 10, 26, 23, 30),
        z(2030, 10, 27, 2, 10),
        [z(2030, 10, 27, 0), z(2030, 10, 27, 0, 30), z(2030, 10, 27, 2)],
        z(2030, 10, 27, 2, 30),
    ),
}


@pytest.mark.parametrize("span", sorted(SPANS))
@pytest.mark.parametrize("missed", list(MissedRun))
def test_missed_run_policies_across_a_dst_change(
    redis_url: str, span: str, missed: MissedRun
) -> None:
    last, back, between, resume = SPANS[span]
    rec = Recurrence.cron_expr(FIXED, tz=PARIS)
    # The reference: the rules' occurrences in the downtime, one by one.
    t, want = last, []
    while (t := rec.next_after(t, 0)) < back:
        want.append(t)
    assert want == between and rec.next_after(back, 0) == resume

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await _set_clock(s, last)
            await s.schedule("m", "t", at=last, cron=FIXED, tz=PARIS, missed=missed)
            assert await _drain(s, "m") == [last]
            await _set_clock(s, back)  # the downtime, across the transition
            runs = await _drain(s, "m")
            assert len(runs) == len(set(runs))  # at most once per occurrence
            if missed is MissedRun.ALL:
                assert runs == between  # every one the rules include, in order
            elif missed is MissedRun.ONCE:
                assert runs == [between[0]]  # one run, as the oldest missed occurrence
            else:
                assert runs == []
            info = await s.get("m")
            assert info is not None and info.when_ms == resume
            await _set_clock(s, resume)
            assert await _drain(s, "m") == [resume]
            assert await check_all(s) == {"m": JobState.DUE}

    run(main())


# -- replace=True at run time -------------------------------------------------------------


def test_replace_takes_effect_from_the_next_occurrence_without_a_second_run(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await _set_clock(s, z(2030, 3, 31, 0, 30))
            await s.schedule("r", "t", at=z(2030, 3, 31, 0, 30), cron=FIXED, tz=PARIS)
            batch = await s.claim(0, limit=10)
            (job,) = batch.jobs  # 01:30+01, leased: running
            # A replace while the current occurrence runs is refused (busy), and
            # changes nothing: the running one completes under the rules it ran by.
            res = await s.schedule("r", "t", cron="15 * * * *", tz="Asia/Kolkata", replace=True)
            assert res.status is ScheduleStatus.BUSY
            await s.ack(job)
            info = await s.get("r")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == PARIS and info.when_ms == z(2030, 3, 31, 1)
            # Replaced while due: the next occurrence follows the new rules (Kolkata,
            # +05:30: minute 15 local is minute 45 UTC); the one just run is not run again.
            res = await s.schedule("r", "t", cron="15 * * * *", tz="Asia/Kolkata", replace=True)
            assert res.status is ScheduleStatus.REPLACED
            assert res.when_ms == z(2030, 3, 31, 0, 45)
            await _set_clock(s, z(2030, 3, 31, 0, 45))
            assert await _drain(s, "r") == [z(2030, 3, 31, 0, 45)]
            # Replaced with rules whose first occurrence is the one just run: that
            # occurrence is done, and it is not run a second time.
            res = await s.schedule(
                "r", "t", at=z(2030, 3, 31, 0, 45), cron="45 * * * *", replace=True
            )
            assert res.status is ScheduleStatus.DONE
            assert await _drain(s, "r") == []
            info = await s.get("r")
            assert info is not None and info.recurrence is not None
            assert (info.recurrence.tz, info.when_ms) == ("Asia/Kolkata", z(2030, 3, 31, 1, 45))

    run(main())
