"""Timers: in memory below the threshold, in Redis when durable or long; callbacks stay
in memory and can never be durable."""

from __future__ import annotations

import asyncio

import pytest

from tests.durable_support import open_scheduler, run
from tests.spill_support import until
from tickwheel.durable import JobState, TaskContext, TaskRegistry, Timers

pytestmark = pytest.mark.redis


def _registry(seen: list[TaskContext]) -> TaskRegistry:
    reg = TaskRegistry()

    @reg.task(name="note")
    async def note(ctx: TaskContext) -> None:
        seen.append(ctx)

    return reg


def test_routing_by_threshold_and_flag(redis_url: str) -> None:
    async def main() -> None:
        seen: list[TaskContext] = []
        async with open_scheduler(redis_url, shards=2) as s:
            timers = Timers(s, _registry(seen), threshold=2.0)
            # In memory: counted before any Redis round trip (a busy cluster took more
            # than 50 ms for the two below, and a short timer had fired meanwhile).
            short = await timers.schedule(0.3, "note", {"n": [1, 2]})
            at_threshold = await timers.schedule(2.0, "note", job_id="edge")
            assert len(timers) == 2  # short and edge are in memory
            long = await timers.schedule(2.5, "note", b"raw")
            flagged = await timers.schedule(0.05, "note", durable=True, job_id="flag")
            assert flagged == "flag" and at_threshold == "edge"
            assert await s.get(short) is None and await s.get("edge") is None
            for job_id in (long, flagged):
                info = await s.get(job_id)
                assert info is not None and info.state is JobState.DUE and info.task == "note"
            long_info = await s.get(long)
            assert long_info is not None and long_info.payload == b"raw"
            assert await until(lambda: seen, 3)
            await asyncio.sleep(0.1)  # flagged (durable, due long ago) gets its chance
            # Only the in-memory one ran here: durable ones wait for a worker's loader.
            assert [c.job_id for c in seen] == [short]
            ctx = seen[0]
            assert ctx.payload == {"n": [1, 2]}  # JSON round trip, as a durable payload
            # What would not come back the same is refused in memory as in Redis.
            with pytest.raises(TypeError, match=r"payload\['n'\] is a tuple"):
                await timers.schedule(0.3, "note", {"n": (1, 2)})
            assert (ctx.attempt, ctx.epoch, ctx.durable, ctx.job) == (1, 0, False, None)
            assert await timers.cancel("edge") is True
            assert await timers.cancel(flagged) is True
            assert await s.get(flagged) is None
            assert await timers.cancel("edge") is False
            assert await timers.close() == []

    run(main())


def test_scheduling_an_id_again_keeps_the_pending_timer(redis_url: str) -> None:
    async def main() -> None:
        seen: list[TaskContext] = []
        async with open_scheduler(redis_url, shards=1) as s:
            timers = Timers(s, _registry(seen))
            await timers.schedule(0.05, "note", 1, job_id="same")
            await timers.schedule(0.01, "note", 2, job_id="same")
            assert await until(lambda: seen, 3)
            await asyncio.sleep(0.1)  # the second one, were it kept, would have run too
            assert [c.payload for c in seen] == [1]

    run(main())


def test_callables_stay_in_memory_and_cannot_be_durable(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            timers = Timers(s, TaskRegistry(), threshold=1.0)
            fired: list[int] = []
            t = timers.schedule_callback(0.01, fired.append, 7)
            assert not t.cancelled()
            assert await until(lambda: fired, 3)
            assert fired == [7]

            def fn(ctx: TaskContext) -> None:
                pass

            with pytest.raises(TypeError, match=r"task must be a task name.*schedule_callback"):
                await timers.schedule(0.01, fn, durable=True)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"task must be a task name"):
                await timers.schedule(5.0, fn)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="fn must be callable"):
                timers.schedule_callback(0.01, "note")  # type: ignore[arg-type]
            # An in-memory timer must name a registered task; a durable one need not
            # (a producer may not import the tasks its workers run).
            with pytest.raises(ValueError, match="task 'nope' is not registered"):
                await timers.schedule(0.01, "nope")
            assert await timers.schedule(0.01, "nope", durable=True, job_id="d") == "d"
            with pytest.raises(ValueError, match="delay must be a finite number >= 0"):
                await timers.schedule(-1, "nope", durable=True)
            with pytest.raises(TypeError, match="payload must be bytes or JSON"):
                await timers.schedule(5.0, "nope", object())
            with pytest.raises(TypeError, match="registry must be a TaskRegistry"):
                Timers(s, {})  # type: ignore[arg-type]

    run(main())


def test_close_returns_unfired_in_memory_ids(redis_url: str) -> None:
    """close() cancels the in-memory timers that have not fired and returns their ids:
    past their due time they never run."""

    async def main() -> None:
        seen: list[TaskContext] = []
        async with open_scheduler(redis_url, shards=1) as s:
            timers = Timers(s, _registry(seen))
            await timers.schedule(0.05, "note", job_id="soon")
            await timers.schedule(0.1, "note", job_id="later")
            assert sorted(await timers.close()) == ["later", "soon"]
            assert len(timers) == 0
            # A timer due after both on the same wheel: the wheel fires in due order, so
            # once it ran, the closed ones would have run (and their tasks started) too.
            passed = asyncio.Event()
            timers.wheel.schedule(0.2, passed.set)
            await asyncio.wait_for(passed.wait(), 30)
            await asyncio.sleep(0.05)  # a task started by a firing gets its turn
            assert seen == []
            assert await timers.close() == []

    run(main())
