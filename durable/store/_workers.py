"""The workers of a namespace as Redis holds them: the member set their heartbeats keep,
and the stats document each one publishes for the dashboard.

Ground rules:

- ``{ns}:workers`` is a sorted set of worker tokens scored by each one's last heartbeat
  (Redis ms, ``lua/members.lua``); ``{ns}:wstats:<token>`` a JSON object with a TTL
  (the member TTL), so a dead worker's document expires with its membership. Both
  keys share the ``{ns}`` slot: reading every worker is two commands.
- The document's shape is :data:`STATS_VERSION` 1, checked by
  :func:`parse_stats_document`: ``v`` the version, ``t`` the writer's wall clock (ms),
  ``c`` the monotonic counters named by :data:`STATS_COUNTERS`, and optionally
  ``host``, ``pid``, ``owned``, ``loaded``, ``running`` and ``lat`` (the
  firing-lateness histogram's counts) and ``tasks`` (per task name: runs, acks,
  retries, dead letters, then its lateness bucket counts; ``runtime/_task_stats.py``).
  A document that is not that shape reads as none: a reader skips it, never fails on it.
- ``{ns}:samples`` is a stream of chart samples: every :data:`SAMPLE_S` seconds each
  worker adds how much its counters grew since its previous sample (``dt`` its ms,
  ``c``, ``lat`` and ``tasks`` as in the document, but differences), under an id of
  Redis time; each add trims the entries older than :data:`SAMPLE_KEEP_MS` (XADD
  MINID), so the stream holds the last hour: at most live workers x 360 entries. The
  dashboard reads it, so its charts survive its restarts and show what happened before
  it started. A sample that is not that shape is skipped the same way.
- Every call is bounded and translated like the rest of the store (its ``Transport``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "SAMPLE_KEEP_MS",
    "SAMPLE_READ_MAX",
    "SAMPLE_S",
    "STATS_COUNTERS",
    "STATS_VERSION",
    "Sample",
    "WorkerBoard",
    "WorkerEntry",
    "parse_sample",
    "parse_stats_document",
    "task_growth",
]

# Format version of a worker's stats document.
STATS_VERSION = 1
# The order of the counters in a stats document's "c" list.
# A reader takes a document with fewer (an older worker's: the rest read as 0) or more
# (a newer worker's: the extra ones ignored).
STATS_COUNTERS = ("claimed", "acked", "retries", "dead_letters", "reaped", "timeouts")
# Seconds between a worker's chart samples: the charts' resolution. One XADD per worker
# per sample, off the job path.
SAMPLE_S = 10.0
# How long (ms) the samples are kept: the charts' hour, and a margin for clocks.
SAMPLE_KEEP_MS = 3_900_000
# The most samples one read returns (the last hour of 500 workers at SAMPLE_S).
SAMPLE_READ_MAX = 180_000


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_int(x) for x in value)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _tasks(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and _ints(v) for k, v in value.items()
    )


# The fields of a document and the check of each: required, then optional.
_REQUIRED: dict[str, Callable[[Any], bool]] = {"v": _int, "t": _int, "c": _ints}
_OPTIONAL: dict[str, Callable[[Any], bool]] = {
    "host": _str,
    "pid": _int,
    "owned": _int,
    "loaded": _int,
    "running": _int,
    "lat": _ints,
    "tasks": _tasks,
}
# A chart sample's fields: required, then optional.
_SAMPLE_REQUIRED: dict[str, Callable[[Any], bool]] = {"dt": _int, "c": _ints}
_SAMPLE_OPTIONAL: dict[str, Callable[[Any], bool]] = {"w": _str, "lat": _ints, "tasks": _tasks}


logger = logging.getLogger("tickwheel.durable")
_warned: set[tuple[str, str]] = set()  # (namespace, token) of a malformed document logged


def _parse(
    raw: bytes | str | None,
    required: Mapping[str, Callable[[Any], bool]],
    optional: Mapping[str, Callable[[Any], bool]],
) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if not isinstance(doc, dict):
        return None
    if not all(name in doc and ok(doc[name]) for name, ok in required.items()):
        return None
    if not all(ok(doc[name]) for name, ok in optional.items() if name in doc):
        return None
    return doc


def parse_stats_document(raw: bytes | str | None) -> dict[str, Any] | None:
    """The stats document stored as ``raw``, or None when there is none or it is not of
    the shape the module describes (not JSON, not an object, a field missing or of the
    wrong type). Fields it does not know are kept."""
    return _parse(raw, _REQUIRED, _OPTIONAL)


def parse_sample(raw: bytes | str | None) -> dict[str, Any] | None:
    """A chart sample's data stored as ``raw``, or None when it is not of the shape the
    module describes (``dt`` > 0 too)."""
    doc = _parse(raw, _SAMPLE_REQUIRED, _SAMPLE_OPTIONAL)
    return doc if doc is not None and doc["dt"] > 0 else None


@dataclass(frozen=True, slots=True)
class Sample:
    """One chart sample of one worker, as read from ``{ns}:samples``."""

    id: str  # its stream id ("<Redis ms>-<seq>"): where the next read starts after
    t_ms: int  # Redis time when it was added (ms): the end of the interval it covers
    data: dict[str, Any]  # dt, c, lat, tasks (differences), as the module describes


@dataclass(frozen=True, slots=True)
class WorkerEntry:
    """One member of a namespace's worker set, as read."""

    token: str  # the worker's token (also its owner token)
    beat_ms: int  # its last heartbeat, Redis ms
    stats: dict[str, Any] | None  # its stats document; None when absent or malformed


