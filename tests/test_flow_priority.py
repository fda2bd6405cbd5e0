"""Priorities (issue 35): among the jobs that are due, a higher priority is claimed
first; never before its due; a job late by more than the claim's aging goes before
any priority (the starvation bound). The index ({ns:s}:prio) follows a job through
retry, reap, release, recurrence, reschedule, pause, dead letters and reconcile.
On a real redis-server and a real Redis Cluster (PostgreSQL for the reconcile)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from tests.durable_support import (
    check_shard,
    client_of,
    open_scheduler,
    push_clock,
    run,
    snapshot,
    unique_ns,
)
from tests.pg_support import migrated, pg_scheduler
from tickwheel.durable import (
    MAX_PRIORITY,
    PRIORITY_AGING,
    JobSpec,
    Scheduler,
    SyncScheduler,
    TaskRegistry,
    Worker,
)
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis


async def _claim_ids(s: Scheduler, limit: int, **kwargs: Any) -> list[str]:
    batch = await s.claim(0, limit=limit, **kwargs)
    assert all(j.due_ms <= batch.now_ms for j in batch.jobs)  # never early
    return [j.id for j in batch.jobs]


async def _indexed(s: Scheduler) -> dict[str, int]:
    """The prio index: id -> the priority its score says."""
    raw = await client_of(s).zrange(s.keys.shard(0).prio, 0, -1, withscores=True)
    return {m.decode(): MAX_PRIORITY - int(score) // 2**49 for m, score in raw}


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (MAX_PRIORITY + 1, ValueError), (10**6, ValueError),
     (True, TypeError), (1.0, TypeError), (math.nan, TypeError), ("3", TypeError),
     (None, TypeError)],
)  # fmt: skip
def test_a_bad_priority_is_refused_naming_it_and_nothing_is_written(
    redis_server: RedisServer, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="priority"):
        JobSpec("j", "t", priority=value)  # type: ignore[arg-type]

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.open()
            before = await snapshot(s)
            with pytest.raises(error, match="priority"):
                await s.schedule("j", "t", priority=value)  # type: ignore[arg-type]
            with pytest.raises(error, match="priority"):
                await s.schedule("j", "t", every=5, priority=value)  # type: ignore[arg-type]
            assert await snapshot(s) == before

    run(main())
    sync = SyncScheduler.from_url(redis_server.url, "bad-priority", shards=1)
    try:
        with pytest.raises(error, match="priority"):
            sync.schedule("j", "t", priority=value)  # type: ignore[arg-type]
    finally:
        sync.close()


def test_due_higher_priorities_are_claimed_before_a_low_backlog(redis_url: str) -> None:
    """200 low-priority jobs due, then 10 each at 9, 5 and 1: the claims take 9, then
    5, then 1, each level in due order, then the backlog in due order; a priority-9 job
    due later is not claimed before its due."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            now = await s.now(0)
            await s.schedule_many(JobSpec(f"low{i:03}", "t", at=now - 1000 + i) for i in range(200))
            specs = [
                JobSpec(f"p{p}-{i}", "t", at=now - i, priority=p)
                for p in (1, 5, 9)
                for i in range(10)
            ]
            await s.schedule_many(specs)
            await s.schedule("later", "t", delay=30, priority=9)
            first = await _claim_ids(s, 25)
            assert first == (
                [f"p9-{i}" for i in reversed(range(10))]
                + [f"p5-{i}" for i in reversed(range(10))]
                + [f"p1-{i}" for i in reversed(range(5, 10))]
            )
            second = await _claim_ids(s, 25)
            assert second == [f"p1-{i}" for i in reversed(range(5))] + [
                f"low{i:03}" for i in range(20)
            ]
            assert await _indexed(s) == {"later": 9}  # only the one not due yet
            await check_shard(s, 0)
            rest = await _claim_ids(s, 1000)
            assert rest == [f"low{i:03}" for i in range(20, 200)]
            await push_clock(s, 0, 30_000)
            assert await _claim_ids(s, 10) == ["later"]
            assert await client_of(s).exists(s.keys.shard(0).prio) == 0

    run(main())


