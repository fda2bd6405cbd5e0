"""uvicorn and aiohttp on the wheel-timed loops: keep-alive and request timeouts on time.

Each server runs in its own process, started here on a free port on the loop under test
(uvicorn through its own ``--loop tickwheel.wheel:...`` option). A client holds
``CONNECTIONS`` keep-alive connections, each after one request, and waits for the server
to hang up: never before the keep-alive timeout counted from the request (the server arms
it after answering), within a generous bound after. ``GET /slow`` times out inside the
handler (``asyncio.timeout``) and answers 504: never before the timeout.

Short form: 300 idle connections per server and loop; ``TICKWHEEL_SOAK=1``: 10,000.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterator

import pytest
from loop_servers_support import SLOW_TIMEOUT, request_then_idle, start_server

from tickwheel.durable.servers import free_port

SOAK = os.environ.get("TICKWHEEL_SOAK") == "1"
CONNECTIONS = 10_000 if SOAK else 300
KEEPALIVE = 1.0  # seconds (uvicorn's --timeout-keep-alive takes whole seconds)
LATE = 5.0  # bound on a close's lateness on a loaded 2-core machine (the clients included;
# aiohttp 3.10+ checks an idle connection once per keep-alive period, so its close can
# come up to a whole period after the timeout before any load adds to it)

EXPECTED_LOOP = {"wheel": b"WheelEventLoop", "wheel-uvloop": b"WheelUVLoop"}

pytestmark = pytest.mark.slow  # real clock, child processes


@pytest.fixture(scope="module", autouse=True)
def _enough_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * CONNECTIONS + 200  # the client's sockets, and the server's (inherited)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _open_many(port: int, n: int) -> list[tuple[int, float, float, bytes]]:
    # Opened in waves, so that the listen backlog is never the thing measured.
    tasks = []
    for i in range(0, n, 500):
        tasks += [asyncio.create_task(request_then_idle(port)) for _ in range(min(500, n - i))]
        await asyncio.sleep(0.05)
    return await asyncio.gather(*tasks)


@pytest.mark.parametrize("loop", ["wheel", "wheel-uvloop"])
@pytest.mark.parametrize("server", ["uvicorn", "aiohttp"])
def test_idle_keepalive_connections_close_on_time(server: str, loop: str) -> None:
    port = free_port()
    proc = start_server(server, loop, port, KEEPALIVE)
    try:

        async def main() -> None:
            *_, name = await request_then_idle(port, "/loop")
            assert name == EXPECTED_LOOP[loop]
            slow = asyncio.create_task(request_then_idle(port, "/slow"))
            results = await _open_many(port, CONNECTIONS)
            status, answered, _closed, _ = await slow
            assert status == 504
            assert SLOW_TIMEOUT <= answered < SLOW_TIMEOUT + LATE, answered
            assert len(results) == CONNECTIONS
            for status, _answered, closed, _ in results:
                assert status == 200
                assert KEEPALIVE <= closed < KEEPALIVE + LATE, closed

        asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(10)
