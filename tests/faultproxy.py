"""A TCP fault proxy on loopback, for tests: latency, lost replies, resets, black holes.

``FaultProxy`` listens on 127.0.0.1 and relays every connection to a loopback target (a
redis-server, or any TCP server). Faults are switched at run time, while connections are
open, from the test's own event loop; ``ThreadedFaultProxy`` runs the same proxy on a loop
in a thread of its own, with a blocking control API, for sync tests and for workers that
are separate processes.

What each fault does on the wire:

- ``latency(s, direction)``: every chunk read in that direction waits ``s`` seconds
  before it is written on (chunks stay in order; a chunk waits at least ``s``).
- ``drop_next_reply(match)`` / ``drop_reply_when(predicate)``: a one-shot. The first
  client->server chunk that matches (any chunk when ``match`` is None) is forwarded, so
  the server applies it; the first server->client chunk read on that connection after
  it is discarded and both sides of the connection are reset (RST: SO_LINGER 0, then
  ``abort()``). The client never sees the reply. ``wait_dropped()`` waits until every
  armed drop has fired.
- ``reset_all(refuse_for=s)``: resets (RST) both sides of every open connection; for
  ``s`` seconds after, a new connection is accepted and reset at once.
- ``black_hole()``: bytes are read from both sides and held, nothing is forwarded, and
  nothing is answered; a new connection is accepted, its bytes held, and no connection
  to the target is opened. Sockets stay open. On ``heal()`` the held bytes flow on in
  order, as TCP's retransmission would deliver them after a short partition; to lose
  them (a partition longer than TCP gives up after), call ``reset_all()`` first.
- ``half_close()``: sends EOF (shutdown SHUT_WR) to every client; the proxy keeps
  reading the client and forwarding to the server, and discards the server's answers.
  A connection opened later gets the EOF at once, until ``heal()``.
- ``heal()``: clears every fault above: no latency, no refusal, no black hole, no
  half-close for new connections, pending drops disarmed. A connection already reset or
  half-closed stays so.

Limitations:

- A drop works on chunks, not on RESP messages: with a pipelining client, the chunk
  dropped may hold replies to earlier requests of the same connection too, or only the
  first part of the reply (the connection is reset then, so the rest never arrives).
  Match on a command the client sends alone (``b"EVALSHA"``, not ``b"PING"``), and arm
  after the connection's handshake (redis-py sends ``CLIENT SETINFO`` on connect).
- A refusal accepts, then resets: the kernel completes the TCP handshake before the
  proxy sees the connection. A client sees ECONNRESET on its first read, not
  ECONNREFUSED. (Closing the listener would refuse for real, but its port could be taken
  by another socket before the proxy binds it again.)
- Latency is per chunk as read; a client whose requests coalesce into one chunk pays it
  once.

Redis Cluster: a client learns the nodes' addresses from the cluster itself (CLUSTER
SLOTS / SHARDS and MOVED replies carry each node's announced port), so a proxy in front
of one node sees only the bootstrap connection; the client then talks to the nodes
directly. To put every node behind a proxy: make the ``RedisClusterServer`` (its nodes
have their ports before they start), one proxy per node (target ``node.port``), add
``--cluster-announce-port <its proxy's port>`` to each node's ``extra_args``, then start
the cluster and wait until every node's ``CLUSTER SLOTS`` lists only proxy ports. A
``RedisCluster`` client then sends every command through the proxies. Announcing at
start rather than with ``CONFIG SET`` works on Redis 6.2 too, which applies a runtime
change to the other nodes' view but never to a node's own. The cluster bus keeps
``node.port + 10000`` (``cluster-announce-bus-port`` unset), so a fault does not disturb
failure detection. While the ports are announced, ``RedisClusterServer.master_of_slot``
finds no master (it compares announced ports with ``node.port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["Direction", "FaultProxy", "ThreadedFaultProxy"]

T = TypeVar("T")

# Which way a latency applies: client->server, server->client, or both.
Direction = Literal["to_server", "to_client", "both"]
_DIRECTIONS = ("to_server", "to_client", "both")
# Bytes read per chunk; a StreamReader holds at most twice its limit (64 KiB) besides.
_CHUNK = 65536
# How long close() waits for the forwarding tasks it cancelled: they only need one turn
# of the loop, so anything longer means a bug, and a test must not hang on it.
_CLOSE_TIMEOUT = 5.0
# How long a ThreadedFaultProxy control call may take to run on the proxy's loop.
_CONTROL_TIMEOUT = 10.0
# SO_LINGER on, timeout 0: close() sends RST instead of FIN.
_LINGER_RST = struct.pack("ii", 1, 0)


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"target_host must be a loopback address, got {host!r}")


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close a connection with RST (SO_LINGER 0), dropping whatever it has buffered."""
    if writer is None or writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class _Drop:
    """One armed drop: which client chunk it waits for, and whether it fired."""

    __slots__ = ("disarmed", "fired", "predicate")

    def __init__(self, predicate: Callable[[bytes], bool]) -> None:
        self.predicate = predicate  # true for the client->server chunk whose reply is dropped
        self.fired = asyncio.Event()  # set when the reply was dropped, or on disarm
        self.disarmed = False  # heal() or close() cleared it before it fired


