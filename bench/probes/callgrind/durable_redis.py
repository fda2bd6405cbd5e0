"""Redis instructions per job of the durable hot paths, counted rather than timed.

    python -m bench.probes.callgrind durable-redis [--jobs 5000] [--limit 1000]
        [--hashtables] [--job-timeout S] [--priorities K] [--durable-dir DIR]

Why: on a shared virtual machine a job's Redis time moves by tens of percent from one
day to the next, while callgrind's count of the instructions redis-server executes
for it does not; a change to a script is measured here to a few hundred instructions.

How: one redis-server runs under ``valgrind --tool=callgrind`` (``TracedServer`` of
bench/probes/callgrind/_tools.py); this process drives it natively. For each operation the
server's counters are zeroed, the operation runs, and the dump's total is divided by
the jobs it handled:

- ``claim``: claims of ``--limit`` from ``--jobs`` due jobs of one shard (64 record
  buckets, 32-byte payloads), until none is left;
- ``ack``: ``ack_many`` of each of those claims;
- ``batch near`` / ``batch far``: one ``schedule_many`` of ``--jobs`` jobs over 16
  shards, due in 30 s (into ``due``) or in an hour (into the far index), one delay
  for all of them (a due shared by a run of jobs is formatted once: see schedule.lua);
- ``batch spread``: the same near, with every due distinct.

``--job-timeout`` gives the claimed jobs a timeout of their own (``schedule(timeout=)``).
``--priorities K`` gives job ``i`` the priority ``i % K`` (``schedule(priority=)``; 1,
the default: all 0, no priorities in use), so the claims take them level by level.
``--hashtables`` sets ``hash-max-listpack-entries 0``, so the record buckets are hash
tables as they are past ~32,000 jobs a shard (default: listpacks, as at this size).
``--durable-dir`` loads ``tickwheel.durable`` from another checkout's ``durable/``
(``git archive <commit> durable | tar -x -C /tmp/old``) for a before/after.
Each count includes the script call's fixed cost shared over the jobs of the call.
About a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable

from bench.probes._checkout import load_durable
from bench.probes.callgrind._tools import TracedServer

PAYLOAD = b"x" * 32
SHARDS = 16  # the batch rows' namespace


async def _measure(
    server: TracedServer,
    jobs: int,
    limit: int,
    hashtables: bool,
    own: float | None = None,
    *,
    levels: int = 1,
) -> dict[str, float]:
    import redis.asyncio

    from tickwheel.durable import JobSpec, Scheduler  # after --durable-dir's loading

    client = redis.asyncio.Redis(port=server.port)
    out: dict[str, float] = {}
    try:
        if hashtables:
            await client.config_set("hash-max-listpack-entries", 0)

        async def counted(name: str, count: int, run: Callable[[], Awaitable[object]]) -> None:
            server.zero()
            await run()
            out[name] = server.dump() / count

        # claim and ack, one shard
        s = Scheduler(client, "c", shards=1, check=False)
        await s.open()
        await s.take(0)
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            extra = {} if levels == 1 else {"priority": 0}  # a checkout without priorities
            specs = []
            for i in range(n):
                if levels > 1:
                    extra["priority"] = (start + i) % levels
                specs.append(
                    JobSpec(f"job:{start + i}", "send_email", PAYLOAD, timeout=own, **extra)
                )
            await s.schedule_many(specs)
        warm = await s.claim(0, limit=10)  # the scripts loaded, the connection made
        await s.ack_many(warm.jobs)
        batches = []

        async def claims() -> None:
            while batch := (await s.claim(0, limit=limit)).jobs:
                batches.append(batch)

        async def acks() -> None:
            for batch in batches:
                assert all(await s.ack_many(batch))

        server.zero()
        await claims()
        claimed = sum(len(b) for b in batches)
        out["claim"] = server.dump() / claimed
        await counted("ack", claimed, acks)
        await s.close()

        # batch schedules, 16 shards
        b = Scheduler(client, "b", shards=SHARDS, check=False)
        await b.open()
        # 200 due jobs a shard first: each due set is a skiplist already (past the
        # 128-entry listpack), as in a namespace in use, whichever row comes first.
        warm_specs = (JobSpec(f"w:{i}", "send_email", PAYLOAD) for i in range(200 * SHARDS))
        await b.schedule_many(warm_specs)
        rows = {
            "batch near": lambda i: 30.0,
            "batch far": lambda i: 3600.0,
            "batch spread": lambda i: 30.0 + i / 1000,
        }
        for name, delay in rows.items():
            specs = [
                JobSpec(f"{name}:{i}", "send_email", PAYLOAD, delay=delay(i)) for i in range(jobs)
            ]
            await counted(name, jobs, lambda specs=specs: b.schedule_many(specs))  # type: ignore[misc]
        await b.close()
    finally:
        await client.aclose()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--limit", type=int, default=1000, help="jobs per claim")
    parser.add_argument("--hashtables", action="store_true", help="record buckets as hash tables")
    parser.add_argument("--job-timeout", type=float, help="the claimed jobs' own timeout (s)")
    parser.add_argument("--priorities", type=int, default=1, help="job i's priority: i %% K")
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1 or args.limit < 1:
        raise SystemExit("--jobs and --limit must be at least 1")
    if args.durable_dir:
        load_durable(args.durable_dir)

    with tempfile.TemporaryDirectory() as tmp:
        server = TracedServer(tmp, traced=True)
        try:
            measure = _measure(
                server,
                args.jobs,
                args.limit,
                args.hashtables,
                args.job_timeout,
                levels=args.priorities,
            )
            out = asyncio.run(measure)
        finally:
            server.stop()
    kind = "hash tables" if args.hashtables else "listpacks"
    levels = f", priorities i % {args.priorities}" if args.priorities > 1 else ""
    print(
        f"Redis instructions per job ({args.jobs:,} jobs, claims of {args.limit:,}, "
        f"record buckets as {kind}{levels}):"
    )
    for name, per in out.items():
        print(f"  {name:<13} {per:>10,.0f}")
    return 0
