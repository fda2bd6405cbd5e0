"""The network-server scenario: idle timeouts reset on every request.

A loopback TCP server holds ``conns`` connections; each request resets that
connection's idle timeout; a connection idle for ``idle`` seconds is closed. The server
runs in its own process (``python -m bench.workloads.server_scenario --serve MODE``) so
its CPU time is its own; the client (the caller's process) drives every connection
through ``rounds`` request/response rounds, then goes quiet and records when each
connection is closed.

Four servers, in two pairs that differ only in the timer:

* ``protocol/wheel``: an ``asyncio.Protocol``; ``Timer.reschedule(idle)`` per request.
* ``protocol/call_later``: the same protocol; ``handle.cancel()`` + ``loop.call_later``.
* ``stream/wheel.timeout``: a streams handler in ``tickwheel.wheel.timeout(idle)``,
  ``cm.reschedule(now + idle)`` per request.
* ``stream/asyncio.timeout``: the same handler in ``asyncio.timeout``.

:func:`run_mode` gives, per server: its CPU over the timed rounds, requests, wall time,
and how late each idle connection was closed: the close seen by the client minus (its
last request sent + idle). The server resets the timeout only after that send, so
"early" must stay 0. Run by the server section of ``python -m bench``, by
``python -m bench.probes.server_scenario`` (a table) and, under callgrind, by
``python -m bench.probes.callgrind server``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.loops import new_loop

ROOT = Path(__file__).resolve().parents[2]  # the repository: the server imports bench
MODES = ["protocol/wheel", "protocol/call_later", "stream/wheel.timeout", "stream/asyncio.timeout"]
# The same servers with no per-connection timer at all, for profiling only (the floor a
# timer's cost sits on; python -m bench.probes.callgrind server): one sweep every ``idle``
# seconds closes the connections that saw no request since the sweep before.
FLOOR_MODES = ["protocol/none", "stream/none"]
REQUEST = b"ping\n"
RESPONSE = b"pong\n"
# Listen backlog (the kernel caps it at net.core.somaxconn). asyncio's default of 100
# overflowed under waves of 500 connects: dropped SYNs were retried after 1 s, 3 s, ...,
# so opening 10,000 connections took longer than the idle timeout.
BACKLOG = 4096
WAVE = 500  # connects in flight at once, well inside the backlog
# Extra seconds the client waits, past the idle timeout, for the closes before it gives up.
CLOSE_GRACE = 30.0


def raise_fd_limit(need: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to at least ``need`` (up to the hard limit).

    Raises:
        RuntimeError: if the hard limit is below ``need``.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise RuntimeError(f"ulimit -n: the hard limit {hard} is below the {need} fds needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


# -- the server (child process) ---------------------------------------------------------


def _protocol_factory(mode: str, idle: float) -> Callable[[], asyncio.Protocol]:
    from tickwheel.wheel import TimingWheel

    loop = asyncio.get_running_loop()
    wheel = TimingWheel()

    if mode == "protocol/none":
        return _floor_protocol(idle)

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            if mode == "protocol/wheel":
                self.timer: Any = wheel.schedule(idle, transport.close)
            else:
                self.timer = loop.call_later(idle, transport.close)

        def data_received(self, data: bytes) -> None:
            if mode == "protocol/wheel":
                self.timer.reschedule(idle)
            else:
                self.timer.cancel()
                self.timer = loop.call_later(idle, self.transport.close)
            self.transport.write(RESPONSE * data.count(b"\n"))

        def connection_lost(self, exc: BaseException | None) -> None:
            self.timer.cancel()

    return Conn


def _sweep_every(idle: float, seen: dict[Any, bool]) -> None:
    """Close, every ``idle`` s, what saw no request since the last sweep (floor modes)."""
    loop = asyncio.get_running_loop()

    def sweep() -> None:
        for transport, active in list(seen.items()):
            if active:
                seen[transport] = False
            else:
                del seen[transport]
                transport.close()
        loop.call_later(idle, sweep)

    loop.call_later(idle, sweep)


def _floor_protocol(idle: float) -> Callable[[], asyncio.Protocol]:
    seen: dict[Any, bool] = {}
    _sweep_every(idle, seen)

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            seen[transport] = True

        def data_received(self, data: bytes) -> None:
            seen[self.transport] = True
            self.transport.write(RESPONSE * data.count(b"\n"))

    return Conn


async def _serve(mode: str, port: int, idle: float, conns: int) -> None:
    raise_fd_limit(conns + 100)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(
        signal.SIGUSR1,
        lambda: print(f"cpu {time.process_time():.6f} user {os.times().user:.6f}", flush=True),
    )
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    if mode.startswith("protocol/"):
        server = await loop.create_server(
            _protocol_factory(mode, idle), "127.0.0.1", port, backlog=BACKLOG
        )
    else:
        from tickwheel.wheel import timeout as wheel_timeout

        timeout = wheel_timeout if mode == "stream/wheel.timeout" else asyncio.timeout

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                async with timeout(idle) as cm:
                    while line := await reader.readline():
                        cm.reschedule(loop.time() + idle)
                        writer.write(RESPONSE * line.count(b"\n"))
            except TimeoutError:
                pass
            finally:
                writer.close()

        seen: dict[Any, bool] = {}

        async def handle_floor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen[writer] = True
            try:
                while line := await reader.readline():
                    seen[writer] = True
                    writer.write(RESPONSE * line.count(b"\n"))
            finally:
                writer.close()

        if mode == "stream/none":
            _sweep_every(idle, seen)
        server = await asyncio.start_server(
            handle_floor if mode == "stream/none" else handle,
            "127.0.0.1",
            port,
            limit=1024,
            backlog=BACKLOG,
        )
    print("ready", flush=True)
    async with server:
        await stop


# -- the client (this process) ----------------------------------------------------------


class _Client(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiter: asyncio.Future[None] | None = None
        self.last_sent = 0.0  # the server resets the timeout after this, never before
        self.closed_at = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.closed_at.done():
            self.closed_at.set_result(time.monotonic())
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(
                ConnectionError("closed while a request was pending: raise --idle")
            )

    async def request(self) -> None:
        if self.closed_at.done():  # a write to a closed transport would wait forever
            raise ConnectionError("closed before a request: raise --idle")
        self.waiter = self.loop.create_future()
        self.last_sent = time.monotonic()
        self.transport.write(REQUEST)
        await self.waiter


def _server_cpu(proc: subprocess.Popen[str]) -> tuple[float, float]:
    """The server's CPU seconds so far: (user + system, user)."""
    assert proc.stdout is not None
    proc.send_signal(signal.SIGUSR1)
    fields = proc.stdout.readline().split()
    return float(fields[1]), float(fields[3])


