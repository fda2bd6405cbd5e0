"""The core against a plain model (a heap) on virtual time, with hypothesis.

The model is what the wheel promises: after ``advance(now)`` exactly the timers with a
deadline <= now have fired, none early, in deadline order and FIFO within a tick, and no
cancelled timer ever fires. ``_check()`` runs after every step.

The same machine runs on both cores through an adapter (tests/wheel_impls.py): the
pure-Python ``Core``, and the compiled one on integer ticks. The compiled
core keeps ticks in 64 bits (deadlines beyond 2**62 ticks never come due), so its run
draws delays and clock steps that stay below that.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

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
from wheel_impls import CORES, IMPLS, Adapter


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
    "python": lambda: machine(CORES["python"], 2**70, 2**72),
    "c": lambda: machine(CORES["c"], 2**55, 2**55),
}


@pytest.mark.parametrize("impl", list(IMPLS))
def test_core_versus_heap(impl: str) -> None:
    run_state_machine_as_test(MACHINES[impl]())