class _Link:
    """One client connection and its connection to the target."""

    __slots__ = (
        "client_r",
        "client_shut",
        "client_w",
        "drop",
        "pumps",
        "server_r",
        "server_w",
        "task",
    )

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.client_r = reader
        self.client_w = writer
        self.task: asyncio.Task[None] | None = None  # relays: connects, runs the pumps
        self.pumps: list[asyncio.Task[None]] = []  # one per direction, once connected
        self.server_r: asyncio.StreamReader | None = None  # None until the target answered
        self.server_w: asyncio.StreamWriter | None = None
        self.drop: _Drop | None = None  # claimed by a request; its reply is to be dropped
        self.client_shut = False  # EOF sent to the client; server data is discarded

    def reset(self) -> None:
        """RST both sides and stop relaying at once, held or delayed bytes included."""
        _reset(self.client_w)
        _reset(self.server_w)
        # A pump may be asleep on latency or a black hole: it must not wake and forward.
        if self.pumps:
            for pump in self.pumps:
                pump.cancel()
        elif self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def shut_client(self) -> None:
        if not self.client_shut and not self.client_w.transport.is_closing():
            self.client_shut = True
            self.client_w.write_eof()

    def close(self) -> None:
        self.client_w.close()
        if self.server_w is not None:
            self.server_w.close()


