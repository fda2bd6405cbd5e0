"""The pure core: a hierarchical hashed timing wheel on integer ticks.

No asyncio and no clock here (G9): the core is told what tick it is and hands back the
buckets that are due. The driver (``_driver.py``) is the only module that touches a loop.

Shape (Varghese & Lauck's scheme 7, with Kafka-style overflow levels):

* Level ``L`` has ``SLOTS`` buckets; a bucket of level ``L`` covers ``SLOTS ** L`` ticks,
  so level 0 buckets are single ticks. Levels are created on demand, so the horizon is
  unbounded (G6): a deadline ``2 ** 200`` ticks away needs 34 levels, not clamping.
* A deadline ``d`` lives at the level of the highest ``BITS``-bit group in which it
  differs from ``elapsed`` (``level_for``), in the bucket indexed by that group of ``d``.
* A bucket is a ``dict`` used as an insertion-ordered set: O(1) insert and delete by key,
  iteration in insertion order (FIFO within a tick, G7), all in C.
* Above level 0 a bucket is split into *leaves* by the next ``BITS`` of the deadline (the
  slot each entry will take one level down). When ``elapsed`` reaches the bucket, a leaf
  whose group is not 0 belongs whole to one bucket of the level below and is moved there
  as it is, in O(1): its entries keep pointing at it. Only the leaf of group 0 (due
  soonest) and leaves that arrived whole from above (``UNSORTED``) are re-placed entry
  by entry. Cascading a bucket of N entries thus costs about N / 64 placements instead of
  N, which keeps the pause at a level boundary short: in pure Python a placement costs
  about half a microsecond, so cascading 100,000 timers at once would stall the loop for
  some 50 ms.

Ground rules (asserted by :meth:`Core._check`):

1. Every pending entry has ``elapsed <= entry._deadline`` and sits in exactly one bucket,
   the one ``locate(elapsed, entry._deadline)`` names; ``entry._bucket`` is that bucket's
   dict at level 0, or the leaf holding it above; a leaf's key is ``UNSORTED`` or the
   entry's group one level down.
2. For ``L > 0`` the bucket at the current position of ``elapsed`` is empty: entries
   there were cascaded down when ``elapsed`` reached the bucket's start.
3. A non-empty bucket has its bit set in ``occupied[L]``. The converse may fail: a cancel
   leaves the bit set (cancel stays a single dict delete), and the next search for the
   earliest bucket clears stale bits as it meets them.
4. ``len(core)`` counts the entries in buckets plus those handed out by ``pop_due`` that
   the driver has neither fired nor cancelled yet.
5. All entries of level ``L`` share with ``elapsed`` every bit above level ``L``'s group,
   hence the lowest non-empty level holds the earliest deadline.
6. ``fired <= elapsed``: ``fired`` is the tick of the last level-0 bucket handed out. A new
   deadline is raised to ``max(elapsed, fired + 1)``: an overdue timer joins the current
   tick if that tick has not been handed out, and the next one if it has, so a callback
   that reschedules itself at delay 0 cannot spin inside one ``pop_due`` loop.

An entry is removed by deleting it from ``entry._bucket``; the bucket handed out by
``pop_due`` keeps working for that, so a callback may cancel a timer that is due in the
same tick and has not run yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Generic, TypeVar

__all__ = [
    "BITS",
    "MASK",
    "SLOTS",
    "UNSORTED",
    "Core",
    "Entry",
    "level_for",
    "locate",
    "slot_start",
]

# Slots per level. 64 = 2**6: slot index and level are shifts and masks of the tick, and a
# level's occupancy fits in one machine word, as in tokio's timer (LEVEL_MULT = 64).
BITS: Final = 6
SLOTS: Final = 1 << BITS
MASK: Final = SLOTS - 1
# Key of a leaf that came down whole from the level above, so is not split by group.
UNSORTED: Final = -1


class Entry:
    """What the core stores: anything with a deadline tick and a bucket reference.

    The public handle (:class:`tickwheel.wheel.Timer`) subclasses this, so a pending timer
    is one object, not a handle plus a node.
    """

    __slots__ = ("_bucket", "_deadline")

    _deadline: int  # tick at which the entry is due; >= the core's elapsed while pending
    _bucket: dict[Any, None] | None  # the bucket holding it; None when not pending


E = TypeVar("E", bound=Entry)


def level_for(elapsed: int, deadline: int) -> int:
    """Return the level a deadline belongs to, seen from ``elapsed``.

    It is the index of the highest ``BITS``-bit group in which the two differ (0 when
    they differ only in the lowest group). Runtime complexity: O(1) for 64-bit ticks.
    """
    return (((elapsed ^ deadline) | MASK).bit_length() - 1) // BITS


def locate(elapsed: int, deadline: int) -> tuple[int, int]:
    """Return ``(level, slot)`` of the bucket a deadline is placed in."""
    level = level_for(elapsed, deadline)
    return level, (deadline >> (level * BITS)) & MASK


def slot_start(elapsed: int, level: int, slot: int) -> int:
    """Return the first tick covered by ``slot`` of ``level`` in elapsed's current range."""
    shift = level * BITS
    above = shift + BITS
    return ((elapsed >> above) << above) | (slot << shift)


