"""The publish handoff to a message broker: the message format, and the consumers' dedup.

Ground rules:

- One format for every broker (``docs/brokers.md`` is its contract, for consumers in
  other languages): the body is the job's payload as the scheduler stores it (bytes as
  they are, anything else as UTF-8 JSON: the ``tickwheel-flags`` header says which), and
  the headers carry the job (:data:`HEADERS`). The message id is ``<job id>:<nominal
  ms>``, so a broker with dedup (JetStream's ``Nats-Msg-Id``) drops a re-publish.
- Each publish also carries a token of its own (``tickwheel-publish``). A consumer
  records, per occurrence ``(job id, nominal ms)``, the token of the message that owns
  it: a redelivery of that message (its consumer died) is processed again, another
  message of the same occurrence (a re-publish past the broker's window, or from a
  broker with no dedup) is dropped. Once the task returned, the occurrence is marked
  done: a redelivery whose ack was lost is dropped too. (A consumer that dies between
  the task's return and that mark runs it again on redelivery: at least once.) The
  record is the Redis Streams consumer's (``store/_streams.py``: ``lua/dedup.lua``),
  or a bounded map in memory.
- The broker modules (``jetstream.py``, ``amqp.py``) import their client; this one
  imports none, so the format can be used and tested without them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tickwheel.durable.model import (
    MAX_TRACE_BYTES,
    BrokerUnavailable,
    Job,
    RedisUnavailable,
    UndecodablePayload,
    finite_seconds_ms,
)
from tickwheel.durable.scheduler import ACKED, RETRIED, Scheduler, Tracing
from tickwheel.durable.store import Client, Stream, decode_payload, encode_payload

from ._tasks import TaskContext, TaskFunc, TaskRegistry, call_task

__all__ = [
    "DEFAULT_DEDUP_KEEP",
    "FORMAT_VERSION",
    "HEADERS",
    "BrokerMessage",
    "Dedup",
    "HandoffConsumer",
    "consume_one",
    "decode_message",
    "encode_message",
    "message_id",
]

logger = logging.getLogger("tickwheel.durable")

# The version of the message format (header ``tickwheel-version``); a consumer refuses
# a message of a version it does not know.
FORMAT_VERSION = 1
# The headers every message carries, each a decimal or UTF-8 string.
HEADERS = (
    "tickwheel-version",  # FORMAT_VERSION
    "tickwheel-id",  # the job id
    "tickwheel-nominal",  # nominal due, epoch ms (Redis's clock)
    "tickwheel-task",  # the task name
    "tickwheel-attempt",  # the scheduler's attempt that published it, from 1
    "tickwheel-epoch",  # the shard owner's fencing epoch of the lease
    "tickwheel-flags",  # 1: the body is UTF-8 JSON; 0: raw bytes
    "tickwheel-publish",  # a token unique to this publish (the consumers' dedup)
)
# The owner recorded for an occurrence whose task ran (no publish token is this).
DONE_MARK = "done"
# Occurrences an in-memory dedup remembers (the oldest are forgotten first).
DEFAULT_DEDUP_KEEP = 100_000
# Payloads of published jobs were accepted by the scheduler already; no second limit.
_NO_LIMIT = 2**31


def message_id(job_id: str, nominal_ms: int) -> str:
    """The broker message id of an occurrence: ``<job id>:<nominal ms>``."""
    return f"{job_id}:{nominal_ms}"


# Publish tokens: this process's random prefix and a counter (unique without a
# uuid4() per message: the publish path is profiled at 5,000 jobs/s).
_TOKEN_PREFIX = uuid.uuid4().hex[:16]
_token_count = itertools.count()


def _publish_token() -> str:
    return f"{_TOKEN_PREFIX}{next(_token_count):x}"


def encode_message(job: Job) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the message for ``job`` (a fresh publish token each
    call)."""
    body, flags = encode_payload(job.payload, _NO_LIMIT)
    headers = {
        "tickwheel-version": str(FORMAT_VERSION),
        "tickwheel-id": job.id,
        "tickwheel-nominal": str(job.nominal_ms),
        "tickwheel-task": job.task,
        "tickwheel-attempt": str(job.attempt),
        "tickwheel-epoch": str(job.epoch),
        "tickwheel-flags": str(flags),
        "tickwheel-publish": _publish_token(),
    }
    if job.trace:  # the producer's W3C trace context, under the standard header names
        parent, _, state = job.trace.decode("ascii", "replace").partition("\n")
        headers["traceparent"] = parent
        if state:
            headers["tracestate"] = state
    return body, headers


