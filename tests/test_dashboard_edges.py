"""The dashboard at its edges (issue 42): no page shows a credential of its URLs, a
request body is capped before it is parsed, logins are rate-limited, a logout ends its
session on the server, and numbers in query strings are parsed strictly. Against a real
Redis, through the ASGI test client and a real uvicorn."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator

import httpx
import pytest
from dashboard_support import BASE, TOKEN, LiveDashboard, api_client, bearer, config, login
from durable_support import open_scheduler, run, unique_ns
from starlette.testclient import TestClient

from tickwheel.durable import JobSpec
from tickwheel.durable.ops.dashboard import SESSION_COOKIE, create_app
from tickwheel.durable.ops.dashboard._app import MAX_BODY_BYTES, MAX_LOGIN_BODY_BYTES
from tickwheel.durable.ops.dashboard._serve import serve
from tickwheel.durable.ops.dashboard._sessions import (
    LOGIN_FAILURES,
    LOGIN_WINDOW_S,
    LoginLimiter,
)
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis

SECRET = "Hunter2secret"
PAGES = ["/", "/login", "/scheduled", "/scheduled?shard=0", "/dead", "/recurring", "/job?id=x"]
PAGES += ["/internals", "/history", "/history?outcome=dead"]
APIS = ["/api/overview", "/api/scheduled", "/api/dead", "/api/job?id=x", "/api/charts"]
APIS += ["/api/internals", "/api/scheduled?shard=0", "/api/history", "/api/history?id=x"]


async def _schedule(url: str, ns: str) -> None:
    async with open_scheduler(url, ns, shards=4) as sched:
        await sched.schedule_many([JobSpec("a", "t", delay=60)])


@pytest.mark.parametrize(
    "shape",
    [
        "{url}?password={secret}",  # redis-py sends it (AUTH): this Redis has none
        "{url}?db=0&PassWord={secret}",
        "{scheme}://:pa#{secret}@{rest}",  # malformed: an unencoded '#' in the password
        "{scheme}://:pa/{secret}@{rest}",
    ],
)
def test_no_page_shows_a_credential_of_the_redis_url(redis_server: RedisServer, shape: str) -> None:
    url = redis_server.url
    scheme, _, rest = url.partition("://")
    given = shape.format(url=url, scheme=scheme, rest=rest, secret=SECRET)
    ns = unique_ns()
    run(_schedule(url, ns))
    with api_client(given, ns, postgres_url=f"postgresql://u:{SECRET}@127.0.0.1:1/x") as client:
        for path in PAGES + APIS:
            r = client.get(path)
            assert SECRET not in r.text, (path, r.status_code, r.text)
            assert "pa'" not in r.text and "'pa" not in r.text, (path, r.text)
        r = client.post("/api/job/cancel", json={"id": "a"}, headers=bearer())
        assert SECRET not in r.text, r.text


def _raw_post(port: int, path: str, head: bytes, body: Iterator[bytes] | None = None) -> bytes:
    """POST over a bare socket: headers, then the body's chunks; return what the server
    said within 10 s (the bytes sent when it answered are left unsent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n".encode()
            + head
            + b"\r\n"
        )
        answer = b""
        sock.setblocking(False)
        for chunk in body or ():
            with contextlib.suppress(BlockingIOError):
                answer += sock.recv(65536)
            if answer:
                break
            try:
                sock.sendall(chunk)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(10)
        try:
            while b"\r\n\r\n" not in answer:
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def test_an_oversized_login_is_refused_before_its_body_is_read(redis_server: RedisServer) -> None:
    ns = unique_ns()
    with LiveDashboard(config(redis_server.url, ns)) as live:
        # A declared 990 MB: refused from its Content-Length, not one byte of it read.
        answer = _raw_post(live.port, "/login", b"Content-Length: 990000000\r\n")
        assert answer.startswith(b"HTTP/1.1 413"), answer
        answer = _raw_post(live.port, "/api/job/cancel", b"Content-Length: 990000000\r\n")
        assert answer.startswith(b"HTTP/1.1 413"), answer
        # A chunked body that never says its size: refused once past the cap, and the
        # server never holds much more than the cap in memory.
        chunk = b"token=" + b"x" * (64 * 1024)
        framed = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(800))  # 50 MB
        tracemalloc.start()
        try:
            answer = _raw_post(live.port, "/login", b"Transfer-Encoding: chunked\r\n", framed)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert peak < 8 * 1024 * 1024, peak
        # What fits still works.
        with httpx.Client(base_url=live.url) as client:
            r = client.post("/login", data={"token": TOKEN}, headers={"Origin": live.url})
            assert r.status_code in (200, 303), r.text
    assert MAX_LOGIN_BODY_BYTES < MAX_BODY_BYTES <= 4 * 1024 * 1024


