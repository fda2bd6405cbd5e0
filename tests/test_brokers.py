"""The publish handoff to NATS JetStream and RabbitMQ: every due job is published with
its id and nominal due, the lease is cleared only after the broker's confirm, and the
consumer runs each occurrence's task once with a worker's TaskContext."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.broker_support import (
    FAST,
    Recorder,
    consuming,
    nats_stream,
    rabbit_queue,
    schedule_batch,
    unique,
)
from tests.durable_support import check_all, open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import (
    BrokerMisconfigured,
    BrokerUnavailable,
    Job,
    TaskContext,
    TaskRegistry,
)
from tickwheel.durable.runtime.amqp import RabbitConsumer, RabbitPublisher
from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher
from tickwheel.durable.servers import NatsServer, RabbitServer, RedisServer, free_port

pytestmark = pytest.mark.redis

N = 200


def _check_contexts(rec: Recorder) -> None:
    for ctx in rec.contexts:
        assert ctx.task == "t" and ctx.durable and ctx.attempt == 1 and ctx.epoch >= 1
        assert ctx.payload == {"i": int(ctx.job_id[1:])}


def test_nats_every_job_published_once_and_run_once(
    redis_server: RedisServer, nats_server: NatsServer
) -> None:
    async def main() -> None:
        _, subject = await nats_stream(nats_server.url)
        async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
            await schedule_batch(s, N)
            publisher = NatsPublisher(nats_server.url, subject)
            await publisher.open()
            rec = Recorder()
            consumer = NatsConsumer(nats_server.url, subject, unique("c"), rec.registry)
            async with (
                consuming(consumer),
                running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
            ):
                assert await until(lambda: len(rec.runs) == N, 15), len(rec.runs)
            await publisher.close()
            assert rec.ids() == {f"j{i}" for i in range(N)} and rec.repeats() == 0
            assert publisher.published == N and publisher.duplicates == 0
            assert await check_all(s) == {}  # every lease cleared after its ack
            _check_contexts(rec)

    run(main())


def test_rabbitmq_every_job_published_once_and_run_once(
    redis_server: RedisServer, rabbit_server: RabbitServer
) -> None:
    async def main() -> None:
        exchange, queue = await rabbit_queue(rabbit_server.url)
        async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
            await schedule_batch(s, N)
            publisher = RabbitPublisher(rabbit_server.url, exchange)
            await publisher.open()
            rec = Recorder()
            consumer = RabbitConsumer(rabbit_server.url, queue, rec.registry)
            async with (
                consuming(consumer),
                running_worker(s, TaskRegistry(), publisher=publisher, **FAST),
            ):
                assert await until(lambda: len(rec.runs) == N, 15), len(rec.runs)
            await publisher.close()
            assert rec.ids() == {f"j{i}" for i in range(N)} and rec.repeats() == 0
            assert publisher.published == N
            assert await check_all(s) == {}
            _check_contexts(rec)

    run(main())


def test_misconfiguration_is_a_clear_error_at_open(
    nats_server: NatsServer, rabbit_server: RabbitServer
) -> None:
    async def main() -> None:
        with pytest.raises(BrokerMisconfigured, match="no JetStream stream"):
            await NatsPublisher(nats_server.url, unique("nostream.")).open()
        with pytest.raises(BrokerMisconfigured, match="no exchange"):
            await RabbitPublisher(rabbit_server.url, unique("nox")).open()
        with pytest.raises(BrokerMisconfigured, match="no queue"):
            await RabbitConsumer(rabbit_server.url, unique("noq"), TaskRegistry()).open()
        bad = rabbit_server.url.replace("guest:guest", "guest:wrong")
        with pytest.raises(BrokerMisconfigured, match="credentials"):
            await RabbitPublisher(bad, "amq.topic").open()
        with pytest.raises(ValueError, match="subject"):
            NatsPublisher(nats_server.url, "")

    run(main())


def test_a_broker_that_is_down_is_broker_unavailable() -> None:
    async def main() -> None:
        port = free_port()  # nothing listens there
        with pytest.raises(BrokerUnavailable):
            await NatsPublisher(f"nats://127.0.0.1:{port}", "a.b", timeout=1).open()
        with pytest.raises(BrokerUnavailable):
            await RabbitPublisher(f"amqp://guest:guest@127.0.0.1:{port}/", "x", timeout=1).open()

    run(main())


def test_cli_publish_options_are_checked(
    redis_server: RedisServer, nats_server: NatsServer
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))

    def worker(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "tickwheel.durable.ops.cli", "worker",
                "spill_support:registry", "--redis-url", redis_server.url,
                "--no-check", *options,
            ],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip

    got = worker("--publish", nats_server.url)
    assert got.returncode == 2 and "needs --subject" in got.stderr, got.stderr
    got = worker("--subject", "a.b")
    assert got.returncode == 2 and "--subject needs --publish" in got.stderr, got.stderr
    got = worker("--publish", nats_server.url, "--subject", unique("none."))
    assert got.returncode == 2 and "no JetStream stream" in got.stderr, got.stderr
    got = worker("--publish", "kafka://127.0.0.1:1", "--subject", "x")
    assert got.returncode == 2 and "unknown scheme" in got.stderr, got.stderr


def test_unroutable_message_is_not_confirmed(rabbit_server: RabbitServer) -> None:
    """A message no queue takes (mandatory, returned) is BrokerUnavailable: the lease
    stays, the job is published again once a queue is bound."""
    import aio_pika

    from tickwheel.durable import Job

    async def main() -> None:
        conn = await aio_pika.connect(rabbit_server.url)
        ch = await conn.channel()
        name = unique("x")
        await ch.declare_exchange(name, aio_pika.ExchangeType.DIRECT, durable=True)
        await conn.close()
        publisher = RabbitPublisher(rabbit_server.url, name)
        await publisher.open()
        job = Job(
            id="u1", shard=0, task="t", payload=b"x", nominal_ms=1, due_ms=1,
            deadline_ms=2, attempt=1, max_attempts=5, epoch=1, recurrence=None,
        )  # fmt: skip
        with pytest.raises(BrokerUnavailable, match="no queue bound"):
            await publisher.publish(job)
        assert publisher.published == 0
        await publisher.close()

    run(main())


def test_message_format_round_trip_and_version_check() -> None:
    from tickwheel.durable.runtime._handoff import decode_message, message_id

    body = b'{"a": 1}'
    headers = {
        "tickwheel-version": "1", "tickwheel-id": "j", "tickwheel-nominal": "1700000000000",
        "tickwheel-task": "t", "tickwheel-attempt": "2", "tickwheel-epoch": "3",
        "tickwheel-flags": "1", "tickwheel-publish": "ab",
    }  # fmt: skip
    m = decode_message(body, headers)
    assert (m.key, m.task, m.attempt, m.epoch, m.payload) == (
        ("j", 1700000000000),
        "t",
        2,
        3,
        {"a": 1},
    )
    assert message_id("j", 1700000000000) == "j:1700000000000"
    assert decode_message(b"raw", {**headers, "tickwheel-flags": "0"}).payload == b"raw"
    with pytest.raises(ValueError, match="format '2'"):
        decode_message(body, {**headers, "tickwheel-version": "2"})
    with pytest.raises(ValueError, match="no header tickwheel-id"):
        decode_message(body, {k: v for k, v in headers.items() if k != "tickwheel-id"})


def test_the_broker_clients_are_imported_only_when_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tickwheel.durable, tickwheel.durable.ops.cli;"
        "print(sorted(m for m in ('nats', 'aio_pika') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_a_nack_is_not_confirmed(rabbit_server: RabbitServer) -> None:
    """A queue that is full and rejects publishes makes the broker nack: the publish
    raises BrokerUnavailable (the lease stays, the job is published again)."""
    import aio_pika

    from tickwheel.durable import Job

    async def main() -> None:
        conn = await aio_pika.connect(rabbit_server.url)
        ch = await conn.channel()
        name = unique("x")
        ex = await ch.declare_exchange(name, aio_pika.ExchangeType.FANOUT, durable=True)
        q = await ch.declare_queue(
            unique("q"), durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        await q.bind(ex)
        await conn.close()
        publisher = RabbitPublisher(rabbit_server.url, name)
        await publisher.open()

        def job(i: int) -> Job:
            return Job(
                id=f"n{i}", shard=0, task="t", payload=b"x", nominal_ms=1, due_ms=1,
                deadline_ms=2, attempt=1, max_attempts=5, epoch=1, recurrence=None,
            )  # fmt: skip

        await publisher.publish(job(1))
        with pytest.raises(BrokerUnavailable, match="nacked"):
            await publisher.publish(job(2))
        assert publisher.published == 1
        await publisher.close()

    run(main())


def test_refused_credentials_are_broker_misconfigured_at_once(
    tmp_path: Path, rabbit_server: RabbitServer
) -> None:
    async def main() -> None:
        with NatsServer(store_dir=tmp_path, user="tw", password="s3cret") as nats_server:
            _, subject = await nats_stream(nats_server.url)  # the right credentials
            await NatsPublisher(nats_server.url, subject).open()
            for url in (
                nats_server.url.replace(":s3cret@", ":wrong@"),
                nats_server.url.replace("tw:s3cret@", ""),
            ):
                for opener in (
                    NatsPublisher(url, subject, timeout=5),
                    NatsConsumer(url, subject, "d", TaskRegistry(), timeout=5),
                ):
                    started = time.monotonic()
                    with pytest.raises(BrokerMisconfigured, match="credentials refused") as err:
                        await opener.open()
                    assert time.monotonic() - started < 4  # the refusal, not the timeout
                    assert "wrong" not in str(err.value)  # the password is not shown
        bad = rabbit_server.url.replace("guest:guest", "guest:wrong")
        with pytest.raises(BrokerMisconfigured, match="credentials") as err:
            await RabbitConsumer(bad, unique("q"), TaskRegistry()).open()
        assert "wrong" not in str(err.value)

    run(main())


def _job(i: int) -> Job:
    return Job(
        id=f"m{i}", shard=0, task="t", payload={"i": i}, nominal_ms=1000 + i, due_ms=1000 + i,
        deadline_ms=10**13, attempt=1, max_attempts=3, epoch=1, recurrence=None,
    )  # fmt: skip


def test_rabbitmq_rounds_with_failures_ack_exactly_the_ones_that_ran(
    rabbit_server: RabbitServer,
) -> None:
    async def main() -> None:
        exchange, queue = await rabbit_queue(rabbit_server.url)
        publisher = RabbitPublisher(rabbit_server.url, exchange)
        for i in range(40):
            await publisher.publish(_job(i))
        await publisher.close()
        reg = TaskRegistry()
        failed_once: set[str] = set()
        runs: list[str] = []

        @reg.task(name="t")
        def t(ctx: TaskContext) -> None:
            if ctx.payload["i"] % 3 == 0 and ctx.job_id not in failed_once:
                failed_once.add(ctx.job_id)
                raise RuntimeError("first run fails")
            runs.append(ctx.job_id)

        consumer = RabbitConsumer(rabbit_server.url, queue, reg, batch=8)
        try:
            deadline = time.monotonic() + 20
            while consumer.handled < 40 and time.monotonic() < deadline:
                await consumer.process(0.2)
            assert consumer.handled == 40 and consumer.failed == 14
            assert sorted(runs) == sorted(f"m{i}" for i in range(40))  # each once
            # Everything was acked: reopened, the queue delivers nothing.
            await consumer.close()
            assert await consumer.process(0.5) == 0 and consumer.handled == 40
        finally:
            await consumer.close()

    run(main())
