"""Table bloat of tickwheel_jobs / tickwheel_done under a steady run, with PostgreSQL's
default autovacuum and with tuned per-table settings (docs/postgres.md, "Autovacuum").

The PostgreSQL half of the Postgres mode only (PgStore: tickwheel_schedule, the outbox
delete, tickwheel_claimed, tickwheel_ack, prune): Redis does not touch these tables.
Each round schedules a batch of one-shot jobs, acks it, and every ``--prune-every``
jobs prunes everything done (``older_than 0``). Run::

    python -m bench.probes.pg_bloat --jobs 200000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg

from tickwheel.durable.model import JobSpec
from tickwheel.durable.postgres import PgStore, migrate, prune
from tickwheel.durable.postgres._rows import encode_pg_job
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.store import ClaimedRef

TUNED = (
    "ALTER TABLE tickwheel_jobs SET (autovacuum_vacuum_scale_factor = 0.01,"
    " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.01,"
    " autovacuum_vacuum_cost_delay = 0, fillfactor = 80);"
    "ALTER TABLE tickwheel_done SET (autovacuum_vacuum_scale_factor = 0.01,"
    " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.01,"
    " autovacuum_vacuum_cost_delay = 0);"
    "ALTER TABLE tickwheel_outbox SET (autovacuum_vacuum_scale_factor = 0.0,"
    " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);"
)
_STATS = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count,
       pg_relation_size(relid), pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE relname IN ('tickwheel_jobs', 'tickwheel_done',
                                           'tickwheel_outbox') ORDER BY relname
"""


async def run(url: str, tuned: bool, jobs: int, batch: int, prune_every: int) -> dict[str, Any]:
    admin = await asyncpg.connect(url)
    await migrate(admin)
    if tuned:
        await admin.execute(TUNED)
    store = await PgStore(url, "bloat").open()
    peak: dict[str, list[int]] = {}
    start = time.monotonic()
    done = 0
    while done < jobs:
        specs = [JobSpec(f"j{done + k}", "t", b"x" * 16, at=946_684_800_000) for k in range(batch)]
        pg_jobs = sorted((encode_pg_job(s, k % 8, 1 << 20) for k, s in enumerate(specs)),
                         key=lambda j: j.id)  # fmt: skip
        replies = await store.schedule(pg_jobs)
        await store.relayed([seq for _, _, seq in replies])
        refs = [ClaimedRef(j.id, 1, 1, 0) for j in pg_jobs]
        for shard in range(8):
            mine = [r for r, j in zip(refs, pg_jobs, strict=True) if j.shard == shard]
            await store.claimed(shard, 1, [r.id for r in mine], [1] * len(mine))
            await store.ack(shard, 1, mine)
        done += batch
        if done % prune_every == 0:
            await prune(admin, 0)
        for r in await admin.fetch(_STATS):
            cur = peak.setdefault(r[0], [0, 0, 0])
            cur[0] = max(cur[0], r[2])
            cur[1] = max(cur[1], r[4])
            cur[2] = max(cur[2], r[5])
    seconds = time.monotonic() - start
    final = {r[0]: list(r[1:]) for r in await admin.fetch(_STATS)}
    await store.aclose()
    await admin.close()
    return {"seconds": seconds, "peak": peak, "final": final}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--prune-every", type=int, default=20_000)
    args = ap.parse_args()
    # autovacuum_naptime 10 s: a quicker look than the default 60 s, for both runs alike.
    conf = {"autovacuum_naptime": "10s"}
    for tuned in (False, True):
        with PostgresServer(extra_conf=conf) as pg:
            out = asyncio.run(run(pg.url, tuned, args.jobs, args.batch, args.prune_every))
        print(f"== {'tuned' if tuned else 'default'} autovacuum: {out['seconds']:.1f} s")
        for table, (dead, heap, total) in sorted(out["peak"].items()):
            live, dead_f, avc, heap_f, total_f = out["final"][table]
            print(
                f"  {table}: peak dead {dead}, peak heap {heap // 1024} kB, peak total "
                f"{total // 1024} kB | end: live {live} dead {dead_f} autovacuums {avc} "
                f"heap {heap_f // 1024} kB total {total_f // 1024} kB"
            )


if __name__ == "__main__":
    main()
