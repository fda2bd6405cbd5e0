"""Zoned cron series end to end on real Redis: the missed-run policies across a DST
change, replace=True at run time, and worker processes killed (kill -9) across a
transition. The shard's clock is placed at a real transition (now = max(TIME, clock)),
so no test waits for one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from durable_support import check_all, client_of, open_scheduler, run
from spill_support import WorkerProcess

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


# -- worker processes killed across a transition --------------------------------------------

# Small TTLs: a dead owner's shard moves within ~1.5 s, its leases are reaped soon after.
OPTIONS = (
    "--shards", "1", "--owner-ttl", "1.0", "--lease", "1.5", "--lookahead", "0.5",
    "--reap-interval", "0.2", "--poll-interval", "0.05", "--drain-timeout", "2",
)  # fmt: skip
# Every 2 s of minute 59 of hour 1 and minute 0 of hour 3, Paris: 01:59:xx+01 then, after
# the jump, 03:00:xx+02, one series every 2 s of real time through 2030-03-31 01:00Z. Read
# in UTC, it would not fire before 01:00Z at all.
SECONDS_EXPR = "*/2 0,59 1,3 * * *"


@contextlib.asynccontextmanager
async def virtual_clock(s: Scheduler, start: int) -> AsyncIterator[Callable[[], int]]:
    """Run shard 0's clock from ``start`` at the speed of real time (now = max(TIME,
    clock): set every 10 ms); yields the clock's reading."""
    t0 = time.monotonic()

    def read() -> int:
        return start + int((time.monotonic() - t0) * 1000)

    async def drive() -> None:
        while True:
            await _set_clock(s, read())
            await asyncio.sleep(0.01)

    await _set_clock(s, start)
    task = asyncio.ensure_future(drive())
    try:
        yield read
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def zsink_workers(url: str, namespace: str, count: int) -> AsyncIterator[list[WorkerProcess]]:
    """``count`` started worker processes on ``tz_support``'s registry; any still running
    at exit is killed (by pid)."""
    workers = [
        WorkerProcess(url, namespace, *OPTIONS, registry="tz_support:registry")
        for _ in range(count)
    ]
    try:
        for w in workers:
            w.wait_started()
        yield workers
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()


async def _runs(s: Scheduler, prefix: str) -> list[tuple[int, int]]:
    got = await client_of(s).lrange(f"{prefix}:runs", 0, -1)
    return [(int(n), int(p)) for n, p in (x.decode().split(":") for x in got)]


def test_killed_owner_across_a_transition_runs_each_occurrence_once(redis_server) -> None:  # type: ignore[no-untyped-def]
    start, end = z(2030, 3, 31, 0, 59, 58), z(2030, 3, 31, 1, 0, 4)
    want = list(range(start, end + 1, 2_000))
    rec = Recurrence.cron_expr(SECONDS_EXPR, tz=PARIS)
    assert [rec.next_after(t - 1, 0) for t in want] == want
    assert Recurrence.cron_expr(SECONDS_EXPR).next_after(start, 0) == z(2030, 3, 31, 1)

    async def main() -> None:
        url = redis_server.url
        async with open_scheduler(url, shards=1, owner_ttl=1.0) as s:
            ns = prefix = s.keys.namespace
            async with zsink_workers(url, ns, 2) as workers:
                client = client_of(s)
                deadline = time.monotonic() + 15
                while not await client.get(s.keys.shard(0).owner):
                    assert time.monotonic() < deadline, "shard 0 never owned"
                    await asyncio.sleep(0.05)
                async with virtual_clock(s, start - 500) as now:
                    await s.schedule(
                        "zk", "zsink", {"sink": prefix}, at=start, cron=SECONDS_EXPR,
                        tz=PARIS, missed="all",
                    )  # fmt: skip
                    # The owner runs 00:59:58 (01:59:58+01); it is killed (kill -9) once it
                    # holds 01:00:00 (the lookahead claims it 0.5 s ahead), before it runs.
                    while not await _runs(s, prefix):
                        assert time.monotonic() < deadline + 10, await _runs(s, prefix)
                        await asyncio.sleep(0.02)
                    victim_pid = (await _runs(s, prefix))[0][1]
                    await asyncio.sleep(max(0, z(2030, 3, 31, 0, 59, 59, 800_000) - now()) / 1000)
                    victim = next(w for w in workers if w.pid == victim_pid)
                    victim.kill()
                    while max((n for n, _ in await _runs(s, prefix)), default=0) < end:
                        assert time.monotonic() < deadline + 25, await _runs(s, prefix)
                        await asyncio.sleep(0.05)
                    runs = await _runs(s, prefix)
        got = sorted({n for n, _ in runs if n <= end})
        assert got == want, runs  # none skipped
        for n in want:  # once each: a second call only of a run the victim had begun
            pids = [p for m, p in runs if m == n]
            assert len(pids) == 1 or (len(pids) == 2 and victim_pid in pids), (n, runs)
        assert {p for n, p in runs if n > z(2030, 3, 31, 1)} - {victim_pid}, runs

    run(main())
