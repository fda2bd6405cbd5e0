"""The cost of OpenTelemetry tracing: claim+run+ack throughput with ``tracing=True``
(every span sampled) against tracing off, in one run (issue 38's target: at most 10 %
slower).

    python -m bench.probes.tracing_cost [--jobs 20000] [--rounds 5] [--baseline DIR]

On one private redis-server: each round schedules ``--jobs`` due jobs (4 shards,
``schedule_many`` of 5,000) and runs them through a :class:`Worker` on a no-op
``async def`` task. Rows:

- ``off``: ``Scheduler(...)``, no tracing; OpenTelemetry is not imported.
- ``on, sampled``: ``Scheduler(..., tracing=True)`` with the SDK's ``TracerProvider``
  (the default sampler: every root sampled), a ``BatchSpanProcessor`` and an exporter
  that drops the spans (what a real exporter does off the loop's thread, without its
  I/O). Scheduled inside a request span, so each job carries a trace context (its
  claim goes through claim.lua's long path) and each run is a recorded span.
- ``on, unsampled``: as above with the ``ALWAYS_OFF`` sampler: the spans are made but
  not recorded (the context is still stored and parsed).
- ``stored, worker off``: scheduled as in ``on, sampled``, run by a worker without
  tracing: the cost of the stored context alone (claim.lua's long path, the field).
- ``--baseline DIR``: ``off`` on another checkout's ``durable/`` (``git archive <commit>
  durable | tar -x -C /tmp/old``, then ``/tmp/old/durable``): the cost of the code path
  present but off.

Then one span alone, in CPU us: the worker's run span against the SDK's bare span with
the same attributes, sampled and not (tickwheel's own part is the difference).

Only the claim+run+ack phase is timed, by the wall clock (jobs/s) and by the worker
process's CPU time per job (``time.process_time``: less hurt by a loaded machine; it
leaves out Redis's own time, which the ``stored, worker off`` row shows). Every row of
every round runs in a fresh process, the rows in a rotating order; each row's figure is
the median of its rounds, and the ratios are of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any


def _provider(sampled: bool) -> None:
    """A global SDK tracer provider whose exporter drops every span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=100_000))
    trace.set_tracer_provider(provider)


async def _round(url: str, jobs: int, mode: str) -> tuple[float, float]:
    from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry, Worker
    from tickwheel.durable.store._connect import client_from_url

    tracing = mode != "off"
    if tracing:
        _provider(sampled=mode != "unsampled")
    reg = TaskRegistry()

    async def noop(ctx: TaskContext) -> None:
        return None

    reg.register(noop, name="noop")
    client = client_from_url(url)
    try:
        await client.flushall()
        kwargs: dict[str, Any] = {"tracing": True} if tracing else {}
        sched = Scheduler(client, "bench", shards=4, check=False, **kwargs)
        await sched.open()
        specs = [JobSpec(f"j{i}", "noop") for i in range(jobs)]
        request: Any = contextlib.nullcontext()
        if tracing:
            from opentelemetry import trace

            request = trace.get_tracer("bench").start_as_current_span("request")
        with request:
            for i in range(0, jobs, 5000):
                await sched.schedule_many(specs[i : i + 5000])
        if mode == "stored":  # the jobs carry a context; the worker does not trace
            sched = Scheduler(client, "bench", shards=4, check=False)
        worker = Worker(sched, reg, lookahead=0.0, poll_interval=0.01, limit=1000)
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        task = asyncio.ensure_future(worker.run())
        while worker.loader is None or worker.loader.stats.succeeded < jobs:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        worker.stop()
        await task
        return jobs / took, cpu / jobs * 1e6
    finally:
        await client.aclose()


