"""What one awaited single schedule costs, tickwheel beside its durable peers, counted
rather than timed: round trips, and callgrind instructions on each side of the socket.

    python -m bench.probes.callgrind single [--libs tickwheel,arq,bullmq,saq,streaq]

Why: the durable section's "single schedule" row is a ratio of wall times, and on a
shared virtual machine a round trip's cost moves by tens of percent from one day to the
next (the 3x-arq target of issue 14 read 3.14x on one machine and 2.56x on another, for
code whose Redis side had only got cheaper). Counts do not move: with them, a wall time
is about ``round trips x the machine's round trip + instructions / its speed``.

How: one redis-server runs under ``valgrind --tool=callgrind`` for the whole run. Each
library's client (a peer through bench/peers/queues.py) runs in a child
(``python -m bench.probes.callgrind.single LIB PORT N``), itself
under callgrind, twice: ``SMALL`` and then
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
import subprocess
import sys
import tempfile

from bench.probes.callgrind._tools import (
    ROOT,
    TracedServer,
    child_args,
    child_command,
    count,
)

SMALL = 300
LARGE = 1_300
LIBS = ("tickwheel", "arq", "bullmq", "saq", "streaq")
DAY_MS = 86_400_000
PAYLOAD = b"x" * 32
CHILD = "bench.probes.callgrind.single"


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
    from bench.peers.queues import PEERS, now_ms

    peer = PEERS[lib](url)
    await peer.open()
    due = now_ms() + DAY_MS
    for i in range(10):
        await peer.schedule_one(f"warm:{i}", due)
    for i in range(count):
        await peer.schedule_one(f"one:{i}", due)
    await peer.close()


def _reads(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise RuntimeError(f"no syscr in /proc/{pid}/io")


def _counted(traced: TracedServer, plain: TracedServer, lib: str, n: int) -> list[int]:
    """Client instructions, server instructions and round trips of ``n`` schedules
    (with the set-up and start-up that the other count's run repeats)."""
    traced.zero()
    client_total = count(child_command(CHILD, lib, traced.port, n))
    server_total = traced.dump()
    reads0 = _reads(plain.proc.pid)
    cmd = child_command(CHILD, lib, plain.port, n)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} child failed:\n{proc.stderr[-3000:]}")
    return [client_total, server_total, _reads(plain.proc.pid) - reads0]


def measure(libs: list[str]) -> dict[str, dict[str, float]]:
    """Per library: client and server instructions and round trips per single schedule."""
    with tempfile.TemporaryDirectory() as tmp:
        traced = TracedServer(tmp, traced=True)
        plain = TracedServer(tmp, traced=False)
        try:
            out: dict[str, dict[str, float]] = {}
            for lib in libs:
                small = _counted(traced, plain, lib, SMALL)
                large = _counted(traced, plain, lib, LARGE)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--libs", default=",".join(LIBS))


def run(args: argparse.Namespace) -> int:
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


def main() -> None:
    """The child: N awaited single schedules by LIB on the Redis at PORT."""
    lib, port, n = child_args("one library's single schedules", LIBS)
    asyncio.run(_child(lib, port, n))


if __name__ == "__main__":
    main()
