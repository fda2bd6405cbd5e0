"""Where people see a series' zone: JobInfo.upcoming and Recurrence.local, the dashboard's
job and recurring pages (ASGI, real Redis), and ``tickwheel inspect --job``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from dashboard_support import api_client
from durable_support import open_scheduler, run, unique_ns

from tests.test_cli import cli, cli_json, opts
from tickwheel.durable import JobSpec, Recurrence, Scheduler

pytestmark = pytest.mark.redis

PARIS = "Europe/Paris"


def z(*a: int) -> int:
    """A UTC instant in ms."""
    return round(datetime(*a, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


# 09:00 Paris from 2030-03-30 (+01:00), across the spring-forward of 2030-03-31 (+02:00).
FIRST = z(2030, 3, 30, 8)
UTC_TIMES = [z(2030, 3, 30, 8), z(2030, 3, 31, 7), z(2030, 4, 1, 7)]
LOCAL = ["2030-03-30T09:00:00+01:00", "2030-03-31T09:00:00+02:00", "2030-04-01T09:00:00+02:00"]


def test_upcoming_and_local_time() -> None:
    rec = Recurrence.cron_expr("0 9 * * *", tz=PARIS)
    assert rec.upcoming(FIRST, 3) == UTC_TIMES
    assert [rec.local(t).isoformat() for t in UTC_TIMES] == LOCAL
    assert rec.upcoming(FIRST, 0) == []
    utc = Recurrence.cron_expr("0 9 * * *")
    assert utc.local(FIRST).isoformat() == "2030-03-30T08:00:00+00:00"
    every = Recurrence.interval(60)
    assert every.upcoming(1_000, 3) == [1_000, 61_000, 121_000]


async def _series(url: str, ns: str) -> None:
    async with open_scheduler(url, ns, shards=2) as s:
        await s.schedule("digest", "send", at=FIRST, cron="0 9 * * *", tz=PARIS)
        await s.schedule("nightly", "send", at=z(2030, 3, 30, 3), cron="0 3 * * *")
        await s.schedule_many([JobSpec("once", "send", delay=600)])
        info = await s.get("digest")
        assert info is not None and info.upcoming(3) == UTC_TIMES
        once = await s.get("once")
        assert once is not None and once.upcoming() == []


def test_the_dashboard_shows_the_zone_and_local_occurrences(redis_url: str) -> None:
    ns = unique_ns()
    run(_series(redis_url, ns))
    with api_client(redis_url, ns) as client:
        job = client.get("/api/job", params={"id": "digest"}).json()["job"]
        assert job["tz"] == PARIS
        assert job["recurring"].startswith(f"cron 0 9 * * * ({PARIS}), missed: once")
        assert [o["ms"] for o in job["upcoming"][:3]] == UTC_TIMES
        assert [o["local"] for o in job["upcoming"][:3]] == LOCAL
        assert job["upcoming"][1]["utc"] == "2030-03-31T07:00:00.000+00:00"
        page = client.get("/job", params={"id": "digest"}).text
        assert 'id="job-tz">Europe/Paris<' in page
        assert "2030-03-31T09:00:00+02:00 (UTC 2030-03-31T07:00:00.000+00:00)" in page
        once = client.get("/api/job", params={"id": "once"}).json()["job"]
        assert once["tz"] == "" and once["upcoming"] == []
        rec = {j["id"]: j for j in client.get("/api/recurring").json()["jobs"]}
        assert set(rec) == {"digest", "nightly"}
        assert rec["nightly"]["tz"] == "UTC"
        assert rec["nightly"]["recurring"].startswith("cron 0 3 * * *, missed: once")
        assert rec["digest"]["upcoming"][1]["local"] == LOCAL[1]
        page = client.get("/recurring").text
        assert "Europe/Paris" in page and f"{LOCAL[1]} / 2030-03-31T07:00:00.000+00:00" in page


def test_cli_inspect_job_shows_the_zone_and_local_occurrences(redis_url: str) -> None:
    ns = unique_ns()
    o = opts(redis_url, ns, shards=2)
    made = cli_json("schedule", "digest", "send", "--cron", "0 9 * * *", "--tz", PARIS,
                    "--at", "2030-03-30T08:00:00Z", *o)  # fmt: skip
    assert made["status"] == "created"
    view = cli_json("inspect", "--job", "digest", "--upcoming", "3", *o)
    assert (view["found"], view["state"], view["tz"], view["cron"]) == (
        True, "due", PARIS, "0 9 * * *",
    )  # fmt: skip
    assert [u["ms"] for u in view["upcoming"]] == UTC_TIMES
    assert [u["local"] for u in view["upcoming"]] == LOCAL
    text = cli("inspect", "--job", "digest", *o)
    assert text.returncode == 0, text.stderr
    assert f"in {PARIS}" in text.stdout
    assert "next 2030-03-31T09:00:00+02:00  (UTC 2030-03-31T07:00:00.000+00:00)" in text.stdout
    assert cli_json("inspect", "--job", "nope", *o, code=1)["found"] is False
    # The shard view is unchanged.
    assert cli_json("inspect", *o)["due"] == 1


def test_scheduler_get_carries_the_zone(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            assert isinstance(s, Scheduler)
            await s.schedule("d", "t", at=FIRST, cron="0 9 * * *", tz=PARIS)
            info = await s.get("d")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == PARIS
            assert [info.recurrence.local(t).isoformat() for t in info.upcoming(3)] == LOCAL

    run(main())
