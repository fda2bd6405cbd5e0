"""Defer (issue 35): a handler hands its job back for later without spending an
attempt. On a real redis-server (and a Redis Cluster where parametrized)."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import Defer, JobState, LeaseLost, TaskContext, TaskRegistry
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis

FAST = {"lease": 5.0, "lookahead": 0.1, "poll_interval": 0.05, "reap_interval": 0.2}


async def _claim_one(s: Any) -> Any:
    """The one job of shard 0, claimed once it is due by the shard's clock (a loaded
    machine can put a job due "now" a few ms past the next claim's clock); never early."""
    for _ in range(500):
        batch = await s.claim(0, limit=10)
        assert all(j.due_ms <= batch.now_ms for j in batch.jobs)
        if batch.jobs:
            [job] = batch.jobs
            return job
        await asyncio.sleep(0.01)
    raise AssertionError("the job was not claimed within 5 s of its due")


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (math.nan, ValueError), (math.inf, ValueError),
     (10**9, ValueError), (timedelta(0), ValueError), ("1", TypeError)],
)  # fmt: skip
def test_a_bad_defer_is_refused_naming_seconds(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="seconds"):
        Defer(bad)


def test_defer_keeps_the_attempt_and_the_occurrence_and_fences(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("j", "t", {"n": 1}, max_attempts=1)
            await s.take(0)
            [job] = (await s.claim(0, limit=10)).jobs
            assert job.attempt == 1
            now = await s.now()
            when = await s.leases.defer(job, 0.3)
            assert when >= now + 300
            info = await s.get("j")
            assert info is not None and info.state is JobState.DUE
            assert info.attempt == 1 and info.last_error == ""
            with pytest.raises(LeaseLost):  # the same deferral again: lease gone, no write
                await s.leases.defer(job, 0.3)
            assert (await s.claim(0, limit=10)).jobs == []  # not early
            await asyncio.sleep(0.35)
            [again] = (await s.claim(0, limit=10)).jobs
            assert again.attempt == 1 and again.due_ms == when
            await s.ack_many([again])
            assert await s.get("j") is None

    run(main())


def test_a_worker_runs_a_deferred_job_again_without_spending_attempts(redis_url: str) -> None:
    async def main() -> None:
        runs: list[tuple[int, float]] = []
        reg = TaskRegistry()

        @reg.task(name="busy")
        async def busy(ctx: TaskContext) -> None:
            runs.append((ctx.attempt, time.monotonic()))
            if len(runs) < 3:
                raise Defer(0.2)

        async with (
            open_scheduler(redis_url, shards=2) as s,
            running_worker(s, reg, **FAST) as w,
        ):
            await s.schedule("b", "busy", max_attempts=1)
            assert await until(lambda: len(runs) == 3, 10)
            assert [a for a, _ in runs] == [1, 1, 1]
            gaps = [b - a for (_, a), (_, b) in itertools.pairwise(runs)]
            assert all(g >= 0.19 for g in gaps), gaps  # never early (ms rounding aside)
            assert await until(lambda: w.loader is not None and w.loader.stats.succeeded == 1, 10)
            assert w.loader is not None
            assert w.loader.stats.deferred == 2
            assert w.loader.stats.retried == 0 and w.loader.stats.dead == 0

    run(main())


def test_a_recurring_job_defers_this_occurrence_only(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            # A short grace: a deferral longer than it must not read as a missed run.
            await s.schedule("r", "t", every=60, delay=0, missed="skip", misfire_grace=0.05)
            await s.take(0)
            job = await _claim_one(s)
            nominal = job.nominal_ms
            await s.leases.defer(job, 0.3)
            await asyncio.sleep(0.35)
            again = await _claim_one(s)
            assert again.nominal_ms == nominal and again.attempt == 1
            await s.ack_many([again])
            info = await s.get("r")
            assert info is not None and info.state is JobState.DUE
            assert info.nominal_ms == nominal + 60_000  # the series did not move

    run(main())


def test_the_postgres_mode_records_a_deferral_and_refuses_debounce(
    redis_server: RedisServer, pg_url: str
) -> None:
    """A Defer is recorded in PostgreSQL as a retry at the same attempt (reconcile would
    bring it back at its deferred time); debounce and throttle are refused there."""
    from tests.durable_support import snapshot
    from tests.pg_support import migrated, pg_scheduler, rows, table_counts

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("f", "t", b"x", delay=0, max_attempts=4)
            await s.take(0)
            [job] = (await s.claim(0, limit=10)).jobs
            when = await s.leases.defer(job, 60)
            (row,) = await rows(
                pg_url,
                "SELECT attempt, run_ms, due_ms FROM tickwheel_jobs WHERE ns = $1 AND id = 'f'",
                ns,
            )
            assert tuple(row) == (1, when, job.nominal_ms)
            # The outbox row of "f" is deleted behind the calls (_pg_store.relayed_later):
            # let that finish so the counts below see only what the refused calls write.
            await s.pg.behind.settled()  # type: ignore[union-attr]
            for _ in range(500):
                if s.pg.store._forgetting is None:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.01)
            before, counts = await snapshot(s), await table_counts(pg_url)
            for flow in ({"debounce": 5}, {"throttle": 5}):
                with pytest.raises(ValueError, match="Postgres"):
                    await s.schedule("g", "t", **flow)
            assert await snapshot(s) == before and await table_counts(pg_url) == counts

    run(main())


def test_process_hands_a_deferred_job_back(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("p", "t", max_attempts=1)
            await s.take(0)

            async def handler(job: Any) -> None:
                raise Defer(30)

            assert await s.leases.process(handler) == 1
            info = await s.get("p")
            assert info is not None and info.state is JobState.DUE and info.attempt == 1
            assert info.when_ms >= await s.now() + 29_000

    run(main())
