"""OpenTelemetry traces (``Scheduler(..., tracing=True)``, docs/tracing.md): the SDK's
in-memory exporter against a real Redis (and PostgreSQL for the Postgres mode)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from durable_support import open_scheduler, push_clock, run, unique_ns
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from spill_support import running_worker, until

from tickwheel.durable import (
    CancelResult,
    JobSpec,
    JobState,
    Reaper,
    StreamConsumer,
    StreamEntry,
    StreamPublisher,
    SyncScheduler,
    TaskContext,
    TaskRegistry,
)
from tickwheel.durable.store import EncodedJob, encode_job, pack_record
from tickwheel.durable.store._codec import DEFAULTS, FIELDS, pack_oneshot
from tickwheel.durable.store._connect import client_from_url
from tickwheel.durable.store._msgpack import pack_str

FAST = {"lease": 2.0, "lookahead": 0.2, "poll_interval": 0.05, "reap_interval": 0.2}
SCHED = {"shards": 2, "retry_base": 0.05, "retry_max": 0.05, "tracing": True}

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The process's tracer provider (set once: OpenTelemetry allows one) exporting to
    memory; emptied for each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    return _EXPORTER


def of_ns(exporter: InMemorySpanExporter, ns: str, name: str = "") -> list[ReadableSpan]:
    """The finished spans of namespace ``ns`` whose name starts with ``name``."""
    return [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("tickwheel.namespace") == ns and s.name.startswith(name)
    ]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def wait_spans(
    exporter: InMemorySpanExporter, ns: str, name: str, n: int, within: float = 10.0
) -> list[ReadableSpan]:
    await until(lambda: len(of_ns(exporter, ns, name)) >= n, within)
    return of_ns(exporter, ns, name)


def test_a_run_span_is_in_the_trace_of_the_request_that_scheduled_it(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    inner: list[trace.SpanContext] = []
    reg = TaskRegistry()

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        with trace.get_tracer("test").start_as_current_span("inside") as span:
            inner.append(span.get_span_context())

    async def main() -> None:
        async with open_scheduler(redis_url, **SCHED) as s:
            ns = s.keys.namespace
            with trace.get_tracer("test").start_as_current_span("request") as request:
                await s.schedule("j1", "ok", {"n": 1})
            async with running_worker(s, reg, **FAST):
                (run_span,) = await wait_spans(spans, ns, "tickwheel run", 1)
            (produced,) = of_ns(spans, ns, "tickwheel schedule")
            trace_id = request.get_span_context().trace_id
            assert produced.kind is SpanKind.PRODUCER
            assert produced.parent is not None
            assert produced.parent.span_id == request.get_span_context().span_id
            assert attrs(produced)["tickwheel.job_id"] == "j1"
            assert run_span.kind is SpanKind.CONSUMER
            assert run_span.context is not None and run_span.context.trace_id == trace_id
            assert run_span.parent is not None
            assert run_span.parent.span_id == produced.context.span_id  # type: ignore[union-attr]
            a = attrs(run_span)
            assert a["tickwheel.job_id"] == "j1" and a["tickwheel.task"] == "ok"
            assert a["tickwheel.attempt"] == 1 and a["tickwheel.outcome"] == "acked"
            assert a["tickwheel.shard"] == s.keys.shard_of("j1")
            assert a["tickwheel.nominal_ms"] > 0 and a["tickwheel.epoch"] >= 1
            assert a["tickwheel.lateness_ms"] > -1000  # the hosts' clocks agree roughly
            assert run_span.status.status_code is StatusCode.UNSET
            # The handler's own span is the run span's child.
            assert inner and inner[0].trace_id == trace_id
            (claim,) = of_ns(spans, ns, "tickwheel claim")
            assert attrs(claim)["tickwheel.job_ids"] == ("j1",)
            assert claim.parent is None  # a round is a trace of its own

    run(main())


@pytest.mark.parametrize("thread", [False, True])
def test_a_plain_function_runs_in_its_span(
    redis_server: Any, spans: InMemorySpanExporter, thread: bool
) -> None:
    inner: list[int] = []
    reg = TaskRegistry()

    @reg.task(name="plain", thread=thread)
    def plain(ctx: TaskContext) -> None:
        with trace.get_tracer("test").start_as_current_span("inside") as span:
            inner.append(span.get_span_context().trace_id)

    async def main() -> None:
        async with open_scheduler(redis_server.url, **SCHED) as s:
            with trace.get_tracer("test").start_as_current_span("request") as request:
                await s.schedule("p1", "plain")
            async with running_worker(s, reg, **FAST):
                (span,) = await wait_spans(spans, s.keys.namespace, "tickwheel run", 1)
            trace_id = request.get_span_context().trace_id
            assert span.context is not None and span.context.trace_id == trace_id
            assert attrs(span)["tickwheel.outcome"] == "acked"
            assert inner == [trace_id]
            (own,) = [x for x in spans.get_finished_spans() if x.name == "inside"]
            assert own.parent is not None and own.parent.span_id == span.context.span_id

    run(main())


def test_retried_and_dead_runs_carry_their_outcome(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    reg = TaskRegistry()

    @reg.task(name="boom")
    async def boom(ctx: TaskContext) -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        async with open_scheduler(redis_server.url, **SCHED) as s:
            ns = s.keys.namespace
            await s.schedule("b1", "boom", max_attempts=2)
            async with running_worker(s, reg, **FAST):
                runs = await wait_spans(spans, ns, "tickwheel run", 2)
            (produced,) = of_ns(spans, ns, "tickwheel schedule")
            by_attempt = {attrs(r)["tickwheel.attempt"]: r for r in runs}
            first, last = by_attempt[1], by_attempt[2]
            assert attrs(first)["tickwheel.outcome"] == "retried"
            assert attrs(last)["tickwheel.outcome"] == "dead"
            for span in (first, last):
                assert span.status.status_code is StatusCode.ERROR
                assert any(e.name == "exception" for e in span.events)
                assert span.context.trace_id == produced.context.trace_id  # type: ignore[union-attr]
            info = await s.get("b1")
            assert info is not None and info.state is JobState.DEAD

    run(main())


def test_a_timed_out_run_says_so(redis_server: Any, spans: InMemorySpanExporter) -> None:
    reg = TaskRegistry()

    @reg.task(name="slow", timeout=0.2)
    async def slow(ctx: TaskContext) -> None:
        await asyncio.sleep(30)

    async def main() -> None:
        async with open_scheduler(redis_server.url, **SCHED) as s:
            await s.schedule("t1", "slow", max_attempts=1)
            async with running_worker(s, reg, **FAST):
                (span,) = await wait_spans(spans, s.keys.namespace, "tickwheel run", 1)
            a = attrs(span)
            assert a["tickwheel.outcome"] == "timed_out" and a["tickwheel.written"] == "dead"
            assert span.status.status_code is StatusCode.ERROR

    run(main())


def test_a_run_cancelled_while_it_runs_says_so(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    started = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="slow")
    async def slow(ctx: TaskContext) -> None:
        started.set()
        await asyncio.sleep(30)

    async def main() -> None:
        async with open_scheduler(redis_server.url, **SCHED) as s:
            await s.schedule("c1", "slow")
            async with running_worker(s, reg, **FAST) as w:
                await asyncio.wait_for(w.listening.wait(), 10)
                await asyncio.wait_for(started.wait(), 10)
                assert await s.cancel_job("c1") is CancelResult.STOPPED
                (span,) = await wait_spans(spans, s.keys.namespace, "tickwheel run", 1)
            assert attrs(span)["tickwheel.outcome"] == "cancelled"
            assert span.status.status_code is StatusCode.UNSET

    run(main())


def test_a_reap_round_that_moved_leases_is_a_span(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_server.url, **{**SCHED, "shards": 1}) as s:
            await s.schedule("r1", "t")
            await s.take(0)
            batch = await s.claim(0, lease=1.0)
            assert [j.id for j in batch.jobs] == ["r1"]
            reaper = Reaper(s.ownership, tracer=s.tracer)
            assert await reaper.reap_once()  # nothing expired yet: no span
            assert of_ns(spans, s.keys.namespace, "tickwheel reap") == []
            await push_clock(s, 0, 5_000)
            (result,) = await reaper.reap_once()
            assert result.requeued == ["r1"]
            (span,) = of_ns(spans, s.keys.namespace, "tickwheel reap")
            a = attrs(span)
            assert a["tickwheel.job_ids"] == ("r1",) and a["tickwheel.requeued"] == 1
            assert a["tickwheel.shard"] == 0 and span.parent is None

    run(main())


def _raw_job(job_id: str, trace_value: object) -> EncodedJob:
    """A one-shot job due now whose record's trace field is ``trace_value`` as is."""
    fields: list[Any] = [b"ok", b"", 5, 0, 0, 1, 0, *DEFAULTS[7 : len(FIELDS) - 1], trace_value]
    return EncodedJob(job_id, (job_id.encode(), 1, 0, pack_record(fields)))


