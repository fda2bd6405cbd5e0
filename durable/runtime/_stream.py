"""The publish handoff: due jobs go to a broker (a Redis Stream built in) instead of a task.

Ground rules:

- A :class:`~tickwheel.durable.Loader` given a ``publisher`` fires each job in the wheel
  at its due time, publishes it, and acks (clears the lease) only after the publish
  returned: a crash before that leaves the lease to the reaper, so no job is lost.
- So a job may be published more than once (the broker accepted it but the ack never
  happened): every entry carries the job id and nominal due, and consumers deduplicate
  on that pair (:class:`StreamConsumer` does).
- The Redis commands (and their errors, translated) are the store's
  (``store/_streams.py``): here is what an entry holds and which entry is a duplicate.
- Dedup records which *entry* owns an occurrence (``SET key entry_id NX``), not merely
  that it was seen: a redelivery of the owning entry (a dead consumer's pending entry
  taken over with XAUTOCLAIM) is processed again, any other entry of the same
  occurrence is acked and dropped. Marking "seen" at read time instead would drop the
  only copy when the first reader dies.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from tickwheel.durable.model import MAX_TRACE_BYTES, Job, finite_seconds_ms
from tickwheel.durable.scheduler import ACKED, RETRIED, Tracing, make_tracing
from tickwheel.durable.store import Client, Stream, decode_payload, encode_payload

if TYPE_CHECKING:
    pass

__all__ = ["Publisher", "StreamConsumer", "StreamEntry", "StreamPublisher"]

logger = logging.getLogger("tickwheel.durable")

# Entries kept in the stream (approximate trim): enough for consumers that fall minutes
# behind at the source document's peak of ~2,900 jobs/s (docs/design.md); None keeps everything.
DEFAULT_STREAM_MAXLEN = 1_000_000
# How long (s) the owner of an occurrence is remembered: must outlast redeliveries of
# the same occurrence (lease expiry + reap + backoff), like the scheduler's dedup window.
DEFAULT_DEDUP_TTL = 3600.0
# A pending entry idle this long (s) belongs to a dead consumer and is taken over.
DEFAULT_CLAIM_IDLE = 30.0
# Payloads of published jobs were accepted by the scheduler already; no second limit.
_NO_LIMIT = 2**31


class Publisher(Protocol):
    """Hands a due job to a broker; returns only once the broker confirmed it."""

    async def publish(self, job: Job) -> None:
        """Publish ``job``; raise if it cannot be confirmed (the job is retried)."""
        ...


class StreamPublisher:
    """Publish jobs to a Redis Stream with XADD (confirmed by the reply).

    Each entry has the fields ``id``, ``nominal`` (ms), ``task``, ``attempt``,
    ``payload`` and ``flags`` (1: the payload is JSON text), and ``trace`` when the job
    carries its producer's trace context (``Job.trace``, docs/tracing.md).

    Args:
        client: a ``Redis`` or ``RedisCluster`` (any database; it may be another server).
        stream: the stream key.
        maxlen: approximate cap on entries (``XADD MAXLEN ~``); None for none.
    """

    def __init__(
        self,
        client: Client,
        stream: str,
        *,
        maxlen: int | None = DEFAULT_STREAM_MAXLEN,
    ) -> None:
        self.client = client  # where the stream lives
        self.stream = stream  # the stream key
        self.maxlen = maxlen  # approximate trim
        self._stream = Stream(client, stream)  # its commands

    async def publish(self, job: Job) -> None:
        """XADD one entry for ``job``.

        Raises:
            RedisUnavailable: if Redis cannot be reached (the entry may or may not exist:
                the job is retried and consumers drop a duplicate).
        """
        data, flags = encode_payload(job.payload, _NO_LIMIT)
        fields: dict[str, bytes | int | str] = {
            "id": job.id,
            "nominal": job.nominal_ms,
            "task": job.task,
            "attempt": job.attempt,
            "payload": data,
            "flags": flags,
        }
        if job.trace:
            fields["trace"] = job.trace
        await self._stream.add(fields, self.maxlen)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One published job, as a consumer reads it."""

    entry_id: str  # the stream entry id (for XACK)
    job_id: str  # the job id
    nominal_ms: int  # nominal due: with job_id, the dedup key
    task: str  # task name
    attempt: int  # the scheduler's attempt that published it
    payload: Any  # bytes, the decoded JSON value, or an UndecodablePayload
    # The producer's W3C trace context (the ``trace`` field; b"" none, or too long).
    trace: bytes = b""

    @property
    def key(self) -> tuple[str, int]:
        """The idempotency key ``(job_id, nominal_ms)``."""
        return (self.job_id, self.nominal_ms)


