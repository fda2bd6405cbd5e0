"""The fault proxy (tests/faultproxy.py) between redis-py and a real redis-server.

Bounds are generous on purpose: the CI machine is small and loaded, so a test asserts
that a fault took at least its delay, and only a loose upper bound that catches a hang.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.exceptions
import redis.retry

from tests.durable_support import run
from tests.faultproxy import Direction, FaultProxy, ThreadedFaultProxy
from tests.spill_support import until
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis

# A bound that only a hang exceeds, on a loaded 2-core machine.
HANG = 30.0
# asyncio may run a timer up to its clock resolution early (BaseEventLoop._run_once).
CLOCK_SLACK = 0.001
# The socket timeout of a client that is to give up on a black hole.
SHORT_TIMEOUT = 0.5


def _run(main: Coroutine[Any, Any, None]) -> None:
    """``run(main)``, failing on whatever reached the loop's exception handler (asyncio
    only logs those: an exception in a callback, a task destroyed pending)."""
    seen: list[dict[str, Any]] = []

    async def checked() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        await main

    run(checked())
    assert not seen, seen


def _key() -> str:
    return f"fp:{uuid.uuid4().hex[:12]}"


def _client(port: int, timeout: float = HANG) -> redis.asyncio.Redis:
    """An asyncio client that never retries: each fault reaches the test as raised."""
    return redis.asyncio.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


def _sync_client(port: int, timeout: float = HANG) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


def test_passes_commands_through(redis_server: RedisServer) -> None:
    async def main() -> None:
        key = _key()
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
            client = _client(proxy.port)
            direct = _client(redis_server.port)
            try:
                assert await client.set(key, b"v")
                assert await client.get(key) == b"v"
                assert await direct.get(key) == b"v"
                # A reply larger than one chunk arrives whole.
                big = b"x" * 1_000_000
                await client.set(key, big)
                assert await client.get(key) == big
            finally:
                await client.aclose()
                await direct.aclose()
            assert proxy.connections == 1
            assert proxy.bytes_to_server > len(big) and proxy.bytes_to_client > len(big)
            assert proxy.dropped_replies == 0

    _run(main())


@pytest.mark.parametrize(("direction", "ways"), [("to_server", 1), ("to_client", 1), ("both", 2)])
def test_latency_delays_each_direction(
    redis_server: RedisServer, direction: Direction, ways: int
) -> None:
    delay = 0.2

    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = _client(proxy.port)
            try:
                assert await client.ping()
                proxy.latency(delay, direction)
                start = time.monotonic()
                assert await client.ping()
                elapsed = time.monotonic() - start
                assert ways * delay - CLOCK_SLACK <= elapsed < HANG
                proxy.heal()
                assert await client.ping()
            finally:
                await client.aclose()

    _run(main())


def test_drop_next_reply_applies_the_command_and_resets_the_client(
    redis_server: RedisServer,
) -> None:
    async def main() -> None:
        key = _key()
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = _client(proxy.port)
            direct = _client(redis_server.port)
            try:
                assert await client.ping()  # the handshake is past
                proxy.drop_next_reply()
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.incr(key)
                await proxy.wait_dropped(HANG)
                assert proxy.dropped_replies == 1
                assert await direct.get(key) == b"1"  # applied, the reply lost
                # One-shot: the client's next connection goes through.
                assert await client.incr(key) == 2
                assert proxy.connections == 2
            finally:
                await client.aclose()
                await direct.aclose()

    _run(main())


def test_drop_reply_matching_a_request_spares_the_others(redis_server: RedisServer) -> None:
    script = "return redis.call('INCR', KEYS[1])"

    async def main() -> None:
        key = _key()
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = _client(proxy.port)
            direct = _client(redis_server.port)
            try:
                sha = await direct.script_load(script)
                proxy.drop_next_reply(match=b"EVALSHA")
                # The handshake and other commands before the script call go through.
                assert await client.ping()
                assert await client.get(key) is None
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.evalsha(sha, 1, key)
                await proxy.wait_dropped(HANG)
                assert await direct.get(key) == b"1"
                assert await client.evalsha(sha, 1, key) == 2
                assert proxy.dropped_replies == 1
            finally:
                await client.aclose()
                await direct.aclose()

    _run(main())


def test_wait_dropped_times_out_and_heal_disarms(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            proxy.drop_next_reply(match=b"never sent")
            with pytest.raises(TimeoutError):
                await proxy.wait_dropped(0.05)
            proxy.heal()
            with pytest.raises(RuntimeError, match="disarmed"):
                await proxy.wait_dropped(HANG)
            await proxy.wait_dropped(0.05)  # nothing left armed

    _run(main())


def test_reset_all_resets_a_request_in_flight_and_loses_held_bytes(
    redis_server: RedisServer,
) -> None:
    async def main() -> None:
        key = _key()
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = _client(proxy.port)
            direct = _client(redis_server.port)
            try:
                assert await client.ping()
                proxy.black_hole()
                seen = proxy.bytes_from_client

                async def incr_once() -> int:
                    return await client.incr(key)

                incr = asyncio.create_task(incr_once())
                # Held at the proxy:
                assert await until(lambda: proxy.bytes_from_client > seen, HANG)
                proxy.reset_all()
                with pytest.raises(redis.exceptions.ConnectionError):
                    await incr
                assert await until(lambda: proxy.active == 0, HANG)
                proxy.heal()
                assert await client.ping()  # a new connection works
                assert await direct.get(key) is None  # the held INCR never reached Redis
            finally:
                await client.aclose()
                await direct.aclose()

    _run(main())


def test_reset_all_refuses_new_connections_until_healed(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            proxy.reset_all(refuse_for=math.inf)
            client = _client(proxy.port)
            try:
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.ping()
                proxy.heal()
                assert await client.ping()
            finally:
                await client.aclose()

    _run(main())


def test_black_hole_times_clients_out_until_healed(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            old = _client(proxy.port, timeout=SHORT_TIMEOUT)
            new = _client(proxy.port, timeout=SHORT_TIMEOUT)
            try:
                assert await old.ping()
                proxy.black_hole()
                start = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError):
                    await old.ping()
                assert time.monotonic() - start < 5
                # A new connection is accepted but its handshake is never answered.
                with pytest.raises(redis.exceptions.TimeoutError):
                    await new.ping()
                assert proxy.bytes_to_client == proxy.bytes_from_server
                proxy.heal()
                assert await old.ping()
                assert await new.ping()
            finally:
                await old.aclose()
                await new.aclose()

    _run(main())


def test_half_close_sends_eof_to_clients(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = _client(proxy.port)
            try:
                assert await client.ping()
                proxy.half_close()
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.ping()
                proxy.heal()
                assert await client.ping()
            finally:
                await client.aclose()

    _run(main())


def test_half_closed_socket_still_reads_the_client(redis_server: RedisServer) -> None:
    """On the wire: the client reads EOF, its writes still reach the server, and the
    server's answers are discarded."""

    async def main() -> None:
        key = _key()
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            direct = _client(redis_server.port)
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            try:
                writer.write(b"PING\r\n")
                assert await reader.readline() == b"+PONG\r\n"
                proxy.half_close()
                assert await asyncio.wait_for(reader.read(), HANG) == b""  # EOF
                writer.write(f"SET {key} after\r\n".encode())
                await writer.drain()
                # The server answered (so applied the SET); the answer went nowhere.
                assert await until(lambda: proxy.bytes_discarded >= len(b"+OK\r\n"), HANG)
                assert await direct.get(key) == b"after"
            finally:
                writer.close()
                await direct.aclose()

    _run(main())


