"""timeout / timeout_at / sleep: asyncio's semantics, on the wheel."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import uvloop
from vloop import VirtualLoop

from tickwheel.wheel import TimingWheel, get_wheel, sleep, timeout, timeout_at

# Every test here runs on both implementations (tests/wheel_impls.py).
pytestmark = pytest.mark.usefixtures("wheel_impl")


@pytest.fixture(params=["virtual", "asyncio", "uvloop"])
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "virtual": VirtualLoop,
        "asyncio": asyncio.new_event_loop,
        "uvloop": uvloop.new_event_loop,
    }
    lp = factories[request.param]()
    yield lp
    lp.close()


def run(loop: asyncio.AbstractEventLoop, factory: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await factory()

    return loop.run_until_complete(main())


def test_timeout_expires(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with timeout(0.01) as cm:
                await asyncio.sleep(10)
        assert cm.expired()
        assert loop.time() >= start + 0.01
        assert "expired" in repr(cm)

    run(loop, main)


def test_timeout_not_expired(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        async with timeout(10) as cm:
            await asyncio.sleep(0)
        assert not cm.expired()
        assert len(get_wheel()) == 0, "the expiry timer was not cancelled on exit"

    run(loop, main)


def test_timeout_none_and_reschedule(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with timeout(None) as cm:
                assert cm.when() is None
                assert len(get_wheel()) == 0
                when = loop.time() + 0.01
                cm.reschedule(when)
                assert cm.when() == when
                await asyncio.sleep(10)
        async with timeout(0.005) as cm2:
            cm2.reschedule(None)
            await asyncio.sleep(0.02)
        assert not cm2.expired()

    run(loop, main)


def test_reschedule_reuses_the_timer(vloop: VirtualLoop) -> None:
    async def main() -> None:
        async with timeout(5) as cm:
            timer = cm._timer
            for i in range(100):
                cm.reschedule(vloop.time() + 5 + i)
            assert cm._timer is timer
            assert len(get_wheel()) == 1

    run(vloop, main)


def test_timeout_at(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        when = loop.time() + 0.01
        with pytest.raises(TimeoutError):
            async with timeout_at(when) as cm:
                assert cm.when() == when
                await asyncio.sleep(10)
        assert loop.time() >= when

    run(loop, main)


def test_past_deadline_expires_at_next_tick(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with timeout(-1):
                await asyncio.sleep(1)

    run(loop, main)


def test_outer_cancel_is_not_turned_into_timeout(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        async def inner() -> None:
            async with timeout(10):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(inner())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(loop, main)


def test_nested_timeouts(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with timeout(0.01) as outer, timeout(10) as inner:
                await asyncio.sleep(1)
        assert outer.expired()
        assert not inner.expired()

    run(loop, main)


def test_state_errors(vloop: VirtualLoop) -> None:
    async def main() -> None:
        cm = timeout(1)
        with pytest.raises(RuntimeError, match="has not been entered"):
            cm.reschedule(1)
        async with cm:
            with pytest.raises(ValueError, match="nan"):
                cm.reschedule(math.nan)
        with pytest.raises(RuntimeError, match="finished"):
            cm.reschedule(1)
        with pytest.raises(RuntimeError, match="already been entered"):
            async with cm:
                pass

    run(vloop, main)


def test_outside_a_task(vloop: VirtualLoop) -> None:
    errors: list[BaseException] = []

    def plain_callback() -> None:  # runs on the loop, but in no task
        coro = timeout(1).__aenter__()
        try:
            coro.send(None)
        except RuntimeError as exc:
            errors.append(exc)

    vloop.call_soon(plain_callback)
    vloop.run_until_complete(asyncio.sleep(0.01))
    assert len(errors) == 1
    assert "inside a task" in str(errors[0])


@pytest.mark.parametrize(("value", "exc"), [(math.nan, ValueError), ("1", TypeError)])
def test_bad_timeout_values(vloop: VirtualLoop, value: Any, exc: type[Exception]) -> None:
    async def main() -> None:
        with pytest.raises(exc, match="delay"):
            timeout(value)
        with pytest.raises(exc, match="when"):
            timeout_at(value)
        with pytest.raises(exc, match="delay"):
            await sleep(value)

    run(vloop, main)


def test_sleep(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        start = loop.time()
        assert await sleep(0.01, "result") == "result"
        assert loop.time() >= start + 0.01
        assert await sleep(0) is None
        assert await sleep(-5, 7) == 7
        assert len(get_wheel()) == 0

    run(loop, main)


def test_cancelled_sleep_cancels_its_timer(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(sleep(100))
        await asyncio.sleep(0)
        assert len(get_wheel()) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(get_wheel()) == 0

    run(loop, main)


def test_sleep_inf_waits_until_cancelled(vloop: VirtualLoop) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(sleep(math.inf))
        await asyncio.sleep(10**6)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(vloop, main)


def test_wheel_methods_and_default_wheel(vloop: VirtualLoop) -> None:
    async def main() -> None:
        wheel = TimingWheel(tick=0.01)
        assert await wheel.sleep(0.05, 1) == 1
        with pytest.raises(TimeoutError):
            async with wheel.timeout(0.02):
                await asyncio.sleep(1)
        with pytest.raises(TimeoutError):
            async with wheel.timeout_at(vloop.time() + 0.02):
                await asyncio.sleep(1)
        default = get_wheel()
        assert get_wheel() is default
        assert default.tick == 0.001
        default.close()
        assert get_wheel() is not default  # a closed default is replaced

    run(vloop, main)


def test_default_wheel_is_per_loop() -> None:
    wheels = []
    for _ in range(2):
        loop = asyncio.new_event_loop()

        async def grab() -> None:
            wheels.append(get_wheel())

        loop.run_until_complete(grab())
        loop.close()
    assert wheels[0] is not wheels[1]
    assert wheels[0].loop is not wheels[1].loop


def test_get_wheel_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        get_wheel()


# -- drop-in corners, each checked against asyncio.timeout on the same loop ------------


def _both(loop: asyncio.AbstractEventLoop, body: Callable[[Any], Awaitable[Any]]) -> None:
    """Run ``body(factory)`` with asyncio's timeout and the wheel's; results must match."""

    async def main() -> tuple[Any, Any]:
        return await body(asyncio), await body(_WheelNs)

    theirs, ours = loop.run_until_complete(main())
    assert ours == theirs


class _WheelNs:  # stands in for the asyncio module's two names
    timeout = staticmethod(timeout)
    timeout_at = staticmethod(timeout_at)


async def _outcome(aw: Awaitable[Any]) -> str:
    try:
        await aw
    except TimeoutError:
        return "timeout"
    except asyncio.CancelledError:
        return "cancelled"
    except RuntimeError as exc:
        return f"runtime: {type(exc).__name__}"
    return "ok"


@pytest.mark.parametrize("delay", [0, -1])
def test_past_delay_expires_at_next_iteration_like_asyncio(
    loop: asyncio.AbstractEventLoop, delay: float
) -> None:
    async def body(ns: Any) -> tuple[str, bool]:
        cm = ns.timeout(delay)

        async def block() -> None:
            async with cm:
                await asyncio.sleep(0)

        return await _outcome(block()), cm.expired()

    _both(loop, body)


def test_timeout_at_past_expires_at_next_iteration_like_asyncio(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def body(ns: Any) -> tuple[str, bool]:
        cm = ns.timeout_at(loop.time() - 1)

        async def block() -> None:
            async with cm:
                await asyncio.sleep(0)

        return await _outcome(block()), cm.expired()

    _both(loop, body)


def test_reschedule_corners_like_asyncio(loop: asyncio.AbstractEventLoop) -> None:
    async def body(ns: Any) -> list[Any]:
        seen: list[Any] = []
        cm = ns.timeout(10)

        async def into_past() -> None:
            async with cm:
                seen.append(cm.when() is not None)
                cm.reschedule(None)
                seen.append(cm.when())
                cm.reschedule(loop.time() - 5)  # into the past: next iteration
                await asyncio.sleep(0)

        seen.append(await _outcome(into_past()))
        seen.append(cm.expired())
        try:
            cm.reschedule(None)  # after exit
        except RuntimeError:
            seen.append("reschedule after exit: RuntimeError")

        async def reenter() -> None:
            async with cm:
                pass

        seen.append(await _outcome(reenter()))
        # Into the past and back to the future before the loop runs: no expiry.
        cm2 = ns.timeout(10)

        async def back() -> None:
            async with cm2:
                cm2.reschedule(loop.time() - 1)
                cm2.reschedule(loop.time() + 10)
                await asyncio.sleep(0)
                await asyncio.sleep(0)

        seen.append(await _outcome(back()))
        seen.append(cm2.expired())
        return seen

    _both(loop, body)


def test_outside_cancel_of_past_timeout_like_asyncio(loop: asyncio.AbstractEventLoop) -> None:
    async def body(ns: Any) -> list[Any]:
        async def inner() -> None:
            async with ns.timeout(10):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(inner())
        await asyncio.sleep(0)
        task.cancel()
        outer = await _outcome(task)

        async def nested() -> tuple[bool, bool]:
            async with ns.timeout(0) as a, ns.timeout(10) as b:
                await asyncio.sleep(1)
            return a.expired(), b.expired()

        return [outer, await _outcome(nested())]

    _both(loop, body)


def test_timeout_is_the_implementations_own(vloop: VirtualLoop, wheel_impl: Any) -> None:
    """timeout(), timeout_at() and wheel.timeout() make the Timeout of the wheel in use
    (the compiled one is C, wheel/csrc/timeout.h), and it refuses a second await."""

    async def main() -> None:
        wheel = get_wheel()
        made = [timeout(1), timeout_at(None), wheel.timeout(1), wheel.timeout_at(None)]
        assert {type(cm) for cm in made} == {wheel_impl.Timeout}
        cm = made[0]
        step = cm.__aenter__()
        assert await step is cm
        with pytest.raises(RuntimeError):
            await step  # an awaited __aenter__ cannot run again
        await cm.__aexit__(None, None, None)
        assert "finished" in repr(cm)

    run(vloop, main)
