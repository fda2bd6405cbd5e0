"""The history of finished attempts: one capped stream per shard, written by the
workers in batches off the job path, read by the dashboard's job and history pages.

Ground rules:

- ``{ns:s}:history`` is a stream; each entry is a batch of up to :data:`BATCH_MAX`
  attempts that ended (acked, retried, dead, deferred, cancelled, their lease lost or
  expired) in one worker: field ``w`` the worker (host:pid), field ``d`` a compact
  JSON list of rows (:data:`ROW_FIELDS`). One XADD per batch, not per attempt: redis-py
  spends ~15 us of the worker's CPU on each command it sends, which at thousands of
  jobs a second was more than the jobs themselves.
- Its id is Redis time when it was written (a second or so after the attempts ended:
  workers write once per balancing round); ``e`` is each end by the worker's clock.
- Each add trims the stream to about :data:`HISTORY_CAP` batches (XADD MAXLEN ~): a
  shard keeps at least its last ``HISTORY_CAP`` attempts and at most ``BATCH_MAX``
  times as many (~60 bytes a row), whatever the traffic.
- Rows are ordered by (stream id, shard, index in the batch): the history page's
  cursor is a row's place in that order.
- It is an observation, not a record of truth: a worker killed before its batch went
  out loses that batch (the jobs themselves are safe: the reaper returns them), and
  nothing reads it to decide anything.
- Every call is bounded and translated like the rest of the store (its ``Transport``);
  one pipeline per call (one round trip per node).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "BATCH_MAX",
    "HISTORY_CAP",
    "HISTORY_SCAN",
    "ROW_FIELDS",
    "HistoryBoard",
    "HistoryEntry",
]

# Batches kept per shard (approximately: trimmed by whole nodes, MAXLEN ~).
HISTORY_CAP = 2_000
# Rows in one batch at most: a shard keeps at most HISTORY_CAP x BATCH_MAX rows
# (100,000, ~6 MB).
BATCH_MAX = 50
# The most batches one read looks at per shard (a job's attempts, a filtered page).
HISTORY_SCAN = 400
# A row's fields, in order: job id, task, attempt, start and end (ms, the worker's
# clock; start 0 when unknown: a reaped lease), outcome, the error's first line.
ROW_FIELDS = ("id", "task", "attempt", "started_ms", "ended_ms", "outcome", "error")
# An order key: (Redis ms, sequence, shard, index in the batch).
Order = tuple[int, int, int, int]


def order_of(entry_id: str, shard: int, index: int) -> Order:
    """The place of row ``index`` of the batch ``entry_id`` of ``shard``."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq), shard, index


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One finished attempt, as read."""

    order: Order  # its place among every shard's rows (newest is largest)
    shard: int  # the job's shard
    job_id: str  # the job
    task: str  # its task ("" when unknown: a lease the reaper found expired)
    attempt: int  # the attempt that ended (0 when unknown)
    started_ms: int  # when it started (wall ms; 0: unknown)
    ended_ms: int  # when it ended (wall ms)
    outcome: str  # acked, retried, dead, deferred, cancelled, lease_lost, expired
    worker: str  # who ran it (host:pid), or the reaping worker for "expired"
    error: str  # the first line of its error ("" when none)

    @property
    def cursor(self) -> str:
        """Where a page that ends with this row goes on from: ``ms-seq-shard-index``."""
        return "-".join(map(str, self.order))

    def as_dict(self) -> dict[str, Any]:
        """The row as the JSON API gives it."""
        return {
            "entry": self.cursor,
            "shard": self.shard,
            "id": self.job_id,
            "task": self.task,
            "attempt": self.attempt,
            "started_ms": self.started_ms,
            "ended_ms": self.ended_ms,
            "outcome": self.outcome,
            "worker": self.worker,
            "error": self.error,
        }


def _rows(shard: int, raw_id: Any, fields: Any) -> list[HistoryEntry]:
    """The rows of one batch as read, newest first; none when it is not of the
    module's shape (a row that is not is skipped)."""
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
    try:
        rows = json.loads(fields.get(b"d", fields.get("d")))
        worker = fields.get(b"w", fields.get("w", b""))
        worker = worker.decode(errors="replace") if isinstance(worker, bytes) else str(worker)
        ms, _, seq = entry_id.partition("-")
        base = (int(ms), int(seq), shard)
    except (TypeError, ValueError, AttributeError):
        return []
    out = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        try:
            job_id, task, attempt, started, ended, outcome, error = row
            out.append(
                HistoryEntry(
                    order=(*base, i),
                    shard=shard,
                    job_id=str(job_id),
                    task=str(task),
                    attempt=int(attempt),
                    started_ms=int(started),
                    ended_ms=int(ended),
                    outcome=str(outcome),
                    worker=worker,
                    error=str(error),
                )
            )
        except (TypeError, ValueError):
            continue
    out.reverse()
    return out


