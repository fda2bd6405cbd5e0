"""The core against a plain model (a heap) on virtual time, with hypothesis.

The model is what the wheel promises: after ``advance(now)`` exactly the timers with a
deadline <= now have fired, none early, in deadline order and FIFO within a tick, and no
cancelled timer ever fires. ``_check()`` runs after every step.

The same machine runs on both cores through an adapter: the pure-Python ``Core``, and the
compiled one on integer ticks (``_t_insert``, ``_t_move``, ``_t_advance``). The compiled
core keeps ticks in 64 bits (deadlines beyond 2**62 ticks never come due), so its run
draws delays and clock steps that stay below that.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from wheel_impls import IMPLS

from tickwheel.wheel._core import Core, Entry


class Item(Entry):
    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key
        self._bucket = None

    def __repr__(self) -> str:
        return f"Item({self.key}, due={self._deadline})"


class Adapter(Protocol):
    """The core operations the model drives, on integer ticks, with timers named by key."""

    def insert(self, key: int, deadline: int) -> int: ...
    def remove(self, key: int) -> bool: ...
    def move(self, key: int, deadline: int) -> int: ...
    def pending(self, key: int) -> bool: ...
    def deadline(self, key: int) -> int: ...
    def advance(self, now: int) -> list[tuple[int, int]]: ...  # (key, deadline) fired
    def next_deadline(self) -> int | None: ...
    def check(self) -> None: ...
    def __len__(self) -> int: ...


class PythonCore:
    def __init__(self, start: int) -> None:
        self.core: Core[Item] = Core(start)
        self.items: dict[int, Item] = {}

    def insert(self, key: int, deadline: int) -> int:
        item = self.items[key] = Item(key)
        return self.core.insert(item, deadline)

    def remove(self, key: int) -> bool:
        return self.core.remove(self.items[key])

    def move(self, key: int, deadline: int) -> int:
        return self.core.move(self.items[key], deadline)

    def pending(self, key: int) -> bool:
        return self.items[key]._bucket is not None

    def deadline(self, key: int) -> int:
        return self.items[key]._deadline

    def advance(self, now: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = []
        while (bucket := self.core.pop_due(now)) is not None:
            for item in list(bucket):
                if item._bucket is bucket:
                    item._bucket = None
                    self.core._len -= 1
                    got.append((item.key, item._deadline))
        return got

    def next_deadline(self) -> int | None:
        return self.core.next_deadline()

    def check(self) -> None:
        self.core._check()

    def __len__(self) -> int:
        return len(self.core)


class _StubLoop:
    """All a wheel needs to be made; the tick-level methods never touch the loop."""

    def __init__(self, start: int) -> None:
        self.start = float(start)

    def time(self) -> float:
        return self.start

    def call_at(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the tick-level core must not arm the loop")


class CompiledCore:
    def __init__(self, start: int) -> None:
        from tickwheel.wheel._cdriver import TimingWheel

        self.wheel = TimingWheel(tick=1.0, loop=_StubLoop(start))  # type: ignore[arg-type]
        self.timers: dict[int, Any] = {}
        self.keys: dict[int, int] = {}  # id(timer) -> key

    def insert(self, key: int, deadline: int) -> int:
        timer, used = self.wheel._t_insert(print, deadline)
        self.timers[key] = timer
        self.keys[id(timer)] = key
        return used

    def remove(self, key: int) -> bool:
        return self.timers[key].cancel()

    def move(self, key: int, deadline: int) -> int:
        return self.wheel._t_move(self.timers[key], deadline)

    def pending(self, key: int) -> bool:
        return bool(self.timers[key].pending())

    def deadline(self, key: int) -> int:
        return int(self.timers[key]._deadline)

    def advance(self, now: int) -> list[tuple[int, int]]:
        return [(self.keys[id(t)], t._deadline) for t in self.wheel._t_advance(now)]

    def next_deadline(self) -> int | None:
        return self.wheel._next_deadline()

    def check(self) -> None:
        self.wheel._check_core()

    def __len__(self) -> int:
        return len(self.wheel)


# Delays that hit every level: same tick, level 0, the level boundaries, far, very far.
def delays(limit: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, 3),
        st.integers(0, 70),
        st.sampled_from([63, 64, 65, 4095, 4096, 4097, 64**3, 64**3 + 1, 64**4 - 1]),
        st.integers(0, 10**6),
        st.integers(0, limit),
    )


# Clock steps: tiny, a few levels, and huge jumps (a stalled loop).
def steps(limit: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, 5),
        st.integers(0, 5000),
        st.integers(0, 10**7),
        st.integers(0, limit),
    )


def machine(
    make: Callable[[int], Adapter], delay_limit: int, step_limit: int
) -> type[RuleBasedStateMachine]:
    """The model machine over the core ``make(start)`` returns."""

    class WheelVersusHeap(RuleBasedStateMachine):
        timers = Bundle("timers")

        def __init__(self) -> None:
            super().__init__()
            self.seq = itertools.count()
            self.heap: list[tuple[int, int, int]] = []  # (deadline, seq, key): the model
            self.live: dict[int, tuple[int, int]] = {}  # key -> (deadline, seq) while pending
            self.fired: set[int] = set()
            self.now = 0
            self.fired_tick = -1  # deadline of the last timer that fired
            self.core: Adapter = make(0)

        @initialize(start=st.integers(0, 2**40))
        def start(self, start: int) -> None:
            self.now = start
            self.core = make(start)

        def _model_deadline(self, delay: int) -> int:
            # An overdue deadline joins the current tick, or the next once it fired.
            return max(self.now + delay, self.fired_tick + 1)

        @rule(target=timers, delay=delays(delay_limit))
        def schedule(self, delay: int) -> int:
            key = next(self.seq)
            used = self.core.insert(key, self.now + delay)
            assert used == self._model_deadline(delay)
            order = next(self.seq)
            self.live[key] = (used, order)
            heapq.heappush(self.heap, (used, order, key))
            return key

        @rule(key=consumes(timers))
        def cancel(self, key: int) -> None:
            was_pending = key in self.live
            assert self.core.remove(key) is was_pending
            self.live.pop(key, None)

        @rule(key=timers, delay=delays(delay_limit))
        def reschedule(self, key: int, delay: int) -> None:
            if key not in self.live:
                assert not self.core.pending(key)
                return
            used = self.core.move(key, self.now + delay)
            assert used == self._model_deadline(delay)
            order = next(self.seq)
            self.live[key] = (used, order)
            heapq.heappush(self.heap, (used, order, key))  # the old heap entry goes stale

        @rule(key=timers, delta=st.integers(-3, 70))
        def nudge(self, key: int, delta: int) -> None:
            """Push a pending timer a little (an idle-timeout reset): often the same leaf."""
            if key not in self.live:
                return
            target = self.core.deadline(key) + delta
            used = self.core.move(key, target)
            floor = self.now if self.now > self.fired_tick else self.fired_tick + 1
            assert used == max(target, floor)
            order = next(self.seq)
            self.live[key] = (used, order)
            heapq.heappush(self.heap, (used, order, key))

        @rule(step=steps(step_limit))
        def advance(self, step: int) -> None:
            now = self.now + step
            expected: list[tuple[int, int]] = []
            while self.heap and self.heap[0][0] <= now:
                deadline, order, key = heapq.heappop(self.heap)
                if self.live.get(key) == (deadline, order):  # skip stale and cancelled
                    expected.append((key, deadline))
                    del self.live[key]
            got = self.core.advance(now)
            for key, deadline in got:
                assert deadline <= now, f"{key} due {deadline} fired early at {now}"
            assert got == expected
            assert not self.fired & {key for key, _ in got}, "a timer fired twice"
            self.fired.update(key for key, _ in got)
            if expected:
                self.fired_tick = max(self.fired_tick, expected[-1][1])
            self.now = now

        @invariant()
        def consistent(self) -> None:
            self.core.check()
            assert len(self.core) == len(self.live)
            nxt = self.core.next_deadline()
            if self.live:
                earliest = min(d for d, _ in self.live.values())
                assert nxt is not None
                assert nxt == earliest, "the driver would not wake at the first deadline"
            else:
                assert nxt is None

    WheelVersusHeap.TestCase.settings = settings(
        max_examples=300,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return WheelVersusHeap


# The pure core: unbounded ticks. The compiled one: 60 steps stay below 2**62 ticks.
MACHINES: dict[str, Callable[[], type[RuleBasedStateMachine]]] = {
    "python": lambda: machine(PythonCore, 2**70, 2**72),
    "c": lambda: machine(CompiledCore, 2**55, 2**55),
}


@pytest.mark.parametrize("impl", list(IMPLS))
def test_core_versus_heap(impl: str) -> None:
    run_state_machine_as_test(MACHINES[impl]())
