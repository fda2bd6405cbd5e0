"""The rate limit's bookings (issue 35; docs/limits.md, "What is guaranteed"): a job
over its key's rate is booked a start, after the starts and bookings before it, and
made due at it. A waiter that comes for its booked start while the window is still
full (the grants before it lagged their bookings, or it fired a little early) keeps its
place: it is booked again for its own start or for the instant the window leaves room,
never behind the bookings made after it (that cost a whole window per lag: 40 jobs at
10 a second ended at 4 s, not 3). The times checked are the key slot's own (the
starts and bookings as limits.lua wrote them), not this machine's; where a scene needs
the clock to move, a stall of this machine shows in Redis's replies and the scene is
played again. Real redis-server processes and a Redis Cluster (``redis_url`` is
parametrized)."""

from __future__ import annotations

import asyncio

import pytest
from durable_support import open_scheduler, run

from tickwheel.durable import Job, Limits, Scheduler
from tickwheel.durable.store import ACQUIRED, RATE_WAIT

pytestmark = pytest.mark.redis

HOLD = 30_000


async def _claimed(s: Scheduler, n: int, shards: int, key: str = "ep") -> list[Job]:
    """``n`` jobs <key>.0.. of task "hook" on ``key``, scheduled due now and claimed, in
    order."""
    for i in range(n):
        await s.schedule(f"{key}.{i}", "hook", key=key)
    jobs: list[Job] = []
    for shard in range(shards):
        await s.take(shard)
        jobs += (await s.claim(shard, lease=30.0)).jobs
    return sorted(jobs, key=lambda j: int(j.id.rpartition(".")[2]))


async def _scores(s: Scheduler, which: int, key: str = "ep") -> dict[int, float]:
    """limits.lua's starts (``which`` 3) or bookings (4) of ("hook", ``key``), by the
    job's number."""
    zset = s.keys.limit_keys("hook", key)[which]
    raw = await s.store.client.zrange(zset, 0, -1, withscores=True)
    return {int(m.decode().split("|")[1].rpartition(".")[2]): float(v) for m, v in raw}


def test_an_early_rate_waiter_keeps_its_booked_start(redis_url: str) -> None:
    """2 starts a minute: jobs 0 and 1 start, 2 and 3 are booked a window later, 4 and
    5 a window after that. Job 2 fired again before its start (the wheel fires by its
    estimate of Redis's clock) waits again for the very start it had, ahead of 4."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            rate = Limits(rate_n=2, rate_ms=60_000)
            jobs = await _claimed(s, 6, 2)
            codes = await s.store.limits.acquire_many([(j, rate) for j in jobs], HOLD)
            assert [c for c, _ in codes] == [ACQUIRED] * 2 + [RATE_WAIT] * 4
            booked = await _scores(s, 4)
            starts = await _scores(s, 3)
            assert booked[2] == booked[3] == starts[1] + 60_001
            assert booked[4] == booked[5] == booked[2] + 60_001

            before = (await s.key_state("hook", "ep")).now_ms
            (again,) = await s.store.limits.acquire_many([(jobs[2], rate)], HOLD)
            after = (await s.key_state("hook", "ep")).now_ms
            assert again[0] == RATE_WAIT
            assert (await _scores(s, 4)) == booked  # its place kept, nothing moved
            # Due at its own start again (not a window later).
            assert booked[2] - after <= again[1] <= booked[2] - before

    run(main())


@pytest.mark.slow  # waits on the key's clock, 1.5 s a scene
def test_a_rate_waiter_after_a_late_grant_is_booked_when_the_window_frees(
    redis_url: str,
) -> None:
    """1 start a second: job 0 starts; 1, 2 and 3 are booked a window apart. Job 1 is
    granted half a window late; job 2 comes at its booked start and finds the window
    still full of 1's start: it is booked again for the instant 1's start leaves the
    window (never sooner), not behind 3 (that was 3's start plus a window). A stall
    of this machine past half a window (1 granted past its booking's window, or 2 too
    late to find the window full) is seen in Redis's replies and the scene is played
    again on another key."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            rate = Limits(rate_n=1, rate_ms=1000)
            calls = s.store.limits
            for attempt in range(3):
                key = f"ep{attempt}"
                jobs = await _claimed(s, 4, 2, key)
                codes = await calls.acquire_many([(j, rate) for j in jobs], HOLD)
                assert [c for c, _ in codes] == [ACQUIRED] + [RATE_WAIT] * 3
                booked = await _scores(s, 4, key)
                assert booked[1] < booked[2] < booked[3]
                await _until_clock(s, key, booked[1] + 500)
                (late,) = await calls.acquire_many([(jobs[1], rate)], HOLD)
                await _until_clock(s, key, booked[2])
                (code, delay), *_ = await calls.acquire_many([(jobs[2], rate)], HOLD)
                again = await _scores(s, 4, key)
                came = again.get(2, 0) - delay  # the call's now, by the key's clock
                if late[0] != ACQUIRED or code != RATE_WAIT or came > booked[2] + 1000:
                    continue  # stalled past a margin: played again
                granted = (await _scores(s, 3, key))[1]
                assert granted > booked[1]
                assert again[2] == granted + 1001  # the instant the window leaves room
                assert came >= booked[2]  # it came at its booked start
                assert again[3] == booked[3]  # 3 keeps its own booking
                return
            raise AssertionError("three stalls in a row past half a second")

    run(main())


async def _until_clock(s: Scheduler, key: str, ms: float) -> None:
    """Until the clock of ("hook", ``key``)'s slot is at or past ``ms`` (at most 30 s)."""
    for _ in range(3000):
        if (await s.key_state("hook", key)).now_ms >= ms:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the key's clock never reached {ms}")
