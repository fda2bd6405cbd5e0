"""The dashboard's JSON API and pages through an ASGI test client (httpx), against a
real Redis and a real Redis Cluster with real jobs."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest
from dashboard_support import BASE, TOKEN, WorkerThread, api_client, bearer, login, wait_for
from dashboard_support import config as dashboard_config
from durable_support import open_scheduler, run, unique_ns
from starlette.testclient import TestClient

from tickwheel.durable import JobSpec, JobState, TaskRegistry
from tickwheel.durable.ops.dashboard import DashboardConfig, create_app
from tickwheel.durable.ops.dashboard._charts import Charts
from tickwheel.durable.ops.dashboard._page_dead import DeadFilter
from tickwheel.durable.ops.dashboard._rows import lateness_quantile
from tickwheel.durable.servers._redis import RedisServer, free_port
from tickwheel.durable.store import Sample
from tickwheel.durable.store._keys import Keys

pytestmark = pytest.mark.redis

SHARDS = 4
XSS = "<script>alert('x')</script>"


async def _schedule(url: str, ns: str, specs: list[JobSpec]) -> None:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many(specs)


async def _kill(url: str, ns: str, ids: list[str], error: str) -> None:
    """Make dead letters: schedule, claim and fail each for good."""
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many([JobSpec(i, "charge", {"n": i}) for i in ids])
        for shard in {sched.keys.shard_of(i) for i in ids}:
            await sched.take(shard)
            batch = await sched.claim(shard, limit=1000)
            for job in batch.jobs:
                if job.id in ids:
                    assert await sched.retry(job, error, final=True) is JobState.DEAD
        await sched.close()


def _ids_in_shard(ns: str, shard: int, n: int, prefix: str = "j") -> list[str]:
    keys = Keys(ns, SHARDS)
    out: list[str] = []
    i = 0
    while len(out) < n:
        if keys.shard_of(f"{prefix}{i}") == shard:
            out.append(f"{prefix}{i}")
        i += 1
    return out


def test_overview_counts_per_shard_and_totals(redis_url: str) -> None:
    ns = unique_ns()
    with api_client(redis_url, ns) as client:
        r = client.get("/api/overview")
        assert r.status_code == 200 and r.json()["created"] is False
        page = client.get("/")
        assert page.status_code == 200 and "does not exist yet" in page.text
        run(_kill(redis_url, ns, ["d1", "d2"], "boom"))  # (claims every due job)
        run(_schedule(redis_url, ns, [JobSpec(f"a{i}", "t", delay=3600) for i in range(12)]))
        run(_schedule(redis_url, ns, [JobSpec(f"b{i}", "t") for i in range(5)]))
        data = client.get("/api/overview").json()
        assert data["created"] is True
        assert len(data["shards"]) == SHARDS
        totals = data["totals"]
        assert totals["due"] == 17 and totals["dead"] == 2 and totals["leased"] == 0
        assert totals["overdue"] == 5  # due now, nobody claims them
        assert sum(s["due"] for s in data["shards"]) == 17
        assert totals["next_due_ms"] > data["now_ms"]
        html = client.get("/").text
        assert re.search(r'id="total-due"[^>]*>17<', html)
        assert re.search(r'id="total-dead"[^>]*>2<', html)
        fragment = client.get("/?fragment=1").text
        assert "<html" not in fragment and re.search(r'id="total-due"[^>]*>17<', fragment)
        # Members without stats: live while their beat is fresh, gone past the TTL.
        run(_members(redis_url, ns, {"fresh-one": 0, "ghost": -60_000}))
        workers = client.get("/api/overview").json()["workers"]
        assert [w["token"] for w in workers] == ["fresh-one"]
        assert workers[0]["name"] == "fresh-one" and workers[0]["counters"] == {}


async def _members(url: str, ns: str, ages: dict[str, int]) -> None:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        now = await sched.store.now(0)
        await sched.store.client.zadd(sched.keys.workers, {t: now + a for t, a in ages.items()})


def test_a_malformed_stats_document_is_skipped_not_a_failure(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("j", "t", delay=60)]))
    bad = {
        "not-json": "{",
        "a-list": "[1, 2]",
        "counters-text": json.dumps({"v": 1, "t": 5, "c": "lots"}),
        "no-clock": json.dumps({"v": 1, "c": [1, 2, 3, 4, 5]}),
    }
    good = {"v": 1, "t": 5, "host": "h", "pid": 7, "owned": 1, "c": [1, 2, 3, 4, 5]}

    async def publish() -> None:
        async with open_scheduler(redis_url, ns, shards=SHARDS) as sched:
            for token, text in bad.items():
                await sched.store.client.set(sched.keys.worker_stats(token), text)
            await sched.workers.publish("fine", good, 10_000)
            got = {m.token: m.stats for m in await sched.workers.members()}
            assert got == {}  # nobody beat yet: the documents alone are no members
            for token in [*bad, "fine"]:
                await sched.workers.heartbeat(token, 10_000, True)
            with caplog.at_level(logging.WARNING, logger="tickwheel.durable"):
                got = {m.token: m.stats for m in await sched.workers.members()}
            assert got == {**dict.fromkeys(bad), "fine": good}
            warned = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
            assert sorted(warned) == sorted(
                f"worker {t!r}: its stats document is malformed; skipped" for t in bad
            )
            # A heartbeat score that is no finite ms (written by hand) reads as none.
            await sched.store.client.zadd(sched.keys.workers, {"inf-beat": float("inf")})
            beats = {m.token: m.beat_ms for m in await sched.workers.members()}
            assert beats["inf-beat"] == 0
            await sched.store.client.zrem(sched.keys.workers, "inf-beat")

    run(publish())
    with api_client(redis_url, ns) as client:
        r = client.get("/api/overview")
        assert r.status_code == 200, r.text
        workers = {w["token"]: w for w in r.json()["workers"]}
        assert set(workers) == {*bad, "fine"}  # their beats are fresh
        assert all(workers[t]["stats"] == {} and workers[t]["counters"] == {} for t in bad)
        assert workers["fine"]["name"].startswith("h:7/") and workers["fine"]["owned"] == 1
        assert client.get("/api/charts").status_code == 200


def test_lookup_by_id_shows_state_task_payload_and_clear_errors(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("order:1", "charge", {"amount": 5}, delay=60)]))
    with api_client(redis_url, ns) as client:
        job = client.get("/api/job", params={"id": "order:1"}).json()["job"]
        assert job["state"] == "due" and job["task"] == "charge"
        assert json.loads(job["payload"]) == {"amount": 5}
        assert job["attempt"] == 1 and job["shard"] == Keys(ns, SHARDS).shard_of("order:1")
        assert 0 < job["in_ms"] <= 60_000
        missing = client.get("/api/job", params={"id": "nope"})
        assert missing.status_code == 404 and "no job 'nope'" in missing.json()["error"]
        for bad in ("", "x" * 300):
            r = client.get("/api/job", params={"id": bad})
            assert r.status_code == 400 and "job_id" in r.json()["error"]
        page = client.get("/job", params={"id": "x" * 300})
        assert page.status_code == 400 and "job_id must be at most" in page.text
        assert client.get("/job", params={"id": "nope"}).status_code == 404


def test_payloads_ids_and_errors_render_as_text(redis_url: str) -> None:
    ns = unique_ns()
    evil = f"x{XSS}"
    run(_schedule(redis_url, ns, [JobSpec(evil, XSS, {"note": XSS}, delay=60)]))
    run(_kill(redis_url, ns, ["dead" + XSS], XSS))
    with api_client(redis_url, ns) as client:
        for path, params in (
            ("/job", {"id": evil}),
            ("/scheduled", {"shard": str(Keys(ns, SHARDS).shard_of(evil))}),
            ("/dead", {}),
            ("/job", {"id": "nope" + XSS}),
        ):
            r = client.get(path, params=params)
            assert "<script>alert" not in r.text, path
            assert "&lt;script&gt;alert" in r.text, path
            # The one script a page may run carries the response's nonce.
            csp = r.headers["content-security-policy"]
            assert "script-src 'nonce-" in csp and "unsafe-inline" not in csp


def test_a_long_payload_is_cut_and_said_to_be(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("big", "t", b"y" * 5000, delay=60)]))
    with api_client(redis_url, ns) as client:
        job = client.get("/api/job", params={"id": "big"}).json()["job"]
        assert job["payload_truncated"] and job["payload_chars"] == 5000
        assert len(job["payload"]) == 2000
        assert "cut at 2000 of 5000 characters" in client.get("/job?id=big").text


def test_writes_need_the_token_and_a_csrf_check(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec(f"w{i}", "t", delay=60) for i in range(6)]))
    with api_client(redis_url, ns) as client:
        # No token: refused, nothing written.
        r = client.post("/api/job/cancel", json={"id": "w0"})
        assert r.status_code == 401 and "token" in r.json()["error"]
        r = client.post("/job/cancel", data={"id": "w0"}, headers={"Origin": BASE})
        assert r.status_code == 401 and "log in" in r.text
        r = client.post(
            "/api/job/cancel", json={"id": "w0"}, headers={"Authorization": "Bearer no"}
        )
        assert r.status_code == 401
        assert client.get("/api/job", params={"id": "w0"}).status_code == 200
        # A wrong token does not log in.
        r = client.post("/login", data={"token": "wrong"}, headers={"Origin": BASE})
        assert r.status_code == 401 and "wrong token" in r.text
        # The token as a bearer header (a script): allowed.
        r = client.post("/api/job/cancel", json={"id": "w0"}, headers=bearer())
        assert r.status_code == 200 and "cancelled" in r.json()["message"]
        assert client.get("/api/job", params={"id": "w0"}).status_code == 404
        # A session: the CSRF token and the same origin are both needed.
        csrf = login(client)
        r = client.post("/job/cancel", data={"id": "w1"}, headers={"Origin": BASE})
        assert r.status_code == 403 and "CSRF" in r.text
        r = client.post(
            "/job/cancel", data={"id": "w1", "csrf": "x" * 40}, headers={"Origin": BASE}
        )
        assert r.status_code == 403
        evil = {"Origin": "http://evil.example"}
        r = client.post("/job/cancel", data={"id": "w1", "csrf": csrf}, headers=evil)
        assert r.status_code == 403 and "cross-origin" in r.text
        r = client.post("/job/cancel", data={"id": "w1", "csrf": csrf})  # no Origin/Referer
        assert r.status_code == 403
        assert client.get("/api/job", params={"id": "w1"}).status_code == 200
        r = client.post("/job/cancel", data={"id": "w1", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 200 and "cancelled job" in r.text
        r = client.post(
            "/api/job/cancel",
            json={"id": "w2"},
            headers={"X-CSRF-Token": csrf, "Referer": f"{BASE}/job?id=w2"},
        )
        assert r.status_code == 200
        # A bearer write from a foreign page is refused too.
        r = client.post("/api/job/cancel", json={"id": "w3"}, headers={**bearer(), **evil})
        assert r.status_code == 403
        # Logged out: the session is gone.
        client.post("/logout", data={"csrf": csrf}, headers={"Origin": BASE})
        r = client.post("/job/cancel", data={"id": "w3", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 401
        # A foreign Host (DNS rebinding) is not served.
        assert client.get("/", headers={"Host": "evil.example"}).status_code == 400


def test_only_the_exact_token_is_a_bearer(redis_url: str) -> None:
    """README: every write needs the token, as ``Authorization: Bearer TOKEN``. Only
    that exact token under the Bearer scheme writes: an empty bearer, a prefix of the
    token, the token with a suffix, another scheme or no scheme are refused (401) and
    the job is still there; logging in takes the exact token only, too."""
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("b0", "t", delay=60)]))
    refused = [
        "Bearer ",
        "Bearer",
        f"Bearer {TOKEN[:1]}",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN} {TOKEN}",
        f"Basic {TOKEN}",
        f"Token {TOKEN}",
        TOKEN,
    ]
    with api_client(redis_url, ns) as client:
        for auth in refused:
            r = client.post("/api/job/cancel", json={"id": "b0"}, headers={"Authorization": auth})
            assert r.status_code == 401, (auth, r.status_code, r.text)
            assert client.get("/api/job", params={"id": "b0"}).status_code == 200, auth
        for given in ("", TOKEN[:1], TOKEN[:-1], f"{TOKEN}x"):
            r = client.post("/login", data={"token": given}, headers={"Origin": BASE})
            assert r.status_code == 401 and "wrong token" in r.text, given
            r = client.post("/api/job/cancel", json={"id": "b0"})
            assert r.status_code == 401, given  # no session was made
        assert client.get("/api/job", params={"id": "b0"}).status_code == 200
        # The exact token (the scheme in any case) writes.
        r = client.post(
            "/api/job/cancel", json={"id": "b0"}, headers={"Authorization": f"bearer {TOKEN}"}
        )
        assert r.status_code == 200 and "cancelled" in r.json()["message"]
        assert client.get("/api/job", params={"id": "b0"}).status_code == 404


def test_a_session_expires_and_its_cookie_is_secure_over_https(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("e1", "t", delay=60)]))
    # A TTL long enough for the login and the page read before it on a loaded machine
    # (1.5 s ran out before the page was read once, at load 10: the login page came back).
    with api_client(redis_url, ns, session_ttl=3.5) as client:
        r = client.post("/login", data={"token": TOKEN}, headers={"Origin": BASE})
        cookie = r.history[0].headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=4" in cookie
        assert "secure" not in cookie.replace("samesite", "")  # plain http: never sent back
        page = client.get("/job").text
        marker = 'name="csrf" value="'
        start = page.index(marker) + len(marker)
        csrf = page[start : page.index('"', start)]
        # The server refuses an expired session even if the browser still sends it.
        time.sleep(3.6)
        r = client.post("/job/cancel", data={"id": "e1", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 401
        assert client.get("/api/job", params={"id": "e1"}).status_code == 200
        # A new login works again.
        csrf = login(client)
        r = client.post("/job/cancel", data={"id": "e1", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 200 and "cancelled job" in r.text
    https = "https://127.0.0.1"
    app = create_app(dashboard_config(redis_url, ns))
    with TestClient(app, base_url=https) as client:
        r = client.post(
            "/login", data={"token": TOKEN}, headers={"Origin": https}, follow_redirects=False
        )
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower()
    for bad in (0, -1, float("inf"), float("nan"), True, "60"):
        with pytest.raises(ValueError, match="session_ttl"):
            DashboardConfig(redis_url, session_ttl=bad)  # type: ignore[arg-type]


def test_read_only_refuses_every_write(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("r1", "t", delay=60)]))
    run(_kill(redis_url, ns, ["rd"], "boom"))
    with api_client(redis_url, ns, read_only=True) as client:
        for path, body in (
            ("/api/job/cancel", {"id": "r1"}),
            ("/api/job/run-now", {"id": "r1"}),
            ("/api/job/reschedule", {"id": "r1", "delay": 5}),
            ("/api/dead/requeue", {"ids": ["rd"]}),
            ("/api/dead/purge", {"ids": ["rd"]}),
            ("/api/dead/bulk/purge", {"all": "1"}),
        ):
            r = client.post(path, json=body, headers=bearer())
            assert r.status_code == 403 and "read-only" in r.json()["error"], path
        assert client.get("/api/job", params={"id": "r1"}).json()["job"]["state"] == "due"
        assert client.get("/api/overview").json()["totals"]["dead"] == 1
        page = client.get("/job", params={"id": "r1"}).text
        assert "Read-only dashboard" in page and 'id="cancel"' not in page


def test_cancel_reschedule_run_now_and_stale_actions(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec(f"c{i}", "t", delay=600) for i in range(3)]))
    run(_kill(redis_url, ns, ["cd"], "boom"))
    h = bearer()
    with api_client(redis_url, ns) as client:
        seen = client.get("/api/job", params={"id": "c0"}).json()["job"]["seen"]
        r = client.post(
            "/api/job/reschedule", json={"id": "c0", "seen": seen, "delay": 30}, headers=h
        )
        assert r.status_code == 200, r.text
        job = client.get("/api/job", params={"id": "c0"}).json()["job"]
        assert 0 < job["in_ms"] <= 30_000
        # The page's view is stale now (a new occurrence): refused, nothing written.
        r = client.post("/api/job/cancel", json={"id": "c0", "seen": seen}, headers=h)
        assert r.status_code == 409 and "moved on" in r.json()["error"]
        assert client.get("/api/job", params={"id": "c0"}).status_code == 200
        r = client.post("/api/job/run-now", json={"id": "c0", "seen": job["seen"]}, headers=h)
        assert r.status_code == 200 and "runs now" in r.json()["message"]
        assert client.get("/api/job", params={"id": "c0"}).json()["job"]["in_ms"] <= 0
        at = "2100-01-01T00:00:00Z"
        r = client.post("/api/job/reschedule", json={"id": "c1", "at": at}, headers=h)
        assert r.status_code == 200
        assert client.get("/api/job", params={"id": "c1"}).json()["job"]["when"].startswith("2100")
        for body, word in (
            ({"id": "c2", "delay": "soon"}, "delay"),
            ({"id": "c2", "delay": "-1"}, "delay"),
            ({"id": "c2", "at": "tomorrow"}, "at must"),
            ({"id": "c2", "at": "2100-01-01T00:00:00"}, "zone"),
            ({"id": "c2"}, "give a delay"),
            ({"id": "c2", "delay": "1", "at": at}, "not both"),
            ({"id": ""}, "job_id"),
        ):
            r = client.post("/api/job/reschedule", json=body, headers=h)
            assert r.status_code == 400 and word in r.json()["error"], body
        r = client.post("/api/job/run-now", json={"id": "cd"}, headers=h)
        assert r.status_code == 409 and "only a due job" in r.json()["error"]
        r = client.post("/api/job/cancel", json={"id": "gone"}, headers=h)
        assert r.status_code == 409 and "gone" in r.json()["error"]
        r = client.post("/api/job/explode", json={"id": "c2"}, headers=h)
        assert r.status_code == 404
        r = client.post(
            "/api/job/cancel",
            content=b"{not json",
            headers={**h, "Content-Type": "application/json"},
        )
        assert r.status_code == 400 and "JSON object" in r.json()["error"]


def test_dead_letters_list_filter_requeue_and_purge(redis_url: str) -> None:
    ns = unique_ns()
    run(_kill(redis_url, ns, [f"p{i}" for i in range(4)], "PaymentDeclined: card expired"))
    run(_kill(redis_url, ns, [f"q{i}" for i in range(3)], "TimeoutError"))
    h = bearer()
    with api_client(redis_url, ns) as client:
        d = client.get("/api/dead").json()
        assert d["total_dead"] == 7 and len(d["jobs"]) == 7
        row = next(j for j in d["jobs"] if j["id"] == "p0")
        assert row["last_error"].startswith("PaymentDeclined") and row["attempt"] == 1
        d = client.get("/api/dead", params={"reason": "declined"}).json()
        assert sorted(j["id"] for j in d["jobs"]) == ["p0", "p1", "p2", "p3"]
        d = client.get("/api/dead", params={"reason": "timeout", "count": "2"}).json()
        assert len(d["jobs"]) == 2
        d2 = client.get(
            "/api/dead", params={"reason": "timeout", "count": "2", "offset": "2"}
        ).json()
        assert len(d2["jobs"]) == 1 and d2["jobs"][0]["id"] not in {j["id"] for j in d["jobs"]}
        for params, word in (
            ({"shard": "99"}, "shard"),
            ({"shard": "x"}, "shard"),
            ({"count": "0"}, "count"),
            ({"offset": "-1"}, "offset"),
            ({"task": "t" * 200}, "task"),
        ):
            r = client.get("/api/dead", params=params)
            assert r.status_code == 400 and word in r.json()["error"], params
        assert client.get("/dead", params={"shard": "x"}).status_code == 400
        # One at a time.
        r = client.post("/api/dead/requeue", json={"ids": ["p0"]}, headers=h)
        assert r.status_code == 200 and r.json()["requeued"] == ["p0"]
        assert client.get("/api/job", params={"id": "p0"}).json()["job"]["state"] == "due"
        r = client.post("/api/dead/purge", json={"ids": ["p1"]}, headers=h)
        assert r.status_code == 200 and r.json()["purged"] == ["p1"]
        assert client.get("/api/job", params={"id": "p1"}).status_code == 404
        # Stale: p0 is not dead any more.
        r = client.post("/api/dead/purge", json={"ids": ["p0"]}, headers=h)
        assert r.status_code == 409 and "not dead letters" in r.json()["error"]
        r = client.post("/api/dead/purge", json={"ids": []}, headers=h)
        assert r.status_code == 400
        # In bulk, over a filter.
        r = client.post("/api/dead/bulk/requeue", json={"reason": "declined"}, headers=h)
        assert r.status_code == 200 and sorted(r.json()["requeued"]) == ["p2", "p3"]
        r = client.post("/api/dead/bulk/purge", json={}, headers=h)
        assert r.status_code == 400 and "all dead letters" in r.json()["error"]
        r = client.post(
            "/api/dead/bulk/purge", json={"task": "charge", "reason": "timeout"}, headers=h
        )
        assert r.status_code == 200 and r.json()["count"] == 3
        assert client.get("/api/overview").json()["totals"]["dead"] == 0
        run(_kill(redis_url, ns, ["z1", "z2"], "x"))
        r = client.post("/api/dead/bulk/purge", json={"all": "1"}, headers=h)
        assert r.json()["count"] == 2


def test_scheduled_jobs_of_a_shard_paged_by_due_time(redis_url: str) -> None:
    ns = unique_ns()
    ids = _ids_in_shard(ns, 1, 25)
    run(_schedule(redis_url, ns, [JobSpec(i, "t", delay=100 + n) for n, i in enumerate(ids)]))

    async def recurring() -> None:
        async with open_scheduler(redis_url, ns, shards=SHARDS) as sched:
            await sched.schedule("rec", "tick", every=60)
            await sched.schedule("nightly", "report", cron="0 3 * * *", missed="skip")

    run(recurring())
    with api_client(redis_url, ns) as client:
        s = client.get("/api/scheduled", params={"shard": "1", "count": "10"}).json()
        keys = Keys(ns, SHARDS)
        assert s["total"] == 25 + sum(keys.shard_of(i) == 1 for i in ("rec", "nightly"))
        first = [j for j in s["jobs"] if j["id"] not in ("rec", "nightly")]
        assert [j["id"] for j in first] == ids[: len(first)]
        s2 = client.get(
            "/api/scheduled", params={"shard": "1", "count": "10", "offset": "10"}
        ).json()
        whens = [j["when_ms"] for j in s["jobs"] + s2["jobs"]]
        assert whens == sorted(whens) and len(whens) == 20
        cut = s2["jobs"][0]["when_ms"]
        s3 = client.get(
            "/api/scheduled", params={"shard": "1", "from": str(cut), "count": "5"}
        ).json()
        assert s3["jobs"][0]["when_ms"] >= cut and s3["start_rank"] == 10
        page = client.get("/scheduled", params={"shard": "1"}).text
        assert ids[0] in page and 'id="next"' not in page
        for params in (
            {"shard": "9"},
            {"shard": "a"},
            {"shard": "0", "count": "5000"},
            {"shard": "0", "from": "later"},
        ):
            assert client.get("/api/scheduled", params=params).status_code == 400, params

        # Recurring series: interval and cron, with policy and next occurrence.
        rec = client.get("/api/recurring").json()
        assert rec["complete"] is True
        by_id = {j["id"]: j for j in rec["jobs"]}
        assert set(by_id) == {"rec", "nightly"}
        assert by_id["rec"]["recurring"].startswith("every 60s, missed: once")
        assert by_id["nightly"]["recurring"].startswith("cron 0 3 * * *, missed: skip")
        assert "T03:00:00" in by_id["nightly"]["next"]
        assert "nightly" in client.get("/recurring").text


def test_workers_and_live_charts_from_published_stats(redis_url: str) -> None:
    ns = unique_ns()
    reg = TaskRegistry()
    failing: set[str] = {"f0", "f1"}

    @reg.task(name="t")
    async def task(ctx: Any) -> None:
        if ctx.job_id in failing:
            raise RuntimeError("nope")

    run(_schedule(redis_url, ns, [JobSpec("warm", "t", delay=600)]))
    with api_client(redis_url, ns) as client, WorkerThread(redis_url, ns, reg):
        assert wait_for(lambda: len(client.get("/api/overview").json()["workers"]) == 1, 20)
        specs = [JobSpec(f"n{i}", "t") for i in range(40)]
        specs += [JobSpec(i, "t", max_attempts=1) for i in failing]
        run(_schedule(redis_url, ns, specs))

        def done() -> bool:
            o = client.get("/api/overview").json()
            return (
                o["totals"]["due"] == 1 and o["totals"]["dead"] == 2 and o["totals"]["leased"] == 0
            )

        assert wait_for(done, 30)

        def counted() -> bool:
            w = client.get("/api/overview").json()["workers"][0]
            return w["counters"].get("acked", 0) >= 40 and w["counters"].get("dead_letters") == 2

        assert wait_for(counted, 30)
        worker = client.get("/api/overview").json()["workers"][0]
        assert worker["owned"] == SHARDS and worker["beat_age_ms"] < 10_000
        assert sum(worker["stats"]["lat"]) >= 42  # every fired job observed once

        def charted() -> bool:
            pts = client.get("/api/charts").json()["points"]
            return sum(p["acked"] for p in pts) > 0 and any(p["p50"] is not None for p in pts)

        assert wait_for(charted, 30)
        charts = client.get("/api/charts").json()
        assert charts["counters"] == [
            "claimed",
            "acked",
            "retries",
            "dead_letters",
            "reaped",
            "timeouts",
        ]
        html = client.get("/").text
        assert 'id="tasks"' in html and "live workers" in html
        assert 'id="workers"' in client.get("/internals").text  # moved off the first screen
        assert client.get("/api/internals").json()["workers"][0]["token"] == worker["token"]
        token = worker["token"]
        # The document under {ns}:wstats:<token>, with the member TTL (10 s).
        doc, ttl = run(_stats_key(redis_url, ns, token))
        assert doc is not None and 0 < ttl <= 10_000
        assert doc["v"] == 1 and doc["owned"] == SHARDS and len(doc["c"]) == 6
        assert len(doc["lat"]) == 16 and doc["t"] > 0
        # Per task: runs, acks, retries, dead letters, then its lateness buckets.
        runs, acked, retries, dead, late_us, *lat = doc["tasks"]["t"]
        assert runs >= 42 and acked >= 40 and (retries, dead) == (0, 2) and len(lat) == 16
        assert late_us >= 0 and sum(lat) == runs

        def per_task() -> dict[str, Any] | None:
            rows = {r["task"]: r for r in client.get("/api/overview").json()["tasks"]}
            tp = rows.get("t", {}).get("throughput")
            return tp if tp and tp["acked"] >= 40 and tp["dead"] == 2 else None

        assert wait_for(per_task, 20)
        tp = per_task()
        assert tp is not None and tp["acked_per_min"] > 0 and tp["lateness_p99"] is not None
        assert 'data-c="rate"' in client.get("/").text
    # The stats key leaves with the worker.
    assert run(_stats_key(redis_url, ns, token)) == (None, -2)
    # A dashboard started after all that shows it: the samples are kept in Redis.
    with api_client(redis_url, ns) as fresh:

        def history() -> bool:
            pts = fresh.get("/api/charts").json()["points"]
            return sum(p["dead_letters"] for p in pts) > 0 and sum(p["acked"] for p in pts) > 0

        assert wait_for(history, 20)
        rows = {r["task"]: r for r in fresh.get("/api/overview").json()["tasks"]}
        assert rows["t"]["throughput"]["dead"] == 2


async def _stats_key(url: str, ns: str, token: str) -> tuple[Any, int]:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        key = sched.keys.worker_stats(token)
        raw: Any = await sched.store.client.get(key)
        ttl = int(await sched.store.client.pttl(key))
        return (None if raw is None else json.loads(raw)), ttl


def _sample(t_ms: int, dt: int, c: list[int], lat: list[int] | None = None, **kw: Any) -> Sample:
    data: dict[str, Any] = {"dt": dt, "c": c, "lat": lat or [0] * 16, **kw}
    return Sample(f"{t_ms}-0", t_ms, data)


def test_charts_spread_each_sample_over_the_buckets_it_covers() -> None:
    charts = Charts(1.0)
    lat = [0] * 16
    lat[3] = 10  # ten jobs fired <= 10 ms late
    # Worker a: 20 acks over 100_000..102_000; worker b: 4 acks over 101_000..102_000.
    charts.add([_sample(102_000, 2000, [20, 20, 4, 2, 0, 0], lat)], 120_000)
    charts.add([_sample(102_000, 1000, [4, 4, 0, 0, 0, 0], None)], 120_000)
    by_t = {p["t"]: p for p in charts.points}
    assert by_t[101_000]["acked"] == 10.0 and by_t[102_000]["acked"] == 14.0
    assert by_t[101_000]["retries"] == 2.0 and by_t[102_000]["dead_letters"] == 1.0
    assert by_t[101_000]["p50"] == 0.01 and by_t[102_000]["p99"] == 0.01
    assert by_t[101_000]["fired"] == 5 and by_t[103_000]["acked"] == 0.0  # idle: zero
    assert charts.last_id == "102000-0" and charts.series()["points"] == charts.points
    # A bucket is drawn once complete: not within a sample period (and margin) of now.
    assert max(by_t) <= 120_000 - charts.lag_ms()
    # Older than the hour: dropped.
    charts.add([], 102_000 + 3_700_000 + 10_000)
    assert not charts.samples and charts.points == []


def test_charts_per_task_over_the_window() -> None:
    charts = Charts(5.0)
    row = [3, 2, 1, 0, 9000] + [0] * 16
    row[5 + 2] = 3  # all three fired <= 5 ms late
    old = [50, 50, 0, 0, 0] + [0] * 16
    charts.add(
        [
            _sample(1_000_000, 10_000, [0] * 6, tasks={"send": old}),  # before the window
            _sample(1_300_000, 10_000, [0] * 6, tasks={"send": row, "": [1, 0, 0, 1, 0]}),
            _sample(1_305_000, 10_000, [0] * 6, tasks={"send": row}),
        ],
        1_310_000,
    )
    send = charts.per_task(300)["send"]
    assert (send["runs"], send["acked"], send["retries"], send["dead"]) == (6, 4, 2, 0)
    # 4 acks over the 20 s the window's samples cover (1_290_000 to now), not 300 s.
    assert send["acked_per_min"] == 12.0 and send["lateness_p50"] == 0.005
    assert (
        charts.per_task(300)[""]["dead"] == 1 and charts.per_task(300)[""]["lateness_p99"] is None
    )


def test_redis_unreachable_is_said_without_the_password_and_recovers() -> None:
    port = free_port()
    url = f"redis://admin:s3cret-pw@127.0.0.1:{port}/0"
    ns = unique_ns()
    with api_client(url, ns) as client:
        for path in ("/", "/?fragment=1", "/job?id=x", "/dead", "/api/overview", "/api/job?id=x"):
            r = client.get(path)
            assert r.status_code == 503, path
            assert "unreachable" in r.text and f"127.0.0.1:{port}" in r.text, path
            assert "s3cret" not in r.text, path
        r = client.post("/api/job/cancel", json={"id": "x"}, headers=bearer())
        assert r.status_code == 503 and "s3cret" not in r.text
        acl = ["--user", "admin", "on", ">s3cret-pw", "~*", "&*", "+@all"]
        with RedisServer(port=port, extra_args=acl):
            run(_schedule(url, ns, [JobSpec("j", "t", delay=60)]))
            assert wait_for(lambda: client.get("/api/overview").status_code == 200, 20)
            assert client.get("/api/overview").json()["totals"]["due"] == 1
            page = client.get("/")
            assert page.status_code == 200 and "s3cret" not in page.text
        assert wait_for(lambda: client.get("/api/overview").status_code == 503, 20)


def test_protected_reads_need_the_token() -> None:
    with api_client("redis://127.0.0.1:1/0", unique_ns(), protect_reads=True) as client:
        r = client.get("/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        assert client.get("/api/overview").status_code == 401
        assert client.get("/api/history").status_code == 401
        assert client.get("/history", follow_redirects=False).status_code == 303
        assert client.get("/api/overview", headers=bearer()).status_code == 503  # no Redis
        r = client.post(
            "/login", data={"token": TOKEN}, headers={"Origin": BASE}, follow_redirects=False
        )
        assert r.status_code == 303
        assert client.get("/api/overview").status_code == 503  # in: only Redis is missing


def test_lateness_quantiles_and_dead_filter() -> None:
    assert lateness_quantile([0] * 16, 0.5) is None
    counts = [0] * 16
    counts[2] = 90  # <= 5 ms
    counts[6] = 10  # <= 100 ms
    assert lateness_quantile(counts, 0.5) == 0.005
    assert lateness_quantile(counts, 0.99) == 0.1
    counts[15] = 1000
    assert lateness_quantile(counts, 0.99) == float("inf")
    flt = DeadFilter.parse(" charge ", "Declined", "", 4)
    assert flt.task == "charge" and not flt.empty
    assert DeadFilter.parse("", "", "", 4).empty


def test_an_error_reply_is_a_502_with_the_reply(redis_url: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_url, ns, [JobSpec("j", "t", delay=60)]))

    async def spoil() -> None:
        async with open_scheduler(redis_url, ns, shards=SHARDS) as sched:
            await sched.store.client.set(sched.keys.workers, "not a sorted set")

    run(spoil())
    with api_client(redis_url, ns) as client:
        r = client.get("/api/overview")
        assert r.status_code == 502 and "WRONGTYPE" in r.json()["error"]
        assert client.get("/").status_code == 502
        assert client.get("/api/job", params={"id": "j"}).status_code == 200  # the rest works


def test_a_far_index_too_long_to_list_is_said_not_hidden(redis_url: str) -> None:
    ns = unique_ns()

    async def fill() -> None:
        async with open_scheduler(redis_url, ns, shards=1) as sched:
            # All in one minute of the far index: from that minute's start, not from an
            # hour from now, which put the last ~1.7% of runs across two minutes (the
            # listing then stopped in the first one, before reading too much).
            at = (await sched.now(0) + 3_600_000) // 60_000 * 60_000
            for start in range(0, 51_000, 1000):  # past the 50,000 a listing reads
                await sched.schedule_many(
                    JobSpec(f"f{i}", "t", at=at + i % 1000) for i in range(start, start + 1000)
                )
            await sched.schedule("rec", "tick", every=3600)

    run(fill())
    with api_client(redis_url, ns) as client:
        r = client.get("/api/scheduled", params={"shard": "0", "count": "10"})
        assert r.status_code == 409 and "ListingTooLong" in r.json()["error"], r.text
        rec = client.get("/api/recurring").json()  # answers, and says it is not complete
        assert rec["complete"] is False
        assert client.get("/api/overview").json()["totals"]["due"] == 51_001
