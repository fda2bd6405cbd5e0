"""Counters of a scheduler (claims, acks, reaps, ...) and a fixed-bucket lateness histogram.

Ground rules:

- Counting costs a plain int increment where the event happens (a Scheduler method, the
  Ownership, the Reaper): no locks, no clocks, no allocation. Readers take a snapshot
  (:meth:`Counters.snapshot`), a frozen :class:`SchedulerStats`.
- Counters only grow (Prometheus counters are monotonic); gauges are not kept here.
- The histogram has fixed bounds (seconds), so observing is one ``bisect`` and two adds.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._jobs import ReapResult

__all__ = ["LATENESS_BOUNDS", "Counters", "LatenessHistogram", "SchedulerStats", "count_reap"]

# Upper bounds (s) of the lateness buckets: the wheel's tick (1 ms) up to a lease expiry
# after a crash (tens of seconds), roughly x2.5 per step as Prometheus' defaults.
LATENESS_BOUNDS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of one scheduler's counters (monotonic since it was made)."""

    claim_calls: int  # claim script calls
    claimed: int  # jobs handed out by claims (duplicates and moved runs excluded)
    acked: int  # leases completed by an ack
    ack_lost: int  # acks that found the lease gone (reaped or cancelled)
    retries: int  # failed jobs put back to due with a backoff
    dead_letters: int  # jobs moved to dead (by a retry on the last attempt, or a reap)
    reaped: int  # expired leases returned to due (attempt + 1) or to dead
    fenced: int  # calls refused because this owner's epoch was stale
    dedup_dropped: int  # occurrences found done at claim time: dropped, not run again
    shards_taken: int  # shards this owner took
    shards_given_back: int  # shards this owner gave back (shutdown, rebalancing)
    shards_lost: int  # shards this owner lost to another (fenced, or renewal failed)
    timeouts: int  # handlers stopped past their timeout (the attempt failed: retry or dead)
    stopped: int  # handlers stopped because their job was cancelled while running

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return asdict(self)


class Counters:
    """The mutable counters behind :class:`SchedulerStats`, one attribute per field."""

    __slots__ = SchedulerStats.__slots__

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    claim_calls: int
    claimed: int
    acked: int
    ack_lost: int
    retries: int
    dead_letters: int
    reaped: int
    fenced: int
    dedup_dropped: int
    shards_taken: int
    shards_given_back: int
    shards_lost: int
    timeouts: int
    stopped: int

    def snapshot(self) -> SchedulerStats:
        """Return the current values. O(fields)."""
        return SchedulerStats(*(getattr(self, name) for name in self.__slots__))


class LatenessHistogram:
    """Counts of lateness observations (s) by bucket, with their sum.

    ``counts[i]`` holds the observations ``<= bounds[i]`` (and above ``bounds[i - 1]``);
    the last count, past every bound, holds the rest (``+Inf``). Negative values (an
    early firing, which must not happen) land in the first bucket and are counted apart.
    """

    __slots__ = ("bounds", "counts", "early", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENESS_BOUNDS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bounds must be increasing and non-empty, got {bounds!r}")
        self.bounds = bounds  # bucket upper bounds (s)
        self.counts = [0] * (len(bounds) + 1)  # per bucket; the last one is +Inf
        self.sum = 0.0  # sum of the observations (s)
        self.early = 0  # observations below zero

    def observe(self, seconds: float) -> None:
        """Count one observation. O(log buckets)."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        if seconds < 0:
            self.early += 1

    @property
    def count(self) -> int:
        """How many observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations <= it)`` pairs ending with ``("+Inf", count)``,
        as the Prometheus text format wants them."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


def count_reap(counters: Counters, result: ReapResult) -> None:
    """Count one reap's expired leases (and the dead letters among them)."""
    counters.reaped += len(result.requeued) + len(result.dead)
    counters.dead_letters += len(result.dead)
