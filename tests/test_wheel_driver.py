"""The asyncio driver: on a virtual clock (exact times), and on the stdlib loop and uvloop."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import uvloop
from vloop import VirtualLoop
from wheel_impls import check_wheel

from tickwheel.wheel import Timer, TimingWheel, WheelClosed, WheelFull

# Every test here runs on both implementations (tests/wheel_impls.py).
pytestmark = pytest.mark.usefixtures("wheel_impl")

T = TypeVar("T")

REAL_LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=["virtual", "asyncio", "uvloop"])
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    """Every behaviour test runs on the virtual clock and on both real loops."""
    lp: asyncio.AbstractEventLoop = (
        VirtualLoop() if request.param == "virtual" else REAL_LOOPS[request.param]()
    )
    yield lp
    lp.close()


def run(loop: asyncio.AbstractEventLoop, factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await factory()

    return loop.run_until_complete(main())


class Recorder:
    """Records (name, loop time, deadline) of each call, and checks it was not early."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[Any, float, float]] = []
        self.done = loop.create_future()
        self.expect = -1

    def __call__(self, name: Any, when: float) -> None:
        now = self.loop.time()
        assert now >= when, f"{name} fired {when - now:.9f}s early"
        self.calls.append((name, now, when))
        if len(self.calls) == self.expect and not self.done.done():
            self.done.set_result(None)

    @property
    def names(self) -> list[Any]:
        return [c[0] for c in self.calls]


# -- firing -------------------------------------------------------------------------------


