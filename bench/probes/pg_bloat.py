"""Table bloat of tickwheel_jobs / tickwheel_done under a steady run, with PostgreSQL's
default autovacuum and with tuned per-table settings (docs/postgres.md, "Autovacuum").

The PostgreSQL half of the Postgres mode only (PgStore: tickwheel_schedule, the outbox
delete, tickwheel_claimed, tickwheel_ack, prune): Redis does not touch these tables.
Each round schedules a batch of one-shot jobs, acks it, and every ``--prune-every``
jobs prunes everything done (``older_than 0``). Run::

    python -m bench.probes.pg_bloat --jobs 200000

``--steady`` is the long steady-state run instead (tests/test_pg_soak.py's full form):
one-shot jobs at a fixed rate (2,000/s) for 30 minutes under the autovacuum settings
docs/postgres.md recommends, pruning every 10 s what is done and a minute old, with the
three tables sampled every 10 s; it says whether each table's size and dead tuples
reached a steady state (:func:`plateau`)::

    python -m bench.probes.pg_bloat --steady --rate 2000 --seconds 1800 --csv steady.csv

(a batch is at most ``--batch`` jobs: at 200 per batch this machine's WAL flushes, nine
commits per batch, held about 1,300 jobs/s, so the run uses 1,000.)
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


# The settings docs/postgres.md recommends ("Autovacuum"): server-wide, the tables at
# their defaults. The steady run below runs under them.
RECOMMENDED = {"autovacuum_naptime": "10s", "autovacuum_vacuum_cost_delay": "2ms"}
TABLES = ("tickwheel_done", "tickwheel_jobs", "tickwheel_outbox")


async def _round(store: PgStore, first: int, n: int) -> None:
    """One batch through the PostgreSQL half of the mode: schedule (own transaction),
    the outbox delete, the claim check and the ack per shard."""
    specs = [JobSpec(f"j{first + k}", "t", b"x" * 16, at=946_684_800_000) for k in range(n)]
    pg_jobs = sorted((encode_pg_job(s, k % 8, 1 << 20) for k, s in enumerate(specs)),
                     key=lambda j: j.id)  # fmt: skip
    replies = await store.schedule(pg_jobs, notify=False)
    await store.relayed([seq for _, _, seq in replies])
    for shard in range(8):
        mine = [ClaimedRef(j.id, 1, 946_684_800_000, 0) for j in pg_jobs if j.shard == shard]
        if mine:
            await store.claimed(shard, 1, [r.id for r in mine], [r.nominal_ms for r in mine])
            await store.ack(shard, 1, mine)


async def steady(
    url: str,
    *,
    rate: float,
    seconds: float,
    batch: int = 200,
    sample_every: float = 10.0,
    prune_every: float = 10.0,
    keep: float = 60.0,
    namespace: str = "steady",
) -> dict[str, Any]:
    """Schedule and ack one-shot jobs at a fixed ``rate`` (jobs/s) for ``seconds``, in
    batches of at most ``batch``, pruning what is done and older than ``keep`` seconds
    every ``prune_every`` seconds (as an operator's cron would), and sample the three
    tables every ``sample_every`` seconds.

    Returns:
        ``jobs`` (scheduled and acked), ``seconds``, ``samples`` (``(t, {table: (live,
        dead, heap bytes, total bytes, autovacuums)})``), ``pending`` and ``outbox``
        (rows of the namespace left at the end: 0 when every job was acked), ``done``
        (done rows left, all within ``keep`` + ``prune_every``).
    """
    admin = await asyncpg.connect(url)
    await migrate(admin)
    store = await PgStore(url, namespace).open()
    samples: list[tuple[float, dict[str, tuple[int, ...]]]] = []

    async def sample(t: float) -> None:
        rows = await admin.fetch(_STATS)
        samples.append((t, {r[0]: (r[1], r[2], r[4], r[5], r[3]) for r in rows}))

    start = time.monotonic()
    next_sample, next_prune, sent = 0.0, prune_every, 0
    while (t := time.monotonic() - start) < seconds:
        if t >= next_sample:
            await sample(t)
            next_sample += sample_every
        if t >= next_prune:
            await prune(admin, keep)
            next_prune += prune_every
        owed = int(t * rate) - sent  # jobs due by now at the fixed rate
        if owed <= 0:
            await asyncio.sleep(min(batch / rate, 0.05))
            continue
        n = min(batch, owed)
        await _round(store, sent, n)
        sent += n
    took = time.monotonic() - start
    await sample(took)
    left = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM tickwheel_jobs WHERE ns = $1 AND state = 0),"
        " (SELECT count(*) FROM tickwheel_outbox WHERE ns = $1),"
        " (SELECT count(*) FROM tickwheel_done WHERE ns = $1)",
        namespace,
    )
    await store.aclose()
    await admin.close()
    return {
        "jobs": sent,
        "seconds": took,
        "samples": samples,
        "pending": int(left[0]),
        "outbox": int(left[1]),
        "done": int(left[2]),
    }


def plateau(samples: list[tuple[float, dict[str, tuple[int, ...]]]]) -> dict[str, dict[str, Any]]:
    """Whether each table reached a steady state: over the last third of the run its
    largest size and dead-tuple count are no more than the middle third's by a margin
    (size: 20 % or 1 MB; dead tuples: 50 % or 20,000, an autovacuum's worth of slack).

    Returns:
        Per table: ``size`` and ``dead`` as (middle-third max, last-third max), ``ok``.
    """
    end = samples[-1][0]
    middle = [m for t, m in samples if end / 3 <= t < 2 * end / 3]
    last = [m for t, m in samples if t >= 2 * end / 3]
    out: dict[str, dict[str, Any]] = {}
    for table in TABLES:
        size = (max(m[table][3] for m in middle), max(m[table][3] for m in last))
        dead = (max(m[table][1] for m in middle), max(m[table][1] for m in last))
        ok = size[1] <= max(size[0] * 1.2, size[0] + (1 << 20)) and dead[1] <= max(
            dead[0] * 1.5, dead[0] + 20_000
        )
        out[table] = {"size": size, "dead": dead, "ok": ok}
    return out


_COLOURS = {"tickwheel_done": "#1f77b4", "tickwheel_jobs": "#d62728", "tickwheel_outbox": "#2ca02c"}


def svg(rows: list[tuple[float, str, int, int, int, int, int]], title: str) -> str:
    """A two-panel SVG plot (no plotting library needed) of ``rows`` (``t, table, live,
    dead, heap, total, autovacuums``, the ``--csv`` columns): each table's total size
    (MB) and dead tuples over the run (minutes)."""
    width, height, left, top = 760, 250, 70, 30
    end = max(r[0] for r in rows) / 60 or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{2 * height + 40}"'
        ' font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="18" font-size="14">{title}</text>',
    ]
    panels = (("total size (MB)", 5, 1 / 2**20), ("dead tuples", 3, 1.0))
    for k, (label, col, scale) in enumerate(panels):
        y0 = top + k * (height + 10)
        plot_h = height - 50
        peak = max(r[col] * scale for r in rows) or 1.0
        parts.append(
            f'<rect x="{left}" y="{y0}" width="{width - left - 20}" height="{plot_h}"'
            ' fill="none" stroke="#999"/>'
        )
        parts.append(f'<text x="8" y="{y0 + 12}">{peak:,.1f}</text>')
        parts.append(f'<text x="8" y="{y0 + plot_h}">0</text>')
        parts.append(f'<text x="{left + 5}" y="{y0 + 14}">{label}</text>')
        parts.append(f'<text x="{width - 140}" y="{y0 + plot_h + 16}">minutes (0-{end:.0f})</text>')
        for i, table in enumerate(TABLES):
            pts = " ".join(
                f"{left + (r[0] / 60) / end * (width - left - 20):.1f},"
                f"{y0 + plot_h - r[col] * scale / peak * plot_h:.1f}"
                for r in rows
                if r[1] == table
            )
            colour = _COLOURS[table]
            parts.append(f'<polyline fill="none" stroke="{colour}" points="{pts}"/>')
            parts.append(
                f'<text x="{left + 10 + 170 * i}" y="{y0 + plot_h + 16}"'
                f' fill="{colour}">{table}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _read_csv(path: str) -> list[tuple[float, str, int, int, int, int, int]]:
    with open(path) as f:
        next(f)
        return [
            (float(t), tb, *(int(v) for v in rest))  # type: ignore[misc]
            for t, tb, *rest in (line.strip().split(",") for line in f if line.strip())
        ]


def _steady_main(args: argparse.Namespace) -> None:
    with PostgresServer(extra_conf=RECOMMENDED) as pg:
        out = asyncio.run(
            steady(
                pg.url,
                rate=args.rate,
                seconds=args.seconds,
                batch=args.batch,
                sample_every=args.sample_every,
                keep=args.keep,
            )
        )
    print(f"== steady: {out['jobs']} jobs in {out['seconds']:.0f} s "
          f"({out['jobs'] / out['seconds']:.0f}/s); left pending {out['pending']}")  # fmt: skip
    for t, m in out["samples"]:
        cells = "  ".join(
            f"{tb[10:]} dead {m[tb][1]} heap {m[tb][2] // 1024} kB total {m[tb][3] // 1024} kB"
            for tb in TABLES
        )
        print(f"  {t:7.0f} s  {cells}")
    for table, verdict in plateau(out["samples"]).items():
        print(f"  {table}: {verdict}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("t,table,live,dead,heap,total,autovacuums\n")
            for t, m in out["samples"]:
                for tb in TABLES:
                    f.write(f"{t:.1f},{tb},{','.join(map(str, m[tb]))}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000, help="jobs per batch (--steady: at most)")
    ap.add_argument("--prune-every", type=int, default=20_000)
    ap.add_argument("--steady", action="store_true", help="a fixed-rate run (the soak's)")
    ap.add_argument("--rate", type=float, default=2000.0, help="--steady: jobs/s")
    ap.add_argument("--seconds", type=float, default=1800.0, help="--steady: run length")
    ap.add_argument("--sample-every", type=float, default=10.0)
    ap.add_argument("--keep", type=float, default=60.0, help="--steady: prune older than")
    ap.add_argument("--csv", default="", help="--steady: write the samples here")
    ap.add_argument("--svg", default="", help="write a plot of --csv's samples here")
    args = ap.parse_args()
    if args.svg and not args.steady:  # plot a finished run's CSV
        title = "PostgreSQL tables under a fixed job rate"
        with open(args.svg, "w") as f:
            f.write(svg(_read_csv(args.csv), title))
        return
    if args.steady:
        _steady_main(args)
        return
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