def test_aging_puts_a_late_job_before_any_priority(redis_url: str) -> None:
    """A job late by the claim's aging or more goes before any priority, oldest first;
    with no aging (None) it waits behind them; the default aging is PRIORITY_AGING."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            now = await s.now(0)
            await s.schedule("old", "t", at=now - 3000)
            await s.schedule_many(JobSpec(f"hi{i}", "t", priority=3) for i in range(5))
            assert await _claim_ids(s, 1, priority_aging=None) == ["hi0"]
            assert await _claim_ids(s, 1) == ["hi1"]  # 3 s late: within the default
            assert await _claim_ids(s, 1, priority_aging=2.5) == ["old"]
            await s.schedule("late", "t")
            await push_clock(s, 0, int(PRIORITY_AGING * 1000) - 1000)
            await s.schedule("hi5", "t", priority=3)
            assert await _claim_ids(s, 1) == ["hi2"]  # 59 s late: not aged yet
            await push_clock(s, 0, 1000)
            # 60 s late: hi3, hi4 and late, oldest first; then hi5 by its priority.
            assert await _claim_ids(s, 10) == ["hi3", "hi4", "late", "hi5"]
            await check_shard(s, 0)

    run(main())


def test_a_low_priority_waits_at_most_the_aging_under_a_sustained_high_backlog(
    redis_url: str,
) -> None:
    """Each second more priority-5 jobs come due than one claim takes; a priority-0 job
    is claimed by the first claim once it is late by the aging (2 s here), not before."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("low", "t")
            due = (await s.get("low")).when_ms  # type: ignore[union-attr]
            await s.schedule_many(JobSpec(f"hi-{i}", "t", priority=5) for i in range(8))
            for second in range(10):
                batch = await s.claim(0, limit=5, priority_aging=timedelta(seconds=2))
                ids = [j.id for j in batch.jobs]
                late = batch.now_ms - due
                if "low" in ids:
                    assert 2000 <= late < 3000, late  # the first claim past the bound
                    break
                assert late < 2000, (late, ids)
                await s.schedule_many(JobSpec(f"hi{second}-{i}", "t", priority=5) for i in range(8))
                await push_clock(s, 0, 1000)
            else:
                raise AssertionError("the low-priority job starved")

    run(main())


def test_the_priority_follows_a_job_through_every_way_back_to_due(redis_url: str) -> None:
    """retry, reap, release, defer, a recurring job's next occurrence, reschedule,
    pause and resume, a dead letter requeued: each comes back indexed, claimed before
    a low backlog; cancel and a replace at priority 0 drop the entry."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule_many(JobSpec(f"low{i:02}", "t", delay=0) for i in range(50))
            await s.schedule("hi", "t", priority=7, max_attempts=3)
            await s.schedule("rec", "t", every=1, priority=4)
            info = await s.get("hi")
            assert info is not None and info.priority == 7
            assert await _indexed(s) == {"hi": 7, "rec": 4}

            async def take_first(expected: list[str]) -> Any:
                # No aging: the clock jumps below would make every job late.
                batch = await s.claim(0, limit=len(expected), priority_aging=None)
                assert [j.id for j in batch.jobs] == expected
                return batch.jobs

            (hi,) = await take_first(["hi"])
            await s.retry(hi, "boom", delay=0)  # attempt 2, back now
            (hi,) = await take_first(["hi"])
            await s.release([hi])
            (hi,) = await take_first(["hi"])
            await push_clock(s, 0, 10 * 60_000)  # its lease expires: the reaper's turn
            await s.reap(0)
            hi, rec = await take_first(["hi", "rec"])  # 7, then the recurring 4, then 0
            await s.ack(rec)  # its next occurrence, indexed at 4
            await s.retry(hi, "boom", delay=0)  # its last attempt: dead
            assert (await s.get("hi")).state.name == "DEAD"  # type: ignore[union-attr]
            assert await s.requeue_dead(["hi"]) == ["hi"]
            assert await _indexed(s) == {"hi": 7, "rec": 4}
            await s.pause("t")
            assert (await s.claim(0, limit=100)).parked > 50
            await s.resume("t")
            assert await _indexed(s) == {"hi": 7, "rec": 4}
            await s.reschedule("hi", delay=3600)
            await push_clock(s, 0, 2000)
            assert [j.id for j in await take_first(["rec", "low00"])] == ["rec", "low00"]
            await s.schedule("hi", "t", replace=True)  # priority 0 now: entry dropped
            await s.schedule("gone", "t", priority=2)
            await s.cancel("gone")
            assert await _indexed(s) == {}
            await check_shard(s, 0)

    run(main())


def test_a_debounced_job_keeps_its_priority(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.take(0)
            await s.schedule("d", "t", debounce=0.001, priority=2)
            await s.schedule("d", "t", debounce=0.001, priority=3)
            assert await _indexed(s) == {"d": 3}
            await s.schedule("d", "t", debounce=0.001)
            assert await _indexed(s) == {}

    run(main())


def test_a_task_handle_spec_takes_timeout_and_priority(redis_server: RedisServer) -> None:
    registry = TaskRegistry()

    @registry.task(name="h")
    async def h(payload: bytes) -> None:
        pass

    spec = h.spec(b"x", id="j", timeout=2.5, priority=4)
    assert (spec.timeout_ms, spec.priority) == (2500, 4)
    with pytest.raises(ValueError, match="priority"):
        h.spec(b"x", id="j", priority=-1)

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.schedule_many([spec])
            info = await s.get("j")
            assert info is not None and (info.timeout_ms, info.priority) == (2500, 4)
            await h.schedule(b"y", id="k", scheduler=s, priority=6)
            assert (await s.get("k")).priority == 6  # type: ignore[union-attr]

    run(main())


def test_reconcile_restores_the_priority_index(private_redis: RedisServer, pg_url: str) -> None:
    """Postgres mode: the priority rides in the stored record; after FLUSHALL, the
    reconcile indexes it again and the claim takes the high job first."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule_many([JobSpec(f"low{i}", "t", delay=0) for i in range(10)])
            await s.schedule("hi", "t", priority=8)
            await s.relay()
            await client_of(s).flushall()
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            assert (await s.reconcile()).restored == 11
            assert (await s.get("hi")).priority == 8  # type: ignore[union-attr]
            await s.take(0)
            batch = await s.claim(0, limit=2)
            assert [j.id for j in batch.jobs][:1] == ["hi"]
            await s.ack_many(batch.jobs)

    run(main())


