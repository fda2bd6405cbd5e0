"""Running jobs under control (issue 34): execution timeouts (async, and plain functions
in the thread pool), cancelling a running job, and the drain deadline at shutdown. On a
real redis-server; real-clock checks assert "never early" and generous upper bounds."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run
from tests.spill_support import running_worker, until
from tickwheel.durable import CancelResult, JobState, TaskContext, TaskRegistry, Worker
from tickwheel.durable.runtime import Loader

pytestmark = pytest.mark.redis

# Short leases and rounds keep these tests quick; retry backoff 0.4-0.8 s then capped.
FAST = {"lease": 2.0, "lookahead": 0.2, "poll_interval": 0.05, "reap_interval": 0.2}
SCHED = {"shards": 2, "retry_base": 0.8, "retry_max": 0.8}


@pytest.mark.parametrize("bad", [-1, 0, math.nan, math.inf, -math.inf])
def test_bad_timeouts_are_refused_naming_timeout(bad: float) -> None:
    reg = TaskRegistry()
    with pytest.raises(ValueError, match="timeout"):
        reg.task(timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        reg.register(lambda ctx: None, name="x", timeout=bad)
    assert "x" not in reg


def test_timeout_type_and_thread_checks() -> None:
    reg = TaskRegistry()
    with pytest.raises(TypeError, match="timeout"):
        reg.task(timeout="1")  # type: ignore[arg-type]

    async def coro(ctx: TaskContext) -> None: ...

    with pytest.raises(TypeError, match="thread"):
        reg.register(coro, thread=True)
    reg.register(coro, name="c", timeout=1.5)
    assert reg.options("c").timeout == 1.5
    assert reg.options("unknown").timeout is None


def test_worker_refuses_a_bad_default_timeout(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            for bad in (-1.0, math.nan, math.inf):
                with pytest.raises(ValueError, match="timeout"):
                    Worker(s, TaskRegistry(), default_timeout=bad)

    run(main())


def _hung_registry(thread: bool, starts: list[float], gate: threading.Event) -> TaskRegistry:
    """A registry whose ``hang`` task never returns by itself (timeout=1), and a
    ``quick`` task that records its start (to see the slot freed)."""
    reg = TaskRegistry()
    if thread:

        @reg.task(name="hang", timeout=1, thread=True)
        def hang_sync(ctx: TaskContext) -> None:
            starts.append(time.monotonic())
            gate.wait(30)  # held until the test ends: the thread cannot be stopped

    else:

        @reg.task(name="hang", timeout=1)
        async def hang_async(ctx: TaskContext) -> None:
            starts.append(time.monotonic())
            await asyncio.sleep(3600)

    return reg


@pytest.mark.parametrize("thread", [False, True], ids=["async", "thread"])
def test_hung_handler_times_out_retries_then_dead_letters(redis_url: str, thread: bool) -> None:
    async def main() -> None:
        starts: list[float] = []
        ends: list[float] = []
        gate = threading.Event()
        reg = _hung_registry(thread, starts, gate)

        @reg.task(name="quick")
        async def quick(ctx: TaskContext) -> None:
            ends.append(time.monotonic())

        try:
            async with (
                open_scheduler(redis_url, **SCHED) as s,
                running_worker(s, reg, max_running=1, **FAST) as w,
            ):
                await s.schedule("hung", "hang", max_attempts=2)
                assert await until(lambda: len(starts) == 1, 10)
                await s.schedule("after", "quick")  # waits for the one slot
                assert await until(lambda: len(ends) == 1, 10), "the slot was not freed"
                # Never early: the slot came free only at the timeout.
                assert ends[0] - starts[0] >= 1.0
                assert ends[0] - starts[0] < 6.0
                info: Any = None

                async def dead() -> bool:
                    nonlocal info
                    info = await s.get("hung")
                    return info is not None and info.state is JobState.DEAD

                deadline = time.monotonic() + 15
                while not await dead():
                    assert time.monotonic() < deadline, info
                    await asyncio.sleep(0.05)
                assert len(starts) == 2
                # Retried with a backoff (>= half of retry_base) after the 1 s timeout.
                assert starts[1] - starts[0] >= 1.0 + 0.4
                assert info.attempt == 2
                assert "TaskTimeout" in info.last_error and "timeout" in info.last_error
                assert w.loader is not None
                # Redis shows it dead before the worker's retry call returned and counted.
                assert await until(lambda: w.loader is not None and w.loader.stats.dead == 1, 5)
                st = w.loader.stats
                assert (st.timeouts, st.retried, st.dead, st.succeeded) == (2, 1, 1, 1)
                assert s.stats().timeouts == 2
                # The task that counted the dead letter ends a loop turn or so later.
                assert await until(lambda: w.loader is not None and w.loader.running == 0, 5)
        finally:
            gate.set()

    run(main())


def test_lease_is_not_extended_past_timeout_plus_grace(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that swallows its cancellation runs on; its lease is extended only
    until its timeout plus the grace, then the reaper takes the job."""
    monkeypatch.setattr("tickwheel.durable.runtime._stopping.TIMEOUT_GRACE", 0.5)

    async def main() -> None:
        starts: list[float] = []
        reg = TaskRegistry()

        @reg.task(name="stubborn", timeout=0.5)
        async def stubborn(ctx: TaskContext) -> None:
            starts.append(time.monotonic())
            end = time.monotonic() + 4
            while time.monotonic() < end:  # swallows every cancellation
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.05)

        async with (
            open_scheduler(redis_url, **SCHED) as s,
            running_worker(s, reg, max_running=1, **{**FAST, "lease": 1.0}) as w,
        ):
            await s.schedule("j", "stubborn", max_attempts=5)
            # The reaper hands it out again (attempt 2) while the first still runs; the
            # first's slot was freed at its timeout plus the grace (max_running=1).
            assert await until(lambda: len(starts) >= 2, 10)
            assert starts[1] - starts[0] < 4
            assert w.loader is not None
            assert w.loader.stats.timeouts == 0  # none settled yet: both still run

    run(main())


