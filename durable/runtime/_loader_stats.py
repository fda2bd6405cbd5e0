"""The loader's counters: :class:`LoaderStats`, written by each of its rooms (claims,
runs, acks) and read by the worker's stats and the metrics exporter."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ._history import HistoryRecorder
from ._task_stats import TaskCounters

__all__ = ["LoaderStats"]


@dataclass(slots=True)
class LoaderStats:
    """Counters of one loader (monotonic)."""

    claimed: int = 0  # jobs leased by claims
    fired: int = 0  # jobs whose wheel timer fired and whose task started
    succeeded: int = 0  # acked after the task returned
    retried: int = 0  # task raised: back to due with backoff
    deferred: int = 0  # task raised Defer: back to due later, same attempt
    limit_waits: int = 0  # over its flow key's limit: back to due to wait, same attempt
    limit_wakes: int = 0  # waiters made due at once by a permit released here
    dead: int = 0  # task raised (or was unknown) on its last attempt
    unknown: int = 0  # no task registered under the job's name
    duplicates: int = 0  # occurrence done already: acked without running
    extended: int = 0  # lease extensions of long tasks
    released: int = 0  # handed back unrun (shutdown, shard given back)
    expired: int = 0  # not run: the lease ran out before the job fired (stall)
    shed: int = 0  # released unrun after waiting too long for a task slot (backlog)
    fenced: int = 0  # a call refused for a stale epoch
    timeouts: int = 0  # handlers stopped past their timeout (then retried or dead)
    cancelled: int = 0  # handlers stopped (or waiting jobs dropped): their job was cancelled
    lease_lost: int = 0  # ack/retry/extend found the lease gone
    unavailable: int = 0  # Redis unreachable (the reaper recovers the job)
    errors: int = 0  # anything else, logged (the reaper recovers the job)
    # The same outcomes per task (runs, acks, retries, dead letters, lateness).
    tasks: TaskCounters = field(default_factory=TaskCounters, repr=False, compare=False)
    # The attempts ended, for the shards' history streams (None: not kept).
    history: HistoryRecorder | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, int]:
        """The counters by name (the per-task ones apart: :attr:`tasks`)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("tasks", "history")
        }
