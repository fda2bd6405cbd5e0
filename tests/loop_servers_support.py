"""Servers on the wheel-timed loops, for tests/test_wheel_loop_servers.py and the
benchmark (bench/probes/loop_servers.py): a trivial ASGI app for uvicorn, the same for
aiohttp, and a client that holds many keep-alive connections and times their close.

``python tests/loop_servers_support.py aiohttp PORT LOOP KEEPALIVE`` serves the aiohttp
app on 127.0.0.1:PORT on LOOP (``stdlib``, ``uvloop``, ``wheel`` or ``wheel-uvloop``).
uvicorn is run by its own command line (``--loop tickwheel.wheel:new_event_loop``).

Both apps answer ``GET /`` with ``ok``, ``GET /loop`` with the loop's class name,
``GET /slow`` with 504 after a request timeout of ``SLOW_TIMEOUT`` seconds
(``asyncio.timeout`` around a sleep that would take longer), ``GET /mem`` (or
``/mem/stop``) with :func:`memory_report` (the benchmark's memory per idle connection),
and ``GET /gc`` with ``ok`` after a full collection (so that two counted runs start
from the same state of the collector).
"""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

SLOW_TIMEOUT = 0.3  # the request timeout of GET /slow, seconds

LOOPS: dict[str, str | None] = {
    "stdlib": None,  # uvicorn --loop asyncio
    "uvloop": "uvloop",
    "wheel": "tickwheel.wheel:new_event_loop",
    "wheel-uvloop": "tickwheel.wheel:new_uvloop_event_loop",
}


async def asgi_app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """A trivial ASGI app: ``ok``, or 504 once ``/slow`` times out."""
    if scope["type"] != "http":
        return
    status, body = 200, b"ok"
    if scope["path"] == "/loop":
        body = type(asyncio.get_running_loop()).__name__.encode()
    elif scope["path"] == "/gc":
        gc.collect()
    elif scope["path"].startswith("/mem"):
        body = memory_report(stop=scope["path"] == "/mem/stop").encode()
    elif scope["path"] == "/slow":
        try:
            async with asyncio.timeout(SLOW_TIMEOUT):
                await asyncio.sleep(30)
        except TimeoutError:
            status, body = 504, b"timeout"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def memory_report(stop: bool = False) -> str:
    """``"TRACED RSS"`` after a full collection: the bytes tracemalloc counts as allocated
    and still live (tracing starts at the first call, so this covers what was allocated
    since), and the process's resident set. ``stop``: end the tracing afterwards (so that
    it no longer slows the server)."""
    gc.collect()
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    traced = tracemalloc.get_traced_memory()[0]
    if stop:
        tracemalloc.stop()
    with open("/proc/self/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    rss = int(m.group(1)) * 1024 if m else -1
    return f"{traced} {rss}"


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop factory of a ``LOOPS`` name."""
    if name == "stdlib":
        return asyncio.SelectorEventLoop
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    from tickwheel.wheel import new_event_loop, new_uvloop_event_loop

    return new_event_loop if name == "wheel" else new_uvloop_event_loop


def serve_aiohttp(port: int, loop: str, keepalive: float) -> None:
    """Serve the aiohttp app on 127.0.0.1:``port`` until killed."""
    from aiohttp import web

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def slow(_request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(SLOW_TIMEOUT):
                await asyncio.sleep(30)
        except TimeoutError:
            return web.Response(status=504, text="timeout")
        return web.Response(text="slept")

    async def loop_name(_request: web.Request) -> web.Response:
        return web.Response(text=type(asyncio.get_running_loop()).__name__)

    async def collect(_request: web.Request) -> web.Response:
        gc.collect()
        return web.Response(text="ok")

    async def mem(request: web.Request) -> web.Response:
        return web.Response(text=memory_report(stop=request.path == "/mem/stop"))

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", ok)
        app.router.add_get("/slow", slow)
        app.router.add_get("/loop", loop_name)
        app.router.add_get("/gc", collect)
        app.router.add_get("/mem", mem)
        app.router.add_get("/mem/stop", mem)
        runner = web.AppRunner(app, keepalive_timeout=keepalive, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(main())


def start_server(
    kind: str,
    loop: str,
    port: int,
    keepalive: float,
    *,
    wrapper: list[str] | None = None,
    start_timeout: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Start uvicorn or aiohttp on ``loop`` in a child process; return once it accepts.

    ``wrapper`` prefixes the command (valgrind's, to count the server's instructions);
    ``start_timeout`` bounds the wait for its first accepted connection.
    """
    if kind == "uvicorn":
        name = LOOPS[loop]
        cmd = [
            sys.executable, "-m", "uvicorn", "loop_servers_support:asgi_app",
            "--app-dir", __file__.rsplit("/", 1)[0], "--host", "127.0.0.1",
            "--port", str(port), "--loop", name or "asyncio", "--http", "h11",
            "--timeout-keep-alive", str(int(keepalive)), "--no-access-log",
            "--log-level", "warning", "--backlog", "4096",
        ]  # fmt: skip
    else:
        cmd = [sys.executable, __file__, "aiohttp", str(port), loop, str(keepalive)]
    proc = subprocess.Popen([*(wrapper or []), *cmd], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} on {loop} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{kind} on {loop} did not start")


REQUEST = b"GET %s HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n"


async def request_then_idle(port: int, path: str = "/") -> tuple[int, float, float, bytes]:
    """One request on a new keep-alive connection, then silence until the server closes.

    Returns:
        (status, seconds from sending the request to the full response, seconds from
        sending the request to the server's close, the body).
    """
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = loop.time()
        writer.write(REQUEST % path.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        answered = loop.time() - sent
        rest = await reader.read()  # b"" at the server's close
        assert rest == b"", rest
        return status, answered, loop.time() - sent, body
    finally:
        writer.close()


if __name__ == "__main__":
    serve_aiohttp(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
