"""Counters per task of one worker: runs, acks, retries, dead letters and a firing
lateness histogram, for the stats document, the chart samples and Prometheus.

Ground rules:

- One list of ints per task (:data:`TASK_FIELDS`, then the lateness bucket counts of
  ``LATENESS_BOUNDS``, the last one +Inf): counting is a dict lookup and an increment
  where the event happens, no lock, no clock.
- The number of tasks is bounded (:data:`MAX_TASKS`): a task name seen past it is
  counted under :data:`OTHER_TASKS`, so a stream of job records with made-up task names
  cannot grow the document, the charts or the Prometheus label set without bound.
- Counters only grow (since the worker started); a reader takes differences.
"""

from __future__ import annotations

import bisect

from tickwheel.durable.model import LATENESS_BOUNDS

__all__ = ["MAX_TASKS", "OTHER_TASKS", "TASK_FIELDS", "TaskCounters"]

# The counters of a task, in the order of its list (the lateness buckets follow):
# handlers started, acks, retries, dead letters, and the sum of the lateness (µs).
TASK_FIELDS = ("runs", "acked", "retries", "dead", "late_us")
_RUNS, _ACKED, _RETRIES, _DEAD, _LATE_US = range(len(TASK_FIELDS))
_LAT = len(TASK_FIELDS)  # index of the first lateness bucket
# Tasks counted by name; the rest are summed under OTHER_TASKS. Far above the task count
# of a real registry, small enough for a stats document of a few KB.
MAX_TASKS = 64
# The name the tasks past MAX_TASKS are counted under (no task can be named "", the
# registry refuses it).
OTHER_TASKS = ""


class TaskCounters:
    """Per task: ``[runs, acked, retries, dead, late_us, *lateness buckets]``
    (monotonic but for ``late_us``, a sum)."""

    __slots__ = ("per_task",)

    def __init__(self) -> None:
        self.per_task: dict[str, list[int]] = {}  # task -> its counters, TASK_FIELDS first

    def _row(self, task: str) -> list[int]:
        row = self.per_task.get(task)
        if row is None:
            if len(self.per_task) >= MAX_TASKS:
                task = OTHER_TASKS
                row = self.per_task.get(task)
            if row is None:
                row = self.per_task[task] = [0] * (_LAT + len(LATENESS_BOUNDS) + 1)
        return row

    def fired(self, task: str, late_s: float) -> None:
        """A job of ``task`` fired ``late_s`` seconds after its due time. O(log buckets)."""
        row = self._row(task)
        row[_RUNS] += 1
        row[_LATE_US] += int(late_s * 1_000_000)
        row[_LAT + bisect.bisect_left(LATENESS_BOUNDS, late_s)] += 1

    def acked(self, task: str) -> None:
        """A run of ``task`` ended in an ack."""
        self._row(task)[_ACKED] += 1

    def retried(self, task: str) -> None:
        """A failed run of ``task`` goes back to due for another attempt."""
        self._row(task)[_RETRIES] += 1

    def dead(self, task: str) -> None:
        """A failed run of ``task`` was its last: dead-lettered."""
        self._row(task)[_DEAD] += 1

    def snapshot(self) -> dict[str, list[int]]:
        """A copy of every task's counters. O(tasks x buckets)."""
        return {task: list(row) for task, row in self.per_task.items()}
