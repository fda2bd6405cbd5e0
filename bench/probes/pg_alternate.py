"""The Postgres mode and pgqueuer in one process, in blocks that take turns.

    .venv-pgqueuer/bin/python -m bench.probes.pg_alternate \\
        --site .venv/lib/python3.11/site-packages [--rounds 7]

``python -m bench --only postgres`` times each peer's whole round after the other's, and
on a loaded machine (several processes sharing 2 cores) the load moves between them:
its per-repeat ratios ranged 0.2-3.9 in one run. Here each round is short blocks that
alternate on the same servers, so both see the same moment:

- schedule: ``--block`` awaited ``Scheduler.schedule`` calls (each its own commit), then
  as many ``enqueue`` calls of pgqueuer (the Redis write behind tickwheel's last calls
  is waited for between the two, untimed, so that it does not run in pgqueuer's block);
- schedule_many: one call of ``--many`` jobs each;
- claim + ack: everything due, claims of 100 and one ack per claim each (pgqueuer:
  ``dequeue`` of 100 and ``log_jobs``).

Prints per figure the median over rounds of pgqueuer's time over tickwheel's (above 1
tickwheel is faster), the range, and the schedule blocks' microseconds per job.

pgqueuer 1.x cannot share the ``bench`` venv (bullmq pins croniter): run this in the
venv ``python -m bench --only postgres`` makes for it (``.venv-pgqueuer/``), with
``--site`` naming the site-packages of a venv where tickwheel is installed (added after
pgqueuer's own, so pgqueuer's dependencies win).
"""

from __future__ import annotations

import argparse
import asyncio
import site
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any


async def _round_trip(s: Any, q: Any, peer: tuple[Any, Any], tag: str, a: Any) -> dict[str, Any]:
    from bench.workloads.durable_ops import claim_ack_rounds
    from tickwheel.durable import JobSpec

    entry, manager = peer
    out: dict[str, Any] = {}
    t = time.perf_counter()
    for k in range(a.block):
        await s.schedule(f"s{tag}-{k}", "t", b"payload", delay=0)
    ours = time.perf_counter() - t
    # The Redis write behind the last schedules, untimed: not in pgqueuer's block either.
    await s.pg.behind.settled()
    t = time.perf_counter()
    for _ in range(a.block):
        await q.enqueue("t", b"payload", 0)
    theirs = time.perf_counter() - t
    out["schedule"] = theirs / ours
    out["us"] = (ours / a.block * 1e6, theirs / a.block * 1e6)
    t = time.perf_counter()
    await s.schedule_many([JobSpec(f"m{tag}-{k}", "t", b"payload") for k in range(a.many)])
    ours = time.perf_counter() - t
    t = time.perf_counter()
    await q.enqueue(["t"] * a.many, [b"payload"] * a.many, [0] * a.many)
    out["schedule_many"] = (time.perf_counter() - t) / ours
    t = time.perf_counter()
    done = await claim_ack_rounds(s, 4)
    ours = (time.perf_counter() - t) / done
    t, done = time.perf_counter(), 0
    while batch := await q.dequeue(100, entry, manager, None, timedelta(seconds=30)):
        await q.log_jobs([(j, "successful", None) for j in batch])
        done += len(batch)
    out["claim+ack"] = (time.perf_counter() - t) / done / ours
    return out


async def _main(a: argparse.Namespace) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import EntrypointExecutionParameter, Queries

    from tickwheel.durable import Scheduler
    from tickwheel.durable.postgres import migrate
    from tickwheel.durable.servers._postgres import PostgresServer
    from tickwheel.durable.servers._redis import RedisServer
    from tickwheel.durable.store._connect import client_from_url

    with (
        RedisServer() as rs,
        PostgresServer(extra_conf={"synchronous_commit": "on"}) as pg,
    ):
        conn: Any = await asyncpg.connect(pg.url)
        await migrate(conn)
        q = Queries(AsyncpgDriver(conn))
        await q.install()
        client = client_from_url(rs.url)
        s = Scheduler(client, "alt", shards=4, check=False, postgres_url=pg.url)
        entry = {"t": EntrypointExecutionParameter(0)}
        manager = uuid.uuid4()
        try:
            await s.open()
            for shard in range(4):
                await s.take(shard)
            await s.schedule("warm", "t", b"payload", delay=3600)  # the pools, the scripts
            await q.enqueue("t", b"payload", 0)
            while await q.dequeue(100, entry, manager, None, timedelta(seconds=30)):  # type: ignore[arg-type]
                pass
            rounds = [await _round_trip(s, q, (entry, manager), str(r), a) for r in range(a.rounds)]
        finally:
            await s.close()
            await client.aclose()
            await conn.close()
    for name in ("schedule", "schedule_many", "claim+ack"):
        got = [r[name] for r in rounds]
        print(
            f"{name:14} {statistics.median(got):6.3f}x  ({min(got):.2f}-{max(got):.2f})"
            "  pgqueuer's time over tickwheel's"
        )
    us = [r["us"] for r in rounds]
    print(
        f"schedule us/job: tickwheel {statistics.median(u[0] for u in us):,.0f},"
        f" pgqueuer {statistics.median(u[1] for u in us):,.0f} (medians)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--site", required=True, help="site-packages of a venv with tickwheel")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=int, default=40, help="awaited schedules per block")
    p.add_argument("--many", type=int, default=500, help="jobs per schedule_many")
    a = p.parse_args()
    site.addsitedir(a.site)
    asyncio.run(_main(a))


if __name__ == "__main__":
    main()
