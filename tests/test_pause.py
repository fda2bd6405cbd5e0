"""Pause and resume (issue 34): a paused task's due jobs are parked once by the claim
that meets them, nothing is lost, the others flow, and resume runs them once in due
order. On a real redis-server (single and cluster)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter

import pytest

from tests.durable_support import check_all, client_of, open_scheduler, push_clock, run, unique_ns
from tests.spill_support import running_worker, until
from tickwheel.durable import (
    CancelResult,
    JobSpec,
    JobState,
    MissedRun,
    SyncScheduler,
    TaskContext,
    TaskRegistry,
)
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis

FAST = {"lease": 5.0, "lookahead": 0.1, "poll_interval": 0.05, "reap_interval": 0.2}


def _counting_registry(calls: Counter[str], order: list[str]) -> TaskRegistry:
    reg = TaskRegistry()

    async def handler(ctx: TaskContext) -> None:
        calls[ctx.job_id] += 1
        order.append(ctx.job_id)

    reg.register(handler, name="paused")
    reg.register(handler, name="other")
    return reg


@pytest.mark.parametrize(
    ("task", "error"),
    [("", ValueError), ("a\0b", ValueError), ("x" * 129, ValueError), (5, TypeError)],
)
def test_bad_task_names_are_refused_and_nothing_is_written(
    redis_url: str, task: object, error: type[Exception]
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            with pytest.raises(error, match="task"):
                await s.pause(task)  # type: ignore[arg-type]
            with pytest.raises(error, match="task"):
                await s.resume(task)  # type: ignore[arg-type]
            assert await s.paused() == {}
            assert not await client_of(s).exists(s.keys.paused, s.keys.shard(0).paused)

    run(main())


def test_pause_parks_once_and_parked_jobs_stay_scheduled(redis_url: str) -> None:
    """A claim parks a paused task's due jobs (out of due) and leases the others; the
    next claims do not see them. A parked job is found, cancelled and rescheduled."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.pause("paused")
            assert list(await s.paused()) == ["paused"]  # a task no worker registers yet
            await s.schedule_many(
                [JobSpec(f"p{i}", "paused") for i in range(50)]
                + [JobSpec(f"o{i}", "other") for i in range(10)]
            )
            await s.take(0)
            batch = await s.claim(0, limit=100)
            assert sorted(j.task for j in batch.jobs) == ["other"] * 10
            assert batch.parked == 50
            k = s.keys.shard(0)
            client = client_of(s)
            assert await client.zcard(k.due) == 0 and await client.zcard(k.parked) == 50
            again = await s.claim(0, limit=100)
            assert (again.jobs, again.parked) == ([], 0)  # not read again
            states = await check_all(s)
            assert states["p3"] is JobState.DUE
            info = await s.get("p3")
            assert info is not None and info.state is JobState.DUE and info.task == "paused"
            assert await s.cancel_job("p3") is CancelResult.REMOVED
            assert await s.get("p3") is None
            assert await s.reschedule("p4", delay=3600)
            (shard,) = await s.inspect()
            assert (shard.parked, shard.paused) == (48, ("paused",))
            assert shard.due == 49 and shard.overdue == 0  # parked: not claimable
            page = await s.operator.store.due_list(0, 0, 100)
            assert page.total == 49 and len(page.jobs) == 49
            await check_all(s)
            assert await s.resume("paused") == 48
            assert await s.paused() == {}
            batch = await s.claim(0, limit=100)
            assert len(batch.jobs) == 48 and batch.parked == 0
            await check_all(s)

    run(main())


def test_paused_jobs_wait_others_flow_and_resume_runs_each_once(redis_url: str) -> None:
    async def main() -> None:
        calls: Counter[str] = Counter()
        order: list[str] = []
        reg = _counting_registry(calls, order)
        async with open_scheduler(redis_url, shards=4) as s:
            await s.pause("paused")
            now = await s.now()
            # Due in the past, each 1 ms apart: resume must run them in this order.
            await s.schedule_many(
                JobSpec(f"p{i:04d}", "paused", at=now - 5000 + i) for i in range(2000)
            )
            await s.schedule_many(JobSpec(f"o{i}", "other") for i in range(300))
            async with running_worker(s, reg, **FAST):
                assert await until(lambda: len(calls) >= 300, 30)
                await asyncio.sleep(0.5)
                assert set(calls) == {f"o{i}" for i in range(300)}  # the others all ran
                infos = [await s.get(f"p{i:04d}") for i in (0, 999, 1999)]
                assert all(i is not None and i.state is JobState.DUE for i in infos)
                order.clear()
                moved = await s.resume("paused")
                assert moved == 2000
                assert await until(lambda: len(calls) >= 2300, 30)
                await asyncio.sleep(0.3)
            assert all(n == 1 for n in calls.values()) and len(calls) == 2300
            # In due order within each shard (shards are claimed side by side).
            for shard in range(4):
                mine = [j for j in order if s.keys.shard_of(j) == shard]
                assert mine == sorted(mine), shard
            await check_all(s)

    run(main())


