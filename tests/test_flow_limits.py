"""Per-key concurrency and rate limits (issue 35): ``@registry.task(concurrency=N,
rate=(n, seconds))`` counted per flow key (``schedule(key=)``) across workers and
shards. Real redis-server processes (and a Redis Cluster where parametrized); the runs
are recorded by Redis's clock (limits_support.py)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from typing import Any

import pytest
from durable_support import client_of, open_scheduler, run
from limits_support import (
    at_peak,
    most_surely_in_window,
    peaks_by_key,
    runs,
    starts,
    with_unfinished,
)
from spill_support import SINK_ENV, WorkerProcess, running_worker, until

from tickwheel.durable import JobSpec, JobState, Limits, TaskContext, TaskRegistry

pytestmark = pytest.mark.redis

SOAK = os.environ.get("TICKWHEEL_SOAK") == "1"
FAST = {"lease": 2.0, "lookahead": 0.1, "poll_interval": 0.02, "reap_interval": 0.2}


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [({"concurrency": 0}, ValueError, "concurrency"),
     ({"concurrency": -1}, ValueError, "concurrency"),
     ({"concurrency": math.nan}, TypeError, "concurrency"),
     ({"concurrency": True}, TypeError, "concurrency"),
     ({"concurrency": 2.0}, TypeError, "concurrency"),
     ({"rate": (0, 1)}, ValueError, "rate"),
     ({"rate": (1, 0)}, ValueError, "rate"),
     ({"rate": (1, -1)}, ValueError, "rate"),
     ({"rate": (1, math.nan)}, ValueError, "rate"),
     ({"rate": (1, math.inf)}, ValueError, "rate"),
     ({"rate": (math.nan, 1)}, TypeError, "rate"),
     ({"rate": (True, 1)}, TypeError, "rate"),
     ({"rate": (1, 86_401)}, ValueError, "rate"),
     ({"rate": 10}, TypeError, "rate"),
     ({"rate": (1, 2, 3)}, TypeError, "rate")],
)  # fmt: skip
def test_bad_limits_are_refused_and_nothing_is_registered(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    reg = TaskRegistry()
    with pytest.raises(error, match=name):

        @reg.task(name="charge", **kwargs)
        async def charge(ctx: TaskContext) -> None: ...

    assert "charge" not in reg


def test_limits_stored_form_round_trips() -> None:
    reg = TaskRegistry()

    @reg.task(name="charge", concurrency=2, rate=(10, 1.5))
    async def charge(ctx: TaskContext) -> None: ...

    @reg.task(name="plain")
    async def plain(ctx: TaskContext) -> None: ...

    declared = reg.limits()
    assert declared == {"charge": Limits(2, 10, 1500), "plain": None}
    lim = declared["charge"]
    assert lim is not None and Limits.decode(lim.encode()) == lim
    assert Limits.decode(b"2 1 1 1") == Limits()  # a later version: no limit, no error
    assert reg.options("charge").limits == lim


def _keyed_specs(prefix: str, n: int, keys: int, ms: int, task: str = "keyed") -> list[JobSpec]:
    return [
        JobSpec(f"j{i}", task, {"sink": prefix, "ms": ms}, key=f"k{i % keys}") for i in range(n)
    ]


def test_concurrency_per_key_across_workers(redis_url: str) -> None:
    """Two workers (one process, their own schedulers), 4 shards, 120 jobs over 6 keys
    with concurrency=2: never more than 2 runs of a key at once; every job runs once."""

    async def main() -> None:
        os.environ[SINK_ENV] = redis_url
        from limits_support import registry

        async with (
            open_scheduler(redis_url, shards=4) as s,
            open_scheduler(redis_url, s.keys.namespace, shards=4) as s2,
            running_worker(s, registry, **FAST),
            running_worker(s2, registry, **FAST),
        ):
            prefix = s.keys.namespace
            await s.schedule_many(_keyed_specs(prefix, 120, 6, 15))
            client = client_of(s)
            assert await until_async(lambda: _count(client, prefix), 120, 30)
            done = await runs(client, prefix)
            assert sorted(r[0] for r in done) == sorted(f"j{i}" for i in range(120))
            assert max(peaks_by_key(done).values()) == 2  # reached, never passed

    run(main())


async def _count(client: Any, prefix: str) -> int:
    return int(await client.llen(f"{prefix}:runs"))


async def until_async(count: Any, n: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while await count() < n:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_a_key_at_its_limit_does_not_delay_another_key(redis_url: str) -> None:
    """Key "busy" holds its 2 permits for 0.4 s per run with 10 runs queued; a job of
    key "free" due meanwhile starts at once (its lateness by Redis's clock), and the
    busy key's waiters wait in Redis, not in the worker."""

    async def main() -> None:
        os.environ[SINK_ENV] = redis_url
        from limits_support import registry

        async with (
            open_scheduler(redis_url, shards=2) as s,
            running_worker(s, registry, **FAST) as w,
        ):
            prefix = s.keys.namespace
            client = client_of(s)
            busy = [
                JobSpec(f"b{i}", "keyed", {"sink": prefix, "ms": 400}, key="busy")
                for i in range(10)
            ]
            await s.schedule_many(busy)
            assert await until_async(lambda: _count_starts(client, prefix), 2, 10)
            await asyncio.sleep(0.2)  # the other 8 are waiting now
            waiting = [await s.get(f"b{i}") for i in range(10)]
            assert sum(1 for j in waiting if j is not None and j.state is JobState.WAITING) >= 7
            assert w.loader is not None and w.loader.loaded == 0  # none held in memory
            t0 = await s.now()
            await s.schedule("f", "keyed", {"sink": prefix, "ms": 0}, key="free")
            assert await until_async(lambda: _count(client, prefix), 1, 10)
            free = [r for r in await runs(client, prefix) if r[0] == "f"]
            assert await until(lambda: True, 0)
            (run_f,) = free or [await _wait_run(client, prefix, "f")]
            assert run_f[2] - t0 < 300, run_f  # started at once (generous on 2 cores)

    run(main())


async def _count_starts(client: Any, prefix: str) -> int:
    return int(await client.llen(f"{prefix}:starts"))


async def _wait_run(client: Any, prefix: str, job_id: str) -> list[Any]:
    for _ in range(200):
        found = [r for r in await runs(client, prefix) if r[0] == job_id]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} never ran")


