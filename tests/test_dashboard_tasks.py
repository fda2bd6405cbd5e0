"""The dashboard's first screen per task, the scheduled list merged across shards, the
internals page, and human times: through the ASGI test client against a real Redis and
a real Redis Cluster, with real jobs."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from dashboard_support import BASE, TOKEN, api_client, bearer
from durable_support import open_scheduler, run, unique_ns

from tickwheel.durable import JobSpec, JobState
from tickwheel.durable.ops.dashboard import _merge, _tasks
from tickwheel.durable.ops.dashboard._human import duration, relative, time_tag, utc

SHARDS = 4
XSS = "<script>alert('x')</script>"
H = 3_600_000


# -- human times (pure) ----------------------------------------------------------------


def test_durations_read_in_their_two_largest_units() -> None:
    assert duration(0) == "0 s"
    assert duration(1) == "1 ms" and duration(999) == "999 ms"
    assert duration(1000) == "1 s" and duration(59_999) == "59 s"  # cut, never rounded up
    assert duration(60_000) == "1 min" and duration(61_000) == "1 min 1 s"
    assert duration(3 * H + 12 * 60_000 + 59_000) == "3 h 12 min"
    assert duration(3 * H + 5_000) == "3 h"  # no gap: "3 h 0 min 5 s" reads as 3 h
    assert duration(2 * 86_400_000 + 4 * H) == "2 d 4 h"
    assert duration(-90_000) == "1 min 30 s"  # the sign is relative()'s business
    assert duration(400 * 86_400_000) == "400 d"
    assert duration(253_402_300_799_999) == "8,035 years"  # 9999-12-31 from 1970
    assert duration(2.5e3) == "2 s"


def test_relative_times_say_which_side_of_now() -> None:
    now = 1_800_000_000_000
    assert relative(now, now) == "now"
    assert relative(now + 999, now) == "now" and relative(now - 999, now) == "now"
    assert relative(now + 3 * H + 12 * 60_000, now) == "in 3 h 12 min"
    assert relative(now - 120_000, now) == "2 min ago"
    assert relative(0, now) == "-"  # no time
    assert relative(1, now).endswith("years ago")  # 1970, from 2027
    assert relative(253_402_300_799_999, now).startswith("in 7,")


def test_a_time_tag_carries_the_exact_utc_time_on_hover() -> None:
    now = 1_800_000_000_000
    tag = str(time_tag(now - 120_000, now))
    assert tag == (
        '<time datetime="2027-01-15T07:58:00.000+00:00" '
        'title="2027-01-15 07:58:00.000 UTC">2 min ago</time>'
    )
    assert str(time_tag(0, now)) == "-"
    assert utc(now) == "2027-01-15 08:00:00.000 UTC" and utc(0) == "-"
    # Out of a datetime's range: the ms, still text.
    assert "ms" in str(time_tag(10**17, now))


# -- the first screen per task ---------------------------------------------------------


async def _fill(url: str, ns: str) -> None:
    """email: 6 due now; charge: 3 due in an hour, 2 dead, 1 waiting to retry;
    sync: 3 running (leased); XSS-named task: 1 due now."""
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many([JobSpec(f"dead{i}", "charge", {"n": i}) for i in range(2)])
        await sched.schedule_many([JobSpec("retry1", "charge", max_attempts=5)])
        for shard in range(SHARDS):
            await sched.take(shard)
            for job in (await sched.claim(shard, limit=100)).jobs:
                final = job.id.startswith("dead")
                error = "CardDeclined: " + XSS if final else "timeout"
                got = await sched.retry(job, error, final=final, delay=None if final else 600)
                assert got is (JobState.DEAD if final else JobState.DUE)
        await sched.schedule_many([JobSpec(f"sync{i}", "sync") for i in range(3)])
        for shard in range(SHARDS):  # leased, never acked: running
            await sched.claim(shard, limit=100)
        await sched.close()
        await sched.schedule_many([JobSpec(f"mail{i}", "email") for i in range(6)])
        await sched.schedule_many([JobSpec(f"pay{i}", "charge", delay=3600) for i in range(3)])
        await sched.schedule_many([JobSpec("x1", XSS)])


def test_the_first_screen_counts_per_task(redis_url: str) -> None:
    ns = unique_ns()
    run(_fill(redis_url, ns))
    time.sleep(0.01)  # the due-now jobs are past due
    with api_client(redis_url, ns) as client:
        data = client.get("/api/overview").json()
        rows = {r["task"]: r for r in data["tasks"]}
        assert set(rows) == {"email", "charge", "sync", XSS}
        assert rows["sync"]["running"] == 3 and rows["sync"]["pending"] == 0
        assert rows["email"]["running"] == 0
        assert data["tasks_exact"] is True
        email, charge = rows["email"], rows["charge"]
        assert (email["pending"], email["overdue"], email["dead"]) == (6, 6, 0)
        assert email["oldest_overdue_ms"] > 0 and email["lateness_ms"] >= 0
        assert (charge["pending"], charge["overdue"], charge["dead"]) == (4, 0, 2)
        assert charge["retrying"] == 1 and charge["next_due_ms"] > data["now_ms"]
        assert "CardDeclined" in charge["last_error"] and "\n" not in charge["last_error"]
        # Worst first: the task with dead letters leads.
        assert data["tasks"][0]["task"] == "charge"
        html = client.get("/").text
        row = re.search(r'<tr data-task="charge">.*?</tr>', html, re.S)
        assert row is not None
        assert re.search(r'data-c="dead"[^>]*><a href="/dead\?task=charge">2</a>', row[0])
        assert re.search(
            r'data-c="next"><time datetime="[^"]+" title="[^"]+ UTC">in 9 min 5\d s', row[0]
        )
        assert "<script>alert" not in html and "&lt;script&gt;alert" in html
        assert 'id="shards"' not in html  # the shard table lives on /internals
        assert "every shard fit" in html.lower()


def test_past_the_sample_counts_are_said_to_be_estimates(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = unique_ns()

    async def fill() -> None:
        async with open_scheduler(redis_url, ns, shards=SHARDS) as sched:
            await sched.schedule_many([JobSpec(f"b{i}", "b") for i in range(8)])
            await asyncio.sleep(0.005)  # the b jobs come first in each shard
            await sched.schedule_many([JobSpec(f"a{i}", "a") for i in range(60)])

    run(fill())
    monkeypatch.setattr(_tasks, "DUE_SAMPLE", 5)
    with api_client(redis_url, ns) as client:
        data = client.get("/api/overview").json()
        rows = {r["task"]: r for r in data["tasks"]}
        assert data["tasks_exact"] is False
        assert rows["a"]["pending_at_least"] and not rows["a"]["exact"]
        assert rows["a"]["pending"] <= SHARDS * 5
        # A task may hide past any shard's sample: no row claims to be exact.
        assert all(r["pending_at_least"] and not r["exact"] for r in data["tasks"])
        # Scaled to each shard's exact overdue: the two tasks sum to the exact total.
        total = rows["a"]["overdue"] + rows["b"]["overdue"]
        assert abs(total - data["totals"]["overdue"]) <= 2  # rounding per task
        html = client.get("/").text
        assert "≥ " in html and "lower bound" in html


def test_internals_page_and_its_json_twin(redis_url: str) -> None:
    ns = unique_ns()
    run(_fill(redis_url, ns))
    with api_client(redis_url, ns) as client:
        data = client.get("/api/internals").json()
        assert len(data["shards"]) == SHARDS and data["tasks"] == []  # no sample here
        assert data["totals"]["dead"] == 2
        html = client.get("/internals").text
        assert 'id="shards"' in html and 'href="/internals" class="here"' in html
        assert "<html" not in client.get("/internals?fragment=1").text
        assert 'href="/internals"' in client.get("/").text  # linked from the nav


# -- the scheduled list across shards --------------------------------------------------


async def _spread(url: str, ns: str) -> dict[str, int]:
    """40 jobs over every shard at distinct times, 12 more at one shared ms; id -> due."""
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        now = await sched.store.now(0)
        at = now + 600_000
        specs = [
            JobSpec(f"s{i}", "even" if i % 2 == 0 else "odd", at=now + 60_000 + i * 997 % 40_000)
            for i in range(40)
        ]
        specs += [JobSpec(f"tie{i}", "odd", at=at) for i in range(12)]
        await sched.schedule_many(specs)
        return {s.id: s.at for s in specs if s.at is not None}  # type: ignore[misc]


def _walk(client: object, params: dict[str, str]) -> list[dict[str, object]]:
    got: list[dict[str, object]] = []
    query = dict(params)
    for _ in range(200):
        r = client.get("/api/scheduled", params=query)  # type: ignore[attr-defined]
        assert r.status_code == 200, r.text
        page = r.json()
        got += page["jobs"]
        if page["next"] is None:
            return got
        query = {**params, "from": str(page["next"]["from_ms"]), "skip": str(page["next"]["skip"])}
    raise AssertionError("the pages never ended")


def test_the_scheduled_list_merges_every_shard_in_due_order(redis_url: str) -> None:
    ns = unique_ns()
    dues = run(_spread(redis_url, ns))
    with api_client(redis_url, ns) as client:
        first = client.get("/api/scheduled", params={"count": "7"}).json()
        assert first["total"] == 52 and len(first["jobs"]) == 7
        assert len({j["shard"] for j in first["jobs"]}) > 1  # not one shard's list
        every = _walk(client, {"count": "7"})
        ids = [str(j["id"]) for j in every]
        assert sorted(ids) == sorted(dues)  # each once, none lost at the 12-way tie
        whens = [int(j["when_ms"]) for j in every]  # type: ignore[call-overload]
        assert whens == sorted(whens)
        odd = _walk(client, {"count": "5", "task": "odd"})
        assert sorted(str(j["id"]) for j in odd) == sorted(
            i for i in dues if i.startswith("tie") or int(i[1:]) % 2 == 1
        )
        ties = _walk(client, {"count": "5", "prefix": "tie"})
        assert sorted(str(j["id"]) for j in ties) == sorted(f"tie{i}" for i in range(12))
        # Small reads: shards are cut, filtered pages end at the earliest cut shard (some
        # are empty), and the walk still yields every match once, in due order.
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_merge, "FILTER_READ", 3)
            small = _walk(client, {"count": "2", "task": "odd"})
            assert [j["id"] for j in small] == [j["id"] for j in odd]
            small = _walk(client, {"count": "1"})
            assert [j["id"] for j in small] == [j["id"] for j in every]
        html = client.get("/scheduled", params={"count": "7"}).text
        assert 'id="next"' in html and "every shard" in html and "<time datetime=" in html
        for bad in (
            {"count": "0"},
            {"count": "999"},
            {"skip": "-1"},
            {"skip": "990"},
            {"from": "later"},
        ):
            assert client.get("/api/scheduled", params=bad).status_code == 400, bad
        r = client.get("/api/scheduled", params={"task": "x" * 300})
        assert r.status_code == 400 and "task" in r.json()["error"]


# -- security of the new pages ---------------------------------------------------------


def test_new_pages_escape_what_jobs_carry_and_keep_the_guards(redis_url: str) -> None:
    ns = unique_ns()
    run(_fill(redis_url, ns))
    with api_client(redis_url, ns) as client:
        for path, params in (
            ("/", {}),
            ("/?fragment=1", {}),
            ("/internals", {}),
            ("/scheduled", {}),
            ("/scheduled", {"task": XSS}),
            ("/scheduled", {"prefix": XSS}),
        ):
            r = client.get(path, params=params)
            assert r.status_code == 200, (path, r.text)
            assert "<script>alert" not in r.text, (path, params)
            csp = r.headers.get("content-security-policy", "")
            assert "fragment" in path or "script-src 'nonce-" in csp
        assert "&lt;script&gt;alert" in client.get("/scheduled").text
        # The pause form on the first screen: only logged in, with the CSRF token.
        assert 'id="pause-form"' not in client.get("/").text
        r = client.post("/api/pause", json={"task": "email"})
        assert r.status_code == 401
        r = client.post("/pause", data={"task": "email"}, headers={"Origin": BASE})
        assert r.status_code == 401
    with api_client(redis_url, ns, protect_reads=True) as client:
        for path in ("/internals", "/scheduled"):
            r = client.get(path, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
        for path in ("/api/internals", "/api/scheduled"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers=bearer()).status_code == 200, path
        r = client.post("/login", data={"token": TOKEN}, headers={"Origin": BASE})
        assert client.get("/internals").status_code == 200


def test_a_records_task_is_read_or_none() -> None:
    import msgpack  # type: ignore[import-untyped]

    assert _tasks._task_of(msgpack.packb(b"email") + msgpack.packb(5)) == "email"
    assert _tasks._task_of(None) is None
    assert _tasks._task_of(b"") is None
    assert _tasks._task_of(b"\xc1") is None  # a byte msgpack never uses
    assert _tasks._task_of(msgpack.packb(7)) is None  # not a name
