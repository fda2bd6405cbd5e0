"""The publish handoff on Redis Streams, NATS JetStream and RabbitMQ, in one run.

    python -m bench.probes.brokers [--jobs 5000] [--rates 1000,5000] [--seconds 3]

Starts a private redis-server, nats-server and RabbitMQ node. For each broker:

- **handoff throughput**: ``--jobs`` jobs due at once; one Worker with a publisher
  (max_running 256) claims, publishes, waits for the confirm and clears each lease:
  jobs per second from the first due until every lease is cleared (the loader's
  ``succeeded`` count).
- **lateness** at each rate: jobs due one every 1/rate s for ``--seconds``, the first
  ``LEAD`` (2) s after they are scheduled; a consumer in the same process records
  when each task starts. Lateness is
  consume start minus nominal due (both on this machine's clock; Redis's clock is the
  same clock here). p50 and p99, and the jobs missing (not consumed within 120 s),
  early or run twice. The publishing worker and the consumer share this process.

Prints one table; ratios are to Redis Streams from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import aio_pika
import nats

from tickwheel.durable import (
    JobSpec,
    Scheduler,
    StreamConsumer,
    StreamPublisher,
    TaskContext,
    TaskRegistry,
    Worker,
)
from tickwheel.durable.runtime.amqp import RabbitConsumer, RabbitPublisher
from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher
from tickwheel.durable.servers import NatsServer, RabbitServer, RedisServer
from tickwheel.durable.store._connect import client_from_url

BROKERS = ("redis-stream", "nats", "rabbitmq")
# Seconds from the scheduling to the first due time of a lateness run: the worker takes
# its shards and claims first (a shorter lead measured the start-up, not the steady rate).
LEAD = 2.0


class Sink:
    """What the consumer saw: per occurrence, how many runs and the first start."""

    def __init__(self) -> None:
        self.runs: Counter[tuple[str, int]] = Counter()
        self.late_ms: dict[tuple[str, int], float] = {}

    def saw(self, job_id: str, nominal_ms: int) -> None:
        key = (job_id, nominal_ms)
        self.runs[key] += 1
        self.late_ms.setdefault(key, time.time() * 1000 - nominal_ms)


async def _setup(broker: str, urls: dict[str, str], sink: Sink) -> tuple[Any, Any, Any]:
    """(publisher, consumer, a coroutine function running the consumer until stop)."""
    name = f"b{uuid.uuid4().hex[:8]}"
    reg = TaskRegistry()

    @reg.task(name="t")
    def record(ctx: TaskContext) -> None:
        sink.saw(ctx.job_id, ctx.nominal_ms)

    if broker == "redis-stream":
        # A pool above max_running: redis-py's default cap (100 connections) would
        # refuse publishes ("Too many connections") and turn them into retries.
        client = client_from_url(urls["redis"], max_connections=1024)
        publisher: Any = StreamPublisher(client, name)
        consumer: Any = StreamConsumer(client, name, "g", "c", count=500)

        async def run_stream(stop: asyncio.Event) -> None:
            async def handle(entry: Any) -> None:
                sink.saw(entry.job_id, entry.nominal_ms)

            while not stop.is_set():
                await consumer.process(handle, block=0.05)

        return publisher, consumer, run_stream
    if broker == "nats":
        nc = await nats.connect(urls["nats"])
        await nc.jetstream().add_stream(name=name, subjects=[f"{name}.jobs"])
        await nc.close()
        publisher = NatsPublisher(urls["nats"], f"{name}.jobs")
        consumer = NatsConsumer(urls["nats"], f"{name}.jobs", "c", reg, batch=500)
    else:
        conn = await aio_pika.connect(urls["rabbitmq"])
        ch = await conn.channel()
        ex = await ch.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue(name, durable=True)
        await q.bind(ex, "#")
        await conn.close()
        publisher = RabbitPublisher(urls["rabbitmq"], name)
        consumer = RabbitConsumer(urls["rabbitmq"], name, reg, batch=500)
    await publisher.open()
    await consumer.open()

    async def run_broker(stop: asyncio.Event) -> None:
        await consumer.run(stop, block=0.05)

    return publisher, consumer, run_broker


async def _one(
    broker: str, urls: dict[str, str], specs: Callable[[], list[JobSpec]], wait_all: bool
) -> tuple[float, Sink, int]:
    """Schedule the specs, run a publishing worker and a consumer until every job was
    consumed; returns (seconds from first due to last lease cleared, the sink, jobs)."""
    sink = Sink()
    publisher, consumer, run_consumer = await _setup(broker, urls, sink)
    client = client_from_url(urls["redis"])
    sched = Scheduler(client, f"n{uuid.uuid4().hex[:8]}", shards=4, check=False)
    jobs = specs()
    first_due = min(time.time() + (j.delay or 0) for j in jobs)  # type: ignore[operator]
    await sched.schedule_many(jobs)
    worker = Worker(
        sched, TaskRegistry(), publisher=publisher, max_running=256, lookahead=0.5,
        poll_interval=0.01, limit=1000,
    )  # fmt: skip
    stop = asyncio.Event()
    # The throughput run has no consumer in this process: it would compete for the CPU.
    consuming = asyncio.ensure_future(run_consumer(stop) if wait_all else stop.wait())
    working = asyncio.ensure_future(worker.run())
    cleared_at = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        loader = worker.loader
        if cleared_at is None and loader is not None and loader.stats.succeeded >= len(jobs):
            cleared_at = time.time()
        if cleared_at is not None and (not wait_all or len(sink.runs) >= len(jobs)):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.3)  # a late duplicate would show
    worker.stop()
    await working
    stop.set()
    await consuming
    with contextlib.suppress(Exception):
        await consumer.close()
        await publisher.close()
    await client.aclose()
    return ((cleared_at or time.time()) - first_due), sink, len(jobs)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def main(
    jobs: int, rates: list[int], seconds: float, brokers: tuple[str, ...] = BROKERS
) -> None:
    with RedisServer() as redis_server, NatsServer() as nats_server, RabbitServer() as rabbit:
        urls = {"redis": redis_server.url, "nats": nats_server.url, "rabbitmq": rabbit.url}
        rows = []
        for broker in brokers:

            def burst() -> list[JobSpec]:
                return [JobSpec(f"j{i}", "t", b"x", delay=0.5) for i in range(jobs)]

            elapsed, _, n = await _one(broker, urls, burst, wait_all=False)
            row: dict[str, Any] = {"broker": broker, "handoff/s": n / elapsed}
            for rate in rates:
                count = int(rate * seconds)

                def paced(count: int = count, rate: int = rate) -> list[JobSpec]:
                    return [
                        JobSpec(f"p{i}", "t", b"x", delay=LEAD + i / rate) for i in range(count)
                    ]

                _, sink, n = await _one(broker, urls, paced, wait_all=True)
                late = list(sink.late_ms.values())
                row[f"p50@{rate}"] = _pct(late, 0.5)
                row[f"p99@{rate}"] = _pct(late, 0.99)
                row[f"missing@{rate}"] = n - len(sink.runs)  # not consumed within 120 s
                row[f"early@{rate}"] = sum(1 for v in late if v < 0)
                row[f"twice@{rate}"] = sum(1 for v in sink.runs.values() if v > 1)
            rows.append(row)
            print(row, flush=True)
        base = rows[0]
        print("\n| broker | handoff jobs/s (x Redis Streams) |", end="")
        for rate in rates:
            print(f" p50 / p99 ms @ {rate}/s | missing, early, twice @ {rate}/s |", end="")
        print("\n| --- | --- |" + " --- | --- |" * len(rates))
        for row in rows:
            ratio = row["handoff/s"] / base["handoff/s"]
            line = f"| {row['broker']} | {row['handoff/s']:.0f} ({ratio:.2f}x) |"
            for rate in rates:
                line += (
                    f" {row[f'p50@{rate}']:.1f} / {row[f'p99@{rate}']:.1f} |"
                    f" {row[f'missing@{rate}']}, {row[f'early@{rate}']}, {row[f'twice@{rate}']} |"
                )
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rates", default="1000,5000")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--brokers", default=",".join(BROKERS))
    a = parser.parse_args()
    chosen = tuple(a.brokers.split(","))
    asyncio.run(main(a.jobs, [int(r) for r in a.rates.split(",")], a.seconds, chosen))