@pytest.mark.slow
def test_rate_per_key(redis_url: str) -> None:
    """rate=(10, 1.0) on one key, 40 jobs due at once (20 on the cluster; soak: 200 on
    both): no 1 s window holds more than 10 grants, by Redis's clock (the key's
    ``window_starts``, read all along, and the grants surely in a window, from each
    run's due and start); the last starts no sooner than the limit allows and not much
    later (the soak's 200: from 19 s to 28.75 s, a quarter of a window's lag each)."""
    n = 200 if SOAK else 20 if redis_url.startswith("redis+cluster") else 40

    async def main() -> None:
        os.environ[SINK_ENV] = redis_url
        from limits_support import registry

        async with (
            open_scheduler(redis_url, shards=4) as s,
            open_scheduler(redis_url, s.keys.namespace, shards=4) as s2,
            running_worker(s, registry, **FAST),
            running_worker(s2, registry, **FAST),
        ):
            prefix = s.keys.namespace
            client = client_of(s)
            specs = [JobSpec(f"r{i}", "rated", {"sink": prefix}, key="ep") for i in range(n)]
            seen: list[int] = []  # the key's starts in its window, by its slot's clock

            async def watch() -> None:
                while True:
                    seen.append((await s.key_state("rated", "ep")).window_starts)
                    await asyncio.sleep(0.01)

            t0 = await s.now()
            watcher = asyncio.ensure_future(watch())
            try:
                await s.schedule_many(specs)
                assert await until_async(lambda: _count(client, prefix), n, n / 10 + 30)
            finally:
                watcher.cancel()
            done = await runs(client, prefix)
            assert sorted(r[0] for r in done) == sorted(f"r{i}" for i in range(n))
            assert len(seen) > n / 10 and max(seen) == 10, seen  # reached, never passed
            # A grant lies between the due a job was claimed at and its handler's
            # start (the handlers' clock alone would count a lagging start into the
            # next window on a loaded machine).
            # (10 ms less: the worker fires at a due by its estimate of Redis's clock.)
            assert most_surely_in_window(done, 990) <= 10, sorted(round(r[2] - t0) for r in done)
            span = max(r[2] for r in done) - t0
            windows = (n - 1) // 10
            assert span >= windows * 1000, span  # never early
            # Not much more: the window slides on the grants, so a grant that lags its
            # booked start (a claim on a loaded machine) delays the ones after it.
            assert span <= windows * 1250 + 5000, span

    run(main())


RUN_MS = 20  # each run's handler sleeps this long

# The worker processes' options (a lease is a permit's length). The clean run has a
# lease well past any stall of a loaded 2-core machine (a lease lost is a run twice).
PROC_OPTIONS = (
    "--shards", "6", "--owner-ttl", "1", "--poll-interval", "0.02", "--lookahead", "0.05",
    "--reap-interval", "0.2",
)  # fmt: skip


def _start_workers(url: str, ns: str, count: int, lease: float) -> list[WorkerProcess]:
    lease_options = ("--lease", str(lease), "--start-margin", str(lease))
    workers = [
        WorkerProcess(url, ns, *PROC_OPTIONS, *lease_options, registry="limits_support:registry")
        for _ in range(count)
    ]
    for w in workers:
        w.wait_started()
    return workers