async def _drive(
    port: int, conns: int, rounds: int, idle: float, proc: subprocess.Popen[str]
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    clients: list[_Client] = []
    t_open = time.monotonic()
    for start in range(0, conns, WAVE):  # open in waves: the accept backlog is finite
        made = await asyncio.gather(
            *(
                loop.create_connection(lambda: _Client(loop), "127.0.0.1", port)
                for _ in range(min(WAVE, conns - start))
            )
        )
        clients += [c for _, c in made]
    open_s = time.monotonic() - t_open
    await asyncio.gather(*(c.request() for c in clients))  # warm up
    cpu0, user0 = _server_cpu(proc)
    t0 = time.monotonic()
    for _ in range(rounds):
        await asyncio.gather(*(c.request() for c in clients))
    wall = time.monotonic() - t0
    cpu, user = _server_cpu(proc)
    cpu, user = cpu - cpu0, user - user0
    async with asyncio.timeout(idle + CLOSE_GRACE):
        closed = await asyncio.gather(*(c.closed_at for c in clients))
    return {
        "open_s": open_s,
        "requests": conns * rounds,
        "wall": wall,
        "cpu": cpu,
        "cpu_user": user,
        "idle_late": sorted(t - c.last_sent for t, c in zip(closed, clients, strict=True)),
    }


def run_mode(
    mode: str,
    conns: int,
    rounds: int,
    idle: float,
    *,
    uvloop: bool = False,
    wrapper: list[str] | None = None,
) -> dict[str, Any]:
    """One server process in ``mode``, driven from this process.

    Returns:
        ``open_s`` (seconds to open every connection), ``requests``, ``wall`` (s of the
        timed rounds), ``cpu`` (the server's CPU s over them; ``cpu_user``: the user-space
        share, without the kernel's socket work) and ``idle_late`` (sorted
        close lateness per connection, s; negative means closed early).

    ``wrapper`` prefixes the server's command (e.g. valgrind's, to profile it).
    """
    from tickwheel.durable.servers._redis import free_port

    raise_fd_limit(conns + 100)
    port = free_port()
    cmd = [
        *(wrapper or []),
        sys.executable,
        "-m",
        "bench.workloads.server_scenario",
        "--serve",
        mode,
        "--port",
        str(port),
        "--idle",
        str(idle),
    ]
    cmd += ["--conns", str(conns)]
    if uvloop:
        cmd.append("--uvloop")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{mode} server did not start")
        loop = _new_loop(uvloop)
        try:
            result = loop.run_until_complete(_drive(port, conns, rounds, idle, proc))
        finally:
            loop.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10 if wrapper is None else 300)
    result["idle_late"] = [t - idle for t in result["idle_late"]]
    return result


def _new_loop(uvloop: bool) -> asyncio.AbstractEventLoop:
    return new_loop("uvloop" if uvloop else "asyncio")


def main(argv: list[str] | None = None) -> None:
    """The server's process: serve ``--serve MODE`` until SIGTERM."""
    parser = argparse.ArgumentParser(description="one server of the scenario (a child)")
    parser.add_argument("--serve", required=True, choices=MODES + FLOOR_MODES)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--conns", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args(argv)
    loop = _new_loop(args.uvloop)
    loop.run_until_complete(_serve(args.serve, args.port, args.idle, args.conns))
    loop.close()


if __name__ == "__main__":
    main()