def test_the_body_cap_through_the_test_client(redis_server: RedisServer) -> None:
    ns = unique_ns()
    with api_client(redis_server.url, ns) as client:
        big = {"token": "x" * (MAX_LOGIN_BODY_BYTES + 1)}
        r = client.post("/login", data=big, headers={"Origin": BASE})
        assert r.status_code == 413
        r = client.post(
            "/api/dead/bulk/purge",
            content=b"{" + b" " * MAX_BODY_BYTES + b"}",
            headers={**bearer(), "Content-Type": "application/json"},
        )
        assert r.status_code == 413


def test_logins_are_rate_limited_per_client_address(redis_server: RedisServer) -> None:
    ns = unique_ns()
    app = create_app(config(redis_server.url, ns))
    with TestClient(app, base_url=BASE, client=("10.0.0.1", 1000)) as guesser:
        for i in range(LOGIN_FAILURES):
            r = guesser.post("/login", data={"token": f"guess{i}"}, headers={"Origin": BASE})
            assert r.status_code == 401, i
        for given in ("guess-again", TOKEN):  # the right token waits too: no oracle
            r = guesser.post("/login", data={"token": given}, headers={"Origin": BASE})
            assert r.status_code == 429, r.text
            assert 0 < int(r.headers["retry-after"]) <= LOGIN_WINDOW_S
            assert "too many wrong tokens" in r.text
    # Another address is not held up by it.
    with TestClient(app, base_url=BASE, client=("10.0.0.2", 1000)) as other:
        r = other.post("/login", data={"token": TOKEN}, headers={"Origin": BASE})
        assert r.status_code == 200 and other.cookies.get(SESSION_COOKIE)


def test_the_login_limiter_forgets_failures_after_its_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    limiter = LoginLimiter(failures=3, window=60)
    for _ in range(3):
        assert limiter.wait("a") == 0
        limiter.failed("a")
        now[0] += 1
    assert limiter.wait("a") == 57  # the first failure is 3 s old
    assert limiter.wait("b") == 0
    now[0] += 58
    assert limiter.wait("a") == 0  # the oldest failure left the window
    limiter.failed("a")
    limiter.failed("a")
    assert limiter.wait("a") == 1  # 3 within the window again: the oldest is 59 s old
    assert limiter.wait("a") > 0
    limiter.succeeded("a")
    assert limiter.wait("a") == 0


@pytest.mark.parametrize("with_csrf", [True, False])
def test_logout_ends_the_session_on_the_server(redis_server: RedisServer, with_csrf: bool) -> None:
    ns = unique_ns()
    run(_schedule(redis_server.url, ns))
    with api_client(redis_server.url, ns) as client:
        csrf = login(client)
        sid = client.cookies.get(SESSION_COOKIE)
        assert sid
        r = client.post("/logout", data={"csrf": csrf} if with_csrf else {})
        assert r.status_code == 200
        # The old cookie, sent again (a copy an attacker kept), works no more.
        client.cookies.set(SESSION_COOKIE, sid)
        r = client.post("/job/cancel", data={"id": "a", "csrf": csrf}, headers={"Origin": BASE})
        assert r.status_code == 401, r.text
        assert "Log out" not in client.get("/").text
        assert client.get("/api/job", params={"id": "a"}).status_code == 200


ODD_DIGITS = ["\u00b2", "\u0663", "\uff11", "1\u00b2", "-\u00b2", "\u00b9\u2070", "9" * 40]


@pytest.mark.parametrize("odd", ODD_DIGITS)
def test_odd_digits_in_query_strings_are_a_400(redis_server: RedisServer, odd: str) -> None:
    ns = unique_ns()
    run(_schedule(redis_server.url, ns))
    with api_client(redis_server.url, ns) as client:
        for where, name in [
            ("/api/dead", "shard"),
            ("/dead", "shard"),
            ("/api/dead", "offset"),
            ("/api/dead", "count"),
            ("/api/scheduled", "shard"),
            ("/scheduled", "shard"),
            ("/api/scheduled?shard=0", "offset"),
            ("/api/scheduled?shard=0", "count"),
            ("/api/scheduled", "skip"),  # every shard merged
            ("/api/scheduled", "count"),
        ]:
            path, _, shard = where.partition("?shard=")
            r = client.get(path, params={name: odd, **({"shard": shard} if shard else {})})
            assert r.status_code == 400, (path, name, r.status_code, r.text)
            assert name in r.text
        r = client.post("/api/job/reschedule", json={"id": "a", "at": odd}, headers=bearer())
        assert r.status_code in (400, 404), r.text


def test_the_startup_line_shows_no_query_password() -> None:
    """``serve`` says where Redis is without the password given in the query."""
    said: list[str] = []
    cfg = config(f"unix:///nonexistent.sock?password={SECRET}", unique_ns())
    stopper = threading.Timer(3.0, lambda: None)
    stopper.start()

    def say(text: str) -> None:
        said.append(text)
        raise KeyboardInterrupt  # stop serving once it has spoken

    with pytest.raises((KeyboardInterrupt, SystemExit)):
        serve(cfg, "127.0.0.1", 0, token_given=True, say=say)
    stopper.cancel()
    assert said and "unix:///nonexistent.sock?password=***" in said[0]
    assert SECRET not in said[0]