@dataclass(frozen=True, slots=True)
class BrokerMessage:
    """One published job, as a broker consumer reads it."""

    job_id: str  # the job id
    nominal_ms: int  # nominal due: with job_id, the dedup key
    task: str  # task name
    attempt: int  # the scheduler's attempt that published it
    epoch: int  # the fencing epoch of the lease it was published under
    payload: Any  # bytes, the decoded JSON value, or an UndecodablePayload
    token: str  # this publish's token (a redelivery keeps it; a re-publish has another)
    # The producer's W3C trace context as the scheduler stores it (traceparent, then a
    # newline and the tracestate if any); b"" when the message has none.
    trace: bytes = b""

    @property
    def key(self) -> tuple[str, int]:
        """The idempotency key ``(job_id, nominal_ms)``."""
        return (self.job_id, self.nominal_ms)

    def context(self, scheduler: Scheduler | None = None) -> TaskContext:
        """The :class:`TaskContext` a task is run with (``job`` is None: the consumer
        holds no lease; ``scheduler`` for follow-up jobs)."""
        return TaskContext(
            job_id=self.job_id,
            task=self.task,
            payload=self.payload,
            nominal_ms=self.nominal_ms,
            attempt=self.attempt,
            epoch=self.epoch,
            durable=True,
            scheduler=scheduler,
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _trace_of(headers: Mapping[str, Any]) -> bytes:
    """The stored form of a message's ``traceparent`` and ``tracestate`` headers (never
    trusted: tracing parses it and ignores a malformed one); b"" if absent or too long."""
    parent = headers.get("traceparent")
    if parent is None:
        return b""
    state = headers.get("tracestate")
    text = _text(parent) if state is None else f"{_text(parent)}\n{_text(state)}"
    raw = text.encode("ascii", "replace")
    return raw if len(raw) <= MAX_TRACE_BYTES else b""


def decode_message(body: bytes, headers: Mapping[str, Any] | None) -> BrokerMessage:
    """The job in a message's body and headers.

    Raises:
        ValueError: if a header is missing or malformed, or the version is not
            :data:`FORMAT_VERSION`.
    """
    h = headers or {}
    missing = [name for name in HEADERS if name not in h]
    if missing:
        raise ValueError(f"not a tickwheel message: no header {missing[0]}")
    version = _text(h["tickwheel-version"])
    if version != str(FORMAT_VERSION):
        raise ValueError(f"tickwheel message format {version!r}, this consumer reads 1")
    try:
        return BrokerMessage(
            job_id=_text(h["tickwheel-id"]),
            nominal_ms=int(_text(h["tickwheel-nominal"])),
            task=_text(h["tickwheel-task"]),
            attempt=int(_text(h["tickwheel-attempt"])),
            epoch=int(_text(h["tickwheel-epoch"])),
            payload=decode_payload(bytes(body), int(_text(h["tickwheel-flags"]))),
            token=_text(h["tickwheel-publish"]),
            trace=_trace_of(h),
        )
    except ValueError as exc:
        raise ValueError(f"malformed tickwheel message headers: {exc}") from None


class Dedup:
    """Which message owns each occurrence: in Redis (shared by every consumer of a
    group, kept ``ttl``), or in this process (the last ``keep`` occurrences).

    Args:
        client: a Redis (``decode_responses=False``) for a shared record; None: memory.
        key: the prefix of the Redis records (``<key>:owner:<group>:<id>:<nominal>``).
        group: the consumers that share the record (a queue, a durable consumer).
        ttl: seconds an owner is remembered in Redis.
        keep: occurrences remembered in memory.
    """

    def __init__(
        self,
        client: Client | None,
        key: str,
        group: str,
        *,
        ttl: float | timedelta = 3600.0,
        keep: int = DEFAULT_DEDUP_KEEP,
    ) -> None:
        if type(keep) is not int or keep < 1:
            raise ValueError(f"keep must be a positive int, got {keep!r}")
        self.ttl_ms = finite_seconds_ms("dedup_ttl", ttl, minimum_ms=1)
        self.group = group
        self._stream = None if client is None else Stream(client, key)
        self._owners: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._keep = keep

    async def owner(self, message: BrokerMessage) -> str:
        """Record ``message`` as the owner of its occurrence unless one is recorded;
        return the owner's token (``message.token``: process it; another: a duplicate).

        Raises:
            RedisUnavailable: if the Redis record cannot be reached.
        """
        if self._stream is not None:
            got = await self._stream.claim_occurrences(
                self.group, [(message.job_id, message.nominal_ms, message.token)], self.ttl_ms
            )
            return got[0]
        owners = self._owners
        owner = owners.setdefault(message.key, message.token)
        if len(owners) > self._keep:
            owners.popitem(last=False)
        return owner

    async def done(self, message: BrokerMessage) -> None:
        """Record that ``message``'s occurrence ran: any message of it is a duplicate
        from now on, a redelivery of this one too (its ack may have been lost).

        Raises:
            RedisUnavailable: if the Redis record cannot be reached.
        """
        if self._stream is not None:
            await self._stream.set_owner(
                self.group, message.job_id, message.nominal_ms, DONE_MARK, self.ttl_ms
            )
        elif message.key in self._owners:
            self._owners[message.key] = DONE_MARK


# What a consumer does with one message (consume_one's outcome).
DONE = "done"  # the task ran: ack
DUPLICATE = "duplicate"  # another message owns the occurrence: ack, do not run
FAILED = "failed"  # the task raised: redeliver later
REJECTED = "rejected"  # no retry mends it (not a tickwheel message, unknown task): drop


async def consume_one(
    body: bytes,
    headers: Mapping[str, Any] | None,
    dedup: Dedup,
    registry: TaskRegistry,
    scheduler: Scheduler | None,
    *,
    tracer: Tracing | None = None,
) -> str:
    """Decode one message, drop it if another owns its occurrence, else run its task.

    Returns:
        :data:`DONE`, :data:`DUPLICATE`, :data:`FAILED` or :data:`REJECTED`.

    Raises:
        RedisUnavailable: if the dedup record cannot be reached (nothing ran).
    """
    try:
        message = decode_message(body, headers)
    except ValueError as exc:
        logger.error("handoff message rejected: %s", exc)
        return REJECTED
    if await dedup.owner(message) != message.token:
        return DUPLICATE
    fn = registry.get(message.task)
    if fn is None or type(message.payload) is UndecodablePayload:
        why = f"unknown task {message.task!r}" if fn is None else str(message.payload)
        logger.error("handoff job %r rejected: %s", message.job_id, why)
        return REJECTED
    try:
        if tracer is None:
            await call_task(fn, message.context(scheduler))
        else:
            await _traced(tracer, fn, message, scheduler)
    except Exception:
        logger.exception("task %s failed on job %r", message.task, message.job_id)
        return FAILED
    await dedup.done(message)
    return DONE


async def _traced(
    tracer: Tracing, fn: TaskFunc, message: BrokerMessage, scheduler: Scheduler | None
) -> None:
    """The task in a ``CONSUMER`` span, the child of the message's trace context:
    outcome ``acked`` (it returned) or ``retried`` (it raised: redelivered later)."""
    attributes = {
        "tickwheel.job_id": message.job_id,
        "tickwheel.task": message.task,
        "tickwheel.attempt": message.attempt,
        "tickwheel.nominal_ms": message.nominal_ms,
    }
    with tracer.consuming(f"tickwheel consume {message.task}", message.trace, attributes) as span:
        try:
            await call_task(fn, message.context(scheduler))
        except Exception:
            span.set_attribute("tickwheel.outcome", RETRIED)
            raise
        span.set_attribute("tickwheel.outcome", ACKED)


class HandoffConsumer:
    """What the broker consumers share: the task registry, the dedup, the counts, and
    a loop that rides out outages. Subclasses read messages in :meth:`process`."""

    def __init__(
        self,
        registry: TaskRegistry,
        dedup: Dedup,
        scheduler: Scheduler | None,
        tracer: Tracing | None = None,
    ) -> None:
        self.registry = registry  # the tasks run
        self.tracer = tracer  # each task in a CONSUMER span (tracing=True), or None
        self.dedup = dedup  # who owns each occurrence
        self.scheduler = scheduler  # given to each TaskContext (follow-up jobs)
        self.handled = 0  # messages whose task ran and returned (acked)
        self.dropped = 0  # duplicates of an occurrence another message owns (acked)
        self.failed = 0  # messages whose task raised (left for redelivery)
        self.rejected = 0  # messages no retry mends (not ours, unknown task): dropped

    async def _consume(self, body: bytes, headers: Mapping[str, Any] | None) -> str:
        outcome = await consume_one(
            body, headers, self.dedup, self.registry, self.scheduler, tracer=self.tracer
        )
        if outcome == DONE:
            self.handled += 1
        elif outcome == DUPLICATE:
            self.dropped += 1
        elif outcome == FAILED:
            self.failed += 1
        else:
            self.rejected += 1
        return outcome

    async def process(self, block: float | None = None) -> int:
        """One round: read what is there (waiting up to ``block`` s), run each task,
        ack what ran; returns how many tasks ran."""
        raise NotImplementedError

    async def run(self, stop: asyncio.Event, *, block: float = 1.0, pause: float = 0.5) -> None:
        """Call :meth:`process` until ``stop`` is set; an unreachable broker or dedup
        Redis is logged and retried after ``pause`` seconds, never fatal."""
        while not stop.is_set():
            try:
                await self.process(block)
            except (BrokerUnavailable, RedisUnavailable) as exc:
                logger.warning("handoff consumer: %s; retrying", exc)
                await asyncio.sleep(pause)
