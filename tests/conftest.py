"""Shared fixtures: real redis-server processes on free loopback ports.

No Redis test skips: when no binary can be found the fixture errors, so a machine
without Redis fails loudly instead of passing quietly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vloop import VirtualLoop

from tickwheel.durable._server import RedisServer


@pytest.fixture
def vloop() -> Iterator[VirtualLoop]:
    """An event loop on a virtual clock (see vloop.py)."""
    loop = VirtualLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests isolate themselves by namespace)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's redis-server."""
    return redis_server.url


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, stopped (by pid) when the test ends."""
    with RedisServer() as server:
        yield server