def test_fires_in_deadline_order_never_early(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> Recorder:
        wheel = TimingWheel()
        rec = Recorder(loop)
        delays = [0.03, 0.0, 0.001, 0.0105, 0.002, 0.0, 0.03, 0.02]
        for i, d in enumerate(delays):
            when = loop.time() + d
            ticks[i] = wheel.schedule(d, rec, i, when).when()
        rec.expect = len(delays)
        await asyncio.wait_for(rec.done, 5)
        check_wheel(wheel)
        assert len(wheel) == 0
        return rec

    ticks: dict[int, float] = {}
    rec = run(loop, main)
    # In deadline order (each rounded up to its tick), FIFO within a tick. Not the order
    # of the unrounded times: two timers a tick boundary apart in their scheduling can
    # round to the same tick (a loaded machine crosses one mid-loop now and then).
    assert rec.names == sorted(ticks, key=lambda i: (ticks[i], i))
    assert ticks[1] <= ticks[5] and ticks[0] <= ticks[6]


def test_exact_tick_on_virtual_clock(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel(tick=0.01)
        rec = Recorder(vloop)
        start = vloop.time()
        for d in [0.005, 0.01, 0.011, 0.64, 0.641, 40.96, 3600.0]:
            wheel.schedule(d, rec, d, start + d)
        rec.expect = 7
        await rec.done
        for d, fired_at, _ in rec.calls:
            # Rounded up to the tick, and at most one tick late.
            assert start + d <= fired_at <= start + d + 0.01 + 1e-9, (d, fired_at - start)

    run(vloop, main)


def test_schedule_at_in_the_past_fires_at_next_tick(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rec = Recorder(vloop)
        rec.expect = 1
        t = wheel.schedule_at(vloop.time() - 50, rec, "past", vloop.time() - 50)
        assert t.when() > vloop.time() - 50
        await rec.done
        assert rec.calls[0][1] - vloop.time() <= 0.001

    run(vloop, main)


def test_far_timer_fires_exactly_and_wakes_rarely(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rec = Recorder(vloop)
        rec.expect = 1
        when = vloop.time() + 10 * 86400  # ten days
        wheel.schedule_at(when, rec, "far", when)
        await rec.done
        assert rec.calls[0][1] - when < 0.001 + 1e-6
        # One wake-up, at the deadline: none per tick, per second or per level.
        assert wheel.stats().wakeups == 1

    run(vloop, main)


def test_very_far_deadline_is_not_clamped(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        far = vloop.time() + 1e12  # ~31,700 years
        t = wheel.schedule_at(far, print)
        assert far <= t.when() < far + 0.001 + 1e-3
        assert wheel.next_when() is not None
        check_wheel(wheel)
        t.cancel()

    run(vloop, main)


def test_deadline_beyond_2_62_ticks_is_kept(vloop: VirtualLoop) -> None:
    """Past the compiled core's 62-bit tick range (146,000 years at 1 ms): the timer is
    kept with its exact when(), wakes the wheel then, and close() returns it."""

    async def main() -> None:
        wheel = TimingWheel()
        far = vloop.time() + 5e15
        t = wheel.schedule_at(far, print)
        near = wheel.schedule(1.0, print)
        assert far <= t.when() < far + 1.0
        assert t.pending()
        assert wheel.next_when() == near.when()
        near.cancel()
        assert wheel.next_when() == t.when()
        check_wheel(wheel)
        assert t.reschedule_at(far * 2) is True
        assert t.when() >= far * 2
        assert wheel.close() == [t]
        assert t.cancelled() and t.when() >= far * 2

    run(vloop, main)


def test_catch_up_after_a_stall_fires_all_in_order(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rng = random.Random(7)
        rec = Recorder(vloop)
        start = vloop.time()
        delays = [rng.uniform(0, 3600) for _ in range(5000)]
        for i, d in enumerate(delays):
            wheel.schedule(d, rec, i, start + d)
        rec.expect = len(delays)
        vloop.advance(7200)  # the loop stalls for two hours
        await asyncio.sleep(0)
        await rec.done
        fired_whens = [c[2] for c in rec.calls]
        # In deadline order; two deadlines within one tick fire in scheduling order.
        assert all(b > a - 0.001 for a, b in itertools.pairwise(fired_whens))
        assert len(set(rec.names)) == len(delays)
        # Bounded by occupied buckets (<= 5000 * levels), not by 7.2 million ticks.
        assert wheel.stats().wakeups <= 2

    run(vloop, main)


def test_callback_scheduling_at_delay_zero_does_not_spin(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        count = 0

        def again() -> None:
            nonlocal count
            count += 1
            if count < 5:
                wheel.schedule(0, again)

        wheel.schedule(0, again)
        await asyncio.sleep(0.0105)
        assert count == 5

    run(vloop, main)


def test_no_wakeups_while_empty(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        t = wheel.schedule(1.0, print)
        assert wheel._handle is not None
        assert t.cancel() is True
        assert wheel._handle is None, "still armed after the last timer was cancelled"
        fut = vloop.create_future()
        vloop.call_later(3600, fut.set_result, None)  # an hour of an otherwise idle loop
        await fut
        assert wheel.stats().wakeups == 0

    run(vloop, main)


def test_one_wakeup_per_occupied_tick(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        done = vloop.create_future()
        for i in range(100):
            wheel.schedule(0.5, lambda: None)  # all in one tick
            wheel.schedule(0.25 + i * 1e-6, lambda: None)
        wheel.schedule(0.75, done.set_result, None)
        await done
        assert wheel.stats().wakeups == 4  # ticks 250, 251, 500 and 750
        assert wheel.stats().fired == 201

    run(vloop, main)


def test_arms_earlier_when_an_earlier_timer_arrives(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rec = Recorder(vloop)
        rec.expect = 2
        now = vloop.time()
        wheel.schedule(10, rec, "late", now + 10)
        wheel.schedule(0.002, rec, "early", now + 0.002)
        await rec.done
        assert rec.names == ["early", "late"]
        assert rec.calls[0][1] - now < 0.004

    run(vloop, main)


# -- cancel, reschedule -----------------------------------------------------------------


def test_cancel_semantics(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        hits: list[str] = []
        t = wheel.schedule(0.001, hits.append, "x")
        assert t.pending()
        assert not t.cancelled()
        assert t.cancel() is True
        assert t.cancelled()
        assert t.callback is None
        assert t.args == ()
        assert t.cancel() is False
        f = wheel.schedule(0, hits.append, "fired")
        await asyncio.sleep(0.01)
        assert hits == ["fired"]
        assert f.cancel() is False, "cancel() must not claim to stop a callback that ran"
        assert not f.cancelled()
        assert len(wheel) == 0

    run(loop, main)


def test_cancel_from_a_callback_in_the_same_tick(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        hits: list[str] = []
        results: list[bool] = []
        second: list[Timer] = []
        wheel.schedule(0.002, lambda: results.append(second[0].cancel()))
        second.append(wheel.schedule(0.002, hits.append, "second"))
        await asyncio.sleep(0.02)
        assert results == [True]
        assert hits == []
        assert len(wheel) == 0
        check_wheel(wheel)

    run(loop, main)


def test_reschedule(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rec = Recorder(loop)
        rec.expect = 2
        now = loop.time()
        a = wheel.schedule(0.002, rec, "a", now + 0.030)
        b = wheel.schedule(0.050, rec, "b", now + 0.004)
        assert a.reschedule(0.030) is True  # later
        b.reschedule_at(now + 0.004)  # earlier: must re-arm
        assert a.when() >= now + 0.030
        await asyncio.wait_for(rec.done, 5)
        assert rec.names == ["b", "a"]
        assert a.reschedule(1) is False  # fired: nothing to move
        assert len(wheel) == 0

    run(loop, main)


def test_reschedule_reuses_the_handle(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        t = wheel.schedule(5, print)
        ident = id(t)
        for i in range(1000):
            t.reschedule(5 + i * 0.01)
        assert id(t) == ident
        assert len(wheel) == 1
        check_wheel(wheel)
        t.cancel()

    run(vloop, main)


def test_reschedule_goes_to_the_back_of_its_tick(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        rec = Recorder(vloop)
        rec.expect = 3
        when = vloop.time() + 0.010
        a = wheel.schedule_at(when, rec, "a", when)
        wheel.schedule_at(when, rec, "b", when)
        wheel.schedule_at(when, rec, "c", when)
        a.reschedule_at(when)
        await rec.done
        assert rec.names == ["b", "c", "a"]

    run(vloop, main)


# -- errors ---------------------------------------------------------------------------


def test_callback_exception_goes_to_the_loop_handler(loop: asyncio.AbstractEventLoop) -> None:
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))

    async def main() -> None:
        wheel = TimingWheel()
        hits: list[str] = []

        def boom() -> None:
            raise ZeroDivisionError("boom")

        wheel.schedule(0.001, hits.append, "before")
        wheel.schedule(0.001, boom)
        wheel.schedule(0.001, hits.append, "after")
        await asyncio.sleep(0.02)
        assert hits == ["before", "after"]
        check_wheel(wheel)

    run(loop, main)
    assert len(seen) == 1
    assert isinstance(seen[0]["exception"], ZeroDivisionError)
    assert "boom" in seen[0]["message"]
    assert isinstance(seen[0]["timer"], Timer)


def test_keyboard_interrupt_keeps_the_rest_of_the_tick(vloop: VirtualLoop) -> None:
    wheel = TimingWheel(loop=vloop)
    hits: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    wheel.schedule(0.001, hits.append, "a")
    wheel.schedule(0.001, interrupt)
    wheel.schedule(0.001, hits.append, "c")
    with pytest.raises(KeyboardInterrupt):
        vloop.run_until_complete(asyncio.sleep(0.01))
    assert hits == ["a"]
    assert len(wheel) == 1
    check_wheel(wheel)
    vloop.run_until_complete(asyncio.sleep(0.01))
    assert hits == ["a", "c"]


BAD_DELAYS = [
    (-1, ValueError, "delay must be a finite number >= 0, got -1"),
    (-0.001, ValueError, "delay must be a finite number >= 0"),
    (math.nan, ValueError, "delay must be a finite number >= 0, got nan"),
    (math.inf, ValueError, "got inf"),
    ("1", TypeError, "delay must be a real number, got '1'"),
    (None, TypeError, "delay must be a real number, got None"),
    (1j, TypeError, "delay must be a real number"),
]


@pytest.mark.parametrize(("delay", "exc", "msg"), BAD_DELAYS)
def test_bad_delay(vloop: VirtualLoop, delay: Any, exc: type[Exception], msg: str) -> None:
    wheel = TimingWheel(loop=vloop)
    with pytest.raises(exc, match=msg.replace("(", r"\(")):
        wheel.schedule(delay, print)
    t = wheel.schedule(1, print)
    with pytest.raises(exc, match="delay"):
        t.reschedule(delay)
    assert len(wheel) == 1
    assert t.pending()
    check_wheel(wheel)


@pytest.mark.parametrize("when", [math.nan, math.inf, -math.inf, "x", None])
def test_bad_when(vloop: VirtualLoop, when: Any) -> None:
    wheel = TimingWheel(loop=vloop)
    with pytest.raises((ValueError, TypeError), match="when must be"):
        wheel.schedule_at(when, print)
    assert len(wheel) == 0


def test_not_callable(vloop: VirtualLoop) -> None:
    wheel = TimingWheel(loop=vloop)
    with pytest.raises(TypeError, match="callback must be callable, got 42"):
        wheel.schedule(1, 42)  # type: ignore[arg-type]
    assert len(wheel) == 0


@pytest.mark.parametrize(
    ("tick", "exc"),
    [(0, ValueError), (-0.001, ValueError), (math.nan, ValueError), (math.inf, ValueError),
     ("1ms", TypeError), (None, TypeError), (True, TypeError)],
)  # fmt: skip
def test_bad_tick(vloop: VirtualLoop, tick: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc, match="tick must be a positive finite number"):
        TimingWheel(tick, loop=vloop)


@pytest.mark.parametrize("max_pending", [0, -5, 1.5, "10", True])
def test_bad_max_pending(vloop: VirtualLoop, max_pending: Any) -> None:
    with pytest.raises(ValueError, match="max_pending must be a positive int or None"):
        TimingWheel(loop=vloop, max_pending=max_pending)


def test_needs_a_loop() -> None:
    with pytest.raises(RuntimeError, match="needs a running event loop"):
        TimingWheel()


def test_max_pending(vloop: VirtualLoop) -> None:
    wheel = TimingWheel(loop=vloop, max_pending=2)
    a = wheel.schedule(1, print)
    wheel.schedule(1, print)
    with pytest.raises(WheelFull, match="max_pending=2"):
        wheel.schedule(1, print)
    assert len(wheel) == 2
    a.cancel()
    wheel.schedule(1, print)
    assert len(wheel) == 2


def test_close_returns_unfired_timers(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        hits: list[int] = []
        wheel.schedule(0.001, hits.append, 0)
        later = [wheel.schedule(d, hits.append, d) for d in (50, 5, 5000, 5)]
        await asyncio.sleep(0.01)
        unfired = wheel.close()
        assert [t.args for t in unfired] == [(5,), (5,), (50,), (5000,)]
        assert all(t.cancelled() and t.callback == hits.append for t in unfired)
        assert {id(t) for t in unfired} == {id(t) for t in later}
        assert len(wheel) == 0
        assert wheel._handle is None
        assert wheel.close() == []
        with pytest.raises(WheelClosed, match="closed"):
            wheel.schedule(1, print)
        await asyncio.sleep(6000)
        assert hits == [0]

    run(vloop, main)


# -- context, threads -------------------------------------------------------------------

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def test_context(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        seen: list[str] = []
        var.set("scheduler")
        wheel.schedule(0.001, lambda: seen.append(var.get()))
        wheel.schedule(0.001, lambda: seen.append(var.get()), context=contextvars.copy_context())
        await asyncio.sleep(0.01)
        # The wheel was made in this task's context, where var is already "scheduler";
        # a wheel made elsewhere does not see it:
        assert seen[1] == "scheduler"

        other = contextvars.Context()
        wheel2 = other.run(TimingWheel)
        wheel2.schedule(0.001, lambda: seen.append(var.get()))
        await asyncio.sleep(0.01)
        assert seen[2] == "unset"

    run(vloop, main)


@pytest.mark.parametrize("name", list(REAL_LOOPS))
def test_schedule_threadsafe(name: str) -> None:
    loop = REAL_LOOPS[name]()
    try:

        async def main() -> None:
            wheel = TimingWheel()
            fired = asyncio.Event()
            results: list[Any] = []

            def other_thread() -> None:
                fut = wheel.schedule_threadsafe(0.005, fired.set)
                results.append(fut.result(5))
                try:
                    wheel.schedule_threadsafe(-1, fired.set)
                except ValueError as exc:
                    results.append(exc)

            thread = threading.Thread(target=other_thread)
            thread.start()
            await asyncio.wait_for(fired.wait(), 5)
            await asyncio.to_thread(thread.join)
            assert isinstance(results[0], Timer)
            assert isinstance(results[1], ValueError)

        loop.run_until_complete(main())
    finally:
        loop.close()


def test_schedule_threadsafe_reports_a_closed_wheel(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        wheel.close()
        fut = wheel.schedule_threadsafe(1, print)
        await asyncio.sleep(0)
        with pytest.raises(WheelClosed):
            fut.result(0)

    run(vloop, main)


# -- stats, repr -----------------------------------------------------------------------


def test_stats_and_repr(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel()
        t = wheel.schedule(2, print)
        s = wheel.stats()
        assert s.pending == 1
        assert s.next_when is not None
        assert s.next_when <= t.when()
        assert "pending" in repr(t)
        assert "pending=1" in repr(wheel)
        t.cancel()
        assert "cancelled" in repr(t)
        wheel.schedule(0, print, "x")
        await asyncio.sleep(0.01)
        assert wheel.stats().fired == 1
        wheel.close()
        assert "closed" in repr(wheel)

    run(vloop, main)


# -- memory ---------------------------------------------------------------------------


def test_no_memory_is_kept_by_schedule_cancel_fire(vloop: VirtualLoop) -> None:
    """Handles, callbacks and arguments are all released (a C core leaking a reference
    per operation would show here as megabytes)."""
    import gc
    import tracemalloc

    async def main() -> int:
        wheel = TimingWheel()
        hits: list[int] = []

        def rounds(n: int) -> None:
            for i in range(n):
                wheel.schedule(0.5, hits.append, i, context=contextvars.copy_context()).cancel()
                t = wheel.schedule(0.001, hits.append, i)
                t.reschedule(0.002)
                wheel.schedule(10.0, hits.append, i).cancel()

        rounds(1000)
        await asyncio.sleep(0.01)
        hits.clear()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(5):
                rounds(4000)
                await asyncio.sleep(0.01)
                assert len(hits) == 4000
                hits.clear()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(wheel) == 0
        return grown

    assert run(vloop, main) < 64 * 1024


def test_an_abandoned_wheel_is_collected() -> None:
    """Pending timers whose callbacks refer to the wheel form cycles; once the loop lets
    go of the wheel's wake-up, the GC frees the wheel with its timers."""
    import gc
    import weakref

    refs = []
    for _ in range(20):
        loop = VirtualLoop()
        wheel = TimingWheel(loop=loop)
        for i in range(10):
            wheel.schedule(100.0 + i, lambda w=wheel: w)
        assert len(wheel) == 10
        loop.close()  # drops the armed call_at
        refs.append(weakref.ref(wheel))
        del wheel, loop
    gc.collect()
    assert all(r() is None for r in refs)
