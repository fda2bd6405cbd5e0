"""The wheel-timed event loops: call_later/call_at with asyncio's observable semantics.

Each test runs on both loops (``new_event_loop``, the stdlib selector loop, and
``new_uvloop_event_loop``). Real clock: never early, a generous upper bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import random
import time
from collections.abc import Callable, Iterator

import pytest

from tickwheel.wheel import (
    WheelEventLoop,
    WheelTimerHandle,
    new_event_loop,
    new_uvloop_event_loop,
)

FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "stdlib": new_event_loop,
    "uvloop": new_uvloop_event_loop,
}
LATE = 2.0  # upper bound on lateness that holds on a loaded 2-core machine (a stall of
# half a second at load 10 was seen)

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


@pytest.fixture(params=sorted(FACTORIES))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    lp = FACTORIES[request.param]()
    yield lp
    lp.close()


def run(loop: asyncio.AbstractEventLoop, coro: object) -> object:
    return loop.run_until_complete(coro)  # type: ignore[arg-type]


def test_handle_is_a_timer_handle(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        now = loop.time()
        h = loop.call_later(10, print)
        assert isinstance(h, asyncio.TimerHandle) and isinstance(h, WheelTimerHandle)
        assert h.when() == pytest.approx(now + 10, abs=0.01)
        at = loop.call_at(now + 5.0001234, print)
        assert at.when() == now + 5.0001234  # the time asked for, not rounded to a tick
        assert not h.cancelled()
        h.cancel()
        assert h.cancelled()
        h.cancel()  # idempotent
        at.cancel()
        assert "cancelled" in repr(h)
        assert loop._wheel.stats().pending == 0  # type: ignore[attr-defined]

    run(loop, main())


def test_caller_context_is_copied(loop: asyncio.AbstractEventLoop) -> None:
    seen: list[str] = []

    async def main() -> None:
        var.set("caller")
        loop.call_later(0.001, lambda: seen.append(var.get()))
        var.set("changed after")  # a copy was taken at call_later
        ctx = contextvars.copy_context()
        ctx.run(var.set, "given")
        loop.call_later(0.001, lambda: seen.append(var.get()), context=ctx)
        await asyncio.sleep(0.05)

    run(loop, main())
    assert seen == ["caller", "given"]


def test_never_early_and_at_most_a_bound_late(loop: asyncio.AbstractEventLoop) -> None:
    rng = random.Random(41)
    got: list[tuple[float, float, float]] = []

    async def main() -> None:
        for _ in range(200):
            delay = rng.uniform(0, 0.08)
            holder: list[asyncio.TimerHandle] = []
            holder.append(
                loop.call_later(
                    delay,
                    lambda h=holder: got.append((h[0].when(), loop.time(), time.monotonic())),
                )
            )
        await asyncio.sleep(0.3)

    run(loop, main())
    assert len(got) == 200
    for when, at, mono in got:
        assert at >= when and mono >= when, (when, at, mono)
        assert at - when < LATE


def test_same_deadline_in_call_order_and_by_when_in_a_tick(
    loop: asyncio.AbstractEventLoop,
) -> None:
    order: list[str] = []

    async def main() -> None:
        t = loop.time() + 0.02
        for name in "abcde":
            loop.call_at(t, order.append, name)
        # Two deadlines inside one 1 ms tick, asked for latest first: by when().
        loop.call_at(t + 0.0309, order.append, "late-in-tick")
        loop.call_at(t + 0.0301, order.append, "early-in-tick")
        loop.call_at(t + 0.0309, order.append, "late-in-tick-2")
        await asyncio.sleep(0.1)

    run(loop, main())
    assert order == [*"abcde", "early-in-tick", "late-in-tick", "late-in-tick-2"]


def test_past_deadline_runs_at_the_next_iteration(loop: asyncio.AbstractEventLoop) -> None:
    order: list[str] = []

    async def main() -> None:
        loop.call_at(loop.time() - 100, order.append, "past")
        loop.call_at(-math.inf, order.append, "-inf")
        loop.call_later(-1, order.append, "negative delay")
        for _ in range(3):
            await asyncio.sleep(0)
        order.append("after 3 iterations")

    run(loop, main())
    # By when(), as asyncio's heap orders them.
    assert order == ["-inf", "past", "negative delay", "after 3 iterations"]


def test_past_deadline_after_this_turns_soon_callbacks() -> None:
    # The stdlib's exact order: in the next iteration, the ready callbacks queued before
    # it (call_soon) run first, then the due timers; what those queue runs after.
    loop = new_event_loop()
    order: list[str] = []

    def b() -> None:
        order.append("soon")
        loop.call_soon(order.append, "soon of soon")

    try:
        loop.call_soon(lambda: (loop.call_at(0, order.append, "past"), loop.call_soon(b)))
        loop.call_later(0.05, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert order == ["soon", "past", "soon of soon"]


def test_infinity_never_fires_and_bad_when_is_refused(loop: asyncio.AbstractEventLoop) -> None:
    fired: list[int] = []

    async def main() -> None:
        h = loop.call_at(math.inf, fired.append, 1)
        assert not h.cancelled() and h.when() == math.inf
        with pytest.raises(ValueError, match="when"):
            loop.call_at(math.nan, fired.append, 2)
        with pytest.raises(TypeError, match="when"):
            loop.call_at("soon", fired.append, 3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="when"):
            loop.call_at(None, fired.append, 4)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="delay"):
            loop.call_later(None, fired.append, 5)  # type: ignore[arg-type]
        assert len(loop._wheel) == 0  # type: ignore[attr-defined]  # nothing half-filed
        await asyncio.sleep(0.02)
        h.cancel()
        # asyncio.timeout(inf) schedules call_at(inf): it must never expire.
        async with asyncio.timeout(math.inf):
            await asyncio.sleep(0.01)

    run(loop, main())
    assert fired == []


def test_callback_errors_go_to_the_exception_handler(loop: asyncio.AbstractEventLoop) -> None:
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))

    def boom() -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        h = loop.call_later(0.001, boom)
        ok: list[int] = []
        loop.call_later(0.001, ok.append, 1)
        await asyncio.sleep(0.05)
        assert ok == [1]
        assert seen and seen[0]["handle"] is h
        assert isinstance(seen[0]["exception"], RuntimeError)

    run(loop, main())


def test_debug_mode_reports_slow_timer_callbacks(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01

    def slow() -> None:
        time.sleep(0.03)

    async def main() -> None:
        loop.call_later(0.001, slow)
        await asyncio.sleep(0.1)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    reports = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert any("slow" in m and "WheelTimerHandle" in m for m in reports), reports


def test_asyncio_timeouts_wait_for_and_sleep(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.03):
                await asyncio.sleep(10)
        assert t0 + 0.03 <= loop.time() < t0 + 0.03 + LATE  # as the loop's clock adds
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.02)
        assert t0 + 0.02 <= loop.time() < t0 + 0.02 + LATE  # as the loop's clock adds
        t0 = loop.time()
        assert await asyncio.sleep(0.02, "r") == "r"
        assert t0 + 0.02 <= loop.time() < t0 + 0.02 + LATE  # as the loop's clock adds

    run(loop, main())


def test_the_heap_stays_empty_and_close_drops_timers(loop: asyncio.AbstractEventLoop) -> None:
    fired: list[int] = []

    async def main() -> list[asyncio.TimerHandle]:
        return [loop.call_later(5, fired.append, i) for i in range(10)]

    handles = run(loop, main())
    if isinstance(loop, WheelEventLoop):
        assert loop._scheduled == []  # type: ignore[attr-defined]  # all in the wheel
    loop.close()
    assert len(loop._wheel) == 0  # type: ignore[attr-defined]
    for h in handles:  # not filed any more: cancel() is asyncio's alone
        assert h is not None
        h.cancel()
        assert h.cancelled()
    assert len(loop._wheel) == 0  # type: ignore[attr-defined]
    assert loop._wheel.stats().cancelled == 0  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, print)
    assert fired == []


@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_loop_factories_and_bad_tick(factory: str) -> None:
    make = FACTORIES[factory]
    with asyncio.Runner(loop_factory=make) as runner:
        loop = runner.get_loop()
        assert runner.run(asyncio.sleep(0.001, "ok")) == "ok"
        assert loop.tick == 0.001  # type: ignore[attr-defined]
    coarse = make.__wrapped__ if hasattr(make, "__wrapped__") else make
    lp = coarse(tick=0.01)  # type: ignore[call-arg]
    assert lp.tick == 0.01  # type: ignore[attr-defined]
    lp.close()
    with pytest.raises(ValueError, match="tick"):
        coarse(tick=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="tick"):
        coarse(tick="1ms")  # type: ignore[call-arg]
