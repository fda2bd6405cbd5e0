"""The store's own EVALSHA path on one Redis (_direct.py), against a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio
import redis.exceptions

from tests.durable_support import run
from tests.faultproxy import FaultProxy
from tickwheel.durable.servers import RedisServer
from tickwheel.durable.store._direct import _KEY_CACHE, Direct, pack_evalsha


def test_packed_request_is_what_redis_py_packs(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    conn = client.connection_pool.make_connection()
    sha = "a" * 40
    keys, args = ["{n:0}:due", "k\u00e9y"], [0, 12345678901234, b"\x00\xff", "t\u00e9xt"]
    assert pack_evalsha(sha.encode(), keys, args) == b"".join(
        conn.pack_command("EVALSHA", sha, len(keys), *keys, *args)
    )
    with pytest.raises(TypeError, match="bytes, str or int"):
        pack_evalsha(sha.encode(), [], [1.5])
    with pytest.raises(TypeError, match="bytes, str or int"):
        pack_evalsha(sha.encode(), [], [True])  # not packed as the small int 1
    # Small ints (looked up), the edges around them, and cached key names: the same bytes.
    cache: dict[str, bytes] = {}
    for values in ([0, 255, 256, -1, 10**12], [b"", "", 7]):
        expected = b"".join(conn.pack_command("EVALSHA", sha, len(keys), *keys, *values))
        assert pack_evalsha(sha.encode(), keys, values, cache) == expected
        assert pack_evalsha(sha.encode(), keys, values, cache) == expected  # from the cache
    assert set(cache) == set(keys)
    run(client.aclose())


def test_numkeys_of_256_and_more_is_packed(redis_server: RedisServer) -> None:
    """A claim passes every bucket key (up to MAX_BUCKETS = 1024): numkeys past the
    looked-up small ints is formatted."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    conn = client.connection_pool.make_connection()
    for n in (255, 256, 1031):
        keys = [f"{{n:0}}:jobs:{i}" for i in range(n)]
        assert pack_evalsha(b"a" * 40, keys, [1]) == b"".join(
            conn.pack_command("EVALSHA", "a" * 40, n, *keys, 1)
        )
    run(client.aclose())


def test_the_key_cache_is_bounded() -> None:
    cache: dict[str, bytes] = {}
    for i in range(_KEY_CACHE + 10):
        pack_evalsha(b"a" * 40, [f"{{n:0}}:claim:{i}"], [], cache)
    assert 0 < len(cache) <= _KEY_CACHE
    last = f"{{n:0}}:claim:{_KEY_CACHE + 9}"
    assert cache[last] == f"${len(last)}\r\n{last}\r\n".encode()


def test_replies_errors_noscript_and_a_killed_connection(redis_server: RedisServer) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        direct = Direct(client)
        assert Direct.usable(client)
        echo = client.register_script("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
        fail = client.register_script("return redis.error_reply('TW_TEST no')")
        await client.script_flush()
        # Not loaded: NOSCRIPT, loaded, sent again.
        assert await direct.evalsha(echo, ["{x}:a"], [b"v", 41]) == [b"{x}:a", b"v", 42]
        # An error reply leaves the connection usable (it is reused, and answers).
        with pytest.raises(redis.exceptions.ResponseError, match="TW_TEST"):
            await direct.evalsha(fail, ["{x}:a"], [])
        assert len(direct._free) == 1
        assert await direct.evalsha(echo, ["{x}:b"], [b"w", 1]) == [b"{x}:b", b"w", 2]
        # The server closes the idle connection: the next call reconnects first.
        await client.client_kill_filter(_type="normal", skipme=True)
        await asyncio.sleep(0.05)
        assert await direct.evalsha(echo, ["{x}:c"], [b"u", 2]) == [b"{x}:c", b"u", 3]
        # Calls in flight together each take a connection; all are kept for reuse.
        got = await asyncio.gather(*(direct.evalsha(echo, ["k"], [b"", i]) for i in range(5)))
        assert [g[2] for g in got] == [1, 2, 3, 4, 5]
        assert len(direct._free) == 5
        await direct.aclose()
        assert direct._free == []
        await client.aclose()

    run(main())


def test_a_cancelled_call_never_leaves_its_reply_to_the_next(redis_server: RedisServer) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        direct = Direct(client)
        slow = client.register_script(
            "local t = redis.call('TIME') local e = tonumber(t[1]) * 1e6 + tonumber(t[2]) + 200000"
            " repeat t = redis.call('TIME') until tonumber(t[1]) * 1e6 + tonumber(t[2]) >= e"
            " return 'slow'"
        )
        echo = client.register_script("return ARGV[1]")
        await client.script_load(slow.script)
        task = asyncio.ensure_future(direct.evalsha(slow, [], []))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert direct._free == []  # disconnected, not kept
        assert await direct.evalsha(echo, [], [b"mine"]) == b"mine"
        await direct.aclose()
        await client.aclose()

    run(main())


def test_a_transaction_runs_whole_after_noscript_and_raises_a_calls_error(
    redis_server: RedisServer,
) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        direct = Direct(client)
        add = client.register_script(
            "if ARGV[1] == 'bad' then return redis.error_reply('TW_TEST bad') end "
            "return redis.call('INCRBY', KEYS[1], ARGV[1])"
        )
        await client.delete("{t}:n")
        await client.script_flush()
        # NOSCRIPT for every call (none ran): loaded, and the whole of it sent again.
        got = await direct.transaction(add, [(["{t}:n"], [1]), (["{t}:n"], [10])])
        assert got == [1, 11]
        assert await client.get("{t}:n") == b"11"
        with pytest.raises(redis.exceptions.ResponseError, match="TW_TEST bad"):
            await direct.transaction(add, [(["{t}:n"], [5]), (["{t}:n"], [b"bad"])])
        assert await client.get("{t}:n") == b"16"  # EXEC ran the good call (no rollback)
        assert len(direct._free) == 1  # the connection read everything: reused
        assert await direct.transaction(add, [(["{t}:n"], [4])]) == [20]
        await direct.aclose()
        await client.aclose()

    run(main())


def test_after_a_restart_a_missing_script_loads_on_a_held_connection() -> None:
    """A restart empties the script cache and leaves the client's pooled connections
    stale: the NOSCRIPT recovery must not go through them (it did, and raised
    "Connection closed by server" instead of running the call)."""
    server = RedisServer()
    server.start()
    try:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url, retry=None)
            direct = Direct(client)
            echo = client.register_script("return ARGV[1]")
            await client.ping()  # the pool now holds an idle connection
            assert await direct.evalsha(echo, [], [b"before"]) == b"before"
            server.kill()
            server.start()  # same port, empty script cache
            await asyncio.sleep(0.05)
            assert await direct.evalsha(echo, [], [b"after"]) == b"after"
            await direct.aclose()
            await client.aclose()

        run(main())
    finally:
        server.stop()


