"""Chaos with a broker in the loop: publishing worker processes and nats-server killed
at random while a producer schedules jobs; one consumer runs them with a Redis dedup.

A seeded random sequence of faults, one every ~1.5 s:

- ``kill -9`` of a publishing worker (``tickwheel worker --publish nats://...``), and a
  replacement started;
- ``kill -9`` of nats-server, restarted on its store directory and port.

Then the faults stop, everything settles, and the checks run: every job's task ran
exactly once (no occurrence lost, none run twice), none started before its nominal due,
and nothing is left due, leased or dead. The copies each dedup dropped are printed.

The seed is printed; ``TICKWHEEL_CHAOS_SEED`` replays one. The CI form runs 12 s of
faults (about 25 s in all); ``TICKWHEEL_SOAK=1`` runs 5 min.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from tests.broker_support import Recorder, consuming, nats_stream, unique
from tests.durable_support import check_all, client_of, open_scheduler, run
from tests.spill_support import WorkerProcess, until
from tickwheel.durable import JobSpec
from tickwheel.durable.runtime.jetstream import NatsConsumer
from tickwheel.durable.servers import NatsServer, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SOAK = os.environ.get("TICKWHEEL_SOAK") == "1"
CHAOS_SECONDS = 300.0 if SOAK else 12.0
WORKERS = 2
SHARDS = 4


def test_broker_chaos(private_redis: RedisServer) -> None:
    seed = int(os.environ.get("TICKWHEEL_CHAOS_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    print(f"broker chaos seed {seed}")

    async def main() -> None:
        with NatsServer() as nats:
            _, subject = await nats_stream(nats.url)
            async with open_scheduler(private_redis.url, shards=SHARDS, owner_ttl=1.0) as s:
                ns = s.keys.namespace
                options = (
                    "--publish", nats.url, "--subject", subject, "--lease", "1",
                    "--shards", str(SHARDS), "--owner-ttl", "1", "--poll-interval", "0.02",
                )  # fmt: skip
                rec = Recorder()
                consumer = NatsConsumer(
                    nats.url, subject, unique("c"), rec.registry, dedup=client_of(s)
                )
                workers = [WorkerProcess(private_redis.url, ns, *options) for _ in range(WORKERS)]
                scheduled = 0
                faults = {"worker": 0, "nats": 0}
                try:
                    for w in workers:
                        await asyncio.to_thread(w.wait_started)
                    async with consuming(consumer):
                        end = time.monotonic() + CHAOS_SECONDS
                        next_fault = time.monotonic() + 1.0
                        while time.monotonic() < end:
                            await s.schedule_many(
                                JobSpec(
                                    f"j{scheduled + i}", "t", {"i": scheduled + i},
                                    delay=rng.uniform(0.05, 1.0), max_attempts=100,
                                )
                                for i in range(20)
                            )  # fmt: skip
                            scheduled += 20
                            if time.monotonic() >= next_fault:
                                next_fault = time.monotonic() + rng.uniform(1.0, 2.0)
                                if rng.random() < 0.5:
                                    victim = rng.randrange(len(workers))
                                    await asyncio.to_thread(workers[victim].kill)
                                    workers[victim] = WorkerProcess(private_redis.url, ns, *options)
                                    await asyncio.to_thread(workers[victim].wait_started)
                                    faults["worker"] += 1
                                else:
                                    await asyncio.to_thread(nats.kill)
                                    await asyncio.sleep(rng.uniform(0.1, 1.0))
                                    await asyncio.to_thread(nats.start)
                                    faults["nats"] += 1
                            await asyncio.sleep(0.1)
                        # Settle: every job run, every lease cleared.
                        assert await until(lambda: len(rec.runs) == scheduled, 60), (
                            f"seed {seed}: {scheduled - len(rec.runs)} of {scheduled} not run"
                        )
                finally:
                    for w in workers:
                        if w.proc.poll() is None:
                            w.kill()
                assert rec.ids() == {f"j{i}" for i in range(scheduled)}, f"seed {seed}"
                assert rec.repeats() == 0, f"seed {seed}: {rec.repeats()} run twice"
                early = [k for k, at in rec.started_at.items() if at < k[1]]
                assert not early, f"seed {seed}: started early: {early[:5]}"
                assert await until_settled(s), f"seed {seed}: leases left"
                print(
                    f"broker chaos: {scheduled} jobs, faults {faults}, consumer dropped"
                    f" {consumer.dropped}"
                )

    run(main())


async def until_settled(s: object, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check_all(s) == {}:  # type: ignore[arg-type]
            return True
        await asyncio.sleep(0.2)
    return False
