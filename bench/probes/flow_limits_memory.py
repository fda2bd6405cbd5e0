"""Redis bytes per job waiting for a permit of its flow key against the same jobs pending
(docs/limits.md "Costs"), by ``MEMORY USAGE ... SAMPLES 0`` (exact) summed over every key
of each namespace, claims' replies left out, with a breakdown by key kind.

    python -m bench.probes.flow_limits_memory [--jobs 20000] [--keys 1] [--durable-dir DIR]

Pending: ``--jobs`` jobs due in a minute. Waiting: the same jobs (another namespace) due
now, all claimed, their permits asked in one batch (``concurrency=1``: one per key is
granted) and the others handed back to wait, as a worker does it (the store's calls:
``acquire_many``, ``wait_many``); the runners are then cancelled (their permits stay
held). ``--durable-dir`` loads another checkout's ``durable/`` (``git archive <commit>
durable | tar -x -C /tmp/old``): run both, alternated, for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.probes._checkout import load_durable, redis_server_type


async def _bytes(client: Any, namespace: str) -> dict[str, int]:
    """Bytes by key kind (the name's part after the tag: ``due``, ``jobs``, ``q``...)."""
    out: dict[str, int] = {}
    async for raw in client.scan_iter(match=f"{{{namespace}*", count=1000):
        name = raw.decode()
        if ":claim:" in name:
            continue
        kind = name.split("}", 1)[1].split(":")[1] if "}:" in name else name
        out[kind] = out.get(kind, 0) + int(await client.memory_usage(raw, samples=0) or 0)
    return out


async def _measure(url: str, jobs: int, keys: int) -> list[tuple[str, int, dict[str, int]]]:
    from tickwheel.durable import JobSpec, Limits, Scheduler  # after --durable-dir
    from tickwheel.durable.store import ACQUIRED
    from tickwheel.durable.store._connect import client_from_url

    client = client_from_url(url)
    try:
        await client.execute_command("FLUSHALL", "SYNC")
        pending = Scheduler(client, "pending", shards=4, check=False)
        await pending.schedule_many(
            JobSpec(f"m{i}", "mem", key=f"k{i % keys}", delay=60) for i in range(jobs)
        )
        s = Scheduler(client, "waiting", shards=4, check=False)
        one = Limits(concurrency=1)
        await s.store.limits.declare({"mem": one})
        await s.schedule_many(JobSpec(f"m{i}", "mem", key=f"k{i % keys}") for i in range(jobs))
        claimed: list[Any] = []
        for shard in range(4):
            await s.take(shard)
            while got := (await s.claim(shard, lease=60.0, limit=1000)).jobs:
                claimed += got
        codes = await s.store.limits.acquire_many([(j, one) for j in claimed], 60_000)
        waiters = [j for j, (c, _) in zip(claimed, codes, strict=True) if c != ACQUIRED]
        for shard in range(4):
            mine = [(j, 120_000, True) for j in waiters if j.shard == shard]
            await s.store.limits.wait_many(shard, mine)
        for j, (c, _) in zip(claimed, codes, strict=True):
            if c == ACQUIRED:
                await s.cancel(j.id)
        return [
            ("pending", jobs, await _bytes(client, "pending")),
            ("waiting", len(waiters), await _bytes(client, "waiting")),
        ]
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1)
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")
    args = parser.parse_args()
    if args.jobs < 2 or not 1 <= args.keys < args.jobs:
        raise SystemExit("--jobs must be at least 2 and --keys from 1 to below --jobs")
    if args.durable_dir:
        load_durable(args.durable_dir)
    with redis_server_type()() as server:
        rows = asyncio.run(_measure(server.url, args.jobs, args.keys))
    print(f"Redis bytes per job, {args.jobs:,} jobs over {args.keys} key(s), concurrency=1:")
    for label, n, kinds in rows:
        parts = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(kinds.items()) if v / n >= 0.5)
        print(f"  {label:<8} {sum(kinds.values()) / n:7.1f} B  ({parts})")


if __name__ == "__main__":
    main()
