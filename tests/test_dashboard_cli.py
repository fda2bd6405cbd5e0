"""``tickwheel dashboard``: what it prints, what it refuses, and that the rest of the
command line never imports the dashboard's extra."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys

import httpx
import pytest
from dashboard_support import wait_for

from tickwheel.durable.ops.dashboard import TOKEN_ENV, is_loopback
from tickwheel.durable.servers._redis import free_port

pytestmark = pytest.mark.redis


def _dashboard(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    environ.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "tickwheel.durable.ops.cli", "dashboard", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )


def _finish(proc: subprocess.Popen[str], within: float = 60) -> tuple[str, str]:
    """Wait for a command that should exit by itself; kill it (by its pid) if it hangs."""
    try:
        return proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


def _interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C a running dashboard and wait for it; kill it (by its pid) if it hangs."""
    proc.send_signal(signal.SIGINT)
    return _finish(proc, 60)


def _first_lines(proc: subprocess.Popen[str], n: int, within: float = 120) -> list[str]:
    """The first ``n`` lines the command prints, waited for at most ``within`` s."""
    out = proc.stdout
    assert out is not None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(lambda: [out.readline() for _ in range(n)])
        try:
            return reading.result(timeout=within)
        except concurrent.futures.TimeoutError:
            proc.kill()  # ends the read too: its pipe closes
            raise


def test_a_non_loopback_bind_without_a_token_is_refused() -> None:
    proc = _dashboard("--redis-url", "redis://127.0.0.1:1/0", "--host", "0.0.0.0")
    _, err = _finish(proc)
    assert proc.returncode == 2
    assert "not a loopback address" in err and TOKEN_ENV in err


def test_a_short_token_and_a_bad_url_are_refused() -> None:
    proc = _dashboard("--redis-url", "redis://127.0.0.1:1/0", env={TOKEN_ENV: "short"})
    _, err = _finish(proc)
    assert proc.returncode == 2 and "at least 16" in err
    proc = _dashboard("--redis-url", "redis://:hunter2hunter2@127.0.0.1:6379/0?socket_timeout=x")
    _, err = _finish(proc)
    assert proc.returncode == 2 and "--redis-url" in err and "hunter2" not in err
    for bad in ("0", "-5", "inf", "soon"):
        proc = _dashboard("--redis-url", "redis://127.0.0.1:1/0", "--session-ttl", bad)
        _, err = _finish(proc)
        assert proc.returncode == 2 and "--session-ttl" in err, bad


def test_it_prints_where_and_a_generated_token_never_the_password() -> None:
    port = free_port()
    url = f"redis://admin:pw-never-shown@127.0.0.1:{port}/0"
    proc = _dashboard("--redis-url", url, "--port", "0", "--namespace", "shop")
    try:
        first, second = _first_lines(proc, 2)
        assert first.startswith("tickwheel dashboard: http://127.0.0.1:"), first
        assert "redis://admin:***@127.0.0.1" in first and "pw-never-shown" not in first
        token = second.rsplit(" ", 1)[1].strip()
        assert len(token) >= 16
        address = first.split()[2]
        with httpx.Client(base_url=address) as client:
            assert wait_for(lambda: _status(client, "/") == 503, 30)
            page = client.get("/").text
            assert "unreachable" in page and "pw-never-shown" not in page
            refused = client.post("/api/job/cancel", json={"id": "x"})
            assert refused.status_code == 401
            allowed = client.post(
                "/api/job/cancel", json={"id": "x"}, headers={"Authorization": f"Bearer {token}"}
            )
            assert allowed.status_code == 503  # past the guard; Redis is down
    finally:
        _, err = _interrupt(proc)
    assert proc.returncode == 0, err
    assert "pw-never-shown" not in err


def test_a_token_from_the_environment_is_not_printed() -> None:
    secret = "env-token-0123456789abcdef"
    proc = _dashboard(
        "--redis-url", "redis://127.0.0.1:1/0", "--port", "0", env={TOKEN_ENV: secret}
    )
    try:
        _, second = _first_lines(proc, 2)
        assert TOKEN_ENV in second and secret not in second
    finally:
        out, _ = _interrupt(proc)
    assert secret not in out


def test_the_command_line_does_not_import_the_dashboard() -> None:
    code = (
        "import sys, tickwheel.durable.ops.cli as c; c._parser(); "
        "print(any(m.split('.')[0] in ('starlette', 'uvicorn', 'jinja2') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("[::1]") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.org")


def _status(client: httpx.Client, path: str) -> int:
    try:
        return client.get(path).status_code
    except httpx.TransportError:
        return 0
