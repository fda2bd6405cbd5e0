"""Helpers for the broker handoff tests: a stream or queue of the test's own, a task that
records each run, and a worker that publishes through a given publisher."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import nats

from tickwheel.durable import JobSpec, Scheduler, TaskContext, TaskRegistry

# Timing of a worker in these tests: short leases, so the reaper re-publishes quickly.
FAST = {"lookahead": 0.3, "poll_interval": 0.02, "reap_interval": 0.05, "lease": 1.0}


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def nats_stream(url: str, window: float = 120.0) -> tuple[str, str]:
    """A JetStream stream of the test's own; returns (stream name, subject)."""
    name = unique("S")
    subject = f"{name}.jobs"
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=[subject], duplicate_window=window)
    finally:
        await nc.close()
    return name, subject


async def rabbit_queue(url: str) -> tuple[str, str]:
    """A durable topic exchange and a durable queue bound to it with ``#``; returns
    (exchange, queue)."""
    exchange, queue = unique("x"), unique("q")
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(ex, "#")
    finally:
        await conn.close()
    return exchange, queue


class Recorder:
    """A registry whose task ``t`` records each run's (id, nominal) and context."""

    def __init__(self) -> None:
        self.runs: collections.Counter[tuple[str, int]] = collections.Counter()
        self.contexts: list[TaskContext] = []
        self.started_at: dict[tuple[str, int], float] = {}  # first start, epoch ms
        self.registry = TaskRegistry()

        @self.registry.task(name="t")
        async def record(ctx: TaskContext) -> None:
            self.started_at.setdefault(ctx.key, time.time() * 1000)
            self.runs[ctx.key] += 1
            self.contexts.append(ctx)

    def ids(self) -> set[str]:
        return {job_id for job_id, _ in self.runs}

    def repeats(self) -> int:
        return sum(n - 1 for n in self.runs.values())


async def schedule_batch(s: Scheduler, n: int, delay: float = 0.2, prefix: str = "j") -> None:
    await s.schedule_many(
        JobSpec(f"{prefix}{i}", "t", {"i": i}, delay=delay + (i % 10) * 0.01) for i in range(n)
    )


@asynccontextmanager
async def consuming(consumer: Any, block: float = 0.2) -> AsyncIterator[Any]:
    """Run ``consumer.run`` in a task until the block ends; close it after."""
    stop = asyncio.Event()
    await consumer.open()
    task = asyncio.ensure_future(consumer.run(stop, block=block, pause=0.1))
    try:
        yield consumer
    finally:
        stop.set()
        await task
        await consumer.close()
