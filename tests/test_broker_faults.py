"""Faults in the broker handoff: the broker killed (-9) mid-publish and restarted on its
data, a confirm lost on the wire (the fault proxy), a publishing worker killed (-9).
After each, every job is delivered and each occurrence's task runs once; the copies the
broker's dedup dropped and those the consumer dropped are counted."""

from __future__ import annotations

import asyncio

import pytest

from tests.broker_support import (
    FAST,
    Recorder,
    consuming,
    nats_stream,
    rabbit_queue,
    unique,
)
from tests.durable_support import check_all, open_scheduler, run
from tests.faultproxy import FaultProxy
from tests.spill_support import WorkerProcess, running_worker, until
from tickwheel.durable import JobSpec, TaskRegistry
from tickwheel.durable.runtime.amqp import RabbitConsumer, RabbitPublisher
from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher
from tickwheel.durable.servers import NatsServer, RabbitServer, RedisServer

pytestmark = pytest.mark.redis

N = 300


async def _spread(s: object, n: int = N) -> None:
    """``n`` jobs due over ~1.5 s, so a kill lands mid-publish. An unconfirmed publish
    costs no attempt (test_broker_outage.py); a lease left to the reaper (a worker
    killed) does: enough of them for that too."""
    await s.schedule_many(  # type: ignore[attr-defined]
        JobSpec(f"j{i}", "t", {"i": i}, delay=0.2 + i * 0.005, max_attempts=100) for i in range(n)
    )


def test_nats_killed_mid_publish_then_restarted_on_its_store(redis_server: RedisServer) -> None:
    async def main() -> None:
        with NatsServer() as nats:
            _, subject = await nats_stream(nats.url)
            async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
                await _spread(s)
                publisher = NatsPublisher(nats.url, subject, timeout=1.0)
                rec = Recorder()
                consumer = NatsConsumer(nats.url, subject, unique("c"), rec.registry)
                async with (
                    consuming(consumer),
                    running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
                ):
                    assert await until(lambda: publisher.published >= 50, 10)
                    nats.kill()
                    await asyncio.sleep(0.5)
                    nats.start()  # same port, same store directory
                    assert await until(lambda: len(rec.runs) == N, 30), len(rec.runs)
                await publisher.close()
                assert rec.ids() == {f"j{i}" for i in range(N)}
                assert rec.repeats() == 0, rec.repeats()
                assert await check_all(s) == {}
                # The copies each dedup dropped (pytest -s shows them).
                print(
                    f"nats kill: broker dropped {publisher.duplicates}, consumer {consumer.dropped}"
                )

    run(main())


def test_rabbitmq_killed_mid_publish_then_restarted_on_its_data(
    redis_server: RedisServer,
) -> None:
    async def main() -> None:
        with RabbitServer() as rabbit:
            exchange, queue = await rabbit_queue(rabbit.url)
            async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
                await _spread(s)
                publisher = RabbitPublisher(rabbit.url, exchange, timeout=1.0)
                rec = Recorder()
                consumer = RabbitConsumer(rabbit.url, queue, rec.registry)
                async with (
                    consuming(consumer),
                    running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
                ):
                    assert await until(lambda: publisher.published >= 50, 10)
                    await asyncio.to_thread(rabbit.kill)
                    await asyncio.to_thread(rabbit.start)  # same ports, same data
                    assert await until(lambda: len(rec.runs) == N, 40), len(rec.runs)
                await publisher.close()
                assert rec.ids() == {f"j{i}" for i in range(N)}
                assert rec.repeats() == 0, rec.repeats()
                assert await check_all(s) == {}
                print(f"rabbitmq kill: consumer dropped {consumer.dropped}")

    run(main())


