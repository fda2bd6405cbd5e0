"""Guard rails against silent loss through misuse (issue 40): an ``at`` that reads as
seconds or lies before 2000 is refused, naming the parameter and the unit, with nothing
written; a sync redis-py client is refused when the Scheduler (or Worker) is made."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
import redis
import redis.asyncio

from tests.durable_support import client_of, open_scheduler, run, unique_ns
from tickwheel.durable import JobSpec, Scheduler, TaskRegistry, Worker
from tickwheel.durable.model import MIN_AT_MS
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis


def test_min_at_is_2000_01_01() -> None:
    assert datetime.fromtimestamp(MIN_AT_MS / 1000, UTC) == datetime(2000, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("at", "said"),
    [
        # The mistake; a fixed id: a time in the id differs between two collections.
        pytest.param(int(time.time()) + 60, "epoch seconds", id="epoch-seconds-now"),
        (1, "milliseconds on or after 2000-01-01"),
        (MIN_AT_MS - 1, "milliseconds on or after 2000-01-01"),
        (datetime(1999, 12, 31, 23, 59, tzinfo=UTC), "on or after 2000-01-01"),
    ],
)
def test_at_before_2000_is_refused_and_nothing_is_written(
    redis_server: RedisServer, at: int | datetime, said: str
) -> None:
    async def main() -> None:
        ns = unique_ns()
        async with open_scheduler(redis_server.url, ns, shards=2) as s:
            with pytest.raises(ValueError, match=r"^at must be") as info:
                await s.schedule("j", "t", at=at)
            assert said in str(info.value)
            with pytest.raises(ValueError, match=r"^at must be"):
                await s.schedule_many([JobSpec("k", "t", at=at)])
            with pytest.raises(ValueError, match=r"^at must be"):
                JobSpec("k", "t", at=at)
            assert await client_of(s).keys(f"*{ns}*") == []  # not even the layout
            await s.schedule("ok", "t", at=MIN_AT_MS)  # the bound itself is taken
            assert await s.get("j") is None and await s.get("ok") is not None
            # reschedule: refused the same way, the job stays where it was
            before = await s.get("ok")
            with pytest.raises(ValueError, match=r"^at must be"):
                await s.reschedule("ok", at=at)
            assert await s.get("ok") == before

    run(main())


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickwheel.durable.ops.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_at_in_seconds_is_refused_and_nothing_is_written(redis_server: RedisServer) -> None:
    ns = unique_ns()
    o = ["--redis-url", redis_server.url, "--namespace", ns, "--shards", "2"]
    seconds = str(int(time.time()) + 60)
    out = _cli("schedule", "j", "t", "--at", seconds, *o)
    assert out.returncode == 2, out.stderr
    assert "--at must be on or after 2000-01-01" in out.stderr
    assert "epoch seconds? --at takes milliseconds" in out.stderr
    assert "Traceback" not in out.stderr
    out = _cli("schedule", "j", "t", "--at", "1999-06-01T00:00:00Z", *o)
    assert out.returncode == 2 and "--at must be on or after 2000-01-01" in out.stderr
    assert "milliseconds" not in out.stderr  # an ISO time has no unit to get wrong

    async def keys() -> list[bytes]:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return list(await client.keys(f"*{ns}*"))
        finally:
            await client.aclose()

    assert run(keys()) == []


def test_a_sync_client_is_refused_at_construction() -> None:
    sync = redis.Redis()  # never connects: refused before any call
    with pytest.raises(TypeError, match=r"^client must be an asyncio Redis client") as info:
        Scheduler(sync, "ns")  # type: ignore[arg-type]
    text = str(info.value)
    assert "redis.client.Redis" in text and "redis.asyncio.Redis.from_url" in text
    with pytest.raises(TypeError, match=r"RedisCluster"):
        Scheduler(object(), "ns")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^scheduler must be a Scheduler"):
        Worker(redis.asyncio.Redis(), TaskRegistry())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^scheduler must be a Scheduler"):
        Worker(sync, TaskRegistry())  # type: ignore[arg-type]
    # The asyncio clients pass.
    Scheduler(redis.asyncio.Redis(), "ns")
    Scheduler(redis.asyncio.RedisCluster(host="127.0.0.1", port=1), "ns")
