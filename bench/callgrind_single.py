"""What one awaited single schedule costs, tickwheel beside its durable peers, counted
rather than timed: round trips, and callgrind instructions on each side of the socket.

    python -m bench.callgrind_single [--libs tickwheel,arq,bullmq,saq,streaq]

Why: the durable section's "single schedule" row is a ratio of wall times, and on a
shared virtual machine a round trip's cost moves by tens of percent from one day to the
next (the 3x-arq target of issue 14 read 3.14x on one machine and 2.56x on another, for
code whose Redis side had only got cheaper). Counts do not move: with them, a wall time
is about ``round trips x the machine's round trip + instructions / its speed``.

How: one redis-server runs under ``valgrind --tool=callgrind`` for the whole run. Each
library's client runs in a child, itself under callgrind, twice: ``SMALL`` and then
``LARGE`` awaited single schedules of jobs due in a day (as the durable section's row),
after the same set-up. The server's counters are zeroed before each child and dumped
after it. Each figure is the difference of the two runs over ``LARGE - SMALL``, free of
start-up, imports, connections and set-up:

- ``client``: the client process's instructions per schedule (Python, redis-py, the
  library; the kernel's share is not counted);
- ``server``: redis-server's instructions per schedule;
- ``round trips``: the read calls per schedule (``syscr`` of /proc/PID/io) of a second,
  plain redis-server, driven by the same child run natively (valgrind's own polling
  reads would blur the first one's): each request the server waits for is one read.

The namespace holds only the jobs of the run (no 100,000 pending): set-up under
callgrind costs minutes per library. So tickwheel's record buckets are listpacks here,
not the hash tables of the durable section (a few thousand instructions either way).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SMALL = 300
LARGE = 1_300
LIBS = ("tickwheel", "arq", "bullmq", "saq", "streaq")
DAY_MS = 86_400_000
PAYLOAD = b"x" * 32
_TOTAL = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


async def _child(lib: str, port: int, count: int) -> None:
    """``count`` awaited single schedules by ``lib`` (after a warm-up of 10)."""
    import redis.asyncio  # the child's imports are counted in both runs

    url = f"redis://127.0.0.1:{port}"
    if lib == "tickwheel":
        from tickwheel.durable import Scheduler

        client = redis.asyncio.Redis.from_url(url)
        s = Scheduler(client, "bench", shards=1, check=False)
        for i in range(10):
            await s.schedule(f"warm:{i}", "noop", PAYLOAD, delay=DAY_MS / 1000)
        for i in range(count):
            await s.schedule(f"one:{i}", "noop", PAYLOAD, delay=DAY_MS / 1000)
        await s.close()
        await client.aclose()
        return
    from bench import peers

    peer = peers.PEERS[lib](url)
    await peer.open()
    due = peers.now_ms() + DAY_MS
    for i in range(10):
        await peer.schedule_one(f"warm:{i}", due)
    for i in range(count):
        await peer.schedule_one(f"one:{i}", due)
    await peer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reads(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise RuntimeError(f"no syscr in /proc/{pid}/io")


def _total(path: str) -> int:
    with open(path) as f:
        match = _TOTAL.search(f.read())
    if match is None:
        raise RuntimeError(f"no callgrind total in {path}")
    return int(match.group(1))


class TracedServer:
    """A redis-server, under callgrind (counters zeroed and dumped on demand) or not."""

    def __init__(self, tmp: str, traced: bool) -> None:
        self.tmp = tmp
        self.port = _free_port()
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found on PATH")
        tracer = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/server.%p"]
        self.proc = subprocess.Popen(
            [
                *(tracer if traced else []),
                *(binary, "--port", str(self.port), "--save", "", "--appendonly", "no"),
                *("--dir", tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.dumps = 0
        deadline = time.monotonic() + 60
        while True:  # up once it answers a connection
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.2)

    def _control(self, flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(self.proc.pid)], check=True, capture_output=True
        )

    def zero(self) -> None:
        """Zero the instruction counters."""
        self._control("-z")

    def dump(self) -> int:
        """Instructions since the last zero."""
        self._control("-d")
        self.dumps += 1
        path = f"{self.tmp}/server.{self.proc.pid}.{self.dumps}"
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the dump is written whole before the next zero
        return _total(path)

    def stop(self) -> None:
        self.proc.terminate()  # by its pid: a Redis the machine already runs is untouched
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _child_cmd(lib: str, port: int, count: int) -> list[str]:
    return [
        *(sys.executable, "-m", "bench.callgrind_single", "child"),
        *("--lib", lib, "--port", str(port), "--count", str(count)),
    ]


def _run(cmd: list[str], lib: str) -> None:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} child failed:\n{proc.stderr[-3000:]}")


def _counted(
    traced: TracedServer, plain: TracedServer, lib: str, count: int, tmp: str
) -> list[int]:
    """Client instructions, server instructions and round trips of ``count`` schedules
    (with the set-up and start-up that the other count's run repeats)."""
    out = f"{tmp}/client.{lib}.{count}"
    traced.zero()
    _run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *_child_cmd(lib, traced.port, count),
        ],
        lib,
    )
    server_total = traced.dump()
    reads0 = _reads(plain.proc.pid)
    _run(_child_cmd(lib, plain.port, count), lib)
    return [_total(out), server_total, _reads(plain.proc.pid) - reads0]


def measure(libs: list[str]) -> dict[str, dict[str, float]]:
    """Per library: client and server instructions and round trips per single schedule."""
    with tempfile.TemporaryDirectory() as tmp:
        traced = TracedServer(tmp, traced=True)
        plain = TracedServer(tmp, traced=False)
        try:
            out: dict[str, dict[str, float]] = {}
            for lib in libs:
                small = _counted(traced, plain, lib, SMALL, tmp)
                large = _counted(traced, plain, lib, LARGE, tmp)
                per = [(b - a) / (LARGE - SMALL) for a, b in zip(small, large, strict=True)]
                out[lib] = {"client": per[0], "server": per[1], "round_trips": per[2]}
                print(
                    f"{lib:<10} {per[2]:5.2f} round trips  {per[0]:>10,.0f} client"
                    f"  {per[1]:>9,.0f} server instructions per schedule",
                    flush=True,
                )
            return out
        finally:
            traced.stop()
            plain.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="measure", choices=("measure", "child"))
    ap.add_argument("--libs", default=",".join(LIBS))
    ap.add_argument("--lib", default="tickwheel")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--count", type=int, default=SMALL)
    args = ap.parse_args(argv)
    if args.mode == "child":
        asyncio.run(_child(args.lib, args.port, args.count))
        return 0
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed", file=sys.stderr)
            return 1
    libs = args.libs.split(",")
    unknown = sorted(set(libs) - set(LIBS))
    if unknown:
        print(f"--libs: unknown {unknown}; known: {', '.join(LIBS)}", file=sys.stderr)
        return 2
    counts = measure(libs)
    if "tickwheel" in counts:
        ours = counts["tickwheel"]
        for lib, c in counts.items():
            if lib != "tickwheel":
                both = (c["client"] + c["server"]) / (ours["client"] + ours["server"])
                print(
                    f"{lib} / tickwheel: round trips {c['round_trips'] / ours['round_trips']:.2f}x,"
                    f" client {c['client'] / ours['client']:.2f}x,"
                    f" server {c['server'] / ours['server']:.2f}x, client + server {both:.2f}x"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
