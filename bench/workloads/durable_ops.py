"""The durable scheduler's hot paths, as loops to time, count or profile.

- :func:`drain`: claim one shard ``limit`` at a time and ``ack_many`` each batch until
  nothing is due (the claim capacity of ``python -m bench``'s example section, the
  claim cost of the ``scale`` probe);
- :func:`mode_round`: schedule, schedule_many and claim + ack in the Redis-only or the
  Postgres mode, microseconds per job (the postgres section, the ``pg_mode`` probe);
- :func:`hot_path_setup` and :func:`hot_path`: one of :data:`HOT_PATHS` over ``count``
  jobs, for the client-side counts (``python -m bench.probes.callgrind durable-client``)
  and profiles (``python -m bench.probes.profile durable``).
"""

from __future__ import annotations

import time

import redis.asyncio

from tickwheel.durable import JobSpec, Recurrence, Scheduler
from tickwheel.durable.store._connect import client_from_url

PAYLOAD = b"x" * 32
MODE_SHARDS = 4  # mode_round's namespace
# claim_ack: claims of 1000 from due jobs of one shard, each acked with ack_many;
# schedule_many: batches of 1000 over 16 shards; single: awaited schedules, one job each;
# bare: one EVALSHA of a script that only returns, through the store's own call path
# (Direct on one Redis, as a single schedule goes): the floor of an awaited call,
# against which "single" is compared.
# claim_ack_timeout: claim_ack of jobs with their own timeout (schedule(timeout=30)).
# claim_ack_cron / claim_ack_cron_tz: claim_ack of recurring jobs, a daily "0 9 * * *"
# in UTC / in Europe/Paris, each claimed on time at its 09:00 (the shard's clock placed
# there), so the claim plans the next occurrence (and checks for missed ones) per job.
HOT_PATHS = (
    "claim_ack",
    "claim_ack_timeout",
    "schedule_many",
    "single",
    "bare",
    "claim_ack_cron",
    "claim_ack_cron_tz",
)
_CLAIMED = ("claim_ack", "claim_ack_timeout", "claim_ack_cron", "claim_ack_cron_tz")
# The cron paths' first occurrence: 2030-06-03 09:00 in UTC, and in Paris (07:00Z).
_CRON_AT = {
    "claim_ack_cron": (1_906_707_600_000, None),
    "claim_ack_cron_tz": (1_906_700_400_000, "Europe/Paris"),
}
HOT_PATH_JOBS = 12_000  # the claim_ack set-up: as many due jobs for every count
BARE = "return 1"


async def drain(sched: Scheduler, shard: int, limit: int, *, ack: bool = True) -> tuple[int, float]:
    """Claim ``shard`` (owned already) ``limit`` at a time until nothing is due, acking
    each batch unless ``ack`` is off; return the jobs claimed and the seconds it took."""
    claimed = 0
    t = time.perf_counter()
    while True:
        batch = await sched.claim(shard, limit=limit)
        if not batch.jobs:
            break
        claimed += len(batch.jobs)
        if ack:
            await sched.ack_many(batch.jobs)
    return claimed, time.perf_counter() - t


async def claim_ack_rounds(sched: Scheduler, shards: int, most: int | None = None) -> int:
    """Claim (100 a shard) and ack every shard in turn until a round finds nothing or
    ``most`` were done: the jobs done. The Postgres figures' claim + ack."""
    done = 0
    while most is None or done < most:
        got = 0
        for shard in range(shards):
            batch = await sched.claim(shard, limit=100)
            if batch.jobs:
                await sched.ack_many(batch.jobs)
                got += len(batch.jobs)
        if not got:
            break
        done += got
    return done


async def mode_round(redis_url: str, pg_url: str | None, tag: str, jobs: int) -> dict[str, float]:
    """One round in the Postgres mode (``pg_url``) or the Redis-only mode (None):
    ``jobs`` awaited schedules (each its own commit in the Postgres mode), one
    ``schedule_many`` of ``jobs``, then claims of 100 with one ``ack_many`` each until
    both sets ran; microseconds per job (the names of bench/peers/postgres.py's FIGURES)."""
    client = client_from_url(redis_url)
    sched = Scheduler(client, f"b{tag}", shards=MODE_SHARDS, check=False, postgres_url=pg_url)
    out: dict[str, float] = {}
    try:
        await sched.open()
        t = time.perf_counter()
        for i in range(jobs):
            await sched.schedule(f"s{i}", "t", b"payload", delay=0)
        out["schedule (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        t = time.perf_counter()
        await sched.schedule_many([JobSpec(f"m{i}", "t", b"payload") for i in range(jobs)])
        out["schedule_many (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        for shard in range(MODE_SHARDS):
            await sched.take(shard)
        t = time.perf_counter()
        done = await claim_ack_rounds(sched, MODE_SHARDS, 2 * jobs)
        out["claim+ack (us/job)"] = (time.perf_counter() - t) / max(done, 1) * 1e6
    finally:
        await sched.close()
        await client.aclose()
    return out


async def hot_path_setup(port: int, op: str) -> tuple[Scheduler, redis.asyncio.Redis]:
    """A flushed Redis on ``port`` and a scheduler ready for ``op`` (the same set-up for
    every count: claim_ack's due jobs are :data:`HOT_PATH_JOBS` whatever is claimed)."""
    client = redis.asyncio.Redis(port=port)
    await client.flushall()
    s = Scheduler(client, "p", shards=1 if op in _CLAIMED else 16, check=False)
    await s.open()
    if op in ("claim_ack", "claim_ack_timeout"):
        await s.take(0)
        own = 30.0 if op == "claim_ack_timeout" else None
        for start in range(0, HOT_PATH_JOBS, 5000):
            n = min(5000, HOT_PATH_JOBS - start)
            await s.schedule_many(
                JobSpec(f"job:{start + i}", "send_email", PAYLOAD, timeout=own) for i in range(n)
            )
    elif op in _CRON_AT:
        at, tz = _CRON_AT[op]
        await client.set(s.keys.shard(0).clock, at + 1000)  # now = max(TIME, clock)
        await s.take(0)
        rec = Recurrence.cron_expr("0 9 * * *", tz=tz)
        for start in range(0, HOT_PATH_JOBS, 5000):
            n = min(5000, HOT_PATH_JOBS - start)
            await s.schedule_many(
                JobSpec(f"job:{start + i}", "send_email", PAYLOAD, at=at, recurrence=rec)
                for i in range(n)
            )
    return s, client


async def hot_path(s: Scheduler, op: str, count: int) -> None:
    """Run ``op`` (one of :data:`HOT_PATHS`) over ``count`` jobs."""
    if op in _CLAIMED:
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
            await s.store.transport.run(script, ["{p:0}:due"], [f"s:{i}", PAYLOAD], 0)
    else:
        for i in range(count):
            await s.schedule(f"s:{i}", "send_email", PAYLOAD, delay=60)


async def warm_hot_path(s: Scheduler, op: str) -> None:
    """Load the scripts and make the connection before a counted or profiled run."""
    if op not in _CLAIMED:
        await hot_path(s, op, 1 if op in ("single", "bare") else 1000)
