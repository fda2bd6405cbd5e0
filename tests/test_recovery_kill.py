"""Recovery after a worker is killed (issue 40), with real worker processes and SIGKILL:

- jobs a worker had claimed but not started come back within the lookahead plus the
  start margin (plus the takeover), at the same attempt, while a started job keeps its
  whole lease;
- a worker restarted in place with the same ``--worker-id`` takes its shards back at
  once, under new epochs, and the dead process's epoch stays fenced.

Real-clock bounds are generous (a loaded machine): never early, and late by at most a
few seconds over the documented bound.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from durable_support import client_of, open_scheduler, push_clock, run, unique_ns
from recovery_support import runs
from spill_support import WorkerProcess

from tickwheel.durable import Fenced, JobState
from tickwheel.durable.store import Keys
from tickwheel.durable.store._connect import client_from_url

pytestmark = pytest.mark.redis

REGISTRY = "recovery_support:registry"
# Slack over a documented bound for a loaded machine (2 shared cores).
SLACK = 6.0


async def _wait(predicate: object, within: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(step)
    return False


async def _redis_ms(client: redis.asyncio.Redis) -> float:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) / 1000


def test_claimed_unstarted_jobs_of_a_killed_worker_come_back_soon_at_the_same_attempt(
    redis_server: object,
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    ns = unique_ns()
    lookahead, margin, ttl = 1.0, 1.0, 2.0
    options = [
        "--shards", "1", "--lookahead", str(lookahead), "--start-margin", str(margin),
        "--owner-ttl", str(ttl), "--lease", "30", "--max-running", "1",
        "--reap-interval", "0.2",
    ]  # fmt: skip
    a = WorkerProcess(url, ns, *options, "--worker-id", "a", registry=REGISTRY)
    b: WorkerProcess | None = None
    try:
        a.wait_started()

        async def main() -> None:
            nonlocal b
            async with open_scheduler(url, ns, shards=1) as s:
                sink = client_of(s)
                # "slow" takes the only slot; q0..q2 are claimed with it and wait.
                await s.schedule("slow", "record", {"sink": ns, "sleep": 60}, delay=0.3)
                for i in range(3):
                    await s.schedule(f"q{i}", "record", {"sink": ns}, delay=0.6)

                async def slow_started() -> bool:
                    return any(r[0] == "slow" for r in await runs(sink, ns))

                assert await _wait(slow_started, 20)
                await asyncio.sleep(0.5)  # the q jobs are due, claimed, waiting
                assert [r[0] for r in await runs(sink, ns)] == ["slow"]
                a.kill()
                killed_ms = await _redis_ms(sink)
                b = WorkerProcess(url, ns, *options, "--worker-id", "b", registry=REGISTRY)
                b.wait_started()

                async def all_ran() -> bool:
                    return len(await runs(sink, ns)) >= 4

                bound = lookahead + margin + ttl + ttl / 5 + 0.2
                assert await _wait(all_ran, bound + SLACK), await runs(sink, ns)
                done = await runs(sink, ns)
                later = [r for r in done if r[0] != "slow"]
                assert sorted(r[0] for r in later) == ["q0", "q1", "q2"]
                assert {r[1] for r in later} == {1}  # no attempt charged
                assert {r[2] for r in later} == {b.pid}
                for r in later:
                    assert r[3] - killed_ms <= (bound + SLACK) * 1000
                # The started job keeps its whole lease (30 s): not back, still attempt 1.
                info = await s.get("slow")
                assert info is not None and info.state is JobState.LEASED
                assert info.attempt == 1

        run(main())
    finally:
        for w in (a, b):
            if w is not None and w.proc.poll() is None:
                w.kill()


def _owners(url: str, ns: str, shards: int) -> tuple[list[bytes | None], list[int]]:
    async def read() -> tuple[list[bytes | None], list[int]]:
        client = client_from_url(url)
        try:
            keys = Keys(ns, shards)
            owners = [await client.get(keys.shard(s).owner) for s in range(shards)]
            epochs = [int(await client.get(keys.shard(s).epoch) or 0) for s in range(shards)]
            return owners, epochs
        finally:
            await client.aclose()

    return run(read())


@pytest.mark.parametrize("same_id", [True, False], ids=["restart-same-id", "other-worker"])
def test_a_killed_owners_shards_are_taken_within_the_bound(
    redis_server: object, same_id: bool
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    ns = unique_ns()
    shards, ttl = 4, 2.0
    options = ["--shards", str(shards), "--owner-ttl", str(ttl)]
    a = WorkerProcess(url, ns, *options, "--worker-id", "w1", registry=REGISTRY)
    b: WorkerProcess | None = None
    try:
        a.wait_started()
        deadline = time.monotonic() + 20
        while _owners(url, ns, shards)[0] != [b"w1"] * shards:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = _owners(url, ns, shards)[1]
        a.kill()
        killed = time.monotonic()
        b = WorkerProcess(
            url, ns, *options, "--worker-id", "w1" if same_id else "w2", registry=REGISTRY
        )
        b.wait_started()
        # The bound runs from b's start (after the kill): a process that takes
        # seconds to start under load (its imports) cannot take shards before it runs.
        since = time.monotonic()  # later than the kill
        while True:
            owners, epochs = _owners(url, ns, shards)
            if all(e > old for e, old in zip(epochs, before, strict=True)):
                break
            assert time.monotonic() - since < ttl + ttl / 5 + SLACK, (owners, epochs)
            time.sleep(0.02)
        took = time.monotonic() - killed
        assert owners == [b"w1" if same_id else b"w2"] * shards
        if same_id:  # at once: well inside the dead tokens' TTL
            assert took < ttl + SLACK
    finally:
        for w in (a, b):
            if w is not None and w.proc.poll() is None:
                w.kill()


def test_a_restart_with_the_same_id_fences_the_previous_process(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]

    async def main() -> None:
        ns = unique_ns()
        async with open_scheduler(url, ns, shards=1, worker_id="w") as old:
            await old.schedule("j", "t")
            first = await old.take(0)
            assert first
            batch = await old.claim(0, lookahead=0)
            assert [j.id for j in batch.jobs] == ["j"]
            async with open_scheduler(url, ns, shards=1, worker_id="w") as new:
                second = await new.take(0)  # the same token, another process: new epoch
                assert second == first + 1
                with pytest.raises(Fenced):
                    await old.ack(batch.jobs[0])
                assert 0 not in old.ownership.owned  # dropped at the refusal
                with pytest.raises(Fenced):  # its token renewal is refused too
                    await old.ownership.renew_leaving(0, first)
                assert await new.take(0) == second  # held here: no new epoch

    run(main())


def test_the_reaper_charges_an_attempt_only_to_a_lease_whose_run_started(
    redis_server: object,
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]

    async def main() -> None:
        async with open_scheduler(url, shards=1) as s:
            await s.take(0)
            for name in ("unstarted", "started", "plain"):
                await s.schedule(name, "t", max_attempts=1)
            batch = await s.claim(0, lookahead=0, lease=1, prestart=True)
            started = next(j for j in batch.jobs if j.id == "started")
            await s.extend(started, lease=2)  # the run's start: a whole-ms deadline
            leased = await client_of(s).zrange(s.keys.shard(0).leased, 0, -1, withscores=True)
            scores = {m.decode(): score for m, score in leased}
            assert scores["unstarted"] % 1 == 0.5 and scores["started"] % 1 == 0
            await push_clock(s, 0, 60_000)
            await s.reap(0)
            unstarted, ran = await s.get("unstarted"), await s.get("started")
            assert unstarted is not None and unstarted.state is JobState.DUE
            assert unstarted.attempt == 1  # not charged
            assert unstarted.last_error == "lease expired before the run started"
            assert ran is not None and ran.state is JobState.DEAD  # its one attempt spent
            assert ran.last_error == "lease expired"
            # A second return in a row before any run started is charged: a job that
            # kills its worker before its start is marked still runs out of attempts.
            batch = await s.claim(0, lookahead=0, lease=1, prestart=True)
            assert {j.id for j in batch.jobs} == {"unstarted", "plain"}
            assert {j.attempt for j in batch.jobs} == {1}
            await push_clock(s, 0, 60_000)
            await s.reap(0)
            for name in ("unstarted", "plain"):
                info = await s.get(name)
                assert info is not None and info.state is JobState.DEAD, info
                assert info.last_error == "lease expired"

    run(main())
