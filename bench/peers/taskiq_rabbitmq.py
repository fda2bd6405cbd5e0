"""The brokers section's peer: taskiq on RabbitMQ (``taskiq-aio-pika``), a countdown each.

taskiq-aio-pika defers a message with a delay queue: the message is published there
with a per-message TTL (``expiration``) and RabbitMQ dead-letters it into the task
queue when the TTL runs out (RabbitMQ expires messages at a queue's head only, so the
delays here rise with the publish order, as a steady schedule's do). The same job as
tickwheel's handoff: a job scheduled ahead, handed to a RabbitMQ queue at its due time,
run by a consumer; here the broker keeps the schedule.

Each job is kicked with ``.kicker().with_labels(delay=...)`` (taskiq's countdown) and
carries its nominal due in a label. The consumer reads ``broker.listen()`` (taskiq's own
transport, prefetch 500 like tickwheel's consumer in the probe) and records start minus
nominal due before the ack: the lateness, measured as tickwheel's.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
import uuid
from collections import Counter
from typing import Any

__all__ = ["available", "taskiq_lateness"]

PREFETCH = 500


def available() -> bool:
    """Both packages importable (the bench extra installs them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("taskiq", "taskiq_aio_pika"))


async def taskiq_lateness(url: str, rate: int, seconds: float) -> dict[str, Any]:
    """Jobs due one every 1/rate s for ``seconds``, kicked with a countdown, the first
    due after every kick is done (2 s, plus 1 ms per 2 jobs); returns the lateness
    samples (ms) and the runs per job."""
    from taskiq_aio_pika import AioPikaBroker, Exchange, Queue
    from taskiq_aio_pika.queue import QueueType

    name = f"tq{uuid.uuid4().hex[:8]}"
    broker = AioPikaBroker(
        url,
        exchange=Exchange(name=name),
        task_queues=[Queue(name=name, type=QueueType.CLASSIC)],
        delay_queue=Queue(name=f"{name}.delay", type=QueueType.CLASSIC),
        dead_letter_queue=Queue(name=f"{name}.dead", type=QueueType.CLASSIC),
        qos=PREFETCH,
    )

    @broker.task(task_name="t")
    async def t(job: int, nominal_ms: float) -> None:  # never run here: listen() reads
        return None

    n = max(1, int(rate * seconds))
    lead = 2.0 + n / 2000  # as tickwheel's runs (bench.probes.brokers.LEAD), plus the kicks
    runs: Counter[int] = Counter()
    late: dict[int, float] = {}
    broker.is_worker_process = True  # a read connection too: this process consumes
    await broker.startup()
    first_ms = time.time() * 1000 + lead * 1000
    stop = asyncio.Event()

    async def consume() -> None:
        async for message in broker.listen():
            got = broker.formatter.loads(message.data)
            job, nominal = int(got.args[0]), float(got.args[1])
            late.setdefault(job, time.time() * 1000 - nominal)
            runs[job] += 1
            await message.ack()  # type: ignore[misc]
            if len(runs) >= n:
                stop.set()

    consuming = asyncio.ensure_future(consume())
    try:
        for k in range(n):
            nominal = first_ms + k * 1000 / rate
            delay = (nominal - time.time() * 1000) / 1000
            await t.kicker().with_labels(delay=max(delay, 0.0)).kiq(k, nominal)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), lead + seconds + 60)
        await asyncio.sleep(0.3)  # a late duplicate would show
    finally:
        consuming.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await consuming
        await broker.shutdown()
    return {"late_ms": list(late.values()), "runs": runs, "jobs": n}
