"""Client-side cost of the durable hot paths, per job: callgrind or cProfile.

    python -m bench.profile_durable callgrind [--ops claim_ack,schedule_many,single]
    python -m bench.profile_durable cprofile --op claim_ack

``callgrind``: each operation runs in a child under ``valgrind --tool=callgrind``
twice (SMALL and LARGE jobs after the same setup); the difference of the two totals
over ``LARGE - SMALL`` is the client process's instruction count per job, free of
start-up, imports and the setup. The redis-server is a separate process, not traced.
``cprofile``: the top functions by own time of one operation over LARGE jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile

import redis.asyncio

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers import RedisServer

SMALL = 2_000
LARGE = 12_000
OPS = ("claim_ack", "schedule_many", "single", "bare")
# "bare": one EVALSHA of a script that only returns, through the store's own call path
# (Direct on one Redis, as a single schedule goes): the floor of an awaited call,
# against which "single" is compared.
BARE = "return 1"
PAYLOAD = b"x" * 32


async def _setup(port: int, op: str, count: int) -> tuple[Scheduler, redis.asyncio.Redis]:
    client = redis.asyncio.Redis(port=port)
    await client.flushall()
    s = Scheduler(client, "p", shards=1 if op == "claim_ack" else 16, check=False)
    await s.open()
    if op == "claim_ack":
        await s.take(0)
        for start in range(0, LARGE, 5000):  # the same setup for every count
            n = min(5000, LARGE - start)
            await s.schedule_many(
                JobSpec(f"job:{start + i}", "send_email", PAYLOAD) for i in range(n)
            )
    return s, client


async def _run(s: Scheduler, op: str, count: int) -> None:
    if op == "claim_ack":
        n = 0
        while n < count:
            batch = await s.claim(0, limit=min(1000, count - n))
            await s.ack_many(batch.jobs)
            n += len(batch.jobs)
    elif op == "schedule_many":
        for start in range(0, count, 1000):
            await s.schedule_many(
                JobSpec(f"m:{start + i}", "send_email", PAYLOAD, delay=3600) for i in range(1000)
            )
    elif op == "bare":
        # The same call path as a single schedule (the store's, Direct on one Redis).
        script = s.store.client.register_script(BARE)
        for i in range(count):
            await s.store._run(script, ["{p:0}:due"], [f"s:{i}", PAYLOAD], 0)
    else:
        for i in range(count):
            await s.schedule(f"s:{i}", "send_email", PAYLOAD, delay=60)


def child(port: int, op: str, count: int, profile: bool) -> None:
    loop = asyncio.new_event_loop()
    s, client = loop.run_until_complete(_setup(port, op, count))
    # Warm up the scripts' SHA cache and the connection.
    if op != "claim_ack":
        loop.run_until_complete(_run(s, op, 1 if op in ("single", "bare") else 1000))
    if profile:
        loop.run_until_complete(client.config_resetstat())
        prof = cProfile.Profile()
        prof.enable()
        loop.run_until_complete(_run(s, op, count))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        stats = loop.run_until_complete(client.info("commandstats"))
        for name, row in stats.items():
            if "eval" in name:
                print(
                    f"server {name}: {row['calls']} calls, {row['usec']} us, "
                    f"{row['usec'] / count:.2f} us per job"
                )
    else:
        start_toggle()
        loop.run_until_complete(_run(s, op, count))
    loop.run_until_complete(client.aclose())


def start_toggle() -> None:
    """Nothing: callgrind counts the whole process (the SMALL run is subtracted)."""


def _instructions(port: int, op: str, count: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.profile_durable",
            "child",
            "--port",
            str(port),
            "--op",
            op,
            "--count",
            str(count),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        m = re.search(r"Collected : (\d+)", proc.stderr)
        if m is None:
            raise RuntimeError(proc.stderr[-2000:])
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("callgrind", "cprofile", "child"))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--op", default="claim_ack")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--count", type=int, default=LARGE)
    args = ap.parse_args()
    if args.mode == "child":
        child(args.port, args.op, args.count, profile=False)
        return
    server = RedisServer().start()
    try:
        if args.mode == "cprofile":
            child(server.port, args.op, args.count, profile=True)
            return
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind not found")
        for op in args.ops.split(","):
            counts = {n: _instructions(server.port, op, n) for n in (SMALL, LARGE)}
            per = (counts[LARGE] - counts[SMALL]) / (LARGE - SMALL)
            print(f"{op:<14} {per:>10,.0f} instructions per job (client process)", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