def test_a_hostile_trace_context_does_not_break_a_claim(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    ran: list[bytes] = []
    reg = TaskRegistry()

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        assert ctx.job is not None
        ran.append(ctx.job.trace)

    hostile = {
        "long": b"\xff" * 5000,
        "int": 12345,
        "garbage": b"00-zz-not-a-trace-parent\n\x00\x01",
        "zero": b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01",
    }

    async def main() -> None:
        async with open_scheduler(redis_server.url, **SCHED) as s:
            await s.open()
            for job_id, value in hostile.items():
                await s.store.schedule_one(s.keys.shard_of(job_id), _raw_job(job_id, value), False)
            async with running_worker(s, reg, **FAST):
                runs = await wait_spans(spans, s.keys.namespace, "tickwheel run", len(hostile))
            assert sorted(attrs(r)["tickwheel.job_id"] for r in runs) == sorted(hostile)
            for span in runs:
                assert attrs(span)["tickwheel.outcome"] == "acked"
                assert span.parent is None  # no usable context: a root of its own
            assert b"\xff" * 5000 not in ran  # over the bound: dropped at the claim
            assert len(ran) == len(hostile)

    run(main())


def test_tracing_off_records_no_span_and_no_context(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    traces: list[bytes] = []
    reg = TaskRegistry()

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        assert ctx.job is not None
        traces.append(ctx.job.trace)

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=2) as s:
            assert s.tracer is None
            with trace.get_tracer("test").start_as_current_span("request"):
                await s.schedule("o1", "ok")
                await s.schedule_many([JobSpec("o2", "ok")])
            async with running_worker(s, reg, **FAST) as worker:
                assert await until(lambda: len(traces) == 2, 10)
                await until(lambda: worker.loader is not None and worker.loader.running == 0, 5)
            assert traces == [b"", b""]
            assert of_ns(spans, s.keys.namespace) == []

    run(main())
    # Without a trace the record is the one it always was (an old record decodes as one
    # without a trace: its field 15 is at its default).
    encoded = encode_job(JobSpec("a", "t"), 1024)
    assert encoded.values[3] == pack_oneshot(b"t", b"", 5, 0) == pack_str(b"t")


def test_tracing_must_be_a_bool(redis_server: Any) -> None:
    async def main() -> None:
        with pytest.raises(TypeError, match="tracing"):
            async with open_scheduler(redis_server.url, tracing="yes"):
                pass

    run(main())
    with pytest.raises(ValueError, match="trace"):
        JobSpec("x", "t", trace="é")
    with pytest.raises(ValueError, match="trace"):
        JobSpec("x", "t", trace="a" * 513)


def test_schedule_many_and_the_sync_scheduler_carry_the_context(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    reg = TaskRegistry()

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        pass

    ns = unique_ns()
    tracer = trace.get_tracer("test")
    with (
        tracer.start_as_current_span("sync request") as sync_request,
        SyncScheduler.from_url(redis_server.url, ns, shards=2, tracing=True) as sync,
    ):
        sync.schedule("s1", "ok")

    async def main() -> None:
        async with open_scheduler(redis_server.url, ns, **SCHED) as s:
            with trace.get_tracer("test").start_as_current_span("batch") as batch:
                await s.schedule_many([JobSpec("m1", "ok"), JobSpec("m2", "ok")])
            async with running_worker(s, reg, **FAST):
                runs = await wait_spans(spans, ns, "tickwheel run", 3)
            by_id = {attrs(r)["tickwheel.job_id"]: r for r in runs}
            want = {
                "s1": sync_request.get_span_context().trace_id,
                "m1": batch.get_span_context().trace_id,
                "m2": batch.get_span_context().trace_id,
            }
            assert {k: v.context.trace_id for k, v in by_id.items()} == want  # type: ignore[union-attr]
            (many,) = of_ns(spans, ns, "tickwheel schedule_many")
            assert attrs(many)["tickwheel.job_ids"] == ("m1", "m2")

    run(main())


def test_the_stream_handoff_carries_the_context(
    redis_server: Any, spans: InMemorySpanExporter
) -> None:
    async def main() -> None:
        client = client_from_url(redis_server.url)
        stream = f"{unique_ns()}:stream"
        consumer = StreamConsumer(client, stream, "g", "c1", tracing=True)
        got: list[StreamEntry] = []

        async def handle(entry: StreamEntry) -> None:
            got.append(entry)

        try:
            async with open_scheduler(redis_server.url, **SCHED) as s:
                with trace.get_tracer("test").start_as_current_span("request") as request:
                    await s.schedule("p1", "anything")
                publisher = StreamPublisher(client, stream)
                async with running_worker(s, TaskRegistry(), publisher=publisher, **FAST):
                    await wait_spans(spans, s.keys.namespace, "tickwheel run", 1)
                assert await consumer.process(handle, block=1.0) == 1
            assert got and got[0].trace
            (consumed,) = of_ns(spans, stream, "tickwheel consume")
            assert consumed.kind is SpanKind.CONSUMER
            assert consumed.context.trace_id == request.get_span_context().trace_id  # type: ignore[union-attr]
            assert attrs(consumed)["tickwheel.outcome"] == "acked"
        finally:
            await client.aclose()

    run(main())


@pytest.mark.postgres
def test_the_postgres_mode_carries_the_context(
    redis_server: Any, pg_url: str, spans: InMemorySpanExporter
) -> None:
    from pg_support import migrated, pg_scheduler

    reg = TaskRegistry()

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        pass

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(
            redis_server.url, pg_url, shards=1, tracing=True, retry_base=0.05
        ) as s:
            with trace.get_tracer("test").start_as_current_span("request") as request:
                await s.schedule("pg1", "ok")
            async with running_worker(s, reg, **FAST):
                (span,) = await wait_spans(spans, s.keys.namespace, "tickwheel run", 1)
            assert span.context.trace_id == request.get_span_context().trace_id  # type: ignore[union-attr]
            assert attrs(span)["tickwheel.outcome"] == "acked"

    run(main())


def test_a_retried_postgres_row_keeps_the_trace_of_its_record() -> None:
    from tickwheel.durable.postgres._rows import encode_pg_job, record_trace, retried_job

    header = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    job = encode_pg_job(JobSpec("r1", "ok", trace=header), 0, 1024)
    assert record_trace(job.record) == header.encode()
    assert record_trace(b"\xc1" * 80) == b""  # not msgpack: none, no error
    assert record_trace(encode_pg_job(JobSpec("r2", "ok"), 0, 1024).record) == b""
    row = {
        "id": "r1",
        "task": "ok",
        "payload": b"",
        "max_attempts": 5,
        "json_payload": False,
        "due_ms": 1000,
        "attempt": 2,
        "rkind": 0,
        "run_ms": 2000,
        "record": job.record,
    }
    assert record_trace(retried_job(row).values[3]) == header.encode()


def test_tracing_off_never_imports_opentelemetry() -> None:
    """Off, nothing of tickwheel needs OpenTelemetry: with it made unimportable, a
    scheduler and a worker are made and a job is encoded. (redis-py 8 imports it for
    its own metrics when it is installed, so sys.modules cannot tell.)"""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from tickwheel.durable import JobSpec, Scheduler, TaskRegistry, Worker\n"
        "from tickwheel.durable.store import encode_job\n"
        "from tickwheel.durable.store._connect import client_from_url\n"
        "s = Scheduler(client_from_url('redis://127.0.0.1:1/0'), 'x', check=False)\n"
        "Worker(s, TaskRegistry())\n"
        "encode_job(JobSpec('a', 't'), 100)\n"
        "print(s.tracer)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_tracing_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tickwheel.durable.scheduler import make_tracing

    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(ImportError, match=r"tickwheel\[otel\]"):
        make_tracing(True, "ns")
    assert make_tracing(False, "ns") is None


def test_the_broker_handoff_carries_the_context_in_traceparent(
    redis_server: Any, nats_server: Any, spans: InMemorySpanExporter
) -> None:
    from broker_support import Recorder, consuming, nats_stream

    from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher

    async def main() -> None:
        _, subject = await nats_stream(nats_server.url)
        rec = Recorder()
        consumer = NatsConsumer(nats_server.url, subject, "c", rec.registry, tracing=True)
        async with open_scheduler(redis_server.url, **SCHED) as s:
            with trace.get_tracer("test").start_as_current_span("request") as request:
                await s.schedule("b1", "t", {"i": 1})
            publisher = NatsPublisher(nats_server.url, subject)
            async with (
                consuming(consumer),
                running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
            ):
                (consumed,) = await wait_spans(spans, subject, "tickwheel consume", 1)
            await publisher.close()
        assert consumed.kind is SpanKind.CONSUMER
        assert consumed.context.trace_id == request.get_span_context().trace_id  # type: ignore[union-attr]
        assert attrs(consumed)["tickwheel.outcome"] == "acked"
        assert attrs(consumed)["tickwheel.job_id"] == "b1"

    run(main())


def test_the_message_headers_carry_traceparent_and_tracestate() -> None:
    from tickwheel.durable import Job
    from tickwheel.durable.runtime import decode_message, encode_message

    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job = Job(
        id="j", shard=0, task="t", payload=b"x", nominal_ms=1, due_ms=1, deadline_ms=2,
        attempt=1, max_attempts=3, epoch=1, recurrence=None, trace=parent + b"\nk=v",
    )  # fmt: skip
    body, headers = encode_message(job)
    assert headers["traceparent"] == parent.decode() and headers["tracestate"] == "k=v"
    assert decode_message(body, headers).trace == parent + b"\nk=v"
    job.trace = b""
    body, headers = encode_message(job)
    assert "traceparent" not in headers and decode_message(body, headers).trace == b""
