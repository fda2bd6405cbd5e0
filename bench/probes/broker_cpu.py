"""CPU per message of the broker publishers and consumers: this checkout beside another.

    python -m bench.probes.broker_cpu [--durable-dir OLD/durable] [--jobs 3000] [--runs 3]

The lateness probe (``bench.probes.brokers``) measures wall time on a shared machine,
where other processes move it by several times between runs. This one measures what
our code spends: the process CPU time (``time.process_time``) of publishing ``--jobs``
jobs through a publisher (256 in flight, each awaiting its confirm) and of consuming
them with the consumer (``process()`` rounds of 500), divided by the jobs. One
nats-server and one RabbitMQ node serve every run; each run is a child process that
loads either this checkout's ``durable/`` or ``--durable-dir`` (``_checkout.py``),
alternately, ``--runs`` times each. Prints the medians and new/old ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("nats", "rabbitmq")


async def _measure(broker: str, url: str, jobs: int) -> dict[str, float]:
    """In the child: (µs CPU per publish, µs CPU per consumed message)."""
    import aio_pika
    import nats

    from tickwheel.durable import Job, TaskContext, TaskRegistry
    from tickwheel.durable.runtime.amqp import RabbitConsumer, RabbitPublisher
    from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher

    name = f"c{uuid.uuid4().hex[:8]}"
    reg = TaskRegistry()
    seen: set[str] = set()

    @reg.task(name="t")
    def record(ctx: TaskContext) -> None:
        seen.add(ctx.job_id)

    publisher: Any
    consumer: Any
    if broker == "nats":
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name=name, subjects=[f"{name}.jobs"])
        await nc.close()
        publisher = NatsPublisher(url, f"{name}.jobs")
        consumer = NatsConsumer(url, f"{name}.jobs", "c", reg, batch=500)
    else:
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        ex = await ch.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue(name, durable=True)
        await q.bind(ex, "#")
        await conn.close()
        publisher = RabbitPublisher(url, name)
        consumer = RabbitConsumer(url, name, reg, batch=500)
    await publisher.open()
    now = int(time.time() * 1000)
    batch = [
        Job(
            id=f"j{i}",
            shard=0,
            task="t",
            payload={"i": i},
            nominal_ms=now,
            due_ms=now,
            deadline_ms=now + 30_000,
            attempt=1,
            max_attempts=3,
            epoch=1,
            recurrence=None,
        )
        for i in range(jobs)
    ]
    sem = asyncio.Semaphore(256)

    async def one(job: Job) -> None:
        async with sem:
            await publisher.publish(job)

    t0 = time.process_time()
    await asyncio.gather(*(one(j) for j in batch))
    publish_cpu = time.process_time() - t0
    await consumer.open()
    t0 = time.process_time()
    deadline = time.monotonic() + 120
    while len(seen) < jobs and time.monotonic() < deadline:
        await consumer.process(0.2)
    consume_cpu = time.process_time() - t0
    await consumer.close()
    await publisher.close()
    assert len(seen) == jobs, (len(seen), jobs)
    return {"publish_us": publish_cpu / jobs * 1e6, "consume_us": consume_cpu / jobs * 1e6}


def _child(durable_dir: str | None, broker: str, url: str, jobs: int) -> dict[str, float]:
    code = (
        "import asyncio, json, sys\n"
        "from bench.probes._checkout import load_durable\n"
        f"if {durable_dir!r}: load_durable({durable_dir!r})\n"
        "from bench.probes.broker_cpu import _measure\n"
        f"print(json.dumps(asyncio.run(_measure({broker!r}, {url!r}, {jobs}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(durable_dir: str | None, jobs: int, runs: int) -> None:
    from tickwheel.durable.servers import NatsServer, RabbitServer

    versions = {"new": None, "old": durable_dir} if durable_dir else {"new": None}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with NatsServer() as nats_server, RabbitServer() as rabbit:
        urls = {"nats": nats_server.url, "rabbitmq": rabbit.url}
        for _ in range(runs):
            for broker in BROKERS:
                for version, folder in versions.items():
                    got = _child(folder, broker, urls[broker], jobs)
                    results.setdefault((broker, version), []).append(got)
                    print(broker, version, got, flush=True)
    print("\n| broker | version | µs CPU per publish (median) | µs CPU per consume (median) |")
    print("| --- | --- | --- | --- |")
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for (broker, version), rows in sorted(results.items()):
        pub = statistics.median(r["publish_us"] for r in rows)
        con = statistics.median(r["consume_us"] for r in rows)
        medians[(broker, version)] = (pub, con)
        print(f"| {broker} | {version} | {pub:.0f} | {con:.0f} |")
    if durable_dir:
        for broker in BROKERS:
            (np, nc), (op, oc) = medians[(broker, "new")], medians[(broker, "old")]
            print(f"{broker}: new/old publish {np / op:.2f}x, consume {nc / oc:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--durable-dir", default=None)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    a = parser.parse_args()
    main(a.durable_dir, a.jobs, a.runs)
