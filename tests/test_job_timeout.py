"""A job's own timeout (issue 34): ``schedule(..., timeout=)`` is stored with the job
and comes before its task's timeout and the worker's default. On a real redis-server."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from tests.durable_support import client_of, open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import JobSpec, JobState, SyncScheduler, TaskContext, TaskRegistry
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store import pack_record

pytestmark = pytest.mark.redis

FAST = {"lease": 5.0, "lookahead": 0.1, "poll_interval": 0.05, "reap_interval": 0.2}


@pytest.mark.parametrize(
    ("bad", "error"),
    [(-1, ValueError), (0, ValueError), (math.nan, ValueError), (math.inf, ValueError),
     ("1", TypeError), (True, TypeError)],
)  # fmt: skip
def test_bad_job_timeouts_are_refused_naming_timeout_and_nothing_is_written(
    redis_server: RedisServer, bad: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="timeout"):
        JobSpec("a", "t", timeout=bad)

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            with pytest.raises(error, match="timeout"):
                await s.schedule("a", "t", timeout=bad)
            assert await s.get("a") is None
            assert await client_of(s).zcard(s.keys.shard(0).due) == 0

    run(main())
    sync = SyncScheduler.from_url(redis_server.url, shards=1)
    try:
        with pytest.raises(error, match="timeout"):
            sync.schedule("b", "t", timeout=bad)
    finally:
        sync.close()


def test_the_job_timeout_is_stored_and_old_records_read_as_none(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("own", "t", timeout=1.5)
            await s.schedule("rec", "t", timeout=0.25, every=60, delay=0)
            await s.schedule("none", "t")
            # A record written before the field existed: 13 fields at most.
            k = s.keys
            old = pack_record([b"t", b"", 5, 0, 0, 1, 0])
            await client_of(s).hset(k.jobs_key(0, "old"), "old", old)
            await client_of(s).zadd(k.shard(0).due, {"old": 1})
            infos = {i: await s.get(i) for i in ("own", "rec", "none", "old")}
            assert {i: (v.timeout_ms if v else None) for i, v in infos.items()} == {
                "own": 1500, "rec": 250, "none": 0, "old": 0,
            }  # fmt: skip
            await s.take(0)
            batch = await s.claim(0, limit=10)
            got = {j.id: j.timeout_ms for j in batch.jobs}
            assert got == {"own": 1500, "rec": 250, "none": 0, "old": 0}
            await s.ack_many(batch.jobs)
            nxt = await s.get("rec")  # the series' next run keeps it
            assert nxt is not None and nxt.timeout_ms == 250 and nxt.state is JobState.DUE

    run(main())


def test_a_claim_parks_and_leases_a_timed_record_keeping_its_timeout(redis_url: str) -> None:
    """claim.lua's row of a one-shot job with its own timeout is the short one and the
    timeout (7 fields); parked under a pause, its record gets the nominal explicit and
    keeps the timeout, and the claim after the resume leases it with it."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.pause("t")
            await s.schedule("own", "t", timeout=1.5, at=1_700_000_000_000)
            await s.schedule("other", "u", timeout=2)
            await s.take(0)
            batch = await s.claim(0, limit=10)
            assert [(j.id, j.timeout_ms) for j in batch.jobs] == [("other", 2000)]
            assert batch.parked == 1
            raw = await client_of(s).hget(s.keys.jobs_key(0, "own"), "own")
            nominal = [b"t", b"", 5, 0, 1_700_000_000_000, 1, 0, 0, b"", 0, 0, 0, b"", 1500]
            assert raw == pack_record(nominal)
            await s.resume("t")
            [job] = (await s.claim(0, limit=10)).jobs
            assert (job.id, job.timeout_ms, job.nominal_ms) == ("own", 1500, 1_700_000_000_000)
            assert await s.ack_many([job, *batch.jobs]) == [True, True]

    run(main())