def test_cancel_results() -> None:
    assert {r.value for r in CancelResult} == {"not_found", "removed", "stopped"}


@pytest.mark.parametrize("method", ["cancel_job", "cancel"])
def test_cancel_stops_a_running_job_within_the_bound(redis_url: str, method: str) -> None:
    async def main() -> None:
        started = asyncio.Event()
        stopped_at: list[float] = []
        reg = TaskRegistry()

        @reg.task(name="long")
        async def long(ctx: TaskContext) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                stopped_at.append(time.monotonic())
                raise

        # A long lease: the lease extension (the fallback path) cannot be what stops it.
        async with (
            open_scheduler(redis_url, **SCHED) as s,
            running_worker(s, reg, **{**FAST, "lease": 30.0}) as w,
        ):
            assert await s.cancel_job("nothing") is CancelResult.NOT_FOUND
            await s.schedule("later", "long", delay=3600)
            assert await s.cancel_job("later") is CancelResult.REMOVED
            await s.schedule("run", "long")
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.wait_for(w.listening.wait(), 10)
            t0 = time.monotonic()
            if method == "cancel":  # the bool API stops a running handler the same way
                assert await s.cancel("run") is True
            else:
                assert await s.cancel_job("run") is CancelResult.STOPPED
            assert await until(lambda: bool(stopped_at), 5)
            took = stopped_at[0] - t0
            assert took < 1.0, took
            await asyncio.sleep(0.3)
            assert w.loader is not None
            st = w.loader.stats
            assert (st.cancelled, st.succeeded, st.retried, st.dead) == (1, 0, 0, 0)
            assert s.stats().acked == 0 and s.stats().ack_lost == 0
            assert await s.get("run") is None
            assert w.loader.running == 0

    run(main())