def test_namespace_pause_holds_everything_and_task_pauses_outlive_it(redis_url: str) -> None:
    async def main() -> None:
        calls: Counter[str] = Counter()
        reg = _counting_registry(calls, [])
        async with open_scheduler(redis_url, shards=2) as s:
            await s.pause()
            await s.pause("paused")
            assert set(await s.paused()) == {None, "paused"}
            await s.schedule_many(
                [JobSpec(f"p{i}", "paused") for i in range(20)]
                + [JobSpec(f"o{i}", "other") for i in range(20)]
            )
            async with running_worker(s, reg, **FAST):
                await asyncio.sleep(1.0)
                assert not calls
                # Resuming a task moves nothing while the namespace stays paused.
                assert await s.resume("other") == 0
                assert await s.resume() == 20  # the others; "paused" stays paused
                assert await until(lambda: len(calls) == 20, 20)
                assert set(calls) == {f"o{i}" for i in range(20)}
                assert list(await s.paused()) == ["paused"]
                assert await s.resume("paused") == 20
                assert await until(lambda: len(calls) == 40, 20)
            assert all(n == 1 for n in calls.values())
            await check_all(s)

    run(main())


def test_sync_scheduler_pauses_and_resumes_like_the_async_one(redis_server: RedisServer) -> None:
    url = redis_server.url
    sync = SyncScheduler.from_url(url, unique_ns(), shards=2)
    try:
        with pytest.raises(ValueError, match="task"):
            sync.pause("")
        sync.pause("paused")
        sync.pause()
        assert set(sync.paused()) == {None, "paused"}
        sync.schedule("a", "paused")

        async def park() -> None:
            async with open_scheduler(url, sync.keys.namespace, shards=2) as s:
                shard = s.keys.shard_of("a")
                await s.take(shard)
                assert (await s.claim(shard)).parked == 1

        run(park())
        info = sync.get("a")
        assert info is not None and info.state is JobState.DUE
        assert sync.resume() == 0  # "paused" stays paused on its own
        assert sync.resume("paused") == 1
        assert sync.paused() == {}
    finally:
        sync.close()