def test_the_job_timeout_comes_before_the_task_and_worker_ones(redis_url: str) -> None:
    async def main() -> None:
        starts: dict[str, float] = {}
        stops: dict[str, float] = {}
        reg = TaskRegistry()

        @reg.task(name="slow", timeout=30)
        async def slow(ctx: TaskContext) -> None:
            starts[ctx.job_id] = time.monotonic()
            try:
                await asyncio.sleep(ctx.payload["sleep"])
            except asyncio.CancelledError:
                stops[ctx.job_id] = time.monotonic()
                raise

        async with (
            open_scheduler(redis_url, shards=2) as s,
            running_worker(s, reg, default_timeout=60, **FAST),
        ):
            await s.schedule("short", "slow", {"sleep": 30}, timeout=0.5, max_attempts=1)
            await s.schedule("within", "slow", {"sleep": 0.2}, timeout=5, max_attempts=1)
            assert await until(lambda: "short" in stops, 10)
            took = stops["short"] - starts["short"]
            assert 0.5 <= took < 5.0  # never early; its task's 30 s did not apply
            info: Any = None
            for _ in range(100):
                info = await s.get("short")
                if info is not None and info.state is JobState.DEAD:
                    break
                await asyncio.sleep(0.05)
            assert info is not None and info.state is JobState.DEAD
            assert "timeout" in info.last_error and info.timeout_ms == 500
            for _ in range(100):
                if await s.get("within") is None:
                    break
                await asyncio.sleep(0.05)
            assert await s.get("within") is None and "within" not in stops  # acked

    run(main())


def test_cli_schedule_takes_timeout(redis_server: RedisServer) -> None:
    from tests.durable_support import unique_ns
    from tests.test_cli import cli, cli_json, opts

    o = opts(redis_server.url, unique_ns(), shards=1)
    assert cli("schedule", "j", "t", "--timeout", "-1", *o).returncode == 2
    assert cli("schedule", "j", "t", "--timeout", "nan", *o).returncode == 2
    assert cli_json("schedule", "j", "t", "--timeout", "2.5", *o)["status"] == "created"


def test_the_postgres_mode_keeps_a_job_timeout_through_retries_and_a_redis_loss(
    private_redis: RedisServer, pg_url: str
) -> None:
    """In the Postgres mode a job's own timeout is stored in the row's record: its
    attempt times out and retries, FLUSHALL loses Redis, reconcile rebuilds the retried
    occurrence from the row (attempt 2), and it keeps its timeout until it is dead."""
    from tests.pg_support import migrated, pg_scheduler

    stops: list[tuple[int, float]] = []
    reg = TaskRegistry()

    @reg.task(name="hang")
    async def hang(ctx: TaskContext) -> None:
        start = time.monotonic()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stops.append((ctx.attempt, time.monotonic() - start))
            raise

    async def state(s: Any, want: JobState, attempt: int) -> Any:
        for _ in range(200):
            info = await s.get("own")
            if info is not None and info.state is want and info.attempt == attempt:
                return info
            await asyncio.sleep(0.05)
        raise AssertionError(f"own: {await s.get('own')}")

    async def main() -> None:
        await migrated(pg_url)
        opts: dict[str, Any] = {"shards": 1, "retry_base": 1.0, "retry_max": 1.0}
        async with pg_scheduler(private_redis.url, pg_url, **opts) as s:
            ns = s.keys.namespace
            await s.schedule("own", "hang", timeout=0.4, max_attempts=3)
            async with running_worker(s, reg, reconcile_interval=600, **FAST):
                assert await until(lambda: len(stops) == 1, 10)
            await state(s, JobState.DUE, 2)  # retried (after 0.5 s at least): not begun
            await client_of(s).flushall()
        async with pg_scheduler(private_redis.url, pg_url, ns, **opts) as s:
            assert await s.get("own") is None
            assert (await s.reconcile()).restored == 1
            info = await state(s, JobState.DUE, 2)
            assert info.timeout_ms == 400
            async with running_worker(s, reg, reconcile_interval=600, **FAST):
                info = await state(s, JobState.DEAD, 3)
            assert "timeout" in info.last_error and info.timeout_ms == 400
        assert [a for a, _ in stops] == [1, 2, 3]
        assert all(0.4 <= took < 5.0 for _, took in stops)  # never early

    run(main())