def test_cancel_racing_completion_leaves_one_outcome(redis_url: str) -> None:
    async def main() -> None:
        ran: dict[str, int] = {}
        finished: set[str] = set()
        reg = TaskRegistry()

        @reg.task(name="short")
        async def short(ctx: TaskContext) -> None:
            ran[ctx.job_id] = ran.get(ctx.job_id, 0) + 1
            await asyncio.sleep(0.01 * (int(ctx.job_id[1:]) % 5))
            finished.add(ctx.job_id)

        n = 40
        async with (
            open_scheduler(redis_url, **SCHED) as s,
            running_worker(s, reg, **FAST) as w,
        ):
            await asyncio.wait_for(w.listening.wait(), 10)
            ids = [f"j{i}" for i in range(n)]
            for job_id in ids:
                await s.schedule(job_id, "short")
            results: dict[str, CancelResult] = {}
            for i, job_id in enumerate(ids):
                await until(lambda job_id=job_id: job_id in ran, 5, 0.001)
                await asyncio.sleep(0.005 * (i % 7))
                results[job_id] = await s.cancel_job(job_id)
            await asyncio.sleep(1.0)
            assert w.loader is not None
            st = w.loader.stats
            # Never retried, never dead, never run twice; nothing left in Redis.
            assert (st.retried, st.dead) == (0, 0)
            assert all(count == 1 for count in ran.values())
            for job_id in ids:
                assert await s.get(job_id) is None
            stopped = [j for j in ids if results[j] is CancelResult.STOPPED]
            # Each job ended one way: acked, or stopped (its handler cut short or its
            # ack found the lease gone), never both.
            assert st.succeeded + st.cancelled + s.stats().ack_lost == n
            assert st.cancelled <= len(stopped)
            assert w.loader.running == 0

    run(main())


def test_drain_deadline_cancels_and_releases_unrun(redis_url: str) -> None:
    async def main() -> None:
        started = asyncio.Event()
        cancelled_at: list[float] = []
        reg = TaskRegistry()

        @reg.task(name="slow")
        async def slow(ctx: TaskContext) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled_at.append(time.monotonic())
                raise

        async with open_scheduler(redis_url, **SCHED) as s:
            worker = Worker(s, reg, drain_timeout=0.5, **FAST)
            task = asyncio.ensure_future(worker.run())
            await s.schedule("d", "slow")
            await asyncio.wait_for(started.wait(), 10)
            t0 = time.monotonic()
            worker.stop()
            await asyncio.wait_for(task, 10)
            assert cancelled_at, "the handler was not cancelled"
            waited = cancelled_at[0] - t0
            assert 0.5 <= waited < 3.0, waited  # never before the drain timeout
            info = await s.get("d")
            assert info is not None
            assert info.state is JobState.DUE and info.attempt == 1  # released, same attempt
            assert worker.loader is not None
            st = worker.loader.stats
            assert st.released >= 1 and (st.retried, st.succeeded) == (0, 0)

    run(main())


