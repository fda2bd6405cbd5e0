"""The loader inside a worker, on one process: durable timers fire at Redis's due time
(never early), run their task with the idempotency key, and are acked, retried, killed,
extended or handed back as they should."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import os
from typing import Any

import pytest

from tests.durable_support import check_all, client_of, open_scheduler, run
from tests.spill_support import (
    SINK_ENV,
    redis_ms,
    running_worker,
    sink,
    sink_report,
    until,
    wait_effects,
)
from tickwheel.durable import (
    JobSpec,
    JobState,
    Loader,
    Scheduler,
    TaskContext,
    TaskRegistry,
    Timers,
)
from tickwheel.durable.model import split_error
from tickwheel.durable.store._connect import client_from_url
from tickwheel.wheel import TimingWheel

pytestmark = pytest.mark.redis

# Loose bound on lateness (ms) by Redis's clock: a loop tick, a round trip, and a stall
# of a busy 2-core CI box (the wheel's real-clock test allows the same 2 s).
LATE_BOUND_MS = 2000
FAST: dict[str, Any] = {"lookahead": 0.3, "poll_interval": 0.02, "reap_interval": 0.05}


@pytest.fixture
def sink_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SINK_ENV, redis_url)
    return redis_url


def _sink_registry() -> TaskRegistry:
    reg = TaskRegistry()
    reg.register(sink, name="sink")
    return reg


def test_durable_timers_fire_on_time_never_early_and_are_acked(sink_env: str) -> None:
    async def main() -> None:
        async with open_scheduler(sink_env, shards=2, owner_ttl=1.0) as s:
            prefix = s.keys.namespace
            timers = Timers(s, _sink_registry(), threshold=0.5)
            ids = [
                await timers.schedule(0.6 + i * 0.01, "sink", {"sink": prefix}) for i in range(40)
            ] + [await timers.schedule(0.1, "sink", {"sink": prefix}, durable=True)]
            assert len(timers) == 0  # all went to Redis
            async with running_worker(s, _sink_registry(), **FAST) as w:
                client = client_of(s)
                assert await until(lambda: w.loader is not None, 2)
                await wait_effects(client, prefix, len(ids), 3.0)
                report = await sink_report(client, prefix, ids)
                assert w.loader is not None
                stats = w.loader.stats
            assert report["effects"] == len(ids)
            assert set(report["calls"].values()) == {1}
            late = report["late"]
            assert min(late) >= 0, sorted(late)[:5]  # never early by Redis's clock
            assert max(late) < LATE_BOUND_MS, sorted(late)[-5:]
            assert stats.succeeded == len(ids) and stats.fenced == stats.expired == 0
            assert await check_all(s) == {}  # acked: no job left in any state

    run(main())


def test_handler_gets_id_nominal_attempt_and_epoch(sink_env: str) -> None:
    async def main() -> None:
        seen: list[TaskContext] = []
        reg = TaskRegistry()

        @reg.task(name="look")
        def look(ctx: TaskContext) -> None:  # a plain function works too
            seen.append(ctx)

        async with open_scheduler(sink_env, shards=2, owner_ttl=1.0) as s:
            await s.schedule("ctx-job", "look", {"k": "v"}, delay=0.2)
            info = await s.get("ctx-job")
            assert info is not None
            async with running_worker(s, reg, **FAST) as w:
                assert await until(lambda: bool(seen), 3)
                epoch = w.ownership.owned[s.keys.shard_of("ctx-job")]
        (ctx,) = seen
        assert ctx.job_id == "ctx-job" and ctx.task == "look" and ctx.payload == {"k": "v"}
        assert ctx.nominal_ms == info.nominal_ms == info.when_ms
        assert (ctx.attempt, ctx.epoch, ctx.durable) == (1, epoch, True)
        assert ctx.key == ("ctx-job", info.nominal_ms)

    run(main())


def test_failure_is_retried_and_succeeds_on_the_second_attempt(sink_env: str) -> None:
    async def main() -> None:
        attempts: list[tuple[int, str]] = []
        reg = TaskRegistry()

        @reg.task(name="flaky")
        async def flaky(ctx: TaskContext) -> None:
            assert ctx.job is not None
            attempts.append((ctx.attempt, ctx.job.last_error))
            if ctx.attempt == 1:
                raise RuntimeError("downstream 503")

        async with open_scheduler(sink_env, shards=2, owner_ttl=1.0, retry_base=0.1) as s:
            await s.schedule("flaky-job", "flaky", delay=0.1)
            async with running_worker(s, reg, **FAST) as w:
                assert await until(lambda: len(attempts) == 2, 5)
                assert w.loader is not None
                assert await until(lambda: w.loader is not None and w.loader.stats.succeeded, 2)
                stats = w.loader.stats
            (first, none), (second, kept) = attempts
            assert (first, none, second) == (1, "", 2)
            summary, trace = split_error(kept)  # the traceback is kept with the error
            assert summary == "RuntimeError('downstream 503')"
            assert trace.startswith("Traceback (most recent call last):\n")
            assert "in flaky" in trace and trace.endswith("RuntimeError: downstream 503")
            assert (stats.retried, stats.succeeded, stats.dead) == (1, 1, 0)
            assert await s.get("flaky-job") is None  # done

    run(main())


def test_plain_functions_run_at_their_firing_each_in_a_context_of_its_own(
    redis_url: str,
) -> None:
    """A plain (not async) task function runs in the wheel's callback that fires its
    job, not in a task made for it; like a task, it gets a copy of the context, so a
    context variable it sets is not seen by the next job."""
    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("var", default=None)
    seen: list[tuple[str | None, asyncio.Task[Any] | None]] = []
    reg = TaskRegistry()

    @reg.task(name="plain")
    def plain(ctx: TaskContext) -> None:
        seen.append((var.get(), asyncio.current_task()))
        var.set(ctx.job_id)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=2.0) as s:
            ids = [f"p{i}" for i in range(20)]
            for job_id in ids:
                await s.schedule(job_id, "plain", delay=0.05)
            async with running_worker(s, reg, **FAST) as w:
                assert await until(lambda: len(seen) == len(ids), 5)
                assert await until(lambda: w.loader is not None and w.loader.running == 0, 5)
                assert w.loader is not None
                stats = w.loader.stats
            assert seen == [(None, None)] * len(ids)
            assert (stats.fired, stats.succeeded, stats.errors) == (len(ids), len(ids), 0)
            assert await check_all(s) == {}  # acked: no job left in any state

    run(main())


def test_a_plain_function_that_raises_is_retried_and_an_awaitable_it_returns_is_awaited(
    redis_url: str,
) -> None:
    attempts: list[tuple[str, int]] = []
    finished: list[str] = []
    reg = TaskRegistry()

    @reg.task(name="flaky")
    def flaky(ctx: TaskContext) -> None:
        attempts.append((ctx.job_id, ctx.attempt))
        if ctx.attempt == 1:
            raise RuntimeError("downstream 503")

    async def later(ctx: TaskContext) -> None:
        await asyncio.sleep(0.01)
        finished.append(ctx.job_id)

    @reg.task(name="deferring")
    def deferring(ctx: TaskContext) -> Any:
        return later(ctx)  # not a coroutine function, but what it returns is awaitable

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=2.0, retry_base=0.1) as s:
            await s.schedule("flaky-job", "flaky", delay=0.05)
            await s.schedule("deferring-job", "deferring", delay=0.05)
            async with running_worker(s, reg, **FAST) as w:
                assert await until(
                    lambda: w.loader is not None and w.loader.stats.succeeded == 2, 5
                )
                assert w.loader is not None
                stats = w.loader.stats
            assert attempts == [("flaky-job", 1), ("flaky-job", 2)]
            assert finished == ["deferring-job"]
            assert (stats.retried, stats.succeeded, stats.dead, stats.errors) == (1, 2, 0, 0)
            assert await check_all(s) == {}

    run(main())


@dataclasses.dataclass
class _Plain:
    """A callable dataclass: not hashable (it defines __eq__), and not a function."""

    calls: list[str]

    def __call__(self, ctx: TaskContext) -> None:
        self.calls.append(ctx.job_id)


@dataclasses.dataclass
class _Async:
    calls: list[str]

    async def __call__(self, ctx: TaskContext) -> None:
        await asyncio.sleep(0)
        self.calls.append(ctx.job_id)


def test_callable_objects_run_as_tasks_whether_hashable_or_not(redis_url: str) -> None:
    """Any callable registers: an unhashable object whose __call__ is plain runs at its
    firing, one whose __call__ is async (not a coroutine function itself) is awaited."""
    plain, awaited = _Plain([]), _Async([])
    reg = TaskRegistry()
    reg.register(plain, name="plain")
    reg.register(awaited, name="awaited")

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=2.0) as s:
            for i in range(3):
                await s.schedule(f"p{i}", "plain", delay=0.05)
                await s.schedule(f"a{i}", "awaited", delay=0.05)
            async with running_worker(s, reg, **FAST) as w:
                done = until(lambda: w.loader is not None and w.loader.stats.succeeded == 6, 5)
                assert await done
                assert w.loader is not None
                stats = w.loader.stats
            assert sorted(plain.calls) == ["p0", "p1", "p2"]
            assert sorted(awaited.calls) == ["a0", "a1", "a2"]
            assert (stats.errors, stats.retried) == (0, 0)
            assert await check_all(s) == {}

    run(main())


def test_what_a_plain_wrapper_sets_in_the_context_reaches_the_awaitable_it_returns(
    redis_url: str,
) -> None:
    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")
    seen: list[str] = []
    reg = TaskRegistry()

    async def body(ctx: TaskContext) -> None:
        await asyncio.sleep(0)
        seen.append(request.get())

    @reg.task(name="wrapped")
    def wrapped(ctx: TaskContext) -> Any:  # a plain decorator-style wrapper
        request.set(f"req-{ctx.job_id}")
        return body(ctx)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=2.0) as s:
            await s.schedule("w", "wrapped", delay=0.05)
            async with running_worker(s, reg, **FAST) as w:
                assert await until(lambda: w.loader is not None and w.loader.stats.succeeded, 5)
            assert seen == ["req-w"]

    run(main())


def test_a_plain_function_raising_cancelled_does_not_stop_the_job_that_freed_its_slot(
    redis_url: str,
) -> None:
    """With one slot, a plain function waiting for it runs inside the task of the job
    that frees it. Raising CancelledError (its own, not the loader's) must cost only its
    own job, left leased for the reaper; the other job is still acked."""
    order: list[str] = []
    reg = TaskRegistry()

    @reg.task(name="first")
    async def first(ctx: TaskContext) -> None:
        await asyncio.sleep(0.05)
        order.append("first")

    @reg.task(name="second")
    def second(ctx: TaskContext) -> None:
        order.append("second")
        raise asyncio.CancelledError

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=5.0) as s:
            await s.take(0)
            base = await s.now(0)
            await s.schedule("a", "first", at=base + 100)
            await s.schedule("b", "second", at=base + 101)
            loader = Loader(s, reg, TimingWheel(), lookahead=0.5, poll_interval=0.02, max_running=1)
            task = asyncio.ensure_future(loader.run())
            assert await until(lambda: len(order) == 2 and loader.running == 0, 5)
            loader.stop_claiming()
            await task
            assert order == ["first", "second"]
            assert loader.stats.succeeded == 1
            assert await check_all(s) == {"b": JobState.LEASED}  # "a" acked
            await s.close()

    run(main())


def test_drain_still_acks_a_handler_that_returns_at_the_grace_deadline(redis_url: str) -> None:
    """A handler still running when the grace runs out is cancelled; one that catches
    the cancellation and returns did run, so its ack is written (the acks get their own
    grace), and it does not run again after its lease."""
    started = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="stubborn")
    async def stubborn(ctx: TaskContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return  # wraps up and returns instead (on purpose here)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=5.0) as s:
            await s.take(0)
            await s.schedule("j", "stubborn")
            loader = Loader(s, reg, TimingWheel(), lookahead=0.0, poll_interval=0.02)
            task = asyncio.ensure_future(loader.run())
            await asyncio.wait_for(started.wait(), 10)
            loader.stop_claiming()
            assert await loader.drain(0.05) == 1  # the task, cancelled at the deadline
            assert loader.running == 0
            assert loader.stats.succeeded == 1
            assert await check_all(s) == {}
            await task
            await s.close()

    run(main())


def test_drain_waits_for_the_acks_of_jobs_whose_handlers_returned(redis_url: str) -> None:
    """A handler's ack goes out after it returns, batched with others: draining waits
    for it too, so a worker that stops right after its last job ran leaves nothing
    leased (the job would run again after its lease)."""
    count = 50
    ran: list[str] = []
    all_ran = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="quick")
    def quick(ctx: TaskContext) -> None:
        ran.append(ctx.job_id)
        if len(ran) == count:
            all_ran.set()

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, owner_ttl=5.0) as s:
            await s.take(0)
            await s.schedule_many(JobSpec(f"q{i}", "quick") for i in range(count))
            loader = Loader(s, reg, TimingWheel(), lookahead=0.0, poll_interval=0.02)
            task = asyncio.ensure_future(loader.run())
            await asyncio.wait_for(all_ran.wait(), 10)
            loader.stop_claiming()
            assert await loader.drain(10.0) == 0  # at once: the last acks are in flight
            assert loader.running == 0
            assert loader.stats.succeeded == count
            assert await check_all(s) == {}
            await task
            await s.close()

    run(main())


def test_unknown_task_goes_dead_with_the_reason(sink_env: str) -> None:
    async def main() -> None:
        async with open_scheduler(sink_env, shards=2, owner_ttl=1.0) as s:
            # Five attempts allowed, but no retry can mend a missing task: dead at once.
            await s.schedule("lost", "not.registered", delay=0.05, max_attempts=5)
            async with running_worker(s, _sink_registry(), **FAST) as w:
                assert await until(lambda: w.loader is not None and w.loader.stats.dead, 3)
                assert w.loader is not None and w.loader.stats.unknown == 1
            info = await s.get("lost")
            assert info is not None and info.state is JobState.DEAD
            assert info.attempt == 1
            assert info.last_error == "unknown task 'not.registered'"
            page = await s.dead_letters(s.keys.shard_of("lost"))
            assert [(j.id, j.last_error) for j in page.jobs] == [
                ("lost", "unknown task 'not.registered'")
            ]

    run(main())


def test_long_task_gets_its_lease_extended_and_runs_once(sink_env: str) -> None:
    async def main() -> None:
        runs: list[int] = []
        reg = TaskRegistry()

        @reg.task(name="slow")
        async def slow(ctx: TaskContext) -> None:
            runs.append(ctx.attempt)
            await asyncio.sleep(1.2)  # three leases of 0.4 s

        async with open_scheduler(sink_env, shards=1, owner_ttl=1.0) as s:
            await s.schedule("slow-job", "slow", delay=0.05)
            async with running_worker(s, reg, lease=0.4, **FAST) as w:
                assert await until(lambda: w.loader is not None and w.loader.stats.succeeded, 4)
                assert w.loader is not None
                stats = w.loader.stats
            # Without the extensions the reaper (every 50 ms) would have handed it out
            # again after 0.7 s (lookahead + lease).
            assert runs == [1]
            assert stats.extended >= 2 and stats.lease_lost == 0
            assert await s.get("slow-job") is None

    run(main())


def test_graceful_stop_hands_back_loaded_jobs_and_another_worker_fires_them(
    sink_env: str,
) -> None:
    async def main() -> None:
        async with open_scheduler(sink_env, shards=2, owner_ttl=1.0) as s:
            prefix = s.keys.namespace
            ids = [f"h{i}" for i in range(20)]
            for job_id in ids:
                await s.schedule(job_id, "sink", {"sink": prefix}, delay=1.2)
            # A: claims everything 1.5 s ahead, then stops before any of it is due.
            async with running_worker(s, _sink_registry(), **{**FAST, "lookahead": 1.5}) as a:
                assert await until(lambda: a.loader is not None and a.loader.loaded == 20, 3)
            assert a.loader is not None and a.loader.stats.released == 20
            assert a.loader.stats.fired == 0 and a.ownership.owned == {}
            states = await check_all(s)
            assert states == dict.fromkeys(ids, JobState.DUE)  # at once, not after the lease
            for job_id in ids:
                info = await s.get(job_id)
                assert info is not None and info.attempt == 1
            # B (a fresh scheduler, as another process) fires them at their due time.
            client = client_from_url(sink_env)
            b_sched = Scheduler(client, prefix, shards=2, owner_ttl=1.0, check=False)
            try:
                async with running_worker(b_sched, _sink_registry(), **FAST):
                    await wait_effects(client, prefix, 20, 3.0)
                report = await sink_report(client, prefix, ids)
            finally:
                await client.aclose()
            assert report["effects"] == 20 and set(report["calls"].values()) == {1}
            assert report["by"] == {job_id: {os.getpid()} for job_id in ids}
            assert min(report["late"]) >= 0 and max(report["late"]) < LATE_BOUND_MS
            assert await check_all(s) == {}

    run(main())


def test_redis_ms_reads_time() -> None:
    assert redis_ms((b"1", b"500")) == 1000.5


def test_max_running_bounds_concurrency_and_keeps_due_order(sink_env: str) -> None:
    async def main() -> None:
        order: list[str] = []
        active = 0
        peak = 0
        reg = TaskRegistry()

        @reg.task(name="busy")
        async def busy(ctx: TaskContext) -> None:
            nonlocal active, peak
            order.append(ctx.job_id)
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.05)
            active -= 1

        async with open_scheduler(sink_env, shards=1, owner_ttl=1.0) as s:
            ids = [f"b{i:02d}" for i in range(12)]
            for i, job_id in enumerate(ids):
                await s.schedule(job_id, "busy", delay=0.2 + i * 0.001)
            async with running_worker(s, reg, max_running=3, **FAST) as w:
                assert await until(
                    lambda: w.loader is not None and w.loader.stats.succeeded == 12, 4
                )
            assert peak == 3 and order == ids
            assert await check_all(s) == {}

    run(main())
