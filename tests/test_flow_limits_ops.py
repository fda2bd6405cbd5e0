"""The flow limits seen and handled by id (issue 35): a waiting job is an ordinary due
job (get, cancel find it by id in its own shard), a key's state by ``key_state``,
``inspect --key``, the dashboard's ``/key`` and the metrics' totals per task. Real
redis-server processes (and a Redis Cluster where parametrized)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dashboard_support import api_client
from durable_support import open_scheduler, run, unique_ns
from test_cli import opts

from tickwheel.durable import JobState, Limits
from tickwheel.durable.ops.cli import main as cli_main
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of

pytestmark = pytest.mark.redis

LIM = Limits(concurrency=1, rate_n=5, rate_ms=10_000)


def test_waiting_jobs_are_found_by_id_and_woken_by_a_release(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=4) as s:
            calls = s.store.limits
            await calls.declare({"charge": LIM, "plain": None})
            assert await s.limits() == {"charge": LIM}
            for i in range(3):
                await s.schedule(f"c{i}", "charge", key="m1")
            jobs = {}
            for shard in range(4):
                await s.take(shard)
                for job in (await s.claim(shard, lease=30.0)).jobs:
                    jobs[job.id] = job
            assert await calls.acquire(jobs["c0"], LIM, 30_000) == (ACQUIRED, 0)
            for waiter in ("c1", "c2"):
                assert await calls.acquire(jobs[waiter], LIM, 30_000) == (PERMIT_WAIT, 0)
                assert (await calls.wait(jobs[waiter], 60_000, permit=True))[0] == 3
            state = await s.key_state("charge", "m1")
            assert (state.running, state.waiting, state.handed) == (1, 2, 0)
            assert state.next_release_ms > state.now_ms and state.window_starts == 1
            assert await s.limit_waiting() == {"charge": 2}
            info = await s.get("c1")  # by id, in its own shard: a due job, flagged waiting
            assert info is not None and info.state is JobState.WAITING and info.key == "m1"
            assert info.when_ms == info.nominal_ms  # in no index: its nominal due
            # Out of the due index: counted by inspect as waiting, not as due.
            shards = await s.inspect()
            assert sum(i.waiting for i in shards) == 2 and sum(i.due for i in shards) == 0
            assert info.attempt == 1  # the wait spent nothing
            # c0 ends: its permit goes to c1, the first waiter, who is made due now.
            member = member_of(jobs["c0"])
            holder = f"{jobs['c0'].epoch}:{jobs['c0'].attempt}"
            handed = await calls.release("charge", "m1", member, holder, lim=LIM, hold_ms=30_000)
            assert handed == [member_of(jobs["c1"])]
            assert await calls.wake("charge", handed[0]) == 1
            woken = await s.get("c1")
            assert woken is not None and woken.when_ms <= await s.now()
            assert woken.state is JobState.DUE  # out of its wait
            assert await s.limit_waiting() == {"charge": 1}
            # A waiter cancelled while it waits: its handed permit comes back (wake 0).
            assert await s.cancel("c2")
            assert await s.limit_waiting() == {"charge": 0}
            state = await s.key_state("charge", "m1")
            assert (state.running, state.waiting, state.handed) == (0, 1, 1)
            assert await s.key_state("charge") is not None  # the single key: empty

    run(main())


def test_inspect_key_and_schedule_key_in_the_cli(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process (``main``), as ``tickwheel`` runs it: ``schedule --key``, ``inspect
    --job`` showing it, ``inspect --key --task``; bad input refused naming it."""
    base = opts(redis_server.url, unique_ns())

    def out(*argv: str, code: int = 0) -> Any:
        capsys.readouterr()
        assert cli_main([*argv, *base, "--json"]) == code
        return json.loads(capsys.readouterr().out or "null")

    assert out("schedule", "a", "charge", "--key", "merchant:7")["status"] == "created"
    assert out("inspect", "--job", "a")["key"] == "merchant:7"
    state = out("inspect", "--key", "merchant:7", "--task", "charge")
    assert (state["running"], state["waiting"], state["concurrency"]) == (0, 0, 0)
    capsys.readouterr()
    assert cli_main(["inspect", "--key", "merchant:7", *base]) == 2
    assert "--task" in capsys.readouterr().err
    assert cli_main(["schedule", "b", "charge", "--key", "k" * 201, *base]) == 2
    assert "key" in capsys.readouterr().err
    assert out("inspect", "--job", "b", code=1)["found"] is False  # nothing written


def test_the_dashboard_looks_a_key_up(redis_url: str) -> None:
    async def prepare(ns: str) -> None:
        async with open_scheduler(redis_url, ns, shards=4) as s:
            await s.store.limits.declare({"charge": LIM})
            await s.schedule("d1", "charge", key="m/1 &x")

    ns = unique_ns()
    run(prepare(ns))
    with api_client(redis_url, ns) as client:
        data = client.get("/api/key", params={"task": "charge", "key": "m/1 &x"}).json()
        assert data["concurrency"] == 1 and data["rate"] == [5, 10.0]
        assert data["running"] == 0 and data["waiting"] == 0
        page = client.get("/key", params={"task": "charge", "key": "m/1 &x"})
        assert page.status_code == 200 and 'id="key-running">0<' in page.text
        job = client.get("/job", params={"id": "d1"})
        assert 'id="job-key"' in job.text and "/key?task=charge&amp;key=m%2F1%20%26x" in job.text
        bad = client.get("/api/key", params={"task": "charge", "key": "k" * 201})
        assert bad.status_code == 400 and "key" in bad.text
