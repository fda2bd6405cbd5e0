"""EVALSHA packed here and sent on connections of the store's own, for one Redis.

Why: a script call through redis-py's asyncio client (``AsyncScript`` ->
``execute_command``: the pool's lock and observability hooks, the retry wrapper, the
generic packer) cost ~383,000 client instructions per round trip under callgrind, the
same call packed here and written on a held connection ~144,000
(``bench/profile_durable.py``; redis-py 8.1). A single awaited schedule is one such call.

Ground rules:

- One Redis only (a ``redis.asyncio.Redis`` with a plain ``ConnectionPool``); the
  cluster and the pipelined writes keep going through redis-py.
- The connections are made by the client's pool (``make_connection``: its address,
  credentials, database, TLS, socket timeouts) but held here, in a free list: one per
  call in flight, reused after. :meth:`Direct.aclose` closes them (``Store.aclose``).
- A connection is reused only after a whole reply was read (an error reply included).
  Anything else (a timeout, a cancellation, a reset) disconnects it: a reply may still
  be on its way, and must never be read as the next call's.
- The client's retry policy is the one followed: the clients ``_connect`` makes never
  re-send after a lost reply, and then neither does this; a client made with redis-py's
  retrying default re-sends here as it would through redis-py (the claim's token makes
  that safe, tests/test_faults.py). Besides, NOSCRIPT says the script did not run: it is
  loaded, then sent once more.
- An idle connection the server closed meanwhile (a restart) is reconnected before it
  is used, as redis-py's pool does: that call was never sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

__all__ = ["Direct", "pack_evalsha", "pack_script_load"]

_HEAD = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n"
_ARG = b"$%d\r\n%s\r\n"
_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"


def _encoded(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    raise TypeError(f"script arguments must be bytes, str or int, got {type(value).__name__}")


# RESP bulk strings of the ints 0..255 (numkeys, flags, modes), looked up, not formatted.
_SMALL = tuple(_ARG % (len(b"%d" % i), b"%d" % i) for i in range(256))
# Packed key names kept per Direct: a shard's keys recur in every call. Claim reply keys
# are new per claim, so the cache is emptied when it reaches this size.
_KEY_CACHE = 4096


def pack_evalsha(
    sha: bytes,
    keys: Sequence[str],
    args: Sequence[Any],
    packed_keys: dict[str, bytes] | None = None,
) -> bytes:
    """The RESP request ``EVALSHA sha numkeys keys... args...``.

    ``packed_keys``: a cache of packed key names to read and fill (1.4 against 2.6 us
    for schedule_one's request, with small ints looked up too).

    Raises:
        TypeError: for an argument that is not bytes, str or int.
    """
    n = len(keys)
    numkeys = _SMALL[n] if n < 256 else _ARG % (len(b"%d" % n), b"%d" % n)
    parts = [_HEAD % (3 + n + len(args), sha), numkeys]
    append = parts.append
    cache = {} if packed_keys is None else packed_keys
    for key in keys:
        packed = cache.get(key)
        if packed is None:
            data = key.encode()
            packed = _ARG % (len(data), data)
            if len(cache) >= _KEY_CACHE:
                cache.clear()
            cache[key] = packed
        append(packed)
    for value in args:
        if value.__class__ is int and 0 <= value < 256:
            append(_SMALL[value])
        else:
            data = _encoded(value)
            append(_ARG % (len(data), data))
    return b"".join(parts)


def pack_script_load(source: str) -> bytes:
    """The RESP request ``SCRIPT LOAD source``."""
    data = source.encode()
    return b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" + _ARG % (len(data), data)


async def _failed(error: Exception) -> None:
    """Nothing to undo before a retry: the failed call dropped its connection."""


class Direct:
    """Script calls on held connections of one plain client (see the module's rules)."""

    __slots__ = ("_free", "_keys", "_pool", "_retry")

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._free: list[Any] = []  # connected, idle, nothing left to read
        self._keys: dict[str, bytes] = {}  # packed key names (pack_evalsha)
        retry: Any = client.get_retry()
        self._retry = retry if retry is not None and retry.get_retries() != 0 else None

    @staticmethod
    def usable(client: Any) -> bool:
        """True for a client this path serves: a plain ``Redis`` on its own pool."""
        pool = getattr(client, "connection_pool", None)
        return (
            isinstance(client, redis.asyncio.Redis)
            and type(pool) is redis.asyncio.ConnectionPool
            and not client.single_connection_client
            and issubclass(pool.connection_class, redis.asyncio.connection.AbstractConnection)
        )

    async def evalsha(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The reply of ``script`` (a redis-py ``AsyncScript``) called with ``keys`` and
        ``args``; loads it once if the server answers NOSCRIPT.

        Raises:
            redis.exceptions.ResponseError: the script's error reply.
            redis.exceptions.ConnectionError, TimeoutError: the connection failed.
        """
        request = pack_evalsha(script.sha.encode(), keys, args, self._keys)
        if self._retry is None:
            return await self._once(script, request)
        return await self._retry.call_with_retry(lambda: self._once(script, request), _failed)

    async def _once(self, script: Any, request: bytes) -> Any:
        try:
            return await self._call(request)
        except redis.exceptions.NoScriptError:
            await self._load(script)
            return await self._call(request)

    async def _load(self, script: Any) -> None:
        # On a held connection too, not the client's pool: after a restart (which is when
        # a script goes missing) the pool's idle connections are the stale ones.
        await self._call(pack_script_load(script.script))

    async def transaction(
        self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """``script`` once per ``(keys, args)`` in one MULTI/EXEC, sent in one write;
        the replies in call order.

        Every call is the same script, so a NOSCRIPT in EXEC's reply is every call's:
        none ran, and the whole transaction is sent again once the script is loaded.

        Raises:
            redis.exceptions.ResponseError: the first error reply (at queueing, which
                aborts the transaction, or of a call that ran).
        """
        sha = script.sha.encode()
        packed = self._keys
        request = b"".join([_MULTI, *[pack_evalsha(sha, k, a, packed) for k, a in calls], _EXEC])
        if self._retry is None:
            replies = await self._transaction_once(script, request, len(calls))
        else:
            replies = await self._retry.call_with_retry(
                lambda: self._transaction_once(script, request, len(calls)), _failed
            )
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _transaction_once(self, script: Any, request: bytes, n: int) -> list[Any]:
        replies: list[Any] = await self._call(request, n + 1)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            await self._load(script)
            replies = await self._call(request, n + 1)
        return replies

    async def _call(self, request: bytes, queued: int = 0) -> Any:
        conn = self._free.pop() if self._free else self._pool.make_connection()
        reusable = False
        try:
            reader = conn._reader
            if reader is None or reader.at_eof():  # never connected, or closed by the server
                await conn.disconnect()
                await conn.connect()
            conn._writer.write(request)
            first: redis.exceptions.ResponseError | None = None
            for _ in range(queued):  # MULTI's OK, then QUEUED (or an error) per call
                try:
                    await conn.read_response(disable_decoding=True)
                except redis.exceptions.ResponseError as exc:
                    first = first or exc  # EXEC will abort; read on to its reply
            try:
                reply = await conn.read_response(disable_decoding=True)
            except redis.exceptions.ResponseError as exc:
                reusable = True  # a whole error reply was read
                raise (first or exc) from None
            reusable = True
            return reply
        finally:
            if reusable:
                self._free.append(conn)
            else:
                await conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Close the held connections."""
        free, self._free = self._free, []
        for conn in free:
            await conn.disconnect()
