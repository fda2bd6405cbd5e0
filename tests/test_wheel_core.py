"""The pure core on integer ticks: slot arithmetic tables and edge cases.

Most tests here look at the pure core's own structures (dict buckets, leaves, stale
bits); the last group runs its edge cases on both cores through the adapter of
tests/wheel_impls.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from wheel_impls import CORES, Adapter

from tickwheel.wheel._core import BITS, MASK, SLOTS, Core, Entry, level_for, locate, slot_start


class E(Entry):
    __slots__ = ("name",)

    def __init__(self, name: object) -> None:
        self.name = name
        self._bucket = None

    def __repr__(self) -> str:
        return f"E({self.name!r})"


def drain_due(core: Core[E], now: int) -> list[E]:
    """Fire everything due at or before ``now`` the way the driver does."""
    out: list[E] = []
    while (bucket := core.pop_due(now)) is not None:
        for entry in list(bucket):
            if entry._bucket is bucket:
                entry._bucket = None
                core._len -= 1
                out.append(entry)
        core._check()
    core._check()
    return out


def test_constants_are_a_power_of_two() -> None:
    assert SLOTS == 1 << BITS
    assert MASK == SLOTS - 1


@pytest.mark.parametrize(
    ("elapsed", "deadline", "level"),
    [
        (0, 0, 0),
        (0, 1, 0),
        (0, 63, 0),
        (0, 64, 1),
        (63, 64, 1),
        (64, 127, 0),
        (0, 4095, 1),
        (0, 4096, 2),
        (4095, 4096, 2),
        (0, 64**3 - 1, 2),
        (0, 64**3, 3),
        (0, 64**6, 6),
        (0, 2**63, 10),
        (0, 2**200, 33),
        (1_000_000, 1_000_001, 0),
        (1_000_000, 1_000_000 + 64, 1),
        (2**64 - 1, 2**64, 10),
    ],
)
def test_level_for(elapsed: int, deadline: int, level: int) -> None:
    assert level_for(elapsed, deadline) == level


@pytest.mark.parametrize(
    ("elapsed", "deadline", "where"),
    [
        (0, 5, (0, 5)),
        (0, 64, (1, 1)),
        (0, 65, (1, 1)),
        (0, 64 * 63, (1, 63)),
        (0, 4096 + 64 * 3 + 7, (2, 1)),
        (100, 100, (0, 100 & MASK)),
        (64 * 5 + 3, 64 * 5 + 60, (0, 60)),
        (64 * 5 + 3, 64 * 6, (1, 6)),
    ],
)
def test_locate(elapsed: int, deadline: int, where: tuple[int, int]) -> None:
    assert locate(elapsed, deadline) == where


@pytest.mark.parametrize(
    ("elapsed", "level", "slot", "start"),
    [
        (0, 0, 5, 5),
        (70, 0, 10, 74),  # level 0 of the range 64..127
        (70, 1, 2, 128),
        (5000, 1, 3, 4096 + 192),
        (5000, 2, 5, 5 * 4096),
        (2**40 + 3, 2, 1, 2**40 + 4096),
    ],
)
def test_slot_start(elapsed: int, level: int, slot: int, start: int) -> None:
    assert slot_start(elapsed, level, slot) == start


def test_deadline_in_the_past_joins_the_current_tick() -> None:
    core: Core[E] = Core(100)
    assert core.insert(E("late"), 50) == 100
    assert core.insert(E("now"), 100) == 100
    assert [x.name for x in drain_due(core, 100)] == ["late", "now"]
    # Tick 100 has been handed out: overdue timers now go to the next one.
    assert core.insert(E("later"), 99) == 101
    assert drain_due(core, 100) == []
    assert [x.name for x in drain_due(core, 101)] == ["later"]


def test_fires_exactly_at_deadline_at_every_level() -> None:
    core: Core[E] = Core(0)
    deadlines = [1, 63, 64, 65, 4095, 4096, 4097, 64**3 + 1, 64**4 * 3 + 17]
    for d in deadlines:
        core.insert(E(d), d)
    core._check()
    for d in deadlines:
        assert drain_due(core, d - 1) == [], f"{d} fired early"
        assert [x.name for x in drain_due(core, d)] == [d]
    assert len(core) == 0


def test_unbounded_horizon() -> None:
    core: Core[E] = Core(7)
    far = 2**200 + 12345
    e = E("far")
    assert core.insert(e, far) == far
    core._check()
    assert core.next_deadline() is not None
    assert drain_due(core, far - 1) == []
    assert drain_due(core, far) == [e]
    assert core.levels == 34


def test_catch_up_costs_occupied_buckets_not_elapsed_ticks() -> None:
    class Counting(Core[E]):
        visits = 0

        def _earliest(self) -> tuple[int, int] | None:
            self.visits += 1
            return super()._earliest()

    core = Counting(0)
    deadlines = [10, 10**6, 10**9, 10**12]
    for d in deadlines:
        core.insert(E(d), d)
    fired = drain_due(core, 10**13)
    assert [x.name for x in fired] == deadlines
    # Each timer cascades through at most its number of levels; 10**13 ticks elapsed.
    assert core.visits <= 4 * 9 + 2


def test_fifo_within_a_tick_survives_cascading() -> None:
    core: Core[E] = Core(0)
    names = [f"t{i}" for i in range(50)]
    for n in names:
        core.insert(E(n), 64**3 + 5)
    assert [x.name for x in drain_due(core, 64**3 + 5)] == names


def test_remove_and_move() -> None:
    core: Core[E] = Core(0)
    a, b, c = E("a"), E("b"), E("c")
    core.insert(a, 10)
    core.insert(b, 10)
    core.insert(c, 5000)
    assert core.remove(a) is True
    assert core.remove(a) is False
    core.move(c, 10)  # moves to the back of tick 10's queue
    core._check()
    assert drain_due(core, 10) == [b, c]
    with pytest.raises(ValueError, match="not pending"):
        core.move(a, 20)


def test_removing_from_a_handed_out_bucket() -> None:
    core: Core[E] = Core(0)
    a, b = E("a"), E("b")
    core.insert(a, 3)
    core.insert(b, 3)
    bucket = core.pop_due(3)
    assert bucket is not None
    assert core.remove(b) is True  # a callback cancelled b before it ran
    assert len(core) == 1
    core._check(handed_out=1)


def test_restore_puts_back_unfired_entries_in_order() -> None:
    core: Core[E] = Core(0)
    entries = [E(i) for i in range(4)]
    for e in entries:
        core.insert(e, 7)
    bucket = core.pop_due(7)
    assert bucket is not None
    first = entries[0]
    first._bucket = None  # the driver fired it, then a KeyboardInterrupt unwound
    core._len -= 1
    core.restore(bucket)
    core._check()
    assert drain_due(core, 7) == entries[1:]


def test_stale_bits_are_cleared_lazily() -> None:
    core: Core[E] = Core(0)
    e = E("x")
    core.insert(e, 5)
    core.remove(e)
    assert core._occupied[0] >> 5 & 1  # the cancel left the bit
    assert core.next_deadline() is None
    assert core._occupied[0] == 0


def test_pop_due_moves_elapsed_to_now_when_nothing_is_due() -> None:
    core: Core[E] = Core(0)
    core.insert(E("far"), 10_000)
    assert core.pop_due(9_000) is None
    assert core.elapsed == 9_000
    core._check()


def test_advance_idle_only_when_empty() -> None:
    core: Core[E] = Core(0)
    core.advance_idle(500)
    assert core.elapsed == 500
    core.insert(E("x"), 900)
    core.advance_idle(800)
    assert core.elapsed == 500


def test_drain_returns_by_deadline_then_fifo() -> None:
    core: Core[E] = Core(0)
    order = [(300, "a"), (5, "b"), (300, "c"), (64**5, "d"), (5, "e")]
    for d, n in order:
        core.insert(E(n), d)
    assert [x.name for x in core.drain()] == ["b", "e", "a", "c", "d"]
    assert len(core) == 0
    core._check()


def test_check_reports_a_broken_wheel_with_a_dump() -> None:
    core: Core[E] = Core(0)
    e = E("x")
    core.insert(e, 100)
    e._deadline = 7  # corrupt it
    with pytest.raises(AssertionError, match=r"belongs in \(0, 7\)[\s\S]*1/1 leaf 36: \[7\]"):
        core._check()


def test_negative_start_is_refused() -> None:
    with pytest.raises(ValueError, match="elapsed must be >= 0"):
        Core(-1)


def test_cascade_moves_leaves_whole() -> None:
    class Counting(Core[E]):
        placements = 0

        def insert(self, entry: E, deadline: int) -> int:
            self.placements += 1
            return super().insert(entry, deadline)

    core = Counting(0)
    # 3200 timers spread over one level-2 bucket (ticks 4096..8191), 50 per sub-slot.
    for i in range(3200):
        group, j = divmod(i, 50)
        core.insert(E(i), 4096 + group * 64 + 1 + j)
    core.placements = 0
    assert drain_due(core, 4096) == []  # cascades the level-2 bucket at 4096
    core._check()
    # Only the sub-slot due soonest (group 0: 50 timers) is placed entry by entry.
    assert core.placements == 50
    fired = drain_due(core, 8191)
    assert [e._deadline for e in fired] == sorted(e._deadline for e in fired)
    assert len(fired) == 3200


def test_fifo_across_a_leaf_that_came_down_whole() -> None:
    core: Core[E] = Core(0)
    due = 64**3 + 64 * 5 + 9  # level 3 from 0; group 1 (=5 at level 1) not 0
    first = [E(f"old{i}") for i in range(3)]
    for e in first:
        core.insert(e, due)
    assert drain_due(core, 64**3) == []  # level-3 bucket cascades: the leaf comes down whole
    core._check()
    later = [E(f"new{i}") for i in range(3)]
    for e in later:
        core.insert(e, due)  # placed directly, after the old ones
    core._check()
    assert drain_due(core, due) == first + later


def test_move_within_a_leaf_is_a_move_to_the_back() -> None:
    core: Core[E] = Core(0)
    a, b = E("a"), E("b")
    core.insert(a, 5000)  # level 2
    core.insert(b, 5001)
    assert core.move(a, 5001) == 5001  # same leaf: the fast path
    core._check()
    assert drain_due(core, 5001) == [b, a]


def test_move_out_of_an_unsorted_leaf_keeps_fifo() -> None:
    core: Core[E] = Core(0)
    due = 64**3 + 2 * 4096 + 5 * 64 + 9
    a, b = E("a"), E("b")
    core.insert(a, due)  # level 3 from 0
    assert drain_due(core, 64**3) == []  # its leaf comes down whole, as UNSORTED
    assert id(a._bucket) in core._unsorted
    core.insert(b, due + 1)  # placed directly into a sorted leaf of the same bucket
    core.move(a, due + 1)  # after b: must fire after b, though in the same 64-tick window
    core._check()
    assert drain_due(core, due + 1) == [b, a]


# -- the same edge cases on both cores (the compiled one on integer ticks) ----------------


@pytest.fixture(params=list(CORES))
def core_of(request: pytest.FixtureRequest) -> Callable[[int], Adapter]:
    """Makes a core on integer ticks of each implementation (tests/wheel_impls.py)."""
    return CORES[request.param]


def test_both_overdue_deadlines(core_of: Callable[[int], Adapter]) -> None:
    core = core_of(100)
    assert core.insert(1, 50) == 100
    assert core.insert(2, 100) == 100
    assert core.advance(100) == [(1, 100), (2, 100)]
    assert core.insert(3, 99) == 101  # tick 100 was handed out
    assert core.advance(100) == []
    assert core.advance(101) == [(3, 101)]
    core.check()


def test_both_fire_exactly_at_every_level(core_of: Callable[[int], Adapter]) -> None:
    core = core_of(0)
    deadlines = [1, 63, 64, 65, 4095, 4096, 4097, 64**3 + 1, 64**4 * 3 + 17, 2**61 + 3]
    for d in deadlines:
        core.insert(d, d)
    core.check()
    for d in deadlines:
        assert core.next_deadline() == d
        assert core.advance(d - 1) == [], f"{d} fired early"
        assert core.advance(d) == [(d, d)]
        core.check()
    assert len(core) == 0


def test_both_keep_fifo_through_cascades(core_of: Callable[[int], Adapter]) -> None:
    core = core_of(0)
    for key in range(50):
        core.insert(key, 64**3 + 5)
    core.advance(64**2)  # part of the way: one cascade
    for key in range(50, 60):
        core.insert(key, 64**3 + 5)
    assert [k for k, _ in core.advance(64**3 + 5)] == list(range(60))


def test_both_remove_and_move(core_of: Callable[[int], Adapter]) -> None:
    core = core_of(0)
    core.insert(1, 10)
    core.insert(2, 10)
    core.insert(3, 5000)
    assert core.remove(1) is True
    assert core.remove(1) is False
    assert core.move(3, 10) == 10  # to the back of tick 10's queue
    core.check()
    assert core.advance(10) == [(2, 10), (3, 10)]
    with pytest.raises(ValueError, match="not pending"):
        core.move(1, 20)


def test_both_catch_up_in_order(core_of: Callable[[int], Adapter]) -> None:
    core = core_of(0)
    deadlines = [10**12, 10, 10**9, 10**6, 10**9]
    for key, d in enumerate(deadlines):
        core.insert(key, d)
    assert core.advance(10**13) == [(1, 10), (3, 10**6), (2, 10**9), (4, 10**9), (0, 10**12)]
    assert core.next_deadline() is None
