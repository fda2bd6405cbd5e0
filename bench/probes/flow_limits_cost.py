"""Redis instructions per job of the flow limits' batched calls (docs/limits.md "Costs"),
counted by callgrind: a redis-server under ``valgrind --tool=callgrind`` (``TracedServer``),
its counters zeroed before and dumped after each step.

    python -m bench.probes.flow_limits_cost [--durable-dir DIR]

1,000 jobs over 100 flow keys, ``concurrency=4``, 4 shards, all claimed, then, each a
step counted alone and divided by the jobs it carries: the permits taken (limits.lua
'A' over all 1,000: 400 granted, 600 wait), the waits written (waits.lua 'w' per shard,
the 600), the permits released (limits.lua 'R', the 400: each handed to a waiter) and
the waiters woken (waits.lua 'k', the 400). ``--durable-dir`` loads another checkout's
``durable/`` (``git archive <commit> durable | tar -x -C /tmp/old``, then
``/tmp/old/durable``): run both, alternated, for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from typing import Any

from bench.probes._checkout import load_durable
from bench.probes.callgrind._tools import TracedServer, missing

JOBS, KEYS, CONCURRENCY, SHARDS = 1000, 100, 4, 4


async def _measure(server: TracedServer) -> dict[str, float]:
    import redis.asyncio

    from tickwheel.durable import JobSpec, Limits, Scheduler  # after --durable-dir
    from tickwheel.durable.store import ACQUIRED, member_of

    client = redis.asyncio.Redis(port=server.port)
    out: dict[str, float] = {}
    try:
        s = Scheduler(client, "f", shards=SHARDS, check=False)
        await s.open()
        lim = Limits(concurrency=CONCURRENCY)
        calls = s.store.limits
        await calls.declare({"t": lim})
        await s.schedule_many(JobSpec(f"j{i}", "t", key=f"k{i % KEYS}") for i in range(JOBS))
        jobs: list[Any] = []
        for shard in range(SHARDS):
            await s.take(shard)
            while got := (await s.claim(shard, lease=60.0, limit=JOBS)).jobs:
                jobs += got
        server.zero()
        codes = await calls.acquire_many([(j, lim) for j in jobs], 60_000)
        out["permit taken"] = server.dump() / len(jobs)
        granted = [j for j, (c, _) in zip(jobs, codes, strict=True) if c == ACQUIRED]
        waiters = [j for j, (c, _) in zip(jobs, codes, strict=True) if c != ACQUIRED]
        server.zero()
        for shard in range(SHARDS):
            mine = [(j, 120_000, True) for j in waiters if j.shard == shard]
            await calls.wait_many(shard, mine)
        out["wait written"] = server.dump() / len(waiters)
        server.zero()
        items = [("t", j.key, member_of(j), f"{j.epoch}:{j.attempt}", lim) for j in granted]
        handed = await calls.release_many(items, 60_000)
        out["permit released"] = server.dump() / len(granted)
        woken = [("t", m) for ms in handed for m in ms]
        server.zero()
        assert set(await calls.wake_many(woken)) == {1}
        out["waiter woken"] = server.dump() / len(woken)
    finally:
        await client.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")
    args = parser.parse_args()
    if tool := missing():
        raise SystemExit(f"{tool} is not installed")
    if args.durable_dir:
        load_durable(args.durable_dir)
    with tempfile.TemporaryDirectory() as tmp:
        server = TracedServer(tmp, traced=True)
        try:
            out = asyncio.run(_measure(server))
        finally:
            server.stop()
    print(f"Redis instructions per job ({JOBS:,} jobs over {KEYS} keys, concurrency=4):")
    for name, per in out.items():
        print(f"  {name:<17} {per:>9,.0f}")


if __name__ == "__main__":
    main()