def test_loader_takes_a_default_timeout(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            from tickwheel.wheel import TimingWheel

            wheel = TimingWheel()
            with pytest.raises(ValueError, match="timeout"):
                Loader(s, TaskRegistry(), wheel, default_timeout=-1)
            wheel.close()

    run(main())


def test_daemon_pool_runs_calls_and_drops_cancelled_outcomes() -> None:
    from tickwheel.durable.runtime._threads import DaemonPool

    async def main() -> None:
        pool = DaemonPool(2)
        gate = threading.Event()
        assert await pool.submit(lambda x: x * 2, 21) == 42
        with pytest.raises(KeyError):
            await pool.submit({}.__getitem__, "k")
        hung = pool.submit(gate.wait, 30)
        hung.cancel()  # as a timeout does: the thread runs on
        results = await asyncio.gather(*(pool.submit(lambda i=i: i) for i in range(20)))
        assert results == list(range(20))  # the other thread served them all
        threads = [t for t in threading.enumerate() if t.name.startswith("tickwheel-task")]
        assert 1 <= len(threads) <= 2 and all(t.daemon for t in threads)
        gate.set()
        pool.close()
        with pytest.raises(RuntimeError):
            pool.submit(print)

    run(main())


_HUNG_THREAD_SCRIPT = """
import asyncio, sys, threading, time
from tests.durable_support import open_scheduler
from tickwheel.durable import TaskRegistry, Worker

reg = TaskRegistry()
started = threading.Event()

@reg.task(name="hang", timeout=0.5, thread=True)
def hang(ctx):
    started.set()
    time.sleep(120)  # never returns within the test

async def main():
    async with open_scheduler(sys.argv[1], shards=2) as s:
        w = Worker(s, reg, lease=2.0, lookahead=0.2, poll_interval=0.05, drain_timeout=0.2)
        task = asyncio.ensure_future(w.run())
        await s.schedule("h", "hang")
        while not started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.7)  # past its timeout: its slot is free, its thread runs on
        w.stop()
        await task
        print("timeouts", w.loader.stats.timeouts, flush=True)

asyncio.run(main())
"""


def test_a_hung_thread_does_not_keep_the_process_alive(redis_url: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _HUNG_THREAD_SCRIPT, redis_url],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "timeouts 1" in out.stdout, out.stderr
    assert time.monotonic() - t0 < 30  # the thread sleeps 120 s: exit did not wait for it


@pytest.mark.postgres
def test_cancel_stops_a_running_job_in_the_postgres_mode(private_redis: Any, pg_url: str) -> None:
    from tests.pg_support import migrated, pg_scheduler

    async def main() -> None:
        await migrated(pg_url)
        started = asyncio.Event()
        stopped_at: list[float] = []
        reg = TaskRegistry()

        @reg.task(name="long")
        async def long(ctx: TaskContext) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                stopped_at.append(time.monotonic())
                raise

        async with (
            pg_scheduler(private_redis.url, pg_url, shards=1) as s,
            running_worker(s, reg, **{**FAST, "lease": 30.0}) as w,
        ):
            await s.schedule("run", "long")
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.wait_for(w.listening.wait(), 10)
            t0 = time.monotonic()
            assert await s.cancel_job("run") is CancelResult.STOPPED
            assert await until(lambda: bool(stopped_at), 5)
            assert stopped_at[0] - t0 < 1.0
            assert await s.cancel_job("run") is CancelResult.NOT_FOUND
            await asyncio.sleep(0.3)
            assert w.loader is not None
            st = w.loader.stats
            assert (st.cancelled, st.succeeded, st.retried) == (1, 0, 0)
            assert await s.get("run") is None

    run(main())


def test_cancel_of_a_loaded_job_not_started_yet_keeps_it_from_running(redis_url: str) -> None:
    async def main() -> None:
        ran: list[str] = []
        reg = TaskRegistry()

        @reg.task(name="t")
        async def t(ctx: TaskContext) -> None:
            ran.append(ctx.job_id)

        # A long lookahead: the job is claimed and waits in the wheel for its due time.
        async with (
            open_scheduler(redis_url, **SCHED) as s,
            running_worker(s, reg, **{**FAST, "lookahead": 10.0}) as w,
        ):
            t0 = time.monotonic()
            await s.schedule("soon", "t", delay=4.0)
            assert await until(lambda: w.loader is not None and w.loader.loaded == 1, 3.5)
            assert w.loader is not None
            await asyncio.wait_for(w.listening.wait(), 10)
            assert await s.cancel_job("soon") is CancelResult.STOPPED
            assert await until(lambda: w.loader is not None and w.loader.loaded == 0, 2)
            await asyncio.sleep(max(0.0, t0 + 5.0 - time.monotonic()))  # past its due time
            assert ran == []
            assert w.loader.stats.cancelled == 1

    run(main())


def test_timeout_after_the_first_extension(redis_url: str) -> None:
    """A timeout later than half the lease: the lease is extended first, then the
    handler is stopped at its timeout (never early) and dead-lettered with it."""

    async def main() -> None:
        starts: list[float] = []
        stops: list[float] = []
        reg = TaskRegistry()

        @reg.task(name="slow", timeout=1.5)
        async def slow(ctx: TaskContext) -> None:
            starts.append(time.monotonic())
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                stops.append(time.monotonic())
                raise

        async with (
            open_scheduler(redis_url, **SCHED) as s,
            running_worker(s, reg, **{**FAST, "lease": 1.0, "lookahead": 0.0}) as w,
        ):
            await s.schedule("x", "slow", max_attempts=1)
            assert await until(lambda: bool(stops), 10)
            assert 1.5 <= stops[0] - starts[0] < 5.0
            assert await until(lambda: w.loader is not None and w.loader.stats.dead == 1, 5)
            assert w.loader is not None
            st = w.loader.stats
            assert st.extended >= 1 and st.timeouts == 1 and st.lease_lost == 0
            info = await s.get("x")
            assert info is not None and info.state is JobState.DEAD
            assert "timeout" in info.last_error

    run(main())


def test_prometheus_shows_timeouts_and_stopped(redis_url: str) -> None:
    from tickwheel.durable.ops.metrics import MetricsCollector

    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            s.ownership.counters.timeouts += 3
            s.ownership.counters.stopped += 1
            families = {f.name: f for f in MetricsCollector(s).collect()}
            assert families["tickwheel_timeouts"].samples[0].value == 3
            assert families["tickwheel_stopped"].samples[0].value == 1

    run(main())
