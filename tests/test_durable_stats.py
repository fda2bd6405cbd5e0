"""Scheduler.stats() counts where things happen; the wheel's stats count cancels and
wake-up lateness."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from tests.durable_support import client_of, open_scheduler, push_clock, run, unique_ns
from tickwheel.durable import Fenced, JobSpec, LeaseLost
from tickwheel.durable.model._stats import LatenessHistogram


@pytest.mark.redis
def test_scheduler_counts_claims_acks_retries_reaps_dedup_fencing_and_moves(
    redis_url: str,
) -> None:
    async def main() -> None:
        ns = unique_ns()
        async with (
            open_scheduler(redis_url, ns, shards=1) as a,
            open_scheduler(redis_url, ns, shards=1) as b,
        ):
            await a.schedule_many([JobSpec(f"j{i}", "t", max_attempts=1) for i in range(3)])
            await a.schedule("slow", "t", max_attempts=2)
            assert await a.take(0) and await a.take(0)  # a second take is no move
            batch = await a.claim(0, limit=3)
            await a.ack_many(batch.jobs[:1])
            await a.retry(batch.jobs[1], "x")  # last attempt: dead
            await a.retry(batch.jobs[2], "x", final=True)
            (slow,) = (await a.claim(0, lease=0.001)).jobs
            await push_clock(a, 0, 1000)
            assert (await a.reap(0)).requeued == ["slow"]
            with pytest.raises(LeaseLost):
                await a.ack(slow)  # late, but records the occurrence as done
            assert (await a.claim(0)).jobs == []  # the reaped copy: dropped by dedup
            st = a.stats()
            assert (st.claim_calls, st.claimed, st.acked, st.ack_lost) == (3, 4, 1, 1)
            assert (st.retries, st.dead_letters, st.reaped, st.dedup_dropped) == (0, 2, 1, 1)
            assert (st.shards_taken, st.fenced, st.shards_lost) == (1, 0, 0)
            # b takes the shard once a's token is gone: a is fenced out and loses it.
            await client_of(a).delete(a.keys.shard(0).owner)
            assert await b.take(0)
            with pytest.raises(Fenced):
                await a.claim(0)
            st = a.stats()
            assert (st.fenced, st.shards_lost, st.shards_given_back) == (1, 1, 0)
            await b.close()
            assert b.stats().shards_given_back == 1 and b.stats().shards_taken == 1
            assert a.stats().as_dict()["claim_calls"] == 3

    run(main())


def test_wheel_stats_count_cancels_and_wakeup_lateness(wheel_impl: types.SimpleNamespace) -> None:
    """stats() counts fired and cancelled timers, and how late the loop woke the wheel
    past its armed tick (seconds): a loop blocked 100 ms past a 10 ms timer's due time
    wakes it that much late, less the 10 ms and a few ticks of rounding, and no later
    than the time that passed. Twice: the sum holds both wake-ups, the worst the larger."""

    async def main() -> None:
        wheel = wheel_impl.TimingWheel()
        loop = asyncio.get_running_loop()
        start = loop.time()
        bounds: list[float] = []  # per blocked wake-up, how late it was at least
        for n in (1, 2):
            timers = [wheel.schedule(0.01, lambda: None) for _ in range(5)]
            scheduled = loop.time()  # every due time is at most 10 ms after this
            assert timers[0].cancel() and not timers[0].cancel()
            time.sleep(0.1)  # noqa: ASYNC251  (the loop is blocked: no wake-up can run)
            blocked_until = loop.time()
            await asyncio.sleep(0.05)
            st = wheel.stats()
            assert (st.fired, st.cancelled, st.pending) == (4 * n, n, 0)
            # The armed tick is at most the due tick, which rounds up by at most 2 ticks.
            bounds.append(blocked_until - (scheduled + 0.01 + 3 * wheel.tick))
            assert bounds[-1] > 0.08
        st = wheel.stats()
        elapsed = loop.time() - start
        assert st.wakeups >= 2
        assert max(bounds) <= st.wakeup_lateness_max <= elapsed
        # asyncio may run a wake-up up to its clock's resolution early (a hair below 0),
        # never more: the sum is the two blocked ones plus the others, each above -1 ms.
        others = st.wakeup_lateness_sum - sum(bounds)
        assert -0.001 * (st.wakeups - 2) <= others
        assert st.wakeup_lateness_sum <= elapsed * st.wakeups

    asyncio.run(main())


def test_lateness_histogram_buckets() -> None:
    h = LatenessHistogram((0.001, 0.01))
    for x in (-0.001, 0.0005, 0.001, 0.005, 1.0):
        h.observe(x)
    assert h.cumulative() == [("0.001", 3), ("0.01", 4), ("+Inf", 5)]
    assert h.count == 5 and h.early == 1 and h.sum == pytest.approx(1.0055)
    with pytest.raises(ValueError, match="bounds"):
        LatenessHistogram((0.1, 0.01))
