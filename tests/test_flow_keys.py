"""The flow key (issue 35): ``schedule(..., key=)`` is record field 16, shown by get,
the claim, inspect and the Postgres mode's stored record. On a real redis-server and a
Redis Cluster."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run
from tickwheel.durable import MAX_KEY_BYTES, JobSpec, JobState
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    ("bad", "error"),
    [("", ValueError), ("x" * (MAX_KEY_BYTES + 1), ValueError), ("é" * 101, ValueError),
     ("a\x00b", ValueError), ("\ud800", ValueError), (42, TypeError), (b"k", TypeError),
     (math.nan, TypeError)],
)  # fmt: skip
def test_a_bad_key_is_refused_naming_key(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="key"):
        JobSpec("j", "t", key=bad)


def test_a_bad_key_writes_nothing(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            with pytest.raises(ValueError, match="key"):
                await s.schedule("j", "t", key="k" * 201)
            assert await s.get("j") is None

    run(main())


def test_the_key_is_kept_by_get_and_the_claim(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("a", "t", {"n": 1}, key="merchant:42")
            await s.schedule("b", "t", key="k" * MAX_KEY_BYTES, timeout=3)
            await s.schedule("c", "t")
            info = await s.get("a")
            assert info is not None and info.key == "merchant:42"
            assert info.state is JobState.DUE
            plain = await s.get("c")
            assert plain is not None and plain.key is None
            await s.take(0)
            jobs = {j.id: j for j in (await s.claim(0, limit=10)).jobs}
            assert jobs["a"].key == "merchant:42" and jobs["a"].payload == {"n": 1}
            assert jobs["b"].key == "k" * MAX_KEY_BYTES and jobs["b"].timeout_ms == 3000
            assert jobs["c"].key == ""
            leased = await s.get("a")
            assert leased is not None and leased.key == "merchant:42"
            await s.ack_many(list(jobs.values()))

    run(main())


def test_the_sync_producer_and_a_task_handle_take_a_key(redis_server: RedisServer) -> None:
    from tickwheel.durable import SyncScheduler, TaskContext, TaskRegistry
    from tickwheel.durable.store import sync_client_from_url

    client = sync_client_from_url(redis_server.url)
    try:
        sync = SyncScheduler(client, "synckeys", shards=2)
        sync.schedule("s1", "t", key="merchant:9")
        info = sync.get("s1")
        assert info is not None and info.key == "merchant:9"
        with pytest.raises(ValueError, match="key"):
            sync.schedule("s2", "t", key="")
        assert sync.get("s2") is None
    finally:
        client.close()
    reg = TaskRegistry()

    @reg.task(name="charge")
    async def charge(ctx: TaskContext) -> None: ...

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=2) as s:
            await charge.schedule({"n": 1}, id="h1", scheduler=s, key="merchant:3")
            info = await s.get("h1")
            assert info is not None and info.key == "merchant:3"

    run(main())
