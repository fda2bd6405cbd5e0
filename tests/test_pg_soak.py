"""The Postgres mode's tables at a fixed job rate: every job acked, the done rows pruned
as they age, and (full form) the tables' size and dead tuples reaching a steady state
under the autovacuum settings docs/postgres.md recommends.

The PostgreSQL half of the mode only (``bench/probes/pg_bloat.py``'s ``steady``: the
schedule, the outbox delete, the claim check and the ack, per batch): Redis never
touches these tables. Short form: 8 s at 500 jobs/s on the session's server, pruning
every 2 s what is a second old. ``TICKWHEEL_SOAK=1``: 2,000 jobs/s for 30 minutes on a
server of its own with the recommended settings (about 31 minutes in all).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

from tickwheel.durable.servers._postgres import PostgresServer

# The probe is a script of the repository's bench/, not a package the tests can import:
# loaded from its file (it imports only tickwheel and asyncpg).
_PROBE = Path(__file__).resolve().parents[1] / "bench" / "probes" / "pg_bloat.py"
_spec = importlib.util.spec_from_file_location("pg_bloat_probe", _PROBE)
assert _spec is not None and _spec.loader is not None
pg_bloat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pg_bloat)

SOAK = os.environ.get("TICKWHEEL_SOAK") == "1"
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(2400 if SOAK else 300)]


def test_the_tables_stay_bounded_at_a_fixed_rate(pg_url: str) -> None:
    if SOAK:
        rate, seconds, every, prune_every, keep = 2000.0, 1800.0, 10.0, 10.0, 60.0
        with PostgresServer(extra_conf=pg_bloat.RECOMMENDED) as pg:
            out = asyncio.run(
                pg_bloat.steady(
                    pg.url, rate=rate, seconds=seconds, batch=1000, sample_every=every, keep=keep
                )
            )
    else:
        rate, seconds, every, prune_every, keep = 500.0, 8.0, 1.0, 2.0, 1.0
        out = asyncio.run(
            pg_bloat.steady(
                pg_url,
                rate=rate,
                seconds=seconds,
                sample_every=every,
                prune_every=prune_every,
                keep=keep,
            )
        )
    print(f"{out['jobs']} jobs in {out['seconds']:.1f} s")
    assert out["jobs"] > 0
    # Every job scheduled was acked: nothing pending or in the outbox.
    assert (out["pending"], out["outbox"]) == (0, 0)
    # The pruning keeps up: what is left done is at most what the fixed rate can have
    # made since the last prune's cut-off (never more jobs than the rate allows).
    assert out["done"] <= rate * (keep + prune_every + every) + 200
    assert len(out["samples"]) >= seconds / every // 2
    for _, tables in out["samples"]:
        assert set(tables) == set(pg_bloat.TABLES)
    if SOAK:
        verdict = pg_bloat.plateau(out["samples"])
        print(verdict)
        assert all(v["ok"] for v in verdict.values()), verdict
