"""The example applications (examples/) run as their READMEs say: real processes (uvicorn,
``tickwheel worker``), real Redis and PostgreSQL servers, driven over HTTP with httpx.

Checked: each job runs once, never early and not much late; a cancelled reminder or a
rolled-back order makes no run; a worker SIGKILLed while it holds leased jobs loses
none of them (another worker runs them once the leases expire).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from durable_support import run, unique_ns

from tickwheel.durable import SyncScheduler
from tickwheel.durable.servers._redis import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Generous: a loaded 2-core machine, and a killed worker's lease (2 s) and owner TTL.
LATE_MS = 15_000

pytestmark = [pytest.mark.redis]


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process, stopped by its pid at the end (SIGTERM, then SIGKILL)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def worker(
    folder: Path, registry: str, redis_url: str, ns: str, env: dict[str, str], *extra: str
) -> Any:
    argv = [
        sys.executable, "-m", "tickwheel.durable.ops.cli", "worker", registry,
        "--redis-url", redis_url, "--namespace", ns, "--no-check",
        "--lease", "2", "--owner-ttl", "1", "--poll-interval", "0.05", *extra,
    ]  # fmt: skip
    return process(argv, {"PYTHONPATH": str(folder), **env}, folder)


def server(folder: Path, app: str, port: int, env: dict[str, str]) -> Any:
    argv = [
        sys.executable, "-m", "uvicorn", app, "--port", str(port), "--host", "127.0.0.1",
        "--log-level", "warning",
    ]  # fmt: skip
    return process(argv, {"PYTHONPATH": str(folder), **env}, folder)


def wait_http(proc: subprocess.Popen[str], url: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"no answer from {url}")


def runs(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def wait_runs(log: Path, ids: set[str], within: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while {r["id"] for r in runs(log)} < ids:
        if time.monotonic() > deadline:
            raise AssertionError(f"ran {runs(log)}, expected {sorted(ids)}")
        time.sleep(0.05)
    time.sleep(1.0)  # a second run of any of them would show by now
    return runs(log)


def assert_once_on_time(done: list[dict[str, Any]], ids: set[str]) -> None:
    assert sorted(r["id"] for r in done) == sorted(ids), done
    for r in done:
        assert r["ran_ms"] >= r["nominal_ms"] - 1, r  # never early (ms rounding)
        assert r["ran_ms"] - r["nominal_ms"] < LATE_MS, r


def test_fastapi_reminders(redis_server: RedisServer, tmp_path: Path) -> None:
    folder = EXAMPLES / "fastapi_reminders"
    ns, port, log = unique_ns(), free_port(), tmp_path / "ran.jsonl"
    env = {"REDIS_URL": redis_server.url, "TICKWHEEL_NAMESPACE": ns, "REMINDERS_LOG": str(log)}
    base = f"http://127.0.0.1:{port}"
    with (
        worker(folder, "reminders_tasks:registry", redis_server.url, ns, env) as first,
        server(folder, "reminders_app:app", port, env) as api,
    ):
        wait_http(api, f"{base}/docs")
        with httpx.Client(base_url=base, timeout=10) as http:

            def post(rid: str, delay: float) -> dict[str, Any]:
                body = {"id": rid, "user": 7, "text": rid, "delay": delay}
                reply = http.post("/reminders", json=body)
                assert reply.status_code == 201, reply.text
                return dict(reply.json())

            assert post("a", 1.5)["status"] == "CREATED"
            assert post("a", 1.5)["status"] == "KEPT"  # a retried POST
            post("b", 1.5)
            post("c", 30)
            post("d", 2.5)
            assert http.delete("/reminders/b").status_code == 204
            assert http.delete("/reminders/b").status_code == 404
            assert http.patch("/reminders/c", json={"delay": 2}).status_code == 200
            assert http.post("/reminders", json={"id": "x"}).status_code == 422
            # The first worker leases "a" (within its lookahead) and is killed holding it.
            deadline = time.monotonic() + 10
            while http.get("/reminders/a").json().get("state") != "LEASED":
                assert time.monotonic() < deadline, "the worker never leased a"
                time.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
            with worker(folder, "reminders_tasks:registry", redis_server.url, ns, env):
                done = wait_runs(log, {"a", "c", "d"})
            assert http.get("/reminders/a").status_code == 404  # sent: gone
    assert_once_on_time(done, {"a", "c", "d"})


def test_sync_script(redis_server: RedisServer, tmp_path: Path) -> None:
    folder = EXAMPLES / "fastapi_reminders"
    ns, log = unique_ns(), tmp_path / "ran.jsonl"
    env = {
        "REDIS_URL": redis_server.url,
        "TICKWHEEL_NAMESPACE": ns,
        "REMINDERS_LOG": str(log),
        "REMINDER_DELAY": "1",
    }
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "sync_script" / "schedule_reminders.py"), "3"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert [line.split()[:2] for line in out[:3]] == [
        ["script:0", "CREATED"],
        ["script:1", "CREATED"],
        ["script:2", "CREATED"],
    ]
    assert out[3:] == ["moved True", "cancelled True"]
    with worker(folder, "reminders_tasks:registry", redis_server.url, ns, env):
        done = wait_runs(log, {"script:1", "script:2"})
    assert_once_on_time(done, {"script:1", "script:2"})


@pytest.mark.postgres
def test_django_orders(redis_server: RedisServer, pg_url: str, tmp_path: Path) -> None:
    folder = EXAMPLES / "django_orders"
    ns, port, log = unique_ns(), free_port(), tmp_path / "ran.jsonl"
    env = {
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": pg_url,
        "TICKWHEEL_NAMESPACE": ns,
        "ORDERS_LOG": str(log),
        "CHARGE_DELAY": "3",
    }
    full_env = {**os.environ, **env, "PYTHONPATH": str(folder)}
    cli = [sys.executable, "-m", "tickwheel.durable.ops.cli"]
    subprocess.run([*cli, "pg", "migrate", "--postgres-url", pg_url], check=True, env=full_env)
    subprocess.run([sys.executable, "orders_app.py", "setup"], check=True, env=full_env, cwd=folder)
    base = f"http://127.0.0.1:{port}"
    with server(folder, "orders_app:application", port, env) as web:
        wait_http(web, f"{base}/orders")
        with httpx.Client(base_url=base, timeout=10) as http:
            created = http.post("/orders", json={"id": "o1", "total_cents": 1999})
            assert created.status_code == 201, created.text
            declined = http.post("/orders", json={"id": "o2", "total_cents": 5, "decline": True})
            assert declined.status_code == 402
    # No worker (so no relay) ran while the web process lived: the committed charge
    # waits in the outbox, and the first worker started afterwards relays it. That
    # worker is SIGKILLed holding the charge leased; a second one runs it.
    pg_worker = ("--postgres-url", pg_url)
    with (
        SyncScheduler.from_url(redis_server.url, ns, postgres_url=pg_url) as probe,
        worker(folder, "orders_tasks:registry", redis_server.url, ns, env, *pg_worker) as first,
    ):
        deadline = time.monotonic() + 20
        while (info := probe.get("charge:o1")) is None or info.state.name != "LEASED":
            assert time.monotonic() < deadline, "the first worker never leased the charge"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert runs(log) == []
        with worker(folder, "orders_tasks:registry", redis_server.url, ns, env, *pg_worker):
            done = wait_runs(log, {"charge:o1"})
    assert_once_on_time(done, {"charge:o1"})
    assert done[0]["order"] == "o1" and done[0]["cents"] == 1999

    async def tables() -> tuple[list[str], list[str]]:
        conn = await asyncpg.connect(pg_url)
        try:
            orders = [r[0] for r in await conn.fetch("SELECT id FROM orders ORDER BY id")]
            jobs = [r[0] for r in await conn.fetch("SELECT id FROM tickwheel_jobs ORDER BY id")]
            return orders, jobs
        finally:
            await conn.close()

    assert run(tables()) == (["o1"], ["charge:o1"])  # the declined order left nothing
