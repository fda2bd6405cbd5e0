"""OpenTelemetry traces of the durable layer: the ``otel`` extra (``opentelemetry-api``).

Ground rules:

- Off by default. ``Scheduler(..., tracing=True)`` (or ``SyncScheduler``) makes a
  :class:`Tracing`; it imports OpenTelemetry then, and only then. Every traced place
  checks one attribute (``tracer is None``) and does nothing more when it is off.
- The producer: ``schedule``/``schedule_many`` run in a ``PRODUCER`` span, and the W3C
  trace context of that span (``traceparent``, then a newline and the ``tracestate``) is
  stored in the job's record (``JobSpec.trace``, record field 15; at most
  ``MAX_TRACE_BYTES``). Without a configured SDK the span is not recording, has no valid
  context, and nothing is stored.
- The worker: each run of a job is a ``CONSUMER`` span, the child of the stored context
  (one trace from the request that scheduled the job to its runs), current while its
  handler runs, and ended when its outcome is written: :data:`OUTCOMES`.
- A claim round or a reap round that moved jobs is a span of its own (a root: the
  configured sampler decides), made after the call with its start time, so an empty
  round costs nothing; its job ids are the first :data:`MAX_ID_ATTRIBUTES`.
- A stored context is never trusted: anything that is not a well-formed traceparent is
  ignored (the run span is then a root of its own).

Span and attribute names are in docs/tracing.md.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import MAX_TRACE_BYTES, ClaimBatch, Job, JobSpec, ReapResult

# A stored trace context: a traceparent (version, trace id, span id, flags; lowercase
# hex), then a newline and the tracestate if any.
_STORED = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:\n([ -~]*))?")

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "ACKED",
    "CANCELLED",
    "DEAD",
    "DEFERRED",
    "LEASE_LOST",
    "MAX_ID_ATTRIBUTES",
    "OUTCOMES",
    "RELEASED",
    "RETRIED",
    "TIMED_OUT",
    "UNSETTLED",
    "Tracing",
    "make_tracing",
]

# Job ids a claim or reap span lists (its count attribute has them all).
MAX_ID_ATTRIBUTES = 32

# A run's outcome: the span attribute ``tickwheel.outcome``.
ACKED = "acked"  # the handler returned; the ack was written
RETRIED = "retried"  # it failed; due again later (attempt + 1)
DEFERRED = "deferred"  # it raised Defer: due again later, the same attempt
DEAD = "dead"  # it failed for the last time (or can never run): dead-lettered
TIMED_OUT = "timed_out"  # stopped at its timeout; retried or dead as a failure
CANCELLED = "cancelled"  # its job was cancelled while it ran: neither acked nor retried
LEASE_LOST = "lease_lost"  # its lease was gone at the ack, the retry or while it ran
RELEASED = "released"  # stopped unrun at a drain: handed back for another worker
UNSETTLED = "unsettled"  # nothing could be written (an outage): left to the reaper
OUTCOMES = (ACKED, RETRIED, DEFERRED, DEAD, TIMED_OUT, CANCELLED, LEASE_LOST, RELEASED, UNSETTLED)
_FAILED = frozenset((RETRIED, DEAD, TIMED_OUT, LEASE_LOST, UNSETTLED))


def make_tracing(tracing: object, namespace: str) -> Tracing | None:
    """A :class:`Tracing` for ``tracing=True``, None for False.

    Raises:
        TypeError: if ``tracing`` is not a bool.
        ImportError: for True without ``opentelemetry-api`` (the ``otel`` extra).
    """
    if type(tracing) is not bool:
        raise TypeError(f"tracing must be a bool, got {tracing!r}")
    return Tracing(namespace) if tracing else None


def trace_header(carrier: dict[str, str]) -> str:
    """The trace context a job stores, from a W3C carrier: the traceparent, and the
    tracestate after a newline when the whole fits ``MAX_TRACE_BYTES``."""
    parent = carrier.get("traceparent", "")
    state = carrier.get("tracestate", "")
    if parent and state and len(parent) + 1 + len(state) <= MAX_TRACE_BYTES:
        return f"{parent}\n{state}"
    return parent if len(parent) <= MAX_TRACE_BYTES else ""


class Tracing:
    """The spans of one scheduler and the worker on it (see the module's rules).

    Args:
        namespace: the attribute ``tickwheel.namespace`` of every span.

    Raises:
        ImportError: without ``opentelemetry-api`` (install ``tickwheel[otel]``).
    """

    def __init__(self, namespace: str) -> None:
        try:
            from opentelemetry import context, trace  # noqa: PLC0415
            from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise ImportError(
                "tracing=True needs opentelemetry-api: pip install 'tickwheel[otel]'"
            ) from None
        self.namespace = namespace
        self._trace = trace
        self._context = context
        self._tracer = trace.get_tracer("tickwheel.durable")
        self._propagator = TraceContextTextMapPropagator()
        self._producer = trace.SpanKind.PRODUCER
        self._consumer = trace.SpanKind.CONSUMER
        self._internal = trace.SpanKind.INTERNAL
        self._root = context.Context()  # no parent: a span of its own trace
        self._span_context = trace.SpanContext
        self._trace_flags = trace.TraceFlags
        self._trace_state = trace.TraceState
        # id(job) -> its run span: started, handler running or its retry being written;
        # then, handed to the ack batcher, in _acking until its ack is written.
        self._runs: dict[int, Span] = {}
        self._acking: dict[int, Span] = {}

    # -- producer ------------------------------------------------------------------

    @contextmanager
    def producing(self, operation: str, ids: Sequence[str]) -> Iterator[str]:
        """A ``PRODUCER`` span around a schedule; yields the trace context to store
        ("" when there is no valid one: no SDK, say)."""
        attributes: dict[str, Any] = {
            "messaging.system": "tickwheel",
            "messaging.operation": "publish",
            "tickwheel.namespace": self.namespace,
            "tickwheel.job_count": len(ids),
        }
        if len(ids) == 1:
            attributes["tickwheel.job_id"] = ids[0]
        else:
            attributes["tickwheel.job_ids"] = list(ids[:MAX_ID_ATTRIBUTES])
        with self._tracer.start_as_current_span(
            f"tickwheel {operation}", kind=self._producer, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            yield trace_header(carrier)

    @staticmethod
    def traced(specs: Sequence[JobSpec], header: str) -> list[JobSpec]:
        """``specs`` carrying ``header`` (a spec with a trace of its own keeps it)."""
        if not header:
            return list(specs)
        return [
            dataclasses.replace(s, trace=header) if isinstance(s, JobSpec) and not s.trace else s
            for s in specs
        ]

    # -- runs ----------------------------------------------------------------------

    def parent_of(self, trace: bytes) -> Any:
        """The context a stored trace names, or None (absent or malformed). Parsed
        here (one regular expression; the propagator's extract took 3 times as long)."""
        if not trace:
            return None
        m = _STORED.fullmatch(trace)
        if m is None or m[1] == b"ff":
            return None
        trace_id, span_id = int(m[2], 16), int(m[3], 16)
        if not trace_id or not span_id:
            return None
        state = None
        if m[5]:
            try:
                state = self._trace_state.from_header([m[5].decode("ascii")])
            except Exception:  # a bad tracestate is dropped, the traceparent kept
                state = None
        span_context = self._span_context(
            trace_id, span_id, True, self._trace_flags(int(m[4], 16) & 1), state
        )
        return self._trace.set_span_in_context(
            self._trace.NonRecordingSpan(span_context), self._root
        )

    def run_context(self, job: Job) -> contextvars.Context:
        """A copy of the current context with the run span of ``job`` current in it
        (the span started at the first call, when the job's handler is about to run)."""
        span = self._runs.get(id(job))
        if span is None:
            span = self._runs[id(job)] = self._start_run(job)
        ctx = contextvars.copy_context()
        ctx.run(self._context.attach, self._trace.set_span_in_context(span))
        return ctx

    def _start_run(self, job: Job) -> Span:
        now_ms = time.time() * 1000
        parent = self.parent_of(job.trace)
        return self._tracer.start_span(
            f"tickwheel run {job.task}",
            context=self._root if parent is None else parent,
            kind=self._consumer,
            attributes={
                "tickwheel.namespace": self.namespace,
                "tickwheel.job_id": job.id,
                "tickwheel.task": job.task,
                "tickwheel.attempt": job.attempt,
                "tickwheel.nominal_ms": job.nominal_ms,
                "tickwheel.lateness_ms": round(now_ms - job.nominal_ms, 3),
                "tickwheel.epoch": job.epoch,
                "tickwheel.shard": job.shard,
            },
        )

    def acking(self, job: Job) -> None:
        """The handler of ``job`` returned: its span waits for the ack's outcome."""
        span = self._runs.pop(id(job), None)
        if span is not None:
            self._acking[id(job)] = span

    def settle(
        self,
        job: Job,
        outcome: str,
        error: BaseException | str | None = None,
        written: str | None = None,
    ) -> None:
        """End the run span of ``job`` with its outcome (once; later calls do nothing);
        ``written``: what a timeout wrote (RETRIED or DEAD)."""
        key = id(job)
        span = self._runs.pop(key, None) or self._acking.pop(key, None)
        if span is None:
            return
        span.set_attribute("tickwheel.outcome", outcome)
        if written is not None and written != outcome:
            span.set_attribute("tickwheel.written", written)
        if outcome in _FAILED:
            status = self._trace.StatusCode.ERROR
            if isinstance(error, BaseException):
                span.record_exception(error)
            span.set_status(self._trace.Status(status, str(error or outcome)))
        span.end()

    def forget(self, job: Job) -> None:
        """The task of ``job`` ended: a span left open there is unsettled (an outage,
        a fenced shard, a lost lease: the reaper's now)."""
        if id(job) in self._runs:
            self.settle(job, UNSETTLED)

    @contextmanager
    def consuming(self, name: str, trace: bytes, attributes: dict[str, Any]) -> Iterator[Any]:
        """A ``CONSUMER`` span (current inside) for a handler outside the worker (the
        stream consumer's), the child of ``trace``; its outcome is set by the caller
        (``tickwheel.outcome``), an exception that escapes is recorded."""
        parent = self.parent_of(trace)
        attributes = {
            "messaging.system": "tickwheel",
            "messaging.operation": "process",
            "tickwheel.namespace": self.namespace,
            **attributes,
        }
        with self._tracer.start_as_current_span(
            name,
            context=self._root if parent is None else parent,
            kind=self._consumer,
            attributes=attributes,
        ) as span:
            yield span

    # -- rounds --------------------------------------------------------------------

    def now_ns(self) -> int:
        return time.time_ns()

    def claimed(self, batch: ClaimBatch, started_ns: int) -> None:
        """A span for a claim round that leased jobs (from ``started_ns`` to now)."""
        self._round("claim", batch.shard, [job.id for job in batch.jobs], started_ns, {})

    def reaped(self, result: ReapResult, started_ns: int) -> None:
        """A span for a reap round that moved leases (requeued or dead)."""
        ids = [*result.requeued, *result.dead]
        if ids:
            extra = {"tickwheel.requeued": len(result.requeued), "tickwheel.dead": len(result.dead)}
            self._round("reap", result.shard, ids, started_ns, extra)

    def _round(
        self, name: str, shard: int, ids: list[str], started_ns: int, extra: dict[str, Any]
    ) -> None:
        span = self._tracer.start_span(
            f"tickwheel {name}",
            context=self._root,
            kind=self._internal,
            start_time=started_ns,
            attributes={
                "tickwheel.namespace": self.namespace,
                "tickwheel.shard": shard,
                "tickwheel.job_count": len(ids),
                "tickwheel.job_ids": ids[:MAX_ID_ATTRIBUTES],
                **extra,
            },
        )
        span.end()