def _one(args: argparse.Namespace) -> None:
    if args.durable_dir:
        from bench.probes._checkout import load_durable

        load_durable(args.durable_dir)
    print(*asyncio.run(_round(args.url, args.jobs, args.one)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="another checkout's durable/ folder")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row in this process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--durable-dir", help=argparse.SUPPRESS)
    parser.add_argument("--spans", help=argparse.SUPPRESS)  # _span_costs in this process
    args = parser.parse_args()
    if args.spans:
        costs = _span_costs(args.spans == "sampled")
        print(", ".join(f"{name} {us:.1f}" for name, us in costs.items()))
        return
    if args.one:
        _one(args)
        return
    from bench.probes._checkout import redis_server_type

    rows: dict[str, list[str]] = {
        "off": ["off"],
        "on, sampled": ["sampled"],
        "on, unsampled": ["unsampled"],
        "stored, worker off": ["stored"],
    }
    if args.baseline:
        rows["baseline, off"] = ["off", "--durable-dir", args.baseline]
    rates: dict[str, list[float]] = {name: [] for name in rows}
    cpus: dict[str, list[float]] = {name: [] for name in rows}
    server = redis_server_type()().start()
    try:
        names = list(rows)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                one, *extra = rows[name]
                argv = [sys.executable, "-m", "bench.probes.tracing_cost", "--one", one]
                argv += ["--url", server.url, "--jobs", str(args.jobs), *extra]
                out = subprocess.run(argv, capture_output=True, text=True, check=True)
                rate, cpu = out.stdout.split()[-2:]
                rates[name].append(float(rate))
                cpus[name].append(float(cpu))
    finally:
        server.stop()
    print(f"claim+run+ack of {args.jobs} due jobs, {args.rounds} rounds, jobs/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(
            f"  {name:18s} median {medians[name]:8.0f}"
            f"  min {min(values):8.0f}  max {max(values):8.0f}"
        )
    base = medians["off"]
    for name in list(rates)[1:]:
        added = (1 / medians[name] - 1 / base) * 1e6
        print(f"  {name} / off: {medians[name] / base:.3f} ({added:+.1f} us a job)")
    print("the worker process's CPU per job (us; the shared machine's load hurts it less)")
    cpu_medians = {name: statistics.median(values) for name, values in cpus.items()}
    for name, values in cpus.items():
        print(f"  {name:18s} median {cpu_medians[name]:6.1f}  min {min(values):6.1f}")
    for name in list(cpus)[1:]:
        print(f"  {name} / off: {cpu_medians[name] / cpu_medians['off']:.3f}")
    _print_span_costs()


def _span_costs(sampled: bool, n: int = 5_000, rounds: int = 7) -> dict[str, float]:
    """CPU us of one run span as the worker makes it (``run_context``, ``acking``,
    ``settle``: the stored context parsed, the span current in a context copy) against
    the SDK's bare span (``start_span`` with 8 attributes, one more, ``end``), alternated
    in one process; medians of ``rounds``. The difference is tickwheel's own part."""
    from opentelemetry import trace

    from tickwheel.durable.model import Job
    from tickwheel.durable.scheduler import ACKED, Tracing

    _provider(sampled)
    tracing, bare_tracer = Tracing("bench"), trace.get_tracer("bench")
    stored = b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"
    job = Job("j", 0, "noop", b"", 1000, 1000, 5000, 1, 5, 1, None, trace=stored)
    attributes = {f"tickwheel.a{i}": i for i in range(8)}

    def ours() -> None:
        tracing.run_context(job)
        tracing.acking(job)
        tracing.settle(job, ACKED)

    def bare() -> None:
        span = bare_tracer.start_span("x", attributes=attributes)
        span.set_attribute("tickwheel.outcome", ACKED)
        span.end()

    costs: dict[str, list[float]] = {"tickwheel run span": [], "SDK bare span": []}
    for _ in range(rounds):
        for name, fn in zip(costs, (ours, bare), strict=True):
            cpu = time.process_time()
            for _ in range(n):
                fn()
            costs[name].append((time.process_time() - cpu) / n * 1e6)
    return {name: statistics.median(values) for name, values in costs.items()}


def _print_span_costs() -> None:
    for sampled in (True, False):
        argv = [sys.executable, "-m", "bench.probes.tracing_cost", "--spans"]
        argv += ["sampled" if sampled else "unsampled"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        print(f"one span, {'sampled' if sampled else 'unsampled'} (CPU us): {out.stdout.strip()}")


if __name__ == "__main__":
    main()
