"""The history of finished attempts: written by a real worker to each shard's capped
stream, shown on the job page (its attempts, also once the job is gone) and on the
history page across shards (filters, paging), on one Redis and a Redis Cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dashboard_support import WorkerThread, api_client, wait_for
from durable_support import open_scheduler, run, unique_ns

from tickwheel.durable import JobSpec, TaskRegistry
from tickwheel.durable.model import Job
from tickwheel.durable.ops.dashboard import _page_history
from tickwheel.durable.runtime._history import MAX_PENDING, HistoryRecorder, first_line

SHARDS = 4
XSS = "<script>alert('x')</script>"


async def _schedule(url: str, ns: str, specs: list[JobSpec]) -> None:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many(specs)


def test_attempts_and_the_history_page(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = unique_ns()
    reg = TaskRegistry()
    failed_once: set[str] = set()

    @reg.task(name="pay")
    async def pay(ctx: Any) -> None:
        if ctx.job_id.startswith("flaky") and ctx.job_id not in failed_once:
            failed_once.add(ctx.job_id)
            raise RuntimeError("card declined\nsecond line")
        if ctx.job_id.startswith("bad"):
            raise ValueError(f"no such account {XSS}")

    @reg.task(name="mail")
    async def mail(ctx: Any) -> None:
        await asyncio.sleep(0.05)

    specs = [JobSpec(f"ok{i}", "mail") for i in range(12)]
    specs += [JobSpec("flaky", "pay", max_attempts=3), JobSpec(f"bad{XSS}", "pay", max_attempts=1)]
    worker = WorkerThread(redis_url, ns, reg, shards=SHARDS, history=True)
    with api_client(redis_url, ns) as client, worker:
        run(_schedule(redis_url, ns, specs))

        def finished() -> dict[str, Any] | None:
            got = client.get("/api/history", params={"id": "flaky"}).json()["attempts"]
            return got if len(got) == 2 else None

        assert wait_for(finished, 30)
        flaky = finished()
        assert flaky is not None
        first, second = flaky
        assert (first["attempt"], first["outcome"], first["task"]) == (1, "retried", "pay")
        assert first["error"] == "RuntimeError('card declined\\nsecond line')"
        assert (second["attempt"], second["outcome"], second["error"]) == (2, "acked", "")
        for a in flaky:
            assert 0 < a["started_ms"] <= a["ended_ms"] and a["took_ms"] >= 0
            assert ":" in a["worker"]  # host:pid
        # The job is gone (acked): its page says so and still shows its attempts.
        page = client.get("/job", params={"id": "flaky"})
        assert page.status_code == 404 and 'id="attempts"' in page.text
        assert "card declined" in page.text and "acked" in page.text
        # A dead letter: its record and its attempt, the error escaped.
        dead = client.get("/api/job", params={"id": f"bad{XSS}"}).json()
        assert [a["outcome"] for a in dead["attempts"]] == ["dead"]
        page = client.get("/job", params={"id": f"bad{XSS}"}).text
        assert "no such account" in page and "<script>alert" not in page

        def all_done() -> bool:
            rows = client.get("/api/history", params={"count": "100"}).json()["entries"]
            return len(rows) == 15

        assert wait_for(all_done, 20)
        rows = client.get("/api/history", params={"count": "100"}).json()["entries"]
        ends = [(r["ended_ms"], r["entry"]) for r in rows]
        assert [r["entry"] for r in rows] == sorted(
            (r["entry"] for r in rows), key=lambda i: tuple(map(int, i.split("-"))), reverse=True
        ), ends
        mail = client.get("/api/history", params={"task": "mail"}).json()["entries"]
        assert len(mail) == 12 and {r["outcome"] for r in mail} == {"acked"}
        assert all(r["took_ms"] >= 50 for r in mail)  # each slept 50 ms
        deads = client.get("/api/history", params={"outcome": "dead"}).json()["entries"]
        assert [r["id"] for r in deads] == [f"bad{XSS}"]
        # Paged: 5 at a time, newest first, nothing twice, nothing left out.
        seen: list[str] = []
        before = ""
        for _ in range(10):
            got = client.get("/api/history", params={"count": "5", "before": before}).json()
            seen += [r["entry"] for r in got["entries"]]
            before = got["next"]
            if not before:
                break
        assert len(seen) == len(set(seen)) == 15
        # Filtered, with shards read 3 entries at a time: pages go on past the shards
        # read in full, and still show every match once.
        monkeypatch.setattr(_page_history, "HISTORY_SCAN", 3)
        seen, before = [], ""
        for _ in range(40):
            params = {"task": "mail", "count": "2", "before": before}
            got = client.get("/api/history", params=params).json()
            seen += [r["id"] for r in got["entries"]]
            before = got["next"]
            if not before:
                break
        assert sorted(seen) == sorted(f"ok{i}" for i in range(12))
        monkeypatch.undo()
        html = client.get("/history", params={"outcome": "dead"}).text
        assert 'id="history"' in html and "no such account" in html and "<script>alert" not in html
        # Refused: a bad filter or cursor, named.
        r = client.get("/api/history", params={"outcome": "won"})
        assert r.status_code == 400 and "outcome must be one of" in r.text
        r = client.get("/api/history", params={"before": "x"})
        assert r.status_code == 400 and "before must be a row" in r.text


def test_a_worker_keeps_no_history_by_default(redis_url: str) -> None:
    ns = unique_ns()
    reg = TaskRegistry()

    @reg.task(name="t")
    async def t(ctx: Any) -> None:
        pass

    with api_client(redis_url, ns) as client:
        with WorkerThread(redis_url, ns, reg, shards=SHARDS):
            run(_schedule(redis_url, ns, [JobSpec("a", "t")]))
            assert wait_for(
                lambda: client.get("/api/job", params={"id": "a"}).status_code == 404, 20
            )
        assert client.get("/api/history").json()["entries"] == []


def test_the_recorder_is_bounded_and_keeps_first_lines() -> None:
    rec = HistoryRecorder()
    job = Job(
        id="j", shard=0, task="t", payload=None, nominal_ms=0, due_ms=0, deadline_ms=0,
        attempt=1, max_attempts=1, epoch=1, recurrence=None,
    )  # fmt: skip
    for _ in range(MAX_PENDING + 10):
        rec.ended(job, "acked")
    assert len(rec.pending) <= MAX_PENDING and rec.dropped > 0
    batch = rec.take()
    assert rec.pending == [] and batch[-1][1][5] == "acked" and batch[-1][1][3] == 0
    rec.put_back(batch)
    assert len(rec.pending) == len(batch)
    assert first_line("\n  Boom: x\nTraceback") == "Boom: x" and first_line("") == ""
    assert len(first_line("x" * 1000)) == 200
