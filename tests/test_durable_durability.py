"""Durability: every acknowledged schedule survives a kill -9 with AOF fsync always."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio

from tests.durable_support import run
from tickwheel.durable import JobSpec, JobState, Scheduler
from tickwheel.durable._server import RedisServer

pytestmark = pytest.mark.redis


def test_acknowledged_schedules_survive_a_crash(tmp_path: Path) -> None:
    server = RedisServer(appendonly=True, appendfsync="always", data_dir=tmp_path)
    server.start()
    acked: list[str] = []
    try:

        async def produce() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            s = Scheduler(client, "dur", shards=4)
            await s.open()
            for i in range(100):
                await s.schedule(f"one{i}", "t", {"i": i}, delay=3600)
                acked.append(f"one{i}")
            results = await s.schedule_many(
                JobSpec(f"many{i}", "t", b"x" * 32, delay=3600) for i in range(500)
            )
            acked.extend(r.id for r in results)
            shard = s.keys.shard_of("leased")
            await s.take(shard)
            await s.schedule("leased", "t")
            (job,) = (await s.claim(shard, limit=1)).jobs
            assert job.id == "leased"
            acked.append("leased")
            server.kill()  # right after the last call returned: no graceful shutdown

        run(produce())
    finally:
        server.kill()

    restarted = RedisServer(
        port=server.port, appendonly=True, appendfsync="always", data_dir=tmp_path
    )
    restarted.start()
    try:

        async def verify() -> None:
            client = redis.asyncio.Redis.from_url(restarted.url)
            s = Scheduler(client, "dur", shards=4, check=False)
            for job_id in acked:
                info = await s.get(job_id)
                assert info is not None, job_id
                expected = JobState.LEASED if job_id == "leased" else JobState.DUE
                assert info.state is expected, job_id
            info = await s.get("one7")
            assert info is not None and info.payload == {"i": 7}
            await client.aclose()

        run(verify())
    finally:
        restarted.stop()
