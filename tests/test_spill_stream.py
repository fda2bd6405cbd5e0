"""The publish handoff: due jobs go to a Redis Stream at their due time, the lease is
cleared only after XADD returned, and consumers drop duplicate publishes."""

from __future__ import annotations

import asyncio

import pytest

from tests.durable_support import check_all, client_of, open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import (
    Job,
    RedisUnavailable,
    StreamConsumer,
    StreamEntry,
    StreamPublisher,
    TaskRegistry,
)

pytestmark = pytest.mark.redis

FAST = {"lookahead": 0.3, "poll_interval": 0.02, "reap_interval": 0.05}


def _entry_ms(entry: StreamEntry) -> int:
    return int(entry.entry_id.split("-")[0])  # XADD's Redis time


def test_due_jobs_are_published_on_time_then_acked(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2, owner_ttl=1.0) as s:
            client = client_of(s)
            stream = f"{s.keys.namespace}:out"
            for i in range(10):
                await s.schedule(f"p{i}", "email.send", {"to": i}, delay=0.3 + i * 0.02)
            publisher = StreamPublisher(client, stream)
            async with running_worker(s, TaskRegistry(), publisher=publisher, **FAST) as w:
                assert await until(
                    lambda: w.loader is not None and w.loader.stats.succeeded == 10, 4
                )
            assert await check_all(s) == {}  # every lease cleared after its XADD
            consumer = StreamConsumer(client, stream, "g", "c1")
            entries = await consumer.read()
            assert sorted(e.job_id for e in entries) == [f"p{i}" for i in range(10)]
            for e in entries:
                assert e.task == "email.send" and e.attempt == 1
                assert e.payload == {"to": int(e.job_id[1:])}
                # Published at the due time by Redis's clock: never early.
                assert 0 <= _entry_ms(e) - e.nominal_ms < 500, e
                await consumer.ack(e)
            assert (await client.xpending(stream, "g"))["pending"] == 0
            assert await consumer.read() == []

    run(main())


class LostReply(StreamPublisher):
    """XADD succeeds, then the reply is lost (or the process dies) before the ack."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls = 0

    async def publish(self, job: Job) -> None:
        self.calls += 1
        await super().publish(job)
        if self.calls == 1:
            raise RedisUnavailable("connection reset after XADD")


def test_crash_between_publish_and_lease_clear_gives_a_duplicate_the_consumer_drops(
    redis_url: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=1.0, retry_base=0.05) as s:
            client = client_of(s)
            stream = f"{s.keys.namespace}:out"
            await s.schedule("once", "t", b"x", delay=0.1)
            info = await s.get("once")
            assert info is not None
            publisher = LostReply(client, stream)
            async with running_worker(s, TaskRegistry(), publisher=publisher, **FAST) as w:
                assert await until(lambda: w.loader is not None and w.loader.stats.succeeded, 4)
                assert w.loader is not None and w.loader.stats.retried == 1
            assert await s.get("once") is None  # done after the second publish
            assert await client.xlen(stream) == 2  # the first publish landed too
            consumer = StreamConsumer(client, stream, "g", "c1")
            handled: list[StreamEntry] = []

            async def handle(e: StreamEntry) -> None:
                handled.append(e)

            assert await consumer.process(handle) == 1
            assert consumer.dropped == 1
            assert [(e.job_id, e.nominal_ms, e.attempt) for e in handled] == [
                ("once", info.nominal_ms, 1)
            ]
            assert (await client.xpending(stream, "g"))["pending"] == 0

    run(main())


def test_dead_consumers_entries_are_reclaimed_not_dropped(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            client = client_of(s)
            stream = f"{s.keys.namespace}:out"
            publisher = StreamPublisher(client, stream)
            await s.take(0)
            await s.schedule("r", "t", {"n": 1})
            (job,) = (await s.claim(0)).jobs
            await publisher.publish(job)
            dead = StreamConsumer(client, stream, "g", "dead", claim_idle=0.1)
            (first,) = await dead.read()  # read, then the consumer dies: never acked
            alive = StreamConsumer(client, stream, "g", "alive", claim_idle=0.1)
            assert await alive.read() == []  # not idle long enough yet
            await asyncio.sleep(0.15)
            (again,) = await alive.read()  # XAUTOCLAIM: the same entry, not a duplicate
            assert again == first and alive.dropped == 0
            await alive.ack(again)
            # A late duplicate publish of the same occurrence is dropped.
            await publisher.publish(job)
            assert await alive.read() == [] and alive.dropped == 1
            assert (await client.xpending(stream, "g"))["pending"] == 0

    run(main())
