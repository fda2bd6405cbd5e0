"""The core against a plain model (a heap) on virtual time, with hypothesis.

The model is what the wheel promises: after ``advance(now)`` exactly the timers with a
deadline <= now have fired, none early, in deadline order and FIFO within a tick, and no
cancelled timer ever fires. ``_check()`` runs after every step.
"""

from __future__ import annotations

import heapq
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from tickwheel.wheel._core import Core, Entry


class Item(Entry):
    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key
        self._bucket = None

    def __repr__(self) -> str:
        return f"Item({self.key}, due={self._deadline})"


# Delays that hit every level: same tick, level 0, the level boundaries, far, very far.
delays = st.one_of(
    st.integers(0, 3),
    st.integers(0, 70),
    st.sampled_from([63, 64, 65, 4095, 4096, 4097, 64**3, 64**3 + 1, 64**4 - 1]),
    st.integers(0, 10**6),
    st.integers(0, 2**70),
)
# Clock steps: tiny, a few levels, and huge jumps (a stalled loop).
steps = st.one_of(
    st.integers(0, 5),
    st.integers(0, 5000),
    st.integers(0, 10**7),
    st.integers(0, 2**72),
)


class WheelVersusHeap(RuleBasedStateMachine):
    timers = Bundle("timers")

    def __init__(self) -> None:
        super().__init__()
        self.seq = itertools.count()
        self.heap: list[tuple[int, int, int]] = []  # (deadline, seq, key): the model
        self.live: dict[int, tuple[int, int]] = {}  # key -> (deadline, seq) while pending
        self.items: dict[int, Item] = {}
        self.fired: set[int] = set()
        self.now = 0
        self.fired_tick = -1  # deadline of the last timer that fired
        self.core: Core[Item] = Core(0)

    @initialize(start=st.integers(0, 2**40))
    def start(self, start: int) -> None:
        self.now = start
        self.core = Core(start)

    def _model_deadline(self, delay: int) -> int:
        # An overdue deadline joins the current tick, or the next once the current fired.
        return max(self.now + delay, self.fired_tick + 1)

    @rule(target=timers, delay=delays)
    def schedule(self, delay: int) -> int:
        key = next(self.seq)
        item = Item(key)
        used = self.core.insert(item, self.now + delay)
        assert used == self._model_deadline(delay)
        order = next(self.seq)
        self.live[key] = (used, order)
        heapq.heappush(self.heap, (used, order, key))
        self.items[key] = item
        return key

    @rule(key=consumes(timers))
    def cancel(self, key: int) -> None:
        was_pending = key in self.live
        assert self.core.remove(self.items[key]) is was_pending
        self.live.pop(key, None)

    @rule(key=timers, delay=delays)
    def reschedule(self, key: int, delay: int) -> None:
        item = self.items[key]
        if key not in self.live:
            assert item._bucket is None
            return
        used = self.core.move(item, self.now + delay)
        assert used == self._model_deadline(delay)
        order = next(self.seq)
        self.live[key] = (used, order)
        heapq.heappush(self.heap, (used, order, key))  # the old heap entry goes stale

    @rule(key=timers, delta=st.integers(-3, 70))
    def nudge(self, key: int, delta: int) -> None:
        """Push a pending timer a little (an idle-timeout reset): often the same leaf."""
        item = self.items[key]
        if key not in self.live:
            return
        target = item._deadline + delta
        used = self.core.move(item, target)
        assert used == max(target, self.now if self.now > self.fired_tick else self.fired_tick + 1)
        order = next(self.seq)
        self.live[key] = (used, order)
        heapq.heappush(self.heap, (used, order, key))

    @rule(step=steps)
    def advance(self, step: int) -> None:
        now = self.now + step
        expected: list[int] = []
        while self.heap and self.heap[0][0] <= now:
            deadline, order, key = heapq.heappop(self.heap)
            if self.live.get(key) == (deadline, order):  # skip stale and cancelled entries
                expected.append(key)
                del self.live[key]
        got: list[int] = []
        while (bucket := self.core.pop_due(now)) is not None:
            for item in list(bucket):
                if item._bucket is bucket:
                    item._bucket = None
                    self.core._len -= 1
                    assert item._deadline <= now, f"{item} fired early at {now}"
                    got.append(item.key)
        assert got == expected
        assert not self.fired & set(got), "a timer fired twice"
        self.fired.update(got)
        if expected:
            self.fired_tick = max(self.fired_tick, self.items[expected[-1]]._deadline)
        self.now = now

    @invariant()
    def consistent(self) -> None:
        self.core._check()
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
TestWheelVersusHeap = WheelVersusHeap.TestCase