def test_the_cli_and_the_sync_scheduler_take_a_priority(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tickwheel.durable.ops.cli import main as cli_main

    ns = unique_ns()
    o = ["--redis-url", redis_server.url, "--namespace", ns, "--shards", "1", "--json"]
    assert cli_main(["schedule", "c", "t", "--priority", "6", *o]) == 0
    capsys.readouterr()
    assert cli_main(["inspect", "--job", "c", *o]) == 0
    assert json.loads(capsys.readouterr().out)["priority"] == 6
    for bad in ("10", "-1", "x"):
        assert cli_main(["schedule", "d", "t", "--priority", bad, *o]) == 2
        assert "--priority" in capsys.readouterr().err
    sync = SyncScheduler.from_url(redis_server.url, ns, shards=1)
    try:
        assert sync.schedule("s", "t", priority=9).status.name == "CREATED"
        info = sync.get("s")
        assert info is not None and info.priority == 9 and sync.get("d") is None
    finally:
        sync.close()


def test_the_dashboard_shows_a_jobs_priority(redis_server: RedisServer) -> None:
    from tests.dashboard_support import api_client

    ns = unique_ns()

    async def main() -> None:
        async with open_scheduler(redis_server.url, ns, shards=1) as s:
            await s.schedule("p", "t", delay=600, priority=7)
            await s.schedule("z", "t", delay=600)

    run(main())
    with api_client(redis_server.url, ns) as client:
        assert client.get("/api/job", params={"id": "p"}).json()["job"]["priority"] == 7
        assert 'id="job-priority">7<' in client.get("/job", params={"id": "p"}).text
        assert client.get("/api/job", params={"id": "z"}).json()["job"]["priority"] == 0
        assert "job-priority" not in client.get("/job", params={"id": "z"}).text


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("5", TypeError)],
)
def test_a_bad_priority_aging_is_refused_naming_it(
    redis_server: RedisServer, value: object, error: type[Exception]
) -> None:
    registry = TaskRegistry()

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            with pytest.raises(error, match="priority_aging"):
                Worker(s, registry, priority_aging=value)  # type: ignore[arg-type]
            await s.take(0)
            with pytest.raises(error, match="priority_aging"):
                await s.claim(0, priority_aging=value)  # type: ignore[arg-type]

    run(main())
