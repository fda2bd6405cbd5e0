"""The wheel-timed loops' handle, ``WheelTimerHandle``: an ``asyncio.TimerHandle`` that,
on the compiled core, is also the wheel's entry (wheel/csrc/handle.h), and on the
pure-Python wheel files a ``Timer`` of its own (``TICKWHEEL_PURE=1``).

Each test runs on both loops and holds on both implementations. What is checked is
asyncio's observable behaviour of a handle (and the absence of leaks), not the layout.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import pickle
import sys
import tracemalloc
import weakref
from collections.abc import Callable, Iterator

import pytest

from tickwheel.wheel import IMPLEMENTATION, WheelTimerHandle, new_event_loop, new_uvloop_event_loop

FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "stdlib": new_event_loop,
    "uvloop": new_uvloop_event_loop,
}


@pytest.fixture(params=sorted(FACTORIES))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    lp = FACTORIES[request.param]()
    yield lp
    lp.close()


def pending(loop: asyncio.AbstractEventLoop) -> int:
    return len(loop._wheel)  # type: ignore[attr-defined]


def spin(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def noop() -> None:
    pass


def test_it_is_an_asyncio_timer_handle(loop: asyncio.AbstractEventLoop) -> None:
    h = loop.call_later(10, noop)
    assert type(h) is WheelTimerHandle
    assert isinstance(h, asyncio.TimerHandle) and isinstance(h, asyncio.Handle)
    assert issubclass(WheelTimerHandle, asyncio.TimerHandle)
    assert WheelTimerHandle.__name__ == "WheelTimerHandle"
    assert h._scheduled and not h.cancelled()  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        h.anything = 1  # type: ignore[attr-defined]  # slots only, as asyncio's
    # asyncio's comparisons and hash are by when()
    later = loop.call_at(h.when() + 1, noop)
    assert h < later and later > h and h != later and hash(h) == hash(h.when())
    assert pending(loop) == 2
    h.cancel()
    later.cancel()


def test_when_is_what_was_asked_for(loop: asyncio.AbstractEventLoop) -> None:
    t = loop.time()
    as_float = loop.call_at(t + 5.000123, noop)
    as_int = loop.call_at(int(t) + 5, noop)
    never = loop.call_at(float("inf"), noop)
    assert as_float.when() == t + 5.000123
    assert as_int.when() == int(t) + 5 and type(as_int.when()) is int
    assert never.when() == float("inf")
    assert pending(loop) == 2  # inf is never filed
    for h in (as_float, as_int, never):
        h.cancel()
        assert not h._scheduled  # type: ignore[attr-defined]
    assert pending(loop) == 0


def test_cancel_before_it_fires(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[int] = []
    h = loop.call_later(0.01, ran.append, 1)
    assert h.cancel() is None  # asyncio's cancel returns nothing
    assert h.cancelled() and not h._scheduled  # type: ignore[attr-defined]
    assert h._callback is None and h._args is None  # type: ignore[attr-defined]
    assert pending(loop) == 0
    h.cancel()  # idempotent
    spin(loop, 0.05)
    assert ran == []
    assert loop._wheel.stats().cancelled == 1  # type: ignore[attr-defined]


def test_cancel_after_it_fired(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[int] = []
    h = loop.call_later(0.001, ran.append, 1)
    spin(loop, 0.05)
    assert ran == [1] and not h._scheduled  # type: ignore[attr-defined]
    assert not h.cancelled()
    h.cancel()  # too late: it ran; cancelled() as asyncio reports it
    assert h.cancelled() and pending(loop) == 0
    assert loop._wheel.stats().cancelled == 0  # type: ignore[attr-defined]


def test_fired_then_cancelled_before_it_runs(loop: asyncio.AbstractEventLoop) -> None:
    """Two handles due in the same firing: the first cancels the second, which the wheel
    has already handed to the loop. It must not run (asyncio skips a cancelled ready
    handle)."""
    ran: list[str] = []
    t = loop.time() + 0.01
    second: list[asyncio.TimerHandle] = []

    def first() -> None:
        ran.append("first")
        assert not second[0]._scheduled  # type: ignore[attr-defined]  # fired
        second[0].cancel()

    loop.call_at(t, first)
    second.append(loop.call_at(t, ran.append, "second"))
    spin(loop, 0.05)
    assert ran == ["first"]
    assert second[0].cancelled() and pending(loop) == 0


def test_scheduling_and_cancelling_leaks_nothing(loop: asyncio.AbstractEventLoop) -> None:
    """10^5 handles scheduled and cancelled (and some fired): the callback's and the
    loop's reference counts, the collector's objects and the traced bytes come back."""

    def callback(_arg: object) -> None:
        pass

    arg = object()

    def churn(n: int) -> None:
        for i in range(n):
            h = loop.call_later(100 + (i % 1000) * 0.01, callback, arg)
            h.cancel()
        fired = [loop.call_later(0, callback, arg) for _ in range(100)]
        spin(loop, 0.01)
        assert all(not h._scheduled for h in fired)  # type: ignore[attr-defined]

    churn(1000)  # warm: free lists, the wheel's levels
    gc.collect()
    refs = (sys.getrefcount(callback), sys.getrefcount(arg), sys.getrefcount(loop))
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        traced = tracemalloc.get_traced_memory()[0]
        churn(100_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - traced
    finally:
        tracemalloc.stop()
    assert (sys.getrefcount(callback), sys.getrefcount(arg), sys.getrefcount(loop)) == refs
    assert len(gc.get_objects()) <= objects + 10  # the run's own frames and the like
    assert grown < 200_000, grown  # 10^5 leaked handles would be > 15 MB
    assert pending(loop) == 0


def test_a_handle_outlives_its_loop() -> None:
    for make in FACTORIES.values():
        loop = make()
        h = loop.call_later(10, noop)
        wheel = weakref.ref(loop._wheel)  # type: ignore[attr-defined]
        loop.close()
        del loop
        gc.collect()
        assert wheel() is not None  # the handle's _loop keeps the loop and its wheel
        assert h._scheduled and not h.cancelled()  # type: ignore[attr-defined]  # as asyncio's
        h.cancel()  # not filed any more: asyncio's cancel alone
        assert h.cancelled() and "cancelled" in repr(h)
        del h
        gc.collect()
        assert wheel() is None


def test_pending_handles_of_a_dropped_loop_are_collected() -> None:
    """A loop dropped with handles still filed in its wheel (closed by its base class's
    close, which knows nothing of the wheel): the cycle loop -> wheel -> handles -> loop
    is collected whole."""
    for make in FACTORIES.values():
        loop = make()
        handles = [loop.call_later(10 + i, noop) for i in range(5)]
        wheel = loop._wheel  # type: ignore[attr-defined]
        refs = [weakref.ref(o) for o in (*handles, wheel, loop)]
        type(loop).__mro__[1].close(loop)  # type: ignore[attr-defined]
        assert len(wheel) == 5
        del loop, handles, wheel
        gc.collect()
        assert [r() for r in refs] == [None] * len(refs)


def test_weakref_copy_and_pickling_as_asyncio(loop: asyncio.AbstractEventLoop) -> None:
    h = loop.call_later(10, noop)
    assert weakref.ref(h)() is h
    c = copy.copy(h)  # as asyncio's: a copy of the slots, not filed anywhere
    assert type(c) is WheelTimerHandle and c.when() == h.when() and c._loop is loop  # type: ignore[attr-defined]
    c.cancel()
    assert c.cancelled() and not h.cancelled() and pending(loop) == 1
    for protocol in (0, pickle.HIGHEST_PROTOCOL):
        with pytest.raises((TypeError, AttributeError)):  # the loop cannot be pickled
            pickle.dumps(h, protocol)
    h.cancel()


def test_the_wheel_holds_the_handle_itself(loop: asyncio.AbstractEventLoop) -> None:
    """On the compiled core the handle is the wheel's entry (no Timer beside it); on the
    pure-Python wheel it is the callback of its own Timer."""
    h = loop.call_later(10, noop)
    held = gc.get_referents(loop._wheel)  # type: ignore[attr-defined]
    if IMPLEMENTATION == "c":
        assert any(o is h for o in held)
        assert not hasattr(h, "_timer")
    else:
        timer = h._timer  # type: ignore[attr-defined]
        assert timer is not None and timer.callback is h
    h.cancel()
    assert not any(o is h for o in gc.get_referents(loop._wheel))  # type: ignore[attr-defined]
