"""The worked example at full size: up to 1e7 pending jobs in 16 shards on one Redis.

    python -m bench.probes.scale [--levels 1e4,1e5,1e6,1e7] [--rate 2900] [--seconds 20]
                          [--out FILE]

Starts a private redis-server (no persistence), schedules far-future one-shot jobs with a
32-byte payload into 16 shards until the pending count reaches each level in turn, and
at each level measures:

- memory: Redis ``used_memory`` added per pending job since the empty namespace;
- claim cost: ``--due`` jobs due now in shard 0 (beside that shard's share of the far
  jobs), drained by claim(LIMIT 500) + ``ack_many`` loops. Reported as Redis's own CPU
  per claimed job (the main thread's CPU from ``INFO cpu``, parsing and replies
  included, and the scripts' own ``usec`` from ``INFO commandstats``: both stable
  whatever the client does) and the loop's jobs/s seen by the client;

then, at the last level, the evening peak of the source document (docs/design.md):
``--rate`` jobs/s due for ``--seconds`` s across the 16 shards, run by one
:class:`Worker` that owns all 16 (poll 100 ms, LIMIT 500, lookahead 1 s), with firing
lateness percentiles (never early is checked). The JSON report is rewritten after every
step, so a run cut short keeps what it measured. The full form (1e7) takes about 5
minutes and 2.5 GB of RAM for Redis; the figures and the 3.5e8 sizing are in
docs/scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import redis.asyncio

from bench.runner.harness import percentiles
from bench.workloads.durable_lateness import evening_peak
from bench.workloads.durable_ops import drain
from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisServer

SHARDS = 16
LIMIT = 500  # the document's claim LIMIT (the peak's: durable_lateness.PEAK_LIMIT)
PAYLOAD = b"p" * 32
FAR = 30 * 86_400  # far jobs are due in about a month: never claimed here
CHUNK = 10_000


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(float(part)) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1e4,1e5, got {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"levels must be >= 1, got {text!r}")
    return levels


async def _used_memory(client: Any) -> int:
    return int((await client.info("memory"))["used_memory"])


_SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_evalsha_ro", "cmdstat_eval", "cmdstat_fcall")


async def _redis_cpu(client: Any) -> tuple[float, int]:
    """Redis's main-thread CPU so far (µs: parsing, replies and the network included)
    and its µs in scripts since the last CONFIG RESETSTAT. The scripts' total is theirs
    alone: Redis 7 also counts the commands a script calls, inside the script's time,
    so summing every command would count those twice."""
    cpu = await client.info("cpu")
    main = cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]
    stats = await client.info("commandstats")
    return float(main) * 1e6, sum(int(stats[k]["usec"]) for k in _SCRIPT_CALLS if k in stats)


async def _fill(sched: Scheduler, start: int, stop: int) -> None:
    for lo in range(start, stop, CHUNK):
        await sched.schedule_many(
            JobSpec(f"far:{i}", "remind", PAYLOAD, delay=FAR + i % 86_400)
            for i in range(lo, min(stop, lo + CHUNK))
        )


async def _claim_cost(client: Any, sched: Scheduler, level: int, due: int) -> dict[str, Any]:
    """Drain ``due`` jobs due now from shard 0, beside its share of the far jobs."""
    ids: list[str] = []
    k = 0
    while len(ids) < due:
        job_id = f"due:{level}:{k}"
        if sched.keys.shard_of(job_id) == 0:
            ids.append(job_id)
        k += 1
    await sched.schedule_many(JobSpec(i, "remind", PAYLOAD) for i in ids)
    await client.config_resetstat()
    cpu0, _ = await _redis_cpu(client)
    claimed, elapsed = await drain(sched, 0, LIMIT)
    cpu1, scripts = await _redis_cpu(client)
    if claimed != due:
        raise RuntimeError(f"claim cost: claimed {claimed} of {due} due jobs")
    return {
        # In due and in the far index (inspect counts both).
        "shard0_pending": (await sched.store.inspect(0)).due,
        "claimed": claimed,
        "redis_cpu_us_per_job": (cpu1 - cpu0) / claimed,
        "script_us_per_job": scripts / claimed,
        "client_jobs_per_s": claimed / elapsed,
    }


async def _peak(client: Any, sched: Scheduler, rate: int, seconds: float) -> dict[str, Any]:
    async def opening() -> tuple[float, int]:
        await client.config_resetstat()
        return await _redis_cpu(client)

    peak = await evening_peak(
        sched, rate, seconds, lambda: _redis_cpu(client), payload=PAYLOAD, opening=opening
    )
    late, n_peak = peak.late, peak.jobs
    redis0, _ = peak.opened
    redis1, scripts = peak.closed
    return {
        "rate": rate,
        "seconds": seconds,
        "peak_jobs": n_peak,
        "ran": len(peak.seen),
        "duplicates": len(late) - len(peak.seen),
        "early": sum(1 for x in late if x < 0),
        "lateness_ms": percentiles(late) if late else {},
        "worker_cpu_us_per_job": peak.worker_cpu_s / n_peak * 1e6,
        "redis_cpu_us_per_job": (redis1 - redis0) / n_peak,
        "script_us_per_job": scripts / n_peak,
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"shards": SHARDS, "payload_bytes": len(PAYLOAD), "levels": []}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    with RedisServer() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        sched = Scheduler(client, "reminders", shards=SHARDS, check=False)
        await sched.open()
        await sched.take(0)
        base = await _used_memory(client)
        report["redis_version"] = (await client.info("server"))["redis_version"]
        filled = 0
        for level in args.levels:
            t = time.perf_counter()
            await _fill(sched, filled, level)
            fill_s = time.perf_counter() - t
            added = level - filled
            filled = level
            row: dict[str, Any] = {
                "pending": level,
                "fill_jobs_per_s": added / fill_s if fill_s else 0.0,
                "bytes_per_job": (await _used_memory(client) - base) / level,
            }
            row.update(await _claim_cost(client, sched, level, args.due))
            report["levels"].append(row)
            print(json.dumps(row), flush=True)
            save()
        report["peak"] = await _peak(client, sched, args.rate, args.seconds)
        print(json.dumps(report["peak"]), flush=True)
        save()
        await sched.close()
        await client.aclose()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", type=_levels, default=_levels("1e4,1e5,1e6,1e7"))
    ap.add_argument("--due", type=int, default=20_000, help="due jobs drained per level")
    ap.add_argument("--rate", type=int, default=2_900, help="peak jobs due per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the peak")
    ap.add_argument("--out", help="write the JSON report here (after every step)")
    args = ap.parse_args()
    for name in ("due", "rate", "seconds"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be > 0")
    report = asyncio.run(_main(args))
    peak = report["peak"]
    if peak["ran"] != peak["peak_jobs"] or peak["early"]:
        raise SystemExit(f"peak: ran {peak['ran']} of {peak['peak_jobs']}, {peak['early']} early")


if __name__ == "__main__":
    main()
