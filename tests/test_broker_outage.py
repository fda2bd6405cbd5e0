"""A broker outage costs no attempt: a publish the broker did not confirm releases the
job at its attempt, due again after a back-off, so an outage longer than
``max_attempts x lease`` loses no job and dead-letters none."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.broker_support import FAST, Recorder, consuming, nats_stream, rabbit_queue, unique
from tests.durable_support import check_all, open_scheduler, run
from tests.faultproxy import FaultProxy
from tests.spill_support import running_worker, until
from tickwheel.durable import JobSpec, Scheduler, TaskRegistry
from tickwheel.durable.runtime._handing import BACKOFF_CAP, BACKOFF_FIRST, Handoff
from tickwheel.durable.runtime.amqp import RabbitConsumer, RabbitPublisher
from tickwheel.durable.runtime.jetstream import NatsConsumer, NatsPublisher
from tickwheel.durable.servers import NatsServer, RabbitServer, RedisServer

pytestmark = pytest.mark.redis

N = 20
# No pre-start lease: a claim leases lookahead + lease, each expiry would cost an attempt.
WORKER = {**FAST, "start_margin": None}
LEASE = WORKER["lookahead"] + WORKER["lease"]
OUTAGE = 2 * LEASE + 0.5  # longer than max_attempts (2) x lease


async def _schedule(s: Scheduler) -> None:
    await s.schedule_many(
        JobSpec(f"j{i}", "t", {"i": i}, delay=0.2 + i * 0.01, max_attempts=2) for i in range(N)
    )


async def _dead(s: Scheduler) -> int:
    return sum([(await s.dead_letters(shard)).total for shard in range(s.keys.shards)])


def _check(rec: Recorder) -> None:
    assert rec.ids() == {f"j{i}" for i in range(N)} and rec.repeats() == 0
    assert {ctx.attempt for ctx in rec.contexts} == {1}  # no attempt spent in the outage


def test_nats_down_longer_than_every_attempt_loses_and_kills_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def main() -> None:
        nats = NatsServer(store_dir=tmp_path / "nats").start()
        try:
            _, subject = await nats_stream(nats.url)
            async with open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s:
                await _schedule(s)
                publisher = NatsPublisher(nats.url, subject, timeout=0.5)
                await publisher.open()
                nats.kill()  # down before the first job is due
                async with running_worker(s, TaskRegistry(), publisher=publisher, **WORKER) as w:
                    await asyncio.sleep(OUTAGE)
                    assert await _dead(s) == 0
                    assert w.loader is not None and w.loader.stats.released >= N
                    nats.start()  # on its store and port; the client reconnects
                    rec = Recorder()
                    consumer = NatsConsumer(nats.url, subject, unique("c"), rec.registry)
                    async with consuming(consumer):
                        assert await until(lambda: len(rec.runs) == N, 20), len(rec.runs)
                        # A publish buffered by the client while it reconnected may be
                        # stored after its job was given back: the stream drops the
                        # job's next publish (a duplicate ack) and its lease is cleared.
                        loader = w.loader
                        assert await until(lambda: loader.stats.succeeded >= N, 20)
                await publisher.close()
                _check(rec)
                assert await _dead(s) == 0 and await check_all(s) == {}
        finally:
            nats.stop()

    run(main())


def test_rabbitmq_down_longer_than_every_attempt_loses_and_kills_nothing(
    redis_server: RedisServer, rabbit_server: RabbitServer
) -> None:
    async def main() -> None:
        exchange, queue = await rabbit_queue(rabbit_server.url)
        async with (
            open_scheduler(redis_server.url, shards=2, owner_ttl=1.0) as s,
            FaultProxy("127.0.0.1", rabbit_server.port) as proxy,
        ):
            await _schedule(s)
            url = rabbit_server.url.replace(str(rabbit_server.port), str(proxy.port))
            publisher = RabbitPublisher(url, exchange, timeout=0.5)
            await publisher.open()
            proxy.reset_all(refuse_for=math.inf)  # down: connections reset and refused
            async with running_worker(s, TaskRegistry(), publisher=publisher, **WORKER) as w:
                await asyncio.sleep(OUTAGE)
                assert await _dead(s) == 0
                assert w.loader is not None and w.loader.stats.released >= N
                proxy.heal()
                rec = Recorder()
                consumer = RabbitConsumer(rabbit_server.url, queue, rec.registry)
                async with consuming(consumer):
                    assert await until(lambda: len(rec.runs) == N, 20), len(rec.runs)
            await publisher.close()
            _check(rec)
            assert await _dead(s) == 0 and await check_all(s) == {}

    run(main())


def test_the_back_off_doubles_to_its_cap_and_a_confirm_resets_it() -> None:
    handoff = Handoff.__new__(Handoff)
    handoff.streak = 0
    assert BACKOFF_FIRST * 0.75 <= handoff.backoff() <= BACKOFF_FIRST
    handoff.streak = 3
    assert BACKOFF_FIRST * 8 * 0.75 <= handoff.backoff() <= BACKOFF_FIRST * 8
    handoff.streak = 10_000
    assert BACKOFF_CAP * 0.75 <= handoff.backoff() <= BACKOFF_CAP