def task_growth(samples: Iterable[Sample], since_ms: int) -> tuple[dict[str, list[int]], int]:
    """Each task's counters summed over the samples that end at ``since_ms`` or later,
    and the earliest time (ms) those samples cover (0: no sample). O(samples x tasks)."""
    rows: dict[str, list[int]] = {}
    first_ms = 0
    for s in samples:
        if s.t_ms < since_ms:
            continue
        start = s.t_ms - s.data["dt"]
        first_ms = start if not first_ms else min(first_ms, start)
        for task, grew in s.data.get("tasks", {}).items():
            row = rows.setdefault(task, [])
            if len(row) < len(grew):
                row += [0] * (len(grew) - len(row))
            for j, v in enumerate(grew):
                row[j] += v
    return rows, first_ms


class WorkerBoard:
    """The member set and the stats documents of one namespace's workers.

    Args:
        store: the namespace's store (its keys, client and bounds).
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    async def heartbeat(self, token: str, ttl_ms: int, join: bool) -> int:
        """A worker's heartbeat into ``{ns}:workers`` (members.lua), or its leave with
        ``join=False``; return the live worker count (heartbeats within ``ttl_ms``)."""
        store = self._store
        args = [token, ttl_ms, 1 if join else 0]
        return int(
            await store.transport.run(store._scripts.members, [store.keys.workers], args, -1)
        )

    async def publish(self, token: str, document: Mapping[str, Any], ttl_ms: int) -> None:
        """Write a worker's stats document (compact JSON) under ``{ns}:wstats:<token>``
        with a TTL of ``ttl_ms`` (one SET PX)."""
        store = self._store
        key = store.keys.worker_stats(token)
        text = json.dumps(document, separators=(",", ":"))
        await store.transport.bounded(lambda: store.client.set(key, text, px=ttl_ms))

    async def add_sample(self, data: Mapping[str, Any], wall_ms: int) -> None:
        """Add a worker's chart sample to ``{ns}:samples`` (one XADD), trimming the
        entries older than :data:`SAMPLE_KEEP_MS` before ``wall_ms`` (this host's
        clock; the margin covers a skew of minutes)."""
        store = self._store
        key = store.keys.samples
        text = json.dumps(data, separators=(",", ":"))
        oldest = max(wall_ms - SAMPLE_KEEP_MS, 0)
        await store.transport.bounded(
            lambda: store.client.xadd(key, {"d": text}, minid=oldest, approximate=True)
        )

    async def samples(self, after: str | None = None, since_ms: int = 0) -> list[Sample]:
        """The chart samples after the id ``after`` (exclusive), or from ``since_ms``
        (Redis ms), oldest first, at most :data:`SAMPLE_READ_MAX` (one XRANGE)."""
        store = self._store
        start = f"({after}" if after else str(max(since_ms, 0))
        key = store.keys.samples
        entries: Any = await store.transport.bounded(
            lambda: store.client.xrange(key, start, "+", count=SAMPLE_READ_MAX)
        )
        out = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            data = parse_sample(fields.get(b"d", fields.get("d")))
            if data is not None:
                out.append(Sample(entry_id, int(entry_id.split("-", 1)[0]), data))
        return out

    async def unpublish(self, token: str) -> None:
        """Remove a worker's stats document (it is leaving)."""
        store = self._store
        key = store.keys.worker_stats(token)
        await store.transport.bounded(lambda: store.client.delete(key))

    async def members(self) -> list[WorkerEntry]:
        """Every member of the set, oldest heartbeat first, with its stats document (two
        commands: ZRANGE, then one MGET of the documents).

        The set is pruned only when a worker beats: a member may be long gone (its
        document expired); the caller judges by ``beat_ms``.
        """
        store = self._store
        keys = store.keys
        entries: Any = await store.transport.bounded(
            lambda: store.client.zrange(keys.workers, 0, -1, withscores=True)
        )
        tokens = [m.decode(errors="replace") for m, _ in entries]
        if not tokens:
            return []
        docs: Any = await store.transport.bounded(
            lambda: store.client.mget([keys.worker_stats(t) for t in tokens])
        )
        out = []
        for token, (_, beat), raw in zip(tokens, entries, docs, strict=True):
            doc = parse_stats_document(raw)
            seen = (keys.namespace, token)
            if doc is None and raw is not None and seen not in _warned:
                if len(_warned) < 1024:  # once per worker (the dashboard reads every poll)
                    _warned.add(seen)
                logger.warning("worker %r: its stats document is malformed; skipped", token)
            # A score that is not a finite ms (written by hand) reads as no heartbeat.
            beat_ms = int(beat) if math.isfinite(beat) else 0
            out.append(WorkerEntry(token, beat_ms, doc))
        return out
