"""The history of finished attempts: one capped stream per shard, written by the
workers in batches off the job path, read by the dashboard's job and history pages.

Ground rules:

- ``{ns:s}:history`` is a stream; each entry is one attempt that ended (acked, retried,
  dead, deferred, cancelled, its lease lost or expired), its one field ``d`` a compact
  JSON object (:data:`ENTRY_FIELDS`). Its id is Redis time when it was written (a
  second or so after the attempt ended: workers write in batches), ``e`` the end by
  the worker's clock.
- Each add trims the stream to about :data:`HISTORY_CAP` entries (XADD MAXLEN ~), so a
  shard's history costs at most that many entries, whatever the traffic: the page says
  how far back it reaches.
- It is an observation, not a record of truth: a worker killed before its batch went
  out loses that batch's entries (the jobs themselves are safe: the reaper returns
  them), and nothing reads it to decide anything.
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

__all__ = ["ENTRY_FIELDS", "HISTORY_CAP", "HISTORY_SCAN", "HistoryBoard", "HistoryEntry"]

# Entries kept per shard (approximately: trimmed by whole nodes, MAXLEN ~). 10,000 per
# shard is 160,000 over 16 shards, ~30 MB at ~200 bytes an entry.
HISTORY_CAP = 10_000
# The most entries one read looks at per shard (a job's attempts, a filtered page).
HISTORY_SCAN = 2_000
# An entry's fields: job id, task, attempt, start and end (ms, the worker's clock; start
# 0 when unknown: a reaped lease), outcome, worker (host:pid), error's first line.
ENTRY_FIELDS = ("id", "task", "a", "s", "e", "o", "w", "err")


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One finished attempt, as read."""

    entry_id: str  # its stream id ("<Redis ms>-<seq>"); a page's cursor
    shard: int  # the job's shard
    job_id: str  # the job
    task: str  # its task ("" when unknown: a lease the reaper found expired)
    attempt: int  # the attempt that ended
    started_ms: int  # when it started (wall ms; 0: unknown)
    ended_ms: int  # when it ended (wall ms)
    outcome: str  # acked, retried, dead, deferred, cancelled, lease_lost, expired
    worker: str  # who ran it (host:pid), or the reaping worker for "expired"
    error: str  # the first line of its error ("" when none)

    @property
    def order(self) -> tuple[int, int, int]:
        """Its place among every shard's entries: (Redis ms, sequence, shard). Ids are
        per stream, so two shards may hold the same id: the shard breaks the tie."""
        ms, _, seq = self.entry_id.partition("-")
        return int(ms), int(seq), self.shard

    @property
    def cursor(self) -> str:
        """Where a page that ends with this entry goes on from: ``ms-seq-shard``."""
        return f"{self.entry_id}-{self.shard}"

    def as_dict(self) -> dict[str, Any]:
        """The entry as the JSON API gives it."""
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


def _entry(shard: int, raw_id: Any, fields: Any) -> HistoryEntry | None:
    """An entry as read, or None when it is not of the module's shape."""
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
    try:
        d = json.loads(fields.get(b"d", fields.get("d")))
        return HistoryEntry(
            entry_id=entry_id,
            shard=shard,
            job_id=str(d["id"]),
            task=str(d.get("task", "")),
            attempt=int(d.get("a", 0)),
            started_ms=int(d.get("s", 0)),
            ended_ms=int(d["e"]),
            outcome=str(d["o"]),
            worker=str(d.get("w", "")),
            error=str(d.get("err", "")),
        )
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


class HistoryBoard:
    """The per-shard history streams of one namespace.

    Args:
        store: the namespace's store (its keys, client and bounds).
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    async def add(
        self, entries: Sequence[tuple[int, dict[str, Any]]], cap: int = HISTORY_CAP
    ) -> None:
        """Add ``(shard, entry)`` pairs (the entry a dict of :data:`ENTRY_FIELDS`), each
        stream trimmed to about ``cap`` (one pipeline of XADDs)."""
        if not entries:
            return
        store = self._store
        keys = store.keys

        async def call() -> Any:
            async with store.client.pipeline(transaction=False) as pipe:
                for shard, entry in entries:
                    text = json.dumps(entry, separators=(",", ":"))
                    pipe.xadd(keys.history(shard), {"d": text}, maxlen=cap, approximate=True)
                return await pipe.execute()

        await store.transport.bounded(call)

    async def read(
        self, shards: Sequence[int], ends: Sequence[str] | None = None, count: int = HISTORY_SCAN
    ) -> list[list[HistoryEntry]]:
        """Per shard of ``shards``: its last ``count`` entries up to its end in ``ends``
        (an XREVRANGE end: ``"+"`` the newest, ``"(<id>"`` before an id, ``"<id>"`` up to
        it; None: the newest everywhere), newest first (one pipeline of XREVRANGE)."""
        store = self._store
        keys = store.keys
        tops = list(ends) if ends is not None else ["+"] * len(shards)

        async def call() -> Any:
            async with store.client.pipeline(transaction=False) as pipe:
                for shard, top in zip(shards, tops, strict=True):
                    pipe.xrevrange(keys.history(shard), top, "-", count=count)
                return await pipe.execute()

        replies: Any = await store.transport.bounded(call)
        out = []
        for shard, reply in zip(shards, replies, strict=True):
            parsed = (_entry(shard, raw_id, fields) for raw_id, fields in reply)
            out.append([e for e in parsed if e is not None])
        return out

    async def attempts(self, job_id: str, scan: int = HISTORY_SCAN) -> list[HistoryEntry]:
        """The finished attempts of ``job_id`` among the last ``scan`` entries of its
        shard, oldest first (one XREVRANGE)."""
        shard = self._store.keys.shard_of(job_id)
        (entries,) = await self.read([shard], count=scan)
        return [e for e in reversed(entries) if e.job_id == job_id]
