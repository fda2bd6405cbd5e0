"""Benchmarks of the spill (``Timers``, ``Loader``) against a real redis-server.

How to run::

    .venv/bin/pytest bench/suites/bench_spill.py --benchmark-only -p no:cacheprovider

One event loop lives for the module; every measured function drives it with
``loop.run_until_complete``. The server is a private ``redis-server`` without AOF.

Groups:

``spill schedule``   10^4 ``Timers.schedule`` calls: in memory (below the threshold,
    base) and durable (one awaited script call each). Shows what a spill costs.
``spill load+fire``  10^4 jobs due now on one shard: a :class:`Loader` claims them
    (LIMIT 1000), fires each through the wheel, runs a no-op task and acks it, one ack
    script call per job, at most 32 tasks at once. Target >= 5,000 jobs/s per process
    (measured ~5,400-7,000 here; batching acks is the next step if it matters).
``spill lateness``   2000 durable jobs due over 1 s, loaded 0.5 s ahead: lateness of
    each run by Redis's clock (TIME read in the task minus the due time), as a report
    (p0/p50/p99/max in ms). p0 must be >= 0 (never early).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import redis.asyncio

from tickwheel.durable import JobSpec, Loader, Scheduler, TaskContext, TaskRegistry, Timers
from tickwheel.wheel import TimingWheel

N = 10_000
LATENESS_JOBS = 2000
_ids = itertools.count()


def _registry(sink: list[int] | None = None) -> TaskRegistry:
    reg = TaskRegistry()

    @reg.task(name="noop")
    def noop(ctx: TaskContext) -> None:
        if sink is not None:
            sink.append(1)

    return reg


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_spill_schedule(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis, durable: bool
) -> None:
    benchmark.group = "spill schedule"
    benchmark.extra_info.update(impl="durable" if durable else "memory", ops_per_round=N)
    benchmark.extra_info["base"] = not durable
    state: dict[str, Timers] = {}

    async def make() -> Timers:
        s = Scheduler(client, f"s{next(_ids)}", shards=16, check=False)
        await s.open()
        return Timers(s, _registry(), wheel=TimingWheel())

    def setup() -> None:
        if "t" in state:
            loop.run_until_complete(state["t"].close())
        state["t"] = loop.run_until_complete(make())

    async def many(t: Timers) -> None:
        for _ in range(N):
            await t.schedule(30, "noop", b"", durable=durable)  # below the 60 s threshold

    def run() -> None:
        loop.run_until_complete(many(state["t"]))

    benchmark.pedantic(run, setup=setup, rounds=5 if durable else 10, iterations=1)
    benchmark.extra_info["timers_per_s"] = round(N / benchmark.stats.stats.median)


def test_spill_load_fire(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "spill load+fire"
    benchmark.extra_info.update(impl="Loader", ops_per_round=N, base=True)
    state: dict[str, Any] = {}

    async def make() -> None:
        await client.flushall()
        s = Scheduler(client, f"l{next(_ids)}", shards=1, check=False)
        await s.take(0)
        await s.schedule_many(JobSpec(f"j{i}", "noop") for i in range(N))
        sink: list[int] = []
        state["sink"] = sink
        state["loader"] = Loader(
            s, _registry(sink), TimingWheel(), lookahead=0.0, limit=1000, lease=60
        )

    async def drain(loader: Loader, sink: list[int]) -> None:
        while len(sink) < N or loader.running:
            if not await loader.load_once():
                await asyncio.sleep(0.001)

    def setup() -> None:
        loop.run_until_complete(make())

    def run() -> None:
        loop.run_until_complete(drain(state["loader"], state["sink"]))
        assert state["loader"].stats.succeeded == N, state["loader"].stats

    benchmark.pedantic(run, setup=setup, rounds=5, iterations=1)
    benchmark.extra_info["jobs_per_s"] = round(N / benchmark.stats.stats.median)


def test_spill_lateness(
    benchmark: Any, loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis
) -> None:
    benchmark.group = "spill lateness"
    late: list[float] = []

    async def measure() -> None:
        s = Scheduler(client, f"z{next(_ids)}", shards=1, check=False)
        await s.take(0)
        late.clear()
        reg = TaskRegistry()

        all_ran = asyncio.Event()

        @reg.task(name="probe")
        async def probe(ctx: TaskContext) -> None:
            sec, usec = await client.time()
            assert ctx.job is not None
            late.append(sec * 1000 + usec / 1000 - ctx.job.due_ms)
            if len(late) == LATENESS_JOBS:
                all_ran.set()

        specs = [
            JobSpec(f"z{i}", "probe", delay=0.6 + i / LATENESS_JOBS) for i in range(LATENESS_JOBS)
        ]
        await s.schedule_many(specs)
        loader = Loader(s, reg, TimingWheel(), lookahead=0.5, limit=1000, poll_interval=0.05)
        task = asyncio.ensure_future(loader.run())
        await all_ran.wait()
        loader.stop_claiming()
        await task

    benchmark.pedantic(lambda: loop.run_until_complete(measure()), rounds=1, iterations=1)
    late.sort()
    pct = {q: late[min(len(late) - 1, int(len(late) * q))] for q in (0.5, 0.99)}
    benchmark.extra_info["report"] = (
        f"lateness by Redis clock over {len(late)} runs: p0 {late[0]:.2f} ms, "
        f"p50 {pct[0.5]:.2f} ms, p99 {pct[0.99]:.2f} ms, max {late[-1]:.2f} ms"
    )
    assert late[0] >= 0, "a durable job fired early"