@pytest.mark.slow
@pytest.mark.parametrize("faults", [False, True], ids=["clean", "kills"])
@pytest.mark.parametrize("backend", ["redis_server", "redis_cluster"], ids=["redis", "cluster"])
def test_three_worker_processes_keep_two_per_key(
    request: pytest.FixtureRequest, backend: str, faults: bool
) -> None:
    """3 ``tickwheel worker`` processes, 300 jobs over 20 keys with concurrency=2 (soak:
    2,000), on one Redis and on a Redis Cluster (a key's permits in one slot, its jobs
    in every shard's). Clean: never more than 2 runs of a key at once, every job once.
    With two SIGKILLs and a SIGSTOP past the lease: nothing lost, and a key's overlap
    passes 2 only by runs whose process stalled past half a lease while they ran: the
    stopped worker's, or any a loaded machine starved (their permits could expire under
    them: the stated bound, docs/limits.md). A killed worker's runs count as running
    until its kill."""
    n = 2000 if SOAK else 300
    redis_url = request.getfixturevalue(backend).url
    lease = 1.0 if faults else 5.0

    async def main() -> None:
        async with open_scheduler(redis_url, shards=6) as s:
            ns = s.keys.namespace
            client = client_of(s)
            workers = await asyncio.to_thread(_start_workers, redis_url, ns, 3, lease)
            stopped_at: float | None = None
            stopped_pid = 0
            ends: dict[int, list[float]] = {}  # pid -> when its unfinished runs ended

            def kill(w: WorkerProcess) -> None:
                w.kill()
                ends.setdefault(w.pid, []).append(time.time() * 1000)

            try:
                # The shards settle first (2 each): a worker that starts takes its share
                # from the others, who give it back draining, and jobs scheduled before
                # can run twice (fenced acks), which the clean run counts.
                assert await _balanced(s, 3, 20)
                await s.schedule_many(_keyed_specs(ns, n, 20, RUN_MS))
                if faults:
                    for victim in (0, 1):  # two SIGKILLs, each replaced
                        await until_async(lambda: _count(client, ns), n // 6 * (victim + 1), 30)
                        await asyncio.to_thread(kill, workers[victim])
                        (workers[victim],) = await asyncio.to_thread(
                            _start_workers, redis_url, ns, 1, lease
                        )
                    await until_async(lambda: _count(client, ns), n // 2, 30)
                    stopped_pid = workers[2].pid
                    stopped_at = time.time() * 1000
                    workers[2].signal(signal.SIGSTOP)
                    await asyncio.sleep(2.5 * lease)  # past its lease and its ownership
                    workers[2].signal(signal.SIGCONT)
                    # Its runs cut short by a lost lease end within half a lease.
                    ends[stopped_pid] = [time.time() * 1000 + lease * 1000]
                all_done = await until_async(lambda: _done_ids(client, ns), n, 60)
                assert all_done, f"{await _done_ids(client, ns)} of {n} ran: {await _stuck(s)}"
            finally:
                for w in workers:
                    if w.proc.poll() is None:
                        kill(w)
            finished = await runs(client, ns)
            done = with_unfinished(finished, await starts(client, ns), ends)
            ids = {r[0] for r in finished}
            assert ids == {f"j{i}" for i in range(n)}  # nothing lost
            peaks = peaks_by_key(done)
            if not faults:
                dups = sorted(
                    (r[0], round(r[2]) % 100000, round(r[3]) % 100000, r[4])
                    for r in done
                    if sum(1 for x in done if x[0] == r[0]) > 1
                )
                assert len(done) == n, dups[:20]  # every job once
                assert max(peaks.values()) <= 2, peaks
                return
            assert stopped_at is not None
            # A run whose process stalled past half a lease while it ran (the SIGSTOP,
            # or a loaded machine starving it) may have lost its lease and its permit
            # under it: the stated bound is 2 plus such runs open at the instant, that
            # is, the runs that kept their process running never overlap more than 2.
            prompt = [r for r in done if r[3] - r[2] <= RUN_MS + lease * 500]
            over = {k: p for k, p in peaks_by_key(prompt).items() if p > 2}
            events = {"stopped": (stopped_pid, stopped_at), "ends": ends}
            assert not over, f"{(over, [at_peak(prompt, k) for k in over], events)}"

    run(main())


async def _balanced(s: Any, workers: int, within: float) -> bool:
    """Every shard owned, by ``workers`` distinct owners, the same for 0.5 s."""
    deadline = time.monotonic() + within
    last: list[str] = []
    while time.monotonic() < deadline:
        owners = [i.owner for i in await s.inspect()]
        if all(owners) and len(set(owners)) == workers and owners == last:
            return True
        last = owners
        await asyncio.sleep(0.5)
    return False


async def _stuck(s: Any) -> dict[str, Any]:
    """What a run that stopped making progress left: per shard (owner, due, overdue,
    leased, expired, dead), per key (running, waiting, handed, next permit deadline
    from now), for a failure's message."""
    now = await s.now()
    keys = {}
    for k in range(20):
        st = await s.key_state("keyed", f"k{k}")
        keys[f"k{k}"] = (st.running, st.waiting, st.handed, st.next_release_ms - now)
    shards = [
        (i.shard, i.owner[:8], i.due, i.overdue, i.leased, i.expired, i.dead)
        for i in await s.inspect()
    ]
    return {"keys": keys, "shards": shards}


async def _done_ids(client: Any, prefix: str) -> int:
    return len({r[0] for r in await runs(client, prefix)})