def test_nats_lost_ack_is_published_again_and_the_stream_drops_the_copy(
    redis_server: RedisServer, nats_server: NatsServer
) -> None:
    async def main() -> None:
        _, subject = await nats_stream(nats_server.url)
        async with (
            FaultProxy("127.0.0.1", nats_server.port) as proxy,
            open_scheduler(redis_server.url, shards=1, owner_ttl=1.0) as s,
        ):
            publisher = NatsPublisher(f"nats://127.0.0.1:{proxy.port}", subject, timeout=1.0)
            await publisher.open()
            proxy.drop_next_reply(b"lostack")  # the stream stores it; its ack is lost
            await s.schedule("lostack", "t", {"i": 0}, delay=0.1)
            rec = Recorder()
            consumer = NatsConsumer(nats_server.url, subject, unique("c"), rec.registry)
            async with (
                consuming(consumer),
                running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
            ):
                await proxy.wait_dropped(10)
                assert await until(lambda: publisher.duplicates == 1, 15)
                assert await until(lambda: len(rec.runs) == 1, 5)
                assert await until(lambda: False, 0.3) is False  # no late second run
            await publisher.close()
            assert proxy.dropped_replies == 1
            assert publisher.published == 0 and publisher.duplicates == 1  # broker dropped it
            assert rec.repeats() == 0 and consumer.dropped == 0
            assert await check_all(s) == {}

    run(main())


def test_rabbitmq_lost_confirm_is_published_again_and_the_consumer_drops_the_copy(
    redis_server: RedisServer, rabbit_server: RabbitServer
) -> None:
    async def main() -> None:
        exchange, queue = await rabbit_queue(rabbit_server.url)
        async with (
            FaultProxy("127.0.0.1", rabbit_server.port) as proxy,
            open_scheduler(redis_server.url, shards=1, owner_ttl=1.0) as s,
        ):
            url = rabbit_server.url.replace(str(rabbit_server.port), str(proxy.port))
            publisher = RabbitPublisher(url, exchange, timeout=1.0)
            await publisher.open()
            proxy.drop_next_reply(b"lostack")  # the broker queues it; its confirm is lost
            await s.schedule("lostack", "t", {"i": 0}, delay=0.1)
            rec = Recorder()
            consumer = RabbitConsumer(rabbit_server.url, queue, rec.registry)
            async with (
                consuming(consumer),
                running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
            ):
                await proxy.wait_dropped(10)
                assert await until(lambda: consumer.dropped == 1, 15)
                assert len(rec.runs) == 1
            await publisher.close()
            assert publisher.published == 1  # the second publish's confirm
            assert rec.repeats() == 0 and consumer.dropped == 1  # the consumer dropped it
            assert await check_all(s) == {}

    run(main())


def test_publishing_worker_killed_another_publishes_the_rest(
    redis_server: RedisServer, nats_server: NatsServer
) -> None:
    async def main() -> None:
        _, subject = await nats_stream(nats_server.url)
        async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
            await _spread(s)
            rec = Recorder()
            consumer = NatsConsumer(nats_server.url, subject, unique("c"), rec.registry)
            options = (
                "--publish",
                nats_server.url,
                "--subject",
                subject,
                "--lease",
                "1",
                "--shards",
                "2",
            )
            ns = s.keys.namespace
            async with consuming(consumer):
                first = WorkerProcess(redis_server.url, ns, *options)
                try:
                    await asyncio.to_thread(first.wait_started)
                    assert await until(lambda: len(rec.runs) >= 30, 15)
                    await asyncio.to_thread(first.kill)  # kill -9, mid-publish
                    second = WorkerProcess(redis_server.url, ns, *options)
                    await asyncio.to_thread(second.wait_started)
                    assert await until(lambda: len(rec.runs) == N, 30), len(rec.runs)
                    code, _, err = await asyncio.to_thread(second.stop)
                    assert code == 0, err
                finally:
                    for w in (first,):
                        if w.proc.poll() is None:
                            w.kill()
            assert rec.ids() == {f"j{i}" for i in range(N)} and rec.repeats() == 0
            assert await check_all(s) == {}

    run(main())