class Core(Generic[E]):
    """The wheel's levels and buckets, advanced by integer ticks.

    Args:
        elapsed: the tick to start at; nothing earlier can be scheduled.
    """

    __slots__ = ("_elapsed", "_fired", "_len", "_level0", "_occupied", "_unsorted", "_upper")

    def __init__(self, elapsed: int = 0) -> None:
        if elapsed < 0:
            raise ValueError(f"elapsed must be >= 0, got {elapsed}")
        self._elapsed = elapsed  # current tick; every entry due before it has been handed out
        self._fired = -1  # tick of the last level-0 bucket handed out (rule 6)
        self._level0: list[dict[E, None]] = [{} for _ in range(SLOTS)]  # [slot] -> ordered set
        # [level][slot] -> {group one level down, or UNSORTED: leaf}; [0] is unused
        self._upper: list[list[dict[int, dict[E, None]]]] = [[]]
        self._occupied: list[int] = [0]  # [level] -> bitmap of possibly non-empty slots
        self._unsorted: set[int] = set()  # id() of the leaves filed under UNSORTED (for move)
        self._len = 0  # pending entries, including those handed out and not yet fired

    def __len__(self) -> int:
        return self._len

    @property
    def elapsed(self) -> int:
        """The current tick."""
        return self._elapsed

    @property
    def levels(self) -> int:
        """Levels allocated so far."""
        return len(self._occupied)

    def insert(self, entry: E, deadline: int) -> int:
        """Place a new entry, due at ``deadline`` (an overdue one is raised, rule 6).

        This is the one place that computes where an entry goes; ``move``, cascading and
        ``restore`` all come through it.

        Returns:
            The deadline used. Runtime complexity: O(1).
        """
        elapsed = self._elapsed
        if deadline <= elapsed:
            deadline = elapsed if elapsed > self._fired else self._fired + 1
        diff = elapsed ^ deadline
        if diff < SLOTS:  # level 0: the common case for short timers
            slot = deadline & MASK
            bucket = self._level0[slot]
            self._occupied[0] |= 1 << slot
        else:
            level = (diff.bit_length() - 1) // BITS
            shift = level * BITS
            slot = (deadline >> shift) & MASK
            if level >= len(self._occupied):
                self._grow(level)
            leaves = self._upper[level][slot]
            group = (deadline >> (shift - BITS)) & MASK
            found = leaves.get(group)
            if found is None:
                found = leaves[group] = {}
            bucket = found
            self._occupied[level] |= 1 << slot
        bucket[entry] = None
        entry._bucket = bucket
        entry._deadline = deadline
        self._len += 1
        return deadline

    def move(self, entry: E, deadline: int) -> int:
        """Move a pending entry to a new deadline, at the back of its new tick's queue.

        Returns:
            The deadline used. Runtime complexity: O(1).

        Raises:
            ValueError: the entry is not pending.
        """
        bucket = entry._bucket
        if bucket is None:
            raise ValueError(f"{entry!r} is not pending")
        old = entry._deadline
        if (
            deadline >= old > self._elapsed
            and deadline ^ old < SLOTS
            and (deadline == old or old ^ self._elapsed >= SLOTS * SLOTS)
            and id(bucket) not in self._unsorted
        ):
            # The idle-timeout reset: a far deadline pushed back within its 64-tick window
            # stays in the same leaf (same level, slot and group; level >= 2, or the very
            # same tick), so going to the back of that leaf is all insert would do. Not
            # for an UNSORTED leaf: its entries cascade before the sorted leaves, which
            # would put this timer ahead of ones scheduled before the move (G7).
            del bucket[entry]
            bucket[entry] = None
            entry._deadline = deadline
            return deadline
        del bucket[entry]
        self._len -= 1
        return self.insert(entry, deadline)

    def remove(self, entry: E) -> bool:
        """Remove a pending entry. Returns False if it was not pending. O(1)."""
        bucket = entry._bucket
        if bucket is None:
            return False
        del bucket[entry]
        entry._bucket = None
        self._len -= 1
        return True

    def _grow(self, level: int) -> None:
        """Add levels up to ``level`` (the overflow wheels), so no deadline is clamped."""
        while len(self._occupied) <= level:
            self._upper.append([{} for _ in range(SLOTS)])
            self._occupied.append(0)

    def _earliest(self) -> tuple[int, int] | None:
        """Return ``(level, slot)`` of the earliest non-empty bucket, or None.

        Clears the stale bits (rule 3) it meets. Runtime complexity: O(levels) plus one
        step per stale bit.
        """
        elapsed = self._elapsed
        occupied = self._occupied
        for level, level_bits in enumerate(occupied):
            if not level_bits:
                continue
            bits = level_bits
            pos = (elapsed >> (level * BITS)) & MASK
            ahead = bits >> pos
            while ahead:
                slot = pos + ((ahead & -ahead).bit_length() - 1)
                if self._level0[slot] if level == 0 else any(self._upper[level][slot].values()):
                    occupied[level] = bits
                    return level, slot
                bits &= ~(1 << slot)  # stale: emptied by cancels
                ahead = bits >> pos
            occupied[level] = bits
        return None

    def next_deadline(self) -> int | None:
        """Return the earliest deadline of all pending entries, or None when empty.

        By rule 5 it lies in the earliest non-empty bucket: exact at level 0; above, it is
        the least deadline of two leaves: the one of the lowest group, and the unsorted
        one. So the driver sleeps until the first deadline rather than waking at the
        bucket's start only to cascade.

        Runtime complexity: O(levels), plus O(those two leaves) above level 0.
        """
        found = self._earliest()
        if found is None:
            return None
        level, slot = found
        if level == 0:
            return slot_start(self._elapsed, 0, slot)
        leaves = self._upper[level][slot]
        groups = [group for group, leaf in leaves.items() if leaf and group != UNSORTED]
        candidates = [leaves[min(groups)]] if groups else []
        if leaves.get(UNSORTED):
            candidates.append(leaves[UNSORTED])
        return min(entry._deadline for leaf in candidates for entry in leaf)

    def pop_due(self, now: int) -> dict[E, None] | None:
        """Hand out the next bucket of entries due at or before ``now``, or None.

        Buckets of higher levels met on the way are cascaded and ``elapsed`` moves to each
        bucket's start. The bucket returned is detached from the wheel; its entries stay
        pending (``_bucket`` is the returned dict) until the driver fires them, so
        ``remove`` still works on them. When nothing more is due, ``elapsed`` moves up to
        ``now``.

        Runtime complexity: O(levels) per bucket visited, plus O(1) per leaf and per entry
        re-placed; catching up after a stall costs O(occupied buckets), never O(elapsed
        ticks).
        """
        occupied = self._occupied
        while True:
            found = self._earliest()
            if found is None:
                break
            level, slot = found
            start = slot_start(self._elapsed, level, slot)
            if start > now:
                break
            occupied[level] &= ~(1 << slot)
            self._elapsed = start
            if level == 0:
                # Take the whole bucket before its entries run: callbacks may schedule
                # into this very slot (tokio's process_expiration makes the same point).
                bucket = self._level0[slot]
                self._level0[slot] = {}
                self._fired = start
                return bucket
            leaves = self._upper[level][slot]
            self._upper[level][slot] = {}
            unsorted = leaves.get(UNSORTED)
            if unsorted is not None:
                self._unsorted.discard(id(unsorted))
            self._cascade(level - 1, leaves)
        # Safe: every entry is due after now, so none changes level or slot (rule 5).
        self._elapsed = max(self._elapsed, now)
        return None

    def _cascade(self, below: int, leaves: dict[int, dict[E, None]]) -> None:
        """Hand the leaves of a bucket whose start ``elapsed`` has just reached to the
        level ``below`` it.

        A leaf of group g > 0 is due in bucket g of the level below, which is empty (that
        level's previous range is all in the past) unless entries placed one by one from
        an earlier leaf of this loop went there; then, to keep FIFO, it is placed entry
        by entry after them. No deadline here is below ``elapsed``, and ``elapsed`` is
        past the last tick fired, so ``insert`` keeps every deadline as it is.
        """
        insert = self.insert
        for group, leaf in leaves.items():
            if not leaf:
                continue
            if group > 0:
                if below == 0:
                    if not self._level0[group]:
                        self._level0[group] = leaf
                        self._occupied[0] |= 1 << group
                        continue
                elif not any(self._upper[below][group].values()):
                    self._upper[below][group] = {UNSORTED: leaf}
                    self._unsorted.add(id(leaf))
                    self._occupied[below] |= 1 << group
                    continue
            self._len -= len(leaf)
            for entry in leaf:
                insert(entry, entry._deadline)

    def restore(self, bucket: dict[E, None]) -> None:
        """Put back the entries of a bucket from ``pop_due`` that are still pending.

        For a driver unwinding (``KeyboardInterrupt`` in a callback) part-way through a
        bucket: the rest stay due at ``elapsed``, in their order, rather than being lost.
        """
        self._fired = self._elapsed - 1  # the current tick was not wholly handed out
        for entry in bucket:
            if entry._bucket is bucket:
                self._len -= 1
                self.insert(entry, entry._deadline)

    def advance_idle(self, now: int) -> None:
        """Move ``elapsed`` up to ``now`` while the wheel is empty, so new timers are
        placed relative to the present rather than to when the wheel last ran."""
        if not self._len and now > self._elapsed:
            self._elapsed = now

    def _leaves(self) -> Iterator[tuple[int, int, int | None, dict[E, None]]]:
        """Yield ``(level, slot, key, dict)`` for every bucket dict; key None at level 0."""
        for slot, bucket in enumerate(self._level0):
            yield 0, slot, None, bucket
        for level in range(1, len(self._upper)):
            for slot, leaves in enumerate(self._upper[level]):
                for key, leaf in leaves.items():
                    yield level, slot, key, leaf

    def drain(self) -> list[E]:
        """Remove every entry in a bucket and return them by deadline (FIFO within a tick).

        Entries handed out by ``pop_due`` and not yet fired are not in a bucket and are
        the driver's to account for. Runtime complexity: O(n log n).
        """
        out: list[E] = [entry for *_, leaf in self._leaves() for entry in leaf]
        self._level0 = [{} for _ in range(SLOTS)]
        self._upper = [[]] + [[{} for _ in range(SLOTS)] for _ in self._upper[1:]]
        self._occupied = [0] * len(self._occupied)
        self._unsorted.clear()
        for entry in out:
            entry._bucket = None
        self._len -= len(out)
        # Stable, and a tick's entries sit in one dict in order (or in leaves that came
        # down in order), so FIFO within a tick survives the sort.
        out.sort(key=_deadline_of)
        return out

    def __iter__(self) -> Iterator[E]:
        """Iterate over the entries in buckets (for inspection only)."""
        for *_, leaf in self._leaves():
            yield from leaf

    def _check(self, handed_out: int = 0) -> None:
        """Assert the ground rules; on failure the message carries a dump of the wheel.

        Args:
            handed_out: entries handed out by ``pop_due`` that are still pending.
        """
        try:
            count = 0
            elapsed = self._elapsed
            assert self._fired <= elapsed, f"fired {self._fired} > elapsed {elapsed}"
            assert len(self._upper) == len(self._occupied), "levels and bitmaps differ"
            assert len(self._level0) == SLOTS, f"level 0 has {len(self._level0)} buckets"
            for level, slot, key, leaf in self._leaves():
                pos = (elapsed >> (level * BITS)) & MASK
                if leaf:
                    assert self._occupied[level] >> slot & 1, f"bit {level}/{slot} clear"
                    if level:
                        assert slot != pos, f"current slot of level {level} is not empty"
                for entry in leaf:
                    count += 1
                    d = entry._deadline
                    assert entry._bucket is leaf, f"{entry!r} points elsewhere"
                    assert d >= elapsed, f"{entry!r} due {d} before elapsed {elapsed}"
                    assert locate(elapsed, d) == (level, slot), (
                        f"{entry!r} due {d} in {level}/{slot}, belongs in {locate(elapsed, d)}"
                    )
                    if key is not None and key != UNSORTED:
                        group = (d >> ((level - 1) * BITS)) & MASK
                        assert group == key, f"{entry!r} in leaf {key}, group {group}"
                if key == UNSORTED and leaf:
                    assert id(leaf) in self._unsorted, f"unsorted leaf {level}/{slot} not known"
            assert count + handed_out == self._len, (
                f"len {self._len} != {count} in buckets + {handed_out} handed out"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self._dump()}") from None

    def _dump(self) -> str:
        lines = [f"Core(elapsed={self._elapsed}, fired={self._fired}, len={self._len})"]
        lines += [f"  occupied[{lv}]={occ:#x}" for lv, occ in enumerate(self._occupied)]
        for level, slot, key, leaf in self._leaves():
            if leaf:
                where = f"{level}/{slot}" + ("" if key is None else f" leaf {key}")
                lines.append(f"    {where}: {[e._deadline for e in leaf]}")
        return "\n".join(lines)


def _deadline_of(entry: Entry) -> int:
    return entry._deadline
