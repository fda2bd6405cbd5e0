"""A worker's record of the attempts it ended, for the shards' history streams
(``store/_history.py``): kept in memory as they end, written in one batch per
balancing round, off the job path.

Ground rules:

- Recording is a dict write at a start and a pop and a list append at an end: no
  Redis call, no await. The balancer takes the batch and writes it (one pipeline of a
  few XADDs: the rows go in batches, ``store/_history.py``).
- Bounded: at most :data:`MAX_PENDING` entries wait for a write (Redis unreachable:
  the oldest are dropped and counted), and at most :data:`MAX_STARTS` starts are
  remembered (a start whose end never came, such as a job released at shutdown).
- An error is kept as its first line, cut to :data:`ERROR_CHARS` (the job's whole last
  error and traceback stay in its record).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from tickwheel.durable.model import Job, ReapResult

__all__ = ["ERROR_CHARS", "MAX_PENDING", "MAX_STARTS", "HistoryRecorder"]

# Entries waiting for their write, at most (a few rounds' worth at thousands of jobs/s).
MAX_PENDING = 50_000
# Starts remembered at most: past it they are forgotten (their attempts show no start).
MAX_STARTS = 100_000
# Characters of an error's first line kept in an entry.
ERROR_CHARS = 200

# The outcomes an entry names.
ACKED, RETRIED, DEAD, DEFERRED = "acked", "retried", "dead", "deferred"
CANCELLED, LEASE_LOST, EXPIRED = "cancelled", "lease_lost", "expired"


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, cut to :data:`ERROR_CHARS`."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:ERROR_CHARS]
    return ""


class HistoryRecorder:
    """The attempts a worker ended since its last write, by shard."""

    __slots__ = ("dropped", "pending", "starts", "worker")

    def __init__(self) -> None:
        self.worker = f"{socket.gethostname()}:{os.getpid()}"  # who ran them
        self.starts: dict[tuple[int, str], int] = {}  # (shard, id) -> start (wall ms)
        self.pending: list[tuple[int, list[Any]]] = []  # (shard, row) to write: ROW_FIELDS
        self.dropped = 0  # entries dropped unwritten (MAX_PENDING reached)

    def started(self, job: Job) -> None:
        """``job``'s handler starts now. O(1)."""
        starts = self.starts
        if len(starts) >= MAX_STARTS:
            starts.clear()
        starts[(job.shard, job.id)] = int(time.time() * 1000)

    def ended(self, job: Job, outcome: str, error: str = "") -> None:
        """``job``'s attempt ended with ``outcome`` (and ``error``, its first line kept)."""
        start = self.starts.pop((job.shard, job.id), 0)
        end = int(time.time() * 1000)
        line = first_line(error) if error else ""
        self._add(job.shard, [job.id, job.task, job.attempt, start, end, outcome, line])

    def reaped(self, result: ReapResult) -> None:
        """The expired leases a reap returned to due or dead-lettered (task and attempt
        unknown here: 0 and "")."""
        now = int(time.time() * 1000)
        why = "lease expired (its worker died or stalled)"
        for ids, outcome in ((result.requeued, EXPIRED), (result.dead, DEAD)):
            for job_id in ids:
                self._add(result.shard, [job_id, "", 0, 0, now, outcome, why])

    def _add(self, shard: int, row: list[Any]) -> None:
        pending = self.pending
        if len(pending) >= MAX_PENDING:
            del pending[: len(pending) // 10]  # the oldest tenth: one move, not one per entry
            self.dropped += MAX_PENDING // 10
        pending.append((shard, row))

    def take(self) -> list[tuple[int, list[Any]]]:
        """The entries to write, and forget them here."""
        batch, self.pending = self.pending, []
        return batch

    def put_back(self, batch: list[tuple[int, list[Any]]]) -> None:
        """Entries whose write failed: written with the next batch (bounded)."""
        merged = batch + self.pending
        if len(merged) > MAX_PENDING:
            self.dropped += len(merged) - MAX_PENDING
            merged = merged[-MAX_PENDING:]
        self.pending = merged