def test_a_reply_no_call_asked_for_retires_the_connection(redis_server: RedisServer) -> None:
    """Bytes arriving between calls (here a PONG written behind the path's back) would be
    read as the next call's reply: the connection is retired instead, and the next call
    runs on a new one."""

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        direct = Direct(client)
        echo = client.register_script("return ARGV[1]")
        assert await direct.evalsha(echo, [], [b"one"]) == b"one"
        (held,) = direct._free
        held._transport.write(b"*1\r\n$4\r\nPING\r\n")
        for _ in range(100):
            if not held.usable():
                break
            await asyncio.sleep(0.01)
        assert not held.usable()
        assert await direct.evalsha(echo, [], [b"two"]) == b"two"
        assert len(direct._free) == 1 and direct._free[0] is not held
        await direct.aclose()
        await client.aclose()

    run(main())


@pytest.mark.parametrize("fault", ["reset", "eof"])
def test_a_connection_lost_mid_call_raises_connection_error(
    redis_server: RedisServer, fault: str
) -> None:
    """The reply never comes: the connection is reset after the request went through, or
    the server's side sends EOF. The call fails with redis-py's ConnectionError at once
    (not at a timeout), the connection is not kept, and the next call gets a new one."""

    async def main() -> None:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url, retry=None)
            direct = Direct(client)
            echo = client.register_script("return ARGV[1]")
            assert await direct.evalsha(echo, [], [b"before"]) == b"before"  # loaded
            if fault == "reset":
                proxy.drop_next_reply(b"EVALSHA")
            else:
                proxy.half_close()
            with pytest.raises(redis.exceptions.ConnectionError):
                await asyncio.wait_for(direct.evalsha(echo, [], [b"lost"]), 5)
            assert direct._free == []
            proxy.heal()
            assert await direct.evalsha(echo, [], [b"after"]) == b"after"
            await direct.aclose()
            await client.aclose()

    run(main())


def test_resp3_clients_are_not_served_here(redis_server: RedisServer) -> None:
    # Push messages would arrive unasked; redis-py reads RESP3 itself.
    assert Direct.usable(redis.asyncio.Redis.from_url(redis_server.url))
    assert not Direct.usable(redis.asyncio.Redis.from_url(redis_server.url, protocol=3))


def test_calls_over_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    server = RedisServer(extra_args=["--unixsocket", str(path), "--unixsocketperm", "700"])
    server.start()
    try:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(f"unix://{path}")
            direct = Direct(client)
            assert Direct.usable(client)
            echo = client.register_script("return ARGV[1]")
            assert await direct.evalsha(echo, [], [b"one"]) == b"one"
            await client.client_kill_filter(_type="normal", skipme=True)
            await asyncio.sleep(0.05)
            assert await direct.evalsha(echo, [], [b"two"]) == b"two"  # reconnected
            await direct.aclose()
            await client.aclose()

        run(main())
    finally:
        server.stop()