class FaultProxy:
    """A loopback TCP proxy whose faults a test switches at run time.

    Use as ``async with FaultProxy(host, port) as proxy:`` inside the test's event loop
    (or ``await start()`` / ``await aclose()``). See the module docstring for what each
    fault does on the wire.

    Args:
        target_host: loopback address of the server to relay to.
        target_port: its TCP port.

    Raises:
        ValueError: if ``target_host`` is not a loopback address.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        _check_loopback(target_host)
        if not 0 < target_port < 65536:
            raise ValueError(f"target_port must be in 1..65535, got {target_port}")
        self.target_host = target_host
        self.target_port = target_port
        self._server: asyncio.Server | None = None  # the listener, while open
        self._port = 0  # the listener's port, once started
        self._links: set[_Link] = set()  # open connections
        self._tasks: set[asyncio.Task[None]] = set()  # _serve of each open connection
        self._closed = False  # aclose() began: new connections are reset
        # Faults:
        self._latency = {"to_server": 0.0, "to_client": 0.0}  # seconds per chunk
        self._passable = asyncio.Event()  # cleared while black-holed
        self._passable.set()
        self._refuse_until = 0.0  # loop time before which new connections are reset
        self._half_close = False  # new connections get EOF at once
        self._drops: list[_Drop] = []  # armed, not yet claimed by a request
        self._armed: list[_Drop] = []  # armed and not yet awaited by wait_dropped()
        # Counters:
        self.connections = 0  # connections accepted, ever
        self.dropped_replies = 0  # drops that fired
        self.bytes_from_client = 0  # bytes read from clients, forwarded or not (yet)
        self.bytes_from_server = 0  # bytes read from the target, forwarded or not (yet)
        self.bytes_to_server = 0  # bytes forwarded client->server
        self.bytes_to_client = 0  # bytes forwarded server->client
        self.bytes_discarded = 0  # server->client bytes dropped or sent to a half-closed client

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        """Bind 127.0.0.1 on a free port and start accepting.

        Raises:
            RuntimeError: if already started.
        """
        if self._server is not None or self._closed:
            raise RuntimeError("FaultProxy already started")
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        """Stop listening, reset every connection and wait for their tasks (bounded)."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        # A connection accepted just now has a task that has not yet registered itself.
        await asyncio.sleep(0)
        for link in list(self._links):
            link.reset()
        for drop in self._drops:
            drop.disarmed = True
            drop.fired.set()
        self._drops.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), _CLOSE_TIMEOUT)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1)."""
        if not self._port:
            raise RuntimeError("FaultProxy not started")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``: the target, as seen through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def active(self) -> int:
        """Connections open now."""
        return len(self._links)

    # -- faults ----------------------------------------------------------------------

    def latency(self, seconds: float, direction: Direction = "both") -> None:
        """Delay every chunk in ``direction`` by ``seconds`` (0 turns it off).

        Raises:
            ValueError: for a negative or non-finite ``seconds`` or an unknown direction.
        """
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
        for d in ("to_server", "to_client"):
            if direction in (d, "both"):
                self._latency[d] = float(seconds)

    def drop_next_reply(self, match: bytes | None = None) -> None:
        """Arm a one-shot: forward the next request (containing ``match``, if given),
        drop the server's first answer to it and reset that connection."""
        if match is None:
            self.drop_reply_when(lambda _data: True)
        else:
            needle = bytes(match)
            self.drop_reply_when(lambda data: needle in data)

    def drop_reply_when(self, predicate: Callable[[bytes], bool]) -> None:
        """Arm a one-shot as :meth:`drop_next_reply`, for the first client->server chunk
        for which ``predicate(chunk)`` is true.

        Raises:
            TypeError: if ``predicate`` is not callable.
        """
        if not callable(predicate):
            raise TypeError(f"predicate must be callable, got {predicate!r}")
        self._drops.append(_Drop(predicate))
        self._armed.append(self._drops[-1])

    # The timeout is a required argument, not the caller's asyncio.timeout(): a test
    # that forgot one would hang on a drop that never fires.
    async def wait_dropped(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until every drop armed so far has fired.

        Raises:
            TimeoutError: if one has not fired within ``timeout`` seconds.
            RuntimeError: if ``heal()`` or ``aclose()`` disarmed one before it fired.
        """
        armed = list(self._armed)
        async with asyncio.timeout(timeout):
            for drop in armed:
                await drop.fired.wait()
        self._armed = [d for d in self._armed if not d.fired.is_set()]
        if any(d.disarmed for d in armed):
            raise RuntimeError("an armed drop was disarmed (heal/aclose) before it fired")

    def reset_all(self, refuse_for: float = 0.0) -> None:
        """Reset (RST) every open connection; reset new ones for ``refuse_for`` seconds.

        ``math.inf`` refuses until :meth:`heal`.

        Raises:
            ValueError: for a negative or NaN ``refuse_for``.
        """
        if not refuse_for >= 0:
            raise ValueError(f"refuse_for must be a number >= 0, got {refuse_for!r}")
        if refuse_for > 0:
            self._refuse_until = asyncio.get_running_loop().time() + refuse_for
        for link in list(self._links):
            link.reset()

    def black_hole(self) -> None:
        """Hold every byte, forward nothing, answer nothing, until :meth:`heal`."""
        self._passable.clear()

    def half_close(self) -> None:
        """Send EOF to every client (keep reading it); new clients too, until heal()."""
        self._half_close = True
        for link in list(self._links):
            link.shut_client()

    def heal(self) -> None:
        """Back to a clean pass-through: clear latency, refusal, black hole, half-close
        and armed drops (those a request already claimed too)."""
        self._latency = {"to_server": 0.0, "to_client": 0.0}
        self._refuse_until = 0.0
        self._half_close = False
        for drop in self._drops:
            drop.disarmed = True
            drop.fired.set()
        self._drops.clear()
        for link in self._links:
            if link.drop is not None and not link.drop.fired.is_set():
                link.drop.disarmed = True
                link.drop.fired.set()
            link.drop = None
        self._passable.set()

    # -- relaying --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The streams callback: relay one connection, in a task that may be cancelled.

        This coroutine itself must not end cancelled: asyncio 3.11's callback calls
        ``task.exception()`` on it, which raises for a cancelled task and gets logged as
        "Exception in callback". So the relay runs in a task of its own, and a
        cancellation of either ends here quietly.
        """
        self.connections += 1
        if self._closed or asyncio.get_running_loop().time() < self._refuse_until:
            _reset(writer)
            return
        serve = asyncio.current_task()
        assert serve is not None
        link = _Link(reader, writer)
        self._tasks.add(serve)
        self._links.add(link)
        try:
            link.task = asyncio.create_task(self._relay(link))
            with contextlib.suppress(asyncio.CancelledError):
                await link.task
        finally:
            link.close()
            self._links.discard(link)
            self._tasks.discard(serve)

    async def _relay(self, link: _Link) -> None:
        """Connect to the target (once no black hole stops it), then run both pumps."""
        if self._half_close:
            link.shut_client()
        # A black hole lets no SYN through either: connect once healed.
        await self._passable.wait()
        try:
            link.server_r, link.server_w = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            link.reset()
            return
        # A TaskGroup: a pump that fails takes the other one down with it.
        # (It ignores a pump that reset() cancelled.)
        async with asyncio.TaskGroup() as pumps:
            link.pumps.append(pumps.create_task(self._pump(link, "to_server")))
            link.pumps.append(pumps.create_task(self._pump(link, "to_client")))

    async def _pump(self, link: _Link, direction: Literal["to_server", "to_client"]) -> None:
        """Relay one direction of a link until EOF or reset."""
        to_server = direction == "to_server"
        assert link.server_r is not None and link.server_w is not None
        src = link.client_r if to_server else link.server_r
        dst = link.server_w if to_server else link.client_w
        while True:
            try:
                data = await src.read(_CHUNK)
            except OSError:
                data = b""
            if not data:
                if not dst.transport.is_closing():
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                return
            if to_server:
                self.bytes_from_client += len(data)
            else:
                self.bytes_from_server += len(data)
            # Taken at read time: a chunk read before a request claimed the drop answers
            # an earlier request and goes through.
            drop = link.drop
            delay = self._latency[direction]
            if delay > 0:
                await asyncio.sleep(delay)
            await self._passable.wait()
            if to_server:
                self._claim(link, data)
            elif drop is not None and link.drop is drop:
                self.bytes_discarded += len(data)
                self.dropped_replies += 1
                link.reset()
                drop.fired.set()
                return
            elif link.client_shut:
                self.bytes_discarded += len(data)
                continue
            if dst.transport.is_closing():  # reset meanwhile: the other pump sees it too
                return
            try:
                dst.write(data)
                await dst.drain()
            except OSError:
                link.reset()
                return
            if to_server:
                self.bytes_to_server += len(data)
            else:
                self.bytes_to_client += len(data)

    def _claim(self, link: _Link, data: bytes) -> None:
        """Let the first armed drop that matches this request claim the link's reply."""
        if link.drop is not None:
            return
        for i, drop in enumerate(self._drops):
            if drop.predicate(data):
                del self._drops[i]
                link.drop = drop
                return


class ThreadedFaultProxy:
    """A :class:`FaultProxy` on an event loop in a thread of its own, with blocking
    controls: for sync tests, and for clients that are other processes.

    Use as ``with ThreadedFaultProxy(host, port) as proxy:``. Every control method runs
    on the proxy's loop and returns once it took effect there. The counters read the
    proxy's attributes from this thread (plain ints).

    Args:
        target_host: loopback address of the server to relay to.
        target_port: its TCP port.

    Raises:
        ValueError: if ``target_host`` is not a loopback address.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        _check_loopback(target_host)
        self.target_host = target_host
        self.target_port = target_port
        self._loop: asyncio.AbstractEventLoop | None = None  # the proxy's, while running
        self._proxy: FaultProxy | None = None  # lives on that loop
        self._stop: asyncio.Event | None = None  # set (on the loop) to close the proxy
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()  # the proxy listens, or failed to
        self._error: BaseException | None = None  # why start() failed

    def start(self) -> ThreadedFaultProxy:
        """Start the thread and wait until the proxy listens.

        Raises:
            RuntimeError: if already started, or the proxy did not start.
        """
        if self._thread is not None:
            raise RuntimeError("ThreadedFaultProxy already started")
        self._thread = threading.Thread(target=self._main, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(_CONTROL_TIMEOUT) or self._proxy is None:
            raise RuntimeError("FaultProxy did not start") from self._error
        return self

    def close(self) -> None:
        """Close the proxy (every connection reset) and join its thread (bounded)."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(2 * _CLOSE_TIMEOUT + _CONTROL_TIMEOUT)

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _main(self) -> None:
        asyncio.run(self._amain())

    async def _amain(self) -> None:
        try:
            proxy = await FaultProxy(self.target_host, self.target_port).start()
        except BaseException as e:
            self._error = e
            self._ready.set()
            raise
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._proxy = proxy
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await proxy.aclose()

    def _on_loop(self, fn: Callable[[FaultProxy], T]) -> T:
        return self._await(self._call(fn))

    async def _call(self, fn: Callable[[FaultProxy], T]) -> T:
        assert self._proxy is not None
        return fn(self._proxy)

    def _await(self, coro: Coroutine[Any, Any, T], timeout: float = _CONTROL_TIMEOUT) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("ThreadedFaultProxy not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _running(self) -> FaultProxy:
        if self._proxy is None:
            raise RuntimeError("ThreadedFaultProxy not started")
        return self._proxy

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1)."""
        return self._running().port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return self._running().url

    @property
    def connections(self) -> int:
        """Connections accepted, ever."""
        return self._running().connections

    @property
    def active(self) -> int:
        """Connections open now."""
        return self._running().active

    @property
    def dropped_replies(self) -> int:
        """Drops that fired."""
        return self._running().dropped_replies

    @property
    def bytes_from_client(self) -> int:
        """Bytes read from clients, forwarded or not (yet)."""
        return self._running().bytes_from_client

    @property
    def bytes_to_server(self) -> int:
        """Bytes forwarded client->server."""
        return self._running().bytes_to_server

    @property
    def bytes_to_client(self) -> int:
        """Bytes forwarded server->client."""
        return self._running().bytes_to_client

    def latency(self, seconds: float, direction: Direction = "both") -> None:
        """:meth:`FaultProxy.latency`."""
        self._on_loop(lambda p: p.latency(seconds, direction))

    def drop_next_reply(self, match: bytes | None = None) -> None:
        """:meth:`FaultProxy.drop_next_reply`."""
        self._on_loop(lambda p: p.drop_next_reply(match))

    def drop_reply_when(self, predicate: Callable[[bytes], bool]) -> None:
        """:meth:`FaultProxy.drop_reply_when`; ``predicate`` runs on the proxy's thread."""
        self._on_loop(lambda p: p.drop_reply_when(predicate))

    def wait_dropped(self, timeout: float) -> None:
        """:meth:`FaultProxy.wait_dropped`, blocking."""
        self._await(self._running().wait_dropped(timeout), timeout + _CONTROL_TIMEOUT)

    def reset_all(self, refuse_for: float = 0.0) -> None:
        """:meth:`FaultProxy.reset_all`."""
        self._on_loop(lambda p: p.reset_all(refuse_for))

    def black_hole(self) -> None:
        """:meth:`FaultProxy.black_hole`."""
        self._on_loop(lambda p: p.black_hole())

    def half_close(self) -> None:
        """:meth:`FaultProxy.half_close`."""
        self._on_loop(lambda p: p.half_close())

    def heal(self) -> None:
        """:meth:`FaultProxy.heal`."""
        self._on_loop(lambda p: p.heal())
