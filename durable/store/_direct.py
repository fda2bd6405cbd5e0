"""EVALSHA packed here and sent on connections of the store's own, for one Redis.

Why: a script call through redis-py's asyncio client (``AsyncScript`` ->
``execute_command``: the pool's lock and observability hooks, the retry wrapper, the
generic packer) cost ~383,000 client instructions per round trip under callgrind, the
same call packed here and written on a held connection ~144,000 (``python -m
bench.probes.callgrind durable-client``; redis-py 8.1). A single awaited schedule is one
such call.
Reading the reply through redis-py's connection (its ``read_response``, the parser's
wrapper, asyncio's stream reader) was most of the rest: once a held connection is set
up, its transport is read here by a small protocol (:class:`_Held`, hiredis). A bare
script call through the store then costs 87,000 instructions instead of 143,000, a
single schedule 169,000 instead of 224,000 (``bench.probes.callgrind durable-client``). An
awaited call waits out its round trip either way (its latency did not move), but a
producer with many calls in flight is bound by this CPU: 64 tasks scheduling at once
went from 24,700 to 30,800 schedules/s (``bench.probes.durable_compare``'s in-flight row,
medians of 4 alternating runs).

Ground rules:

- One Redis only (a ``redis.asyncio.Redis`` with a plain ``ConnectionPool``); the
  cluster and the pipelines that end in WAIT keep going through redis-py. A pipeline
  without WAIT (the flow limits' batches, the pauses' calls over the shards) is packed
  here too (:meth:`Direct.pipeline`): the limits' batches cost half the client CPU so.
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
- redis-py makes each connection and does its handshake (AUTH, SELECT, HELLO, client
  name; over TLS too); then :class:`_Held` takes the transport's reading over. RESP2
  only: a client set to RESP3 (push messages) is not served here (:meth:`Direct.usable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions
from redis._parsers.base import BaseParser  # the error-reply classes redis-py's parsers use

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
    for value in args:  # the common classes inline: a flow limits' batch has 8 a job
        cls = value.__class__
        if cls is str:
            data = value.encode()
        elif cls is int:
            if 0 <= value < 256:
                append(_SMALL[value])
                continue
            data = b"%d" % value
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


class _Held(asyncio.Protocol):
    """A held connection: redis-py's ``conn``, connected and past its handshake, whose
    transport delivers what it reads here instead of to asyncio's stream reader.

    One request at a time: :meth:`call` writes it and returns a future of its ``n``
    replies, set once all have arrived (an error reply is an exception object among
    them, as redis-py's hiredis parser gives it). Anything else makes the connection
    :attr:`broken`, never to be reused: a lost connection (the future's error is
    redis-py's ``ConnectionError``), bytes that are not RESP, or a reply nobody asked
    for. The stream reader's protocol is still told of the end of the connection, so
    redis-py's ``disconnect`` finds the stream closed.
    """

    __slots__ = ("_got", "_inner", "_reader", "_transport", "_waiter", "_want", "broken", "conn")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._transport: Any = conn._writer.transport
        self._inner: Any = self._transport.get_protocol()  # asyncio's StreamReaderProtocol
        self._reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse, replyError=BaseParser.parse_error
        )
        self._waiter: asyncio.Future[list[Any]] | None = None
        self._want = 0
        self._got: list[Any] = []
        self.broken = self._transport.is_closing()
        self._transport.set_protocol(self)

    def usable(self) -> bool:
        """Still open, and nothing unread or unexpected on it."""
        return not self.broken and not self._transport.is_closing()

    def call(self, request: bytes, n: int) -> asyncio.Future[list[Any]]:
        """Write ``request``; the future of its ``n`` replies."""
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiter, self._want, self._got = waiter, n, []
        self._transport.write(request)
        return waiter

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:  # RESP2 has no false reply
                waiter = self._waiter
                if waiter is None:
                    raise redis.exceptions.InvalidResponse("a reply that no call asked for")
                self._got.append(reply)
                if len(self._got) == self._want:
                    self._waiter = None
                    if not waiter.done():  # a cancelled call's future is done already
                        waiter.set_result(self._got)
        except redis.exceptions.InvalidResponse as exc:
            self._fail(exc)
            self._transport.close()

    def eof_received(self) -> None:
        self.broken = True  # returning None: the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f": {exc}" if exc is not None else ""
        self._fail(redis.exceptions.ConnectionError(f"Connection closed by server{detail}"))
        self._inner.connection_lost(exc)

    def _fail(self, exc: Exception) -> None:
        self.broken = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class Direct:
    """Script calls on held connections of one plain client (see the module's rules)."""

    __slots__ = ("_free", "_keys", "_pool", "_retry")

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._free: list[_Held] = []  # connected, idle, nothing left to read
        self._keys: dict[str, bytes] = {}  # packed key names (pack_evalsha)
        retry: Any = client.get_retry()
        self._retry = retry if retry is not None and retry.get_retries() != 0 else None

    @staticmethod
    def usable(client: Any) -> bool:
        """True for a client this path serves: a plain ``Redis`` on its own pool, RESP2."""
        pool = getattr(client, "connection_pool", None)
        return (
            isinstance(client, redis.asyncio.Redis)
            and type(pool) is redis.asyncio.ConnectionPool
            and not client.single_connection_client
            and issubclass(pool.connection_class, redis.asyncio.connection.AbstractConnection)
            and str(pool.connection_kwargs.get("protocol") or 2) == "2"
        )

    async def evalsha(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The reply of ``script`` (a redis-py ``AsyncScript``) called with ``keys`` and
        ``args``; loads it once if the server answers NOSCRIPT.

        Raises:
            redis.exceptions.ResponseError: the script's error reply.
            redis.exceptions.ConnectionError, TimeoutError: the connection failed.
        """
        request = pack_evalsha(script.sha.encode(), keys, args, self._keys)
        if self._retry is not None:
            return await self._retry.call_with_retry(lambda: self._once(script, request), _failed)
        try:  # _once, inlined: one coroutine less on the hot path
            return await self._call(request)
        except redis.exceptions.NoScriptError:
            await self._load(script)
            return await self._call(request)

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

    async def pipeline(
        self, calls: Sequence[tuple[Any, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Each ``(script, keys, args)`` as one EVALSHA, all sent in one write, no MULTI
        (each call atomic on its own); the replies in call order, an error reply as the
        exception object in its place (a NOSCRIPT one too: that call did not run, and
        the caller loads the script and resends it). Never re-sent here.

        Raises:
            redis.exceptions.ConnectionError, TimeoutError: the connection failed.
        """
        if not calls:
            return []
        packed = self._keys
        request = b"".join([pack_evalsha(s.sha.encode(), k, a, packed) for s, k, a in calls])
        replies: list[Any] = await self._call(request, len(calls) - 1, raw=True)
        return replies

    async def _call(self, request: bytes, queued: int = 0, *, raw: bool = False) -> Any:
        """The last of the ``queued + 1`` replies of ``request`` (an error reply raised);
        with ``raw``, all of them as they are (error replies in place)."""
        held = self._free.pop() if self._free else None
        conn = self._pool.make_connection() if held is None else held.conn
        replies: list[Any] = []
        reusable = False
        try:
            if held is None or not held.usable():  # never connected, or closed by the server
                await conn.disconnect()
                await conn.connect()
                held = _Held(conn)
            replies = await held.call(request, queued + 1)
            reusable = True  # every reply of the request was read (error replies too)
        finally:
            if reusable and held is not None:
                self._free.append(held)
            else:
                await conn.disconnect(nowait=True)
        if raw:
            return replies
        reply = replies[-1]
        if isinstance(reply, redis.exceptions.ResponseError):
            # MULTI's OK and a QUEUED (or an error) per call came first; EXEC's abort
            # says less than the queued call's own error.
            queued_errors = (
                r for r in replies[:-1] if isinstance(r, redis.exceptions.ResponseError)
            )
            raise next(queued_errors, reply)
        return reply

    async def aclose(self) -> None:
        """Close the held connections."""
        free, self._free = self._free, []
        for held in free:
            await held.conn.disconnect()