class HistoryBoard:
    """The per-shard history streams of one namespace.

    Args:
        store: the namespace's store (its keys, client and bounds).
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    async def add(
        self, worker: str, rows: Sequence[tuple[int, list[Any]]], cap: int = HISTORY_CAP
    ) -> None:
        """Add ``(shard, row)`` pairs (a row the values of :data:`ROW_FIELDS`) ended in
        ``worker``, in batches of at most :data:`BATCH_MAX` per shard, each stream
        trimmed to about ``cap`` batches (one pipeline of XADDs)."""
        if not rows:
            return
        by_shard: dict[int, list[list[Any]]] = {}
        for shard, row in rows:
            by_shard.setdefault(shard, []).append(row)
        store = self._store
        keys = store.keys

        async def call() -> Any:
            async with store.client.pipeline(transaction=False) as pipe:
                for shard, shard_rows in by_shard.items():
                    key = keys.history(shard)
                    for i in range(0, len(shard_rows), BATCH_MAX):
                        text = json.dumps(shard_rows[i : i + BATCH_MAX], separators=(",", ":"))
                        pipe.xadd(key, {"w": worker, "d": text}, maxlen=cap, approximate=True)
                return await pipe.execute()

        await store.transport.bounded(call)

    async def read(
        self, shards: Sequence[int], before: Order | None = None, count: int = HISTORY_SCAN
    ) -> list[tuple[list[HistoryEntry], Order | None]]:
        """Per shard of ``shards``: the rows of its last ``count`` batches older than
        ``before`` (None: the newest), newest first, and, when the read was full (older
        batches are left), the place of the oldest batch read (one pipeline of
        XREVRANGE)."""
        store = self._store
        keys = store.keys
        top = "+" if before is None else f"{before[0]}-{before[1]}"

        async def call() -> Any:
            async with store.client.pipeline(transaction=False) as pipe:
                for shard in shards:
                    pipe.xrevrange(keys.history(shard), top, "-", count=count)
                return await pipe.execute()

        replies: Any = await store.transport.bounded(call)
        out: list[tuple[list[HistoryEntry], Order | None]] = []
        for shard, reply in zip(shards, replies, strict=True):
            rows = [r for raw_id, fields in reply for r in _rows(shard, raw_id, fields)]
            if before is not None:
                rows = [r for r in rows if r.order < before]
            oldest = None
            if len(reply) == count:
                raw = reply[-1][0]
                oldest = order_of(raw.decode() if isinstance(raw, bytes) else str(raw), shard, 0)
            out.append((rows, oldest))
        return out

    async def attempts(self, job_id: str, scan: int = HISTORY_SCAN) -> list[HistoryEntry]:
        """The finished attempts of ``job_id`` among the last ``scan`` batches of its
        shard, oldest first (one XREVRANGE)."""
        shard = self._store.keys.shard_of(job_id)
        ((rows, _),) = await self.read([shard], count=scan)
        return [r for r in reversed(rows) if r.job_id == job_id]