def test_close_is_bounded_and_leaves_no_task_or_listener(private_redis: RedisServer) -> None:
    async def main() -> None:
        proxy = await FaultProxy("127.0.0.1", private_redis.port).start()
        port = proxy.port
        streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        reader, writer = streams[0]
        writer.write(b"PING\r\n")
        assert await reader.readline() == b"+PONG\r\n"
        proxy.latency(HANG, "to_client")  # a reply asleep in its pump
        streams[1][1].write(b"PING\r\n")
        assert await until(lambda: proxy.bytes_from_server > len(b"+PONG\r\n"), HANG)
        proxy.black_hole()  # a request held, and a connection never opened upstream
        streams[2][1].write(b"PING\r\n")
        late = await asyncio.open_connection("127.0.0.1", port)
        streams.append(late)
        assert await until(lambda: proxy.active == 4, HANG)
        start = time.monotonic()
        await proxy.aclose()
        assert time.monotonic() - start < HANG
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert proxy.active == 0
        for r, w in streams:
            with pytest.raises(ConnectionError):  # reset, not closed politely
                await r.read()
            w.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)

    _run(main())


def test_threaded_proxy_controls_from_a_sync_test(redis_server: RedisServer) -> None:
    key = _key()
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as proxy:
        client = _sync_client(proxy.port)
        direct = _sync_client(redis_server.port)
        try:
            assert client.ping()
            proxy.drop_next_reply(match=b"INCR")
            with pytest.raises(redis.exceptions.ConnectionError):
                client.incr(key)
            proxy.wait_dropped(HANG)
            assert proxy.dropped_replies == 1
            assert direct.get(key) == b"1"
            proxy.reset_all(refuse_for=math.inf)
            with pytest.raises(redis.exceptions.ConnectionError):
                client.ping()
            proxy.heal()
            assert client.incr(key) == 2
        finally:
            client.close()
            direct.close()
        port = proxy.port
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.1.1", "example.com", "0.0.0.0"])
def test_refuses_a_target_off_loopback(host: str) -> None:
    with pytest.raises(ValueError, match="target_host"):
        FaultProxy(host, 6379)
    with pytest.raises(ValueError, match="target_host"):
        ThreadedFaultProxy(host, 6379)


def test_refuses_bad_arguments(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="target_port"):
        FaultProxy("127.0.0.1", 0)

    async def main() -> None:
        async with FaultProxy("::1", redis_server.port) as proxy:  # accepted as loopback
            for bad in (-1.0, math.nan, math.inf):
                with pytest.raises(ValueError, match="seconds"):
                    proxy.latency(bad)
            with pytest.raises(ValueError, match="direction"):
                proxy.latency(0.1, "sideways")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="refuse_for"):
                proxy.reset_all(refuse_for=-1)
            with pytest.raises(TypeError, match="predicate"):
                proxy.drop_reply_when(b"EVALSHA")  # type: ignore[arg-type]

    _run(main())