class StreamConsumer:
    """Read published jobs with a consumer group, dropping duplicate publishes.

    Args:
        client: the stream's Redis (``decode_responses=False``).
        stream: the stream key.
        group: the consumer group (created at the stream's start if missing).
        consumer: this consumer's name within the group.
        dedup_ttl: seconds an occurrence's owning entry is remembered.
        claim_idle: seconds a pending entry may idle before another consumer takes it.
        count: entries per read.
        tracing: run each handler of :meth:`process` in an OpenTelemetry ``CONSUMER``
            span, the child of the entry's trace context (needs ``tickwheel[otel]``).
    """

    def __init__(
        self,
        client: Client,
        stream: str,
        group: str,
        consumer: str,
        *,
        dedup_ttl: float | timedelta = DEFAULT_DEDUP_TTL,
        claim_idle: float | timedelta = DEFAULT_CLAIM_IDLE,
        count: int = 100,
        tracing: bool = False,
    ) -> None:
        self.client = client  # the stream's Redis
        self.stream = stream  # stream key
        self.group = group  # consumer group
        self.consumer = consumer  # this consumer
        self.dedup_ttl_ms = finite_seconds_ms("dedup_ttl", dedup_ttl, minimum_ms=1)
        self.claim_idle_ms = finite_seconds_ms("claim_idle", claim_idle)
        self.count = count  # entries per read
        self.dropped = 0  # duplicate entries acked without being returned
        self._group_ready = False  # XGROUP CREATE done
        self._stream = Stream(client, stream)  # its commands
        self.tracer = make_tracing(tracing, stream)  # handler spans, or None

    async def read(self, block: float | None = None) -> list[StreamEntry]:
        """Entries to process: a dead consumer's idle ones first (XAUTOCLAIM), then new
        ones (XREADGROUP). Duplicate publishes of an occurrence are acked and dropped.

        Args:
            block: seconds to wait for new entries when there are none; None: no wait.
                The wait is bounded by ``block`` plus ``READ_GRACE`` (5 s), whatever
                the client's socket timeout.

        Returns:
            The entries; :meth:`ack` each once processed.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        stream = self._stream
        if not self._group_ready:
            await stream.create_group(self.group)
            self._group_ready = True
        raw = await stream.claim_idle(self.group, self.consumer, self.claim_idle_ms, self.count)
        if not raw:
            raw = await stream.read_new(self.group, self.consumer, self.count, block)
        return await self._dedup([self._entry(eid, fields) for eid, fields in raw])

    @staticmethod
    def _entry(entry_id: str, fields: dict[bytes, bytes]) -> StreamEntry:
        trace = fields.get(b"trace", b"")
        return StreamEntry(
            entry_id,
            fields[b"id"].decode(),
            int(fields[b"nominal"]),
            fields[b"task"].decode(),
            int(fields[b"attempt"]),
            decode_payload(fields[b"payload"], int(fields[b"flags"])),
            trace if len(trace) <= MAX_TRACE_BYTES else b"",
        )

    async def _dedup(self, entries: Sequence[StreamEntry]) -> list[StreamEntry]:
        if not entries:
            return []
        # One claim per occurrence, by its first entry in stream order: two entries of
        # one occurrence in one batch must not race for it (concurrent calls on a
        # cluster reach the server in any order, and the later publish could win).
        first: dict[tuple[str, int], StreamEntry] = {}
        for e in entries:
            first.setdefault(e.key, e)
        claims = list(first.values())
        owners = await self._stream.claim_occurrences(
            self.group, [(e.job_id, e.nominal_ms, e.entry_id) for e in claims], self.dedup_ttl_ms
        )
        owner_of = {e.key: owner for e, owner in zip(claims, owners, strict=True)}
        fresh: list[StreamEntry] = []
        dups: list[str] = []
        for e in entries:
            # The owner itself (or a redelivery of it) is processed; any other is a dup.
            if owner_of[e.key] == e.entry_id:
                fresh.append(e)
            else:
                dups.append(e.entry_id)
        if dups:
            await self._stream.ack(self.group, dups)
            self.dropped += len(dups)
        return fresh

    async def ack(self, entry: StreamEntry) -> None:
        """Mark ``entry`` processed (XACK)."""
        await self._stream.ack(self.group, [entry.entry_id])

    async def process(
        self, handler: Callable[[StreamEntry], Awaitable[object]], block: float | None = None
    ) -> int:
        """One round: read, run ``handler`` on each entry, ack those it finished.

        An entry whose handler raised stays pending: after ``claim_idle`` it is read
        again (by this or another consumer).

        Returns:
            How many entries were handled and acked.
        """
        done = 0
        for entry in await self.read(block):
            try:
                if self.tracer is None:
                    await handler(entry)
                else:
                    await self._traced(self.tracer, handler, entry)
            except Exception:
                logger.exception("handler failed on entry %s", entry.entry_id)
                continue
            await self.ack(entry)
            done += 1
        return done

    async def _traced(
        self, tracer: Tracing, handler: Callable[[StreamEntry], Awaitable[object]], e: StreamEntry
    ) -> None:
        """``handler(e)`` in a CONSUMER span: outcome ``acked`` (it returned) or
        ``retried`` (it raised: the entry stays pending, to be read again)."""
        attributes = {
            "tickwheel.job_id": e.job_id,
            "tickwheel.task": e.task,
            "tickwheel.attempt": e.attempt,
            "tickwheel.nominal_ms": e.nominal_ms,
            "tickwheel.stream_entry": e.entry_id,
        }
        with tracer.consuming(f"tickwheel consume {e.task}", e.trace, attributes) as span:
            try:
                await handler(e)
            except Exception:
                span.set_attribute("tickwheel.outcome", RETRIED)
                raise
            span.set_attribute("tickwheel.outcome", ACKED)
