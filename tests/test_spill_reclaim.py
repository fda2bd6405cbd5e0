"""A job whose pre-start lease ran out while its run's end (its ack, or its retry) was
being written: the reaper puts it back in due at the same attempt, and the next claim
returns it to the same worker. That write settles the new lease too (same epoch,
attempt and occurrence), so the job must not run again, whichever of the two replies
(the claim's, the write's) the worker reads first.

The order is made, not waited for: the write is held back until the store has run the
claim, and the claim's reply is handed over before or after the write's. No stall, no
real lease running out (the shard's clock is pushed past it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.durable_support import check_all, open_scheduler, push_clock, run
from tests.spill_support import until
from tickwheel.durable import JobState, Loader, TaskContext, TaskRegistry
from tickwheel.wheel import TimingWheel

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("end", ["ack", "retry"])
@pytest.mark.parametrize("end_reply", ["before-claim-reply", "after-claim-reply"])
def test_a_reclaimed_lease_that_its_run_settled_does_not_run_again(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch, end: str, end_reply: str
) -> None:
    calls: list[str] = []
    reg = TaskRegistry()

    @reg.task(name="note")
    async def note(ctx: TaskContext) -> None:
        calls.append(ctx.job_id)
        if end == "retry":
            raise RuntimeError("fails: its retry is written")

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1, owner_ttl=30.0) as s:
            await s.take(0)
            # A pre-start lease of 5 s: the handler returns long before its start is
            # marked (an extension 1.25 s in), so the lease stays an unstarted one.
            loader = Loader(s, reg, TimingWheel(), lookahead=0.0, lease=10.0, start_margin=5.0)
            # Leases has slots: its class is patched (for this test only).
            leases = type(s.leases)
            name = "ack_many" if end == "ack" else "retry"
            real_write, real_claim = getattr(leases, name), leases.claim
            write_may_go = asyncio.Event()

            async def held_write(self: Any, *args: Any, **kwargs: Any) -> Any:
                await write_may_go.wait()
                return await real_write(self, *args, **kwargs)

            monkeypatch.setattr(leases, name, held_write)
            await s.schedule("j", "note", max_attempts=3)
            assert not await loader.load_once()
            # It ran; its ack (or retry) waits.
            assert await until(lambda: calls == ["j"] and loader.running == 1, 10), calls

            # The pre-start lease runs out (by the shard's clock) before the write
            # reaches the store: the reaper returns the job to due, at the same attempt.
            await push_clock(s, 0, 60_000)
            reaped = await s.reap(0)
            assert reaped.requeued == ["j"]

            async def claim_then_ack(self: Any, *args: Any, **kwargs: Any) -> Any:
                batch = await real_claim(self, *args, **kwargs)  # the store runs it...
                assert [job.id for job in batch.jobs] == ["j"]
                write_may_go.set()  # ...then the write, which settles the claim's lease
                if end_reply == "before-claim-reply":
                    done = loader.stats
                    assert await until(lambda: done.succeeded + done.retried == 1, 10)
                return batch

            monkeypatch.setattr(leases, "claim", claim_then_ack)
            await loader.load_once()
            assert loader.loaded == 0  # the claimed copy is not placed: the write holds it
            assert await until(lambda: loader.running == 0, 10)
            await asyncio.sleep(0)  # a copy fired now would have started by then
            assert calls == ["j"]
            stats = loader.stats
            assert stats.claimed == 2 and stats.fired == 1 and stats.lease_lost == 0
            if end == "ack":
                assert stats.succeeded == 1
                assert await check_all(s) == {}  # acked: nothing leased, nothing due
            else:
                assert stats.retried == 1
                assert await check_all(s) == {"j": JobState.DUE}  # at its next attempt
                info = await s.get("j")
                assert info is not None and info.attempt == 2
            loader.close()

    run(main())