def test_dashboard_pause_and_resume_are_guarded_writes(redis_url: str) -> None:
    from tests.dashboard_support import BASE, api_client, bearer, login

    ns = unique_ns()

    async def make() -> None:
        async with open_scheduler(redis_url, ns, shards=2) as s:
            await s.schedule("d1", "t", delay=60)

    run(make())
    with api_client(redis_url, ns) as client:
        r = client.post("/api/pause", json={"task": "t"})
        assert r.status_code == 401  # no token: nothing written
        assert client.get("/api/overview").json()["paused"] == []
        r = client.post("/api/pause", json={"task": "a\0b"}, headers=bearer())
        assert r.status_code == 400 and "task" in r.json()["error"]
        r = client.post("/api/pause", json={"task": "t"}, headers=bearer())
        assert r.status_code == 200 and "paused task 't'" in r.json()["message"]
        r = client.post("/api/pause", json={}, headers=bearer())  # the whole namespace
        assert r.status_code == 200
        rows = client.get("/api/overview").json()["paused"]
        assert [row["task"] for row in rows] == [None, "t"]
        csrf = login(client)
        page = client.get("/").text
        assert 'data-paused="t"' in page and 'id="pause-form"' in page
        r = client.post("/resume", data={"task": "t"}, headers={"Origin": BASE})
        assert r.status_code == 403  # no CSRF token
        r = client.post("/resume", data={"task": "t", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 200 and "resumed task" in r.text
        r = client.post("/resume", data={"task": "", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 200
        assert client.get("/api/overview").json()["paused"] == []
    with api_client(redis_url, ns, read_only=True) as client:
        r = client.post("/api/pause", json={"task": "t"}, headers=bearer())
        assert r.status_code == 403 and "read-only" in r.json()["error"]


def test_kill_9_of_a_worker_while_paused_loses_nothing(redis_server: RedisServer) -> None:
    """A worker process parks the paused task's jobs, is killed by SIGKILL; nothing is
    lost, and after the resume another worker runs each job once. (One Redis only: two
    worker processes make it the slowest test here.)"""
    redis_url = redis_server.url
    from tests.spill_support import WorkerProcess, sink_report, wait_effects

    async def main() -> None:
        ns = unique_ns()
        prefix = f"sink:{ns}"
        # A short owner TTL: the second worker takes the killed one's shards sooner.
        opts = ("--shards", "2", "--lease", "3", "--poll-interval", "0.05", "--owner-ttl", "2")
        async with open_scheduler(redis_url, ns, shards=2) as s:
            await s.pause("sink")
            ids = [f"k{i}" for i in range(300)]
            await s.schedule_many(JobSpec(i, "sink", {"sink": prefix}) for i in ids)
            first = WorkerProcess(redis_url, ns, *opts)
            try:
                first.wait_started()

                async def parked() -> int:
                    return sum(r.parked for r in await s.inspect())

                for _ in range(200):
                    if await parked() == 300:
                        break
                    await asyncio.sleep(0.05)
                assert await parked() == 300
            finally:
                first.kill()
            states = await check_all(s)
            assert all(states[i] is JobState.DUE for i in ids) and len(states) == 300
            client = client_of(s)
            assert await client.scard(f"{prefix}:effects") == 0
            assert await s.resume("sink") == 300
            second = WorkerProcess(redis_url, ns, *opts)
            try:
                second.wait_started()
                assert await wait_effects(client, prefix, 300, 30) == 300
                report = await sink_report(client, prefix, ids)
                assert all(n == 1 for n in report["calls"].values())
            finally:
                second.stop()

    run(main())


@pytest.mark.parametrize(
    ("missed", "expected_runs"),
    [(MissedRun.ONCE, [0]), (MissedRun.ALL, list(range(11))), (MissedRun.SKIP, [])],
)
def test_a_recurring_series_treats_a_pause_as_a_downtime(
    redis_url: str, missed: MissedRun, expected_runs: list[int]
) -> None:
    """Minutely, grace 1 s, paused over its first ten minutes and more (the shard's
    clock pushed forward): after the resume, its missed-run policy decides, as after
    a downtime (test_durable_recurring's)."""
    minute = 60_000

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.pause("t")
            start = await s.now(0) + 1
            await s.schedule("m", "t", at=start, every=60, missed=missed, misfire_grace=1)
            await push_clock(s, 0, 1_000)
            batch = await s.claim(0, limit=10)
            assert (batch.jobs, batch.parked) == ([], 1)
            await client_of(s).set(s.keys.shard(0).clock, start + 10 * minute + 30_000)
            assert (await s.claim(0, limit=10)).jobs == []  # still paused: nothing
            assert await s.resume("t") == 1
            runs: list[int] = []
            for _ in range(20):
                batch = await s.claim(0, limit=1000)
                for job in batch.jobs:
                    await s.ack(job)
                runs += [(j.nominal_ms - start) // minute for j in batch.jobs]
                info = await s.get("m")
                assert info is not None and info.state is JobState.DUE
                if not batch.jobs and info.when_ms > await s.now(0):
                    break
            assert runs == expected_runs
            info = await s.get("m")
            assert info is not None and info.when_ms == start + 11 * minute
            assert await check_all(s) == {"m": JobState.DUE}

    run(main())


def test_cli_pause_resume_inspect_and_check(redis_server: RedisServer) -> None:
    from tests.test_cli import cli, cli_json, opts

    ns = unique_ns()
    o = opts(redis_server.url, ns, shards=2)
    bad = cli("pause", "--task", "", *o, "--json")
    assert bad.returncode == 2 and "--task" in json.loads(bad.stdout)["error"]
    assert cli_json("resume", "--task", "t", *o, code=1)["created"] is False
    doc = cli_json("pause", "--task", "t", *o)
    assert [row["task"] for row in doc["paused"]] == ["t"]
    cli_json("schedule", "j1", "t", *o)
    insp = cli_json("inspect", *o)
    assert insp["paused"][0]["task"] == "t" and insp["parked"] == 0
    assert all(shard["paused"] == ["t"] for shard in insp["shards"])
    chk = cli_json(
        "check", "--redis-url", redis_server.url, "--namespace", ns, "--shards", "2", code=1
    )
    assert [row["task"] for row in chk["paused"]] == ["t"]  # (exit 1: no AOF on this server)
    assert insp["pause_unsettled_shards"] == []
    text = cli("inspect", *o).stdout
    assert "paused: task 't'" in text and "WARNING" not in text

    async def cut_short() -> None:  # a pause that wrote the state of record only
        async with open_scheduler(redis_server.url, ns, shards=2) as s:
            await client_of(s).hset(s.keys.paused, "u", 1)

    run(cut_short())
    assert cli_json("inspect", *o)["pause_unsettled_shards"] == [0, 1]
    assert "WARNING: shards [0, 1]" in cli("inspect", *o).stdout
    cli_json("pause", "--task", "u", *o)  # run again: settled
    assert cli_json("inspect", *o)["pause_unsettled_shards"] == []
    cli_json("resume", "--task", "u", *o)
    doc = cli_json("resume", "--task", "t", *o)
    assert doc["moved"] == 0 and doc["paused"] == []


def test_a_sigstopped_worker_resumed_after_its_shard_moved_cannot_ack_or_extend(
    redis_server: RedisServer,
) -> None:
    """Fencing (issue 34): a worker stopped (SIGSTOP) while running a job, past its
    owner TTL and its lease, whose shard another owner took and whose job it claimed
    again. Resumed, the stale worker's extend and ack are refused: the new owner's lease
    stands, the record is the new owner's, and nothing the stale worker did removes
    or settles it; a cancel then goes to the new owner's lease."""
    from tests.spill_support import WorkerProcess

    url = redis_server.url

    async def main() -> None:
        async with open_scheduler(url, shards=1, owner_ttl=1.0) as s:
            ns = s.keys.namespace
            prefix = f"fence:{ns}"
            client = client_of(s)
            opts = ("--shards", "1", "--owner-ttl", "1", "--lease", "2")
            stale = WorkerProcess(url, ns, *opts, registry="fencing_support:registry")
            try:
                stale.wait_started()
                await s.schedule("j", "slow", {"sink": prefix, "sleep": 6.0})
                for _ in range(200):
                    if await client.llen(f"{prefix}:started"):
                        break
                    await asyncio.sleep(0.05)
                assert await client.lrange(f"{prefix}:started", 0, -1) == [b"j"]
                stale.signal(signal.SIGSTOP)
                try:
                    await asyncio.sleep(1.5)  # past its owner TTL (1 s)
                    assert await s.take(0) is not None  # the shard moved here
                    for _ in range(50):  # and its lease (2 s, perhaps extended once)
                        reaped = await s.reap(0)
                        if reaped.requeued:
                            break
                        await asyncio.sleep(0.1)
                    assert reaped.requeued == ["j"]
                    batch = await s.claim(0)
                    (job,) = batch.jobs
                    # 2, or 1 when the reaper found its run's start not yet marked (a
                    # quarter of the start margin in: docs/reliability.md), which returns
                    # the job at the same attempt once.
                    assert job.attempt in (1, 2)
                    k = s.keys.shard(0)
                    deadline = await client.zscore(k.leased, "j")
                finally:
                    stale.signal(signal.SIGCONT)
                # Its extends come (at half its 2 s lease) and its handler ends (6 s in).
                for _ in range(200):
                    if await client.llen(f"{prefix}:finished"):
                        break
                    await asyncio.sleep(0.05)
                assert await client.llen(f"{prefix}:finished") == 1
                await asyncio.sleep(0.5)  # its ack (refused) has been sent
                assert await client.zscore(k.leased, "j") == deadline  # not extended
                info = await s.get("j")
                assert info is not None and info.state is JobState.LEASED
                assert (info.attempt, info.epoch) == (job.attempt, job.epoch)  # not acked
                assert await s.cancel_job("j") is CancelResult.STOPPED
                assert await s.get("j") is None
            finally:
                code, stats, err = stale.stop()
            assert stats is not None and stats["fenced"] > 0, (code, stats, err)

    run(main())


def test_replacing_a_parked_job_takes_it_out_and_a_claim_parks_it_again(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.pause("paused")
            await s.schedule_many([JobSpec(f"r{i}", "paused") for i in range(3)])
            await s.take(0)
            assert (await s.claim(0, limit=10)).parked == 3
            kept = await s.schedule("r0", "paused")  # kept: its due time is the parked one
            info = await s.get("r0")
            assert info is not None and kept.when_ms == info.when_ms
            await s.schedule("r0", "paused", {"v": 2}, replace=True)  # due now, unparked
            await s.schedule_many([JobSpec("r1", "other", delay=3600)], replace=True)
            await check_all(s)
            k = s.keys.shard(0)
            assert await client_of(s).zcard(k.parked) == 1
            batch = await s.claim(0, limit=10)
            assert (batch.jobs, batch.parked) == ([], 1)  # r0 again; r1 is due later
            await check_all(s)
            assert await s.resume("paused") == 2
            batch = await s.claim(0, limit=10)
            assert sorted(j.id for j in batch.jobs) == ["r0", "r2"]
            assert next(j for j in batch.jobs if j.id == "r0").payload == {"v": 2}

    run(main())
