"""Section 6 of ``python -m bench``: the publish handoff on NATS JetStream and RabbitMQ,
beside the Redis Streams publisher (the baseline) and taskiq on RabbitMQ (the peer).

One private redis-server, nats-server and RabbitMQ node for the section. Each repeat,
for Redis Streams, NATS and RabbitMQ (``bench/probes/brokers.py``'s ``_one``):

- **handoff throughput**: jobs due at once, one Worker with the publisher (max_running
  256) claims, publishes, waits for the confirm and clears each lease: jobs per second
  from the first due until every lease is cleared. Figures: NATS and RabbitMQ over
  Redis Streams ("higher" is better).
- **lateness** at each of ``durable_rates``: jobs due at that steady rate, scheduled
  ahead, the consumer in the same process records start minus nominal due; p50/p99.
  taskiq on the same RabbitMQ does the same with a countdown per job
  (``bench/peers/taskiq_rabbitmq.py``). Figures: p99 of tickwheel over RabbitMQ against
  taskiq, and of NATS and RabbitMQ against Redis Streams ("lower" is better).

Checked: every job consumed, none early, none run twice (tickwheel's and taskiq's).
taskiq is measured only when the bench extra installed it (``taskiq``,
``taskiq-aio-pika``); without them the section says so and keeps the baseline. Without
the broker clients themselves (nats-py, aio-pika) the section is skipped, and says so.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from bench.peers.taskiq_rabbitmq import available, taskiq_lateness
from bench.runner.harness import Checks, Figure, Plan, Progress, run_async_section
from tickwheel.durable import JobSpec
from tickwheel.durable.servers import NatsServer, RabbitServer, RedisServer

# The broker clients (the nats and rabbitmq extras; dev and bench install them).
CLIENTS = ("nats", "aio_pika")
BROKERS = ("redis-stream", "nats", "rabbitmq")  # bench.probes.brokers.BROKERS

SECTION = "brokers"
PEER = "taskiq on RabbitMQ"
BASE = "redis-stream"


def _seconds(plan: Plan) -> float:
    return 0.3 if plan.quick else 3.0


def _burst(plan: Plan) -> int:
    return 500 if plan.quick else 5_000


def steps(plan: Plan) -> int:
    return plan.repeats


async def _lateness(broker: str, urls: dict[str, str], rate: int, seconds: float) -> dict[str, Any]:
    from bench.probes.brokers import LEAD, _one, _pct

    count = max(1, int(rate * seconds))
    if broker == PEER:
        got = await taskiq_lateness(urls["rabbitmq"], rate, seconds)
        late, runs = got["late_ms"], list(got["runs"].values())
    else:

        def paced() -> list[JobSpec]:
            return [JobSpec(f"p{i}", "t", b"x", delay=LEAD + i / rate) for i in range(count)]

        _, sink, _ = await _one(broker, urls, paced, wait_all=True)
        late, runs = list(sink.late_ms.values()), list(sink.runs.values())
    return {
        "broker": broker,
        "rate": rate,
        "jobs": count,
        "p50_ms": _pct(late, 0.5),
        "p99_ms": _pct(late, 0.99),
        "missing": count - len(runs),
        "early": sum(1 for v in late if v < 0),
        "twice": sum(1 for v in runs if v > 1),
    }


async def _section(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    missing = [m for m in CLIENTS if importlib.util.find_spec(m) is None]
    if missing:  # the one reason to skip: say so in the report
        progress.step("brokers: skipped")
        why = f"skipped: {', '.join(missing)} not installed (pip install -e '.[dev,bench]')"
        return {"figures": [], "raw": {"peer": why, "lateness": []}}
    from bench.probes.brokers import _one

    peer = available()
    names = [*BROKERS, PEER] if peer else list(BROKERS)
    handoff: dict[str, list[float]] = {b: [] for b in BROKERS}
    lateness: list[dict[str, Any]] = []
    with RedisServer() as redis_server, NatsServer() as nats_server, RabbitServer() as rabbit:
        urls = {"redis": redis_server.url, "nats": nats_server.url, "rabbitmq": rabbit.url}
        for r in range(plan.repeats):
            progress.step(f"brokers: repeat {r + 1}/{plan.repeats}: {', '.join(names)}")
            for broker in BROKERS:
                n = _burst(plan)

                def burst(n: int = n) -> list[JobSpec]:
                    return [JobSpec(f"j{i}", "t", b"x", delay=0.5) for i in range(n)]

                elapsed, _, jobs = await _one(broker, urls, burst, wait_all=False)
                handoff[broker].append(jobs / elapsed)
            for rate in plan.durable_rates:
                for broker in names:
                    got = await _lateness(broker, urls, rate, _seconds(plan))
                    got["repeat"] = r
                    lateness.append(got)
    for got in lateness:
        what = f"brokers: {got['broker']} at {got['rate']:,}/s"
        checks.expect(got["missing"] == 0, f"{what}: {got['missing']} of {got['jobs']} not run")
        checks.expect(got["early"] == 0, f"{what}: {got['early']} jobs ran early")
        checks.expect(got["twice"] == 0, f"{what}: {got['twice']} jobs ran twice")
    figures = []
    for broker in BROKERS[1:]:
        fig = Figure(SECTION, f"handoff jobs/s over {broker}", BASE, "jobs/s", "higher")
        for ours, theirs in zip(handoff[broker], handoff[BASE], strict=True):
            fig.add(ours, theirs)
        figures.append(fig)
    by = {(g["broker"], g["rate"], g["repeat"]): g["p99_ms"] for g in lateness}
    pairs = [("nats", BASE), ("rabbitmq", BASE)] + ([("rabbitmq", PEER)] if peer else [])
    for rate in plan.durable_rates:
        for ours, theirs in pairs:
            name = f"p99 lateness at {rate:,}/s over {ours}"
            fig = Figure(SECTION, name, theirs, "ms", "lower")
            for r in range(plan.repeats):
                fig.add(by[(ours, rate, r)], by[(theirs, rate, r)])
            figures.append(fig)
    raw = {
        "handoff_jobs_per_s": handoff,
        "lateness": lateness,
        "peer": PEER if peer else f"{PEER}: not installed (pip install -e '.[bench]')",
    }
    return {"figures": figures, "raw": raw}


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    return run_async_section(_section, plan, progress, checks)
