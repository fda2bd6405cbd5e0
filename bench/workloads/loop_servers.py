"""uvicorn and aiohttp on each event loop, under load and holding idle connections
(issue 41): the measurement behind the ``loop`` section of ``python -m bench`` and
``python -m bench.probes.loop_servers``.

The servers are tests/loop_servers_support.py's (uvicorn with a trivial ASGI app over
h11, and aiohttp; keep-alive 600 s, so no connection closes during a measurement). One
server process per (server, loop), on one of :data:`LOOPS`; in that process, in order:

1. **Memory per idle connection** (the process fresh): ``idle`` keep-alive connections
   each make one request and go quiet, every one holding its keep-alive timer; twice.
   First the growth of the server's resident set (``/proc/PID/status``), then, once
   those have closed, the bytes tracemalloc counts as allocated and still live over the
   same number of new connections (tracing started just before them, by ``GET /mem``,
   and stopped after). tracemalloc sees every allocation made through Python's
   allocators, raw ones included (uvloop's libuv handles, the wheel's C timers), not
   libuv's own ``malloc`` calls (its watcher array: a pointer per descriptor) nor the
   kernel's socket memory (the same on every loop). The second pass reuses the first
   one's grown containers (on the selector loops, the selector's map of descriptors),
   which a fresh process would count.
2. **Requests per second and CPU per request**, at each connection count: a load
   generator (:func:`wrk`, ``wrk -t2`` when on PATH, else :func:`python_load`) keeps
   every connection busy with keep-alive ``GET /`` for ``seconds`` (twice as long above
   1,000 connections); the server's user+system CPU over that run (``/proc/PID/stat``)
   divided by the requests answered.
   Each request cancels one keep-alive timer and arms another (aiohttp 3.10+ re-arms
   lazily: its timer runs once per keep-alive period, not per request).
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers.loops import HAVE_UVLOOP

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from loop_servers_support import start_server  # noqa: E402  (the tests' support module)

LOOPS = ("stdlib", "uvloop", "wheel", "wheel-uvloop")
SERVERS = ("uvicorn", "aiohttp")
KEEPALIVE = 600  # seconds: longer than any measurement
REQUEST = b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n"
WAVE = 500  # idle connections opened at once, well inside the servers' backlog of 4096
# wrk's per-request timeout (its default, 2 s, counts the slow answers of a Python
# server at 10,000 connections as errors instead of requests: each waits its turn).
WRK_TIMEOUT = 30
# Load runs on more connections than this last twice as long: a Python server takes 1-3
# s to accept 10,000 connections, which should not be most of the run.
LONG_RUN_ABOVE = 1_000
_CLK = os.sysconf("SC_CLK_TCK")
_WRK_REQUESTS = re.compile(r"(\d+) requests in")
_WRK_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_WRK_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


def available_loops() -> tuple[str, ...]:
    """The loops of :data:`LOOPS` this machine can run (uvloop is optional)."""
    return tuple(x for x in LOOPS if HAVE_UVLOOP or "uvloop" not in x)


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def raise_fd_limit() -> None:
    """The soft RLIMIT_NOFILE up to the hard one (the servers and wrk inherit it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def rss_bytes(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert m is not None
    return int(m.group(1)) * 1024


def wrk(port: int, connections: int, seconds: float) -> dict[str, int]:
    """``wrk -t2`` on ``connections`` keep-alive connections for ``seconds`` (whole, at
    least 1): ``requests`` answered, ``bad`` (answers other than 200), ``lost``
    (connections that failed once open: read or write errors), ``unopened`` (connect
    errors) and ``timeouts`` (requests unanswered after :data:`WRK_TIMEOUT`)."""
    out = subprocess.run(
        [
            "wrk",
            f"-t{min(2, connections)}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={WRK_TIMEOUT}s",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = _WRK_REQUESTS.search(out)
    if m is None:
        raise RuntimeError(f"wrk printed no request count:\n{out}")
    res = {"requests": int(m.group(1)), "bad": 0, "lost": 0, "unopened": 0, "timeouts": 0}
    if (bad := _WRK_NON2XX.search(out)) is not None:
        res["bad"] = int(bad.group(1))
    if (sock := _WRK_ERRORS.search(out)) is not None:
        connect, read, write, timeout = (int(x) for x in sock.groups())
        res.update(lost=read + write, unopened=connect, timeouts=timeout)
    return res


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes = b"/"
) -> tuple[int, bytes]:
    """One keep-alive request on an open connection: (status, body)."""
    writer.write(REQUEST % path)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    return int(head.split(b" ", 2)[1]), body


async def _busy(port: int, deadline: float, counts: dict[str, int]) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        counts["unopened"] += 1
        return
    try:
        while time.monotonic() < deadline:
            ok = (await exchange(reader, writer))[0] == 200
            counts["requests" if ok else "bad"] += 1
    except (OSError, asyncio.IncompleteReadError):
        counts["lost"] += 1
    finally:
        writer.close()


def python_load(port: int, connections: int, seconds: float) -> dict[str, int]:
    """What :func:`wrk` measures, from a Python client (for a machine without wrk): every
    connection makes keep-alive requests one after the other for ``seconds``. The client
    shares the machine's cores with the server, so requests/s is the pair's; the
    server's CPU per request is still its own. The same counts as :func:`wrk`."""

    async def main() -> dict[str, int]:
        counts = {"requests": 0, "bad": 0, "lost": 0, "unopened": 0, "timeouts": 0}
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_busy(port, deadline, counts) for _ in range(connections)))
        return counts

    return asyncio.run(main())


async def _request(port: int, path: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return (await exchange(reader, writer, path))[1]
    finally:
        writer.close()


async def _traced(port: int, path: bytes = b"/mem") -> int:
    """The server's tracemalloc count (``GET /mem`` starts tracing at its first call)."""
    return int((await _request(port, path)).split()[0])


async def _open_idle(port: int, n: int) -> tuple[list[asyncio.StreamWriter], int]:
    """``n`` connections, one answered request each, left open: (writers, non-200s)."""

    async def one() -> tuple[asyncio.StreamWriter, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return writer, (await exchange(reader, writer))[0]

    writers: list[asyncio.StreamWriter] = []
    bad = 0
    for i in range(0, n, WAVE):
        for writer, status in await asyncio.gather(*(one() for _ in range(min(WAVE, n - i)))):
            writers.append(writer)
            bad += status != 200
    await asyncio.sleep(0.5)  # every keep-alive timer armed, the server quiet
    return writers, bad


async def _close(writers: list[asyncio.StreamWriter]) -> None:
    for w in writers:
        w.close()
    await asyncio.sleep(0.5)  # the server has seen the closes


def idle_memory(port: int, pid: int, n: int, rss: bool = True) -> dict[str, Any]:
    """Memory per idle keep-alive connection of the server ``pid``: RSS (unless not
    ``rss``), then traced. ``idle_bad``: idle connections not answered 200."""

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {"idle_bad": 0}
        if rss:
            before = rss_bytes(pid)
            writers, bad = await _open_idle(port, n)
            out["rss_bytes_per_idle"] = (rss_bytes(pid) - before) / n
            out["idle_bad"] += bad
            await _close(writers)
        t0 = await _traced(port)
        writers, bad = await _open_idle(port, n)
        out["traced_bytes_per_idle"] = (await _traced(port, b"/mem/stop") - t0) / n
        out["idle_bad"] += bad
        await _close(writers)
        return out

    return asyncio.run(main())


def measure(
    kind: str,
    loop: str,
    conns: tuple[int, ...],
    seconds: float,
    idle: int,
    *,
    use_wrk: bool,
    short: bool = False,
) -> dict[str, Any]:
    """One server process of ``kind`` on ``loop``: memory per idle connection (``idle``
    of them; 0: not measured), then requests/s and CPU per request at each of ``conns``.
    ``short`` (``--quick``): no RSS pass and no warm-up.
    """
    from tickwheel.durable.servers import free_port

    port = free_port()
    proc = start_server(kind, loop, port, keepalive=KEEPALIVE)
    load = wrk if use_wrk else python_load
    try:
        out: dict[str, Any] = {"server": kind, "loop": loop, "load": load.__name__}
        if idle:
            out.update(idle_memory(port, proc.pid, idle, rss=not short))
        if not short:
            load(port, min(50, max(conns)), 1)  # warm up
        for c in conns:
            cpu0 = cpu_seconds(proc.pid)
            t0 = time.monotonic()
            length = seconds * (2 if c > LONG_RUN_ABOVE else 1)
            counts = load(port, c, length)
            wall = time.monotonic() - t0
            cpu = cpu_seconds(proc.pid) - cpu0
            requests = counts["requests"]
            out[f"c{c}"] = {
                **counts,
                "seconds": length,
                "requests_per_s": requests / length,
                "cpu_us_per_request": cpu / max(requests, 1) * 1e6,
                "wall_s": wall,
            }
        return out
    finally:
        proc.terminate()
        proc.wait(30)
