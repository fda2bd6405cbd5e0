"""The time bound of single script calls (store/_bound.py): exact, never early, and
only its own cancel becomes a timeout."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from tickwheel.durable.store._bound import Bound

T = TypeVar("T")


class Expired(Exception):
    """What the caller raises for its own bound (the store's RedisUnavailable)."""


async def bounded(bound: Bound, aw: Awaitable[T]) -> T:
    """The pattern Transport._run follows."""
    task = bound.enter()
    try:
        return await aw
    except asyncio.CancelledError:
        if bound.expired(task):
            raise Expired from None
        raise
    finally:
        bound.leave(task)


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan])
def test_the_length_must_be_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match="seconds must be > 0"):
        Bound(seconds)


def test_a_call_past_its_bound_expires_at_its_deadline_never_before() -> None:
    async def main() -> float:
        bound = Bound(0.2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(Expired):
            await bounded(bound, asyncio.sleep(30))
        elapsed = loop.time() - start
        assert len(bound) == 0
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        # The same bound serves the next call, which ends in time.
        assert await bounded(bound, asyncio.sleep(0, "ok")) == "ok"
        return elapsed

    elapsed = asyncio.run(main())
    assert elapsed >= 0.2
    assert elapsed < 5.0  # a loaded machine's latency, not a second bound


def test_calls_in_flight_expire_each_at_its_own_deadline() -> None:
    async def main() -> None:
        bound = Bound(0.3)
        loop = asyncio.get_running_loop()
        ends: dict[str, float] = {}

        async def call(name: str, seconds: float) -> str:
            start = loop.time()
            try:
                return await bounded(bound, asyncio.sleep(seconds, name))
            except Expired:
                ends[name] = loop.time() - start
                return "expired"

        first = asyncio.create_task(call("first", 30))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(call("second", 30))
        quick = asyncio.create_task(call("quick", 0.01))
        assert await quick == "quick"
        assert await first == "expired"
        assert not second.done()  # started 0.1 s later: its deadline is later
        assert await second == "expired"
        assert ends["first"] >= 0.3
        assert ends["second"] >= 0.3
        assert len(bound) == 0

    asyncio.run(main())


def test_another_cancel_stays_a_cancel() -> None:
    async def main() -> None:
        bound = Bound(30)
        task = asyncio.create_task(bounded(bound, asyncio.sleep(30)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(bound) == 0
        # An outer timeout shorter than the bound is the outer one's TimeoutError.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await bounded(bound, asyncio.sleep(30))

    asyncio.run(main())


def test_a_cancel_arriving_with_the_expiry_is_not_swallowed() -> None:
    """Both cancels reach the task before it runs again: it must end cancelled, as
    asyncio.timeout does, not with the bound's error."""

    async def main() -> None:
        bound = Bound(0.05)
        loop = asyncio.get_running_loop()
        blocker = asyncio.Event()
        task = asyncio.create_task(bounded(bound, blocker.wait()))
        await asyncio.sleep(0)
        # Cancel from outside in the same loop iteration as the bound's check.
        handle = bound._handle
        assert handle is not None
        loop.call_at(handle.when(), task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_swallowed_expiry_is_taken_back() -> None:
    async def main() -> None:
        bound = Bound(0.05)

        async def stubborn() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return "swallowed"
            return "slept"

        assert await bounded(bound, stubborn()) == "swallowed"
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0.01)  # not cancelled again

    asyncio.run(main())


def test_one_check_is_armed_while_calls_come_and_none_after() -> None:
    async def main() -> None:
        bound = Bound(0.1)
        for _ in range(50):
            await bounded(bound, asyncio.sleep(0))
        assert bound.armed  # the first call's check, not re-armed by the next 49
        await asyncio.sleep(0.3)
        assert not bound.armed  # it fired, found no call in flight, armed nothing

    asyncio.run(main())


def test_a_bound_moves_to_a_new_event_loop() -> None:
    bound = Bound(0.1)

    async def expire() -> None:
        with pytest.raises(Expired):
            await bounded(bound, asyncio.sleep(30))

    async def leave_armed() -> None:
        await bounded(bound, asyncio.sleep(0))
        assert bound.armed

    asyncio.run(leave_armed())  # its loop closes with the check still armed
    asyncio.run(expire())  # a new loop: the check must be armed there


def test_outside_a_task_is_refused() -> None:
    with pytest.raises(RuntimeError):  # no loop at all
        Bound(1).enter()

    async def main() -> None:
        # A plain callback of a running loop: a loop, but no task to cancel.
        got: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        def callback() -> None:
            try:
                Bound(1).enter()
            except RuntimeError as exc:
                got.set_result(exc)

        asyncio.get_running_loop().call_soon(callback)
        assert "asyncio task" in str(await got)

    asyncio.run(main())


def test_a_call_made_while_the_task_is_being_cancelled_keeps_that_cancel() -> None:
    """A call in a task's cleanup after it was cancelled (a close in ``except
    CancelledError``) is still bounded: its expiry raises the bound's error, and the
    task's pending cancel is left as it was, for the task to finish with."""

    async def cleanup(bound: Bound) -> tuple[str, int]:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 1
            try:
                await bounded(bound, asyncio.sleep(30))
            except Expired:
                return "expired", task.cancelling()
        return "not cancelled", 0

    async def main() -> None:
        task = asyncio.create_task(cleanup(Bound(0.05)))
        await asyncio.sleep(0.01)
        task.cancel()
        assert await task == ("expired", 1)

    asyncio.run(main())
