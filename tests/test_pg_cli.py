"""The command line in the Postgres mode: pg migrate/status, schedule, reconcile."""

from __future__ import annotations

import pytest

from tests.durable_support import run, unique_ns
from tests.pg_support import rows
from tests.test_cli import cli, cli_json
from tickwheel.durable.postgres import SCHEMA_VERSION, migrations
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_pg_migrate_status_and_errors(pg_url: str) -> None:
    status = cli_json("pg", "status", "--postgres-url", pg_url, code=1)
    assert status == {"applied": [], "version": 0, "wanted": SCHEMA_VERSION}
    done = cli_json("pg", "migrate", "--postgres-url", pg_url)
    assert done["applied"] == [m.version for m in migrations()]
    again = cli("pg", "migrate", env={"TICKWHEEL_POSTGRES_URL": pg_url})
    assert again.returncode == 0 and "schema is current" in again.stdout
    assert cli_json("pg", "status", "--postgres-url", pg_url)["version"] == SCHEMA_VERSION
    missing = cli("pg", "migrate", env={"TICKWHEEL_POSTGRES_URL": ""})
    assert missing.returncode == 2 and "--postgres-url is required" in missing.stderr
    down = cli("pg", "migrate", "--postgres-url", "postgresql://postgres@127.0.0.1:1/x")
    assert down.returncode == 5 and "cannot reach PostgreSQL" in down.stderr


def test_schedule_and_reconcile(redis_server: RedisServer, pg_url: str) -> None:
    ns = unique_ns()
    o = ["--redis-url", redis_server.url, "--postgres-url", pg_url, "--namespace", ns]
    unmigrated = cli("schedule", "a", "t", *o)
    assert unmigrated.returncode == 1 and "tickwheel pg migrate" in unmigrated.stderr
    cli_json("pg", "migrate", "--postgres-url", pg_url)
    assert cli_json("schedule", "a", "t", '{"x": 1}', "--delay", "60", *o)["status"] == "created"
    assert cli_json("schedule", "a", "t", *o)["status"] == "kept"
    (row,) = run(rows(pg_url, "SELECT id, state FROM tickwheel_jobs"))
    assert tuple(row) == ("a", 0)
    first = cli_json("reconcile", *o)
    assert first["pending"] == 1 and first["restored"] == 0
    redis_lose(redis_server, ns)
    second = cli_json("reconcile", *o)
    assert second["pending"] == 1 and second["restored"] == 1
    assert cli_json("inspect", *o)["due"] == 1
    # Without --postgres-url the namespace's mode is refused (issue 40), nothing written.
    out = cli("inspect", "--redis-url", redis_server.url, "--namespace", ns)
    assert out.returncode == 2 and "--postgres-url" in out.stderr
    assert cli_json("cancel", "a", *o) == {"id": "a", "cancelled": True, "result": "removed"}
    assert run(rows(pg_url, "SELECT id FROM tickwheel_jobs")) == []
    assert cli_json("reconcile", *o)["pending"] == 0


def redis_lose(server: RedisServer, ns: str) -> None:
    """Delete every key of the namespace (a FLUSHALL limited to this test's keys)."""
    import redis

    with redis.Redis(port=server.port) as c:
        for key in c.scan_iter(match=f"*{ns}*"):
            c.delete(key)


def test_pg_prune_deletes_old_done_rows_only(redis_server: RedisServer, pg_url: str) -> None:
    ns = unique_ns()
    o = ["--redis-url", redis_server.url, "--postgres-url", pg_url, "--namespace", ns]
    cli_json("pg", "migrate", "--postgres-url", pg_url)
    for job_id in ("old", "new", "pending"):
        cli_json("schedule", job_id, "t", "--delay", "3600", *o)
    run(
        rows(
            pg_url,
            """
            WITH d AS (
                INSERT INTO tickwheel_done (ns, id, nominal_ms, epoch, attempt, done_at)
                SELECT ns, id, due_ms, 1, 1,
                       CASE id WHEN 'old' THEN now() - interval '8 days' ELSE now() END
                FROM tickwheel_jobs WHERE id IN ('old', 'new')
            )
            UPDATE tickwheel_jobs SET state = 1,
                updated_at = CASE id WHEN 'old' THEN now() - interval '8 days' ELSE now() END
            WHERE id IN ('old', 'new')
            """,
        )
    )
    assert cli_json("pg", "prune", "--postgres-url", pg_url) == {
        "done_deleted": 1,
        "jobs_deleted": 1,
    }
    left = run(rows(pg_url, "SELECT id FROM tickwheel_jobs ORDER BY id"))
    assert [r[0] for r in left] == ["new", "pending"]
    assert [r[0] for r in run(rows(pg_url, "SELECT id FROM tickwheel_done"))] == ["new"]
    again = cli_json("pg", "prune", "--postgres-url", pg_url, "--older-than", "0")
    assert again == {"done_deleted": 1, "jobs_deleted": 1}
