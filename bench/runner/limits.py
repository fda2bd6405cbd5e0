"""Section 7 of ``python -m bench``: per-key flow limits (issue 35, docs/limits.md),
against the same jobs without limits and against BullMQ's global rate limiter.

One private redis-server for the section; each measurement flushes it first
(bench/workloads/flow_limits.py says what each one runs). Each repeat:

1. **claim+run+ack**: ``jobs`` due jobs over many flow keys, one
   Worker, a no-op task, without limits and with ``concurrency=4`` (the order
   alternates between repeats). Figure: limited jobs/s over unlimited (the issue's
   target: at least 0.5x). Two shapes, all the jobs due at once in both: 10 a key
   (``jobs / 10`` keys) and 5 a key (``jobs / 5`` keys). How many of them wait for a
   permit depends on where the permits are taken: at the worker's gate (a cluster,
   the Postgres mode, the release before 2026-12-06) 6 of each key's 10 wait once,
   and 1 of 5; in the claim (one Redis, the Redis-only mode: docs/limits.md) a claim
   leases a shard's due jobs spread over the keys, and few wait.
2. **release latency**: one key, ``concurrency=1``, ``limits_release_jobs`` due at once:
   the time from a run's end to the next run's start, p50 and p99. Figures against
   the issue's target of a 5 ms p99 (a constant, not a peer: above 1 means under it).
3. **memory**: ``limits_memory_jobs`` jobs pending (due in a minute) against the same
   jobs waiting for a permit, by ``MEMORY USAGE`` over the namespace's keys. Figure
   (the issue's): all of them on one key, concurrency=1, waiting bytes over pending
   bytes (the target: no more). One key is the shape measured before (20,000 waiters:
   355 B a job then) and the one whose waiters' structure is largest (a listpack holds
   a small key's, a list of listpack nodes a big one's). A second figure: the same jobs
   over ``limits_memory_jobs / 40`` keys (40 a key), each key's runner included.
4. **rate**: ``limits_rate_jobs`` jobs of one key due at once under ``rate=(10, 1.0)``,
   against BullMQ's ``Worker(limiter={max: 10, duration: 1000})`` on one queue (the
   peer: bench/peers/bullmq_limiter.py, which also says why its ``drainDelay`` is 1 s).
   Figure: the time from scheduling to the last start. BullMQ's limiter is per queue;
   it has no per-key limit (that is BullMQ Pro's).

Checked: every job ran in each measurement; tickwheel's rate run has no 1 s window
that surely holds more than 10 grants (a grant lies between the due a job was claimed
at and its handler's start), and its last start is not before the limit allows
((n - 1) // 10 windows after the first).
"""

from __future__ import annotations

from typing import Any

from bench.peers.bullmq_limiter import available, bullmq_rate
from bench.runner.harness import Checks, Figure, Plan, Progress, percentiles, run_async_section
from bench.workloads import flow_limits as fl
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SECTION = "limits"
TARGET_P99_MS = 5.0  # the release latency target
PEER = "bullmq limiter (per queue)"


def sizes(plan: Plan) -> dict[str, int]:
    """The section's sizes: a few seconds under ``--quick`` (CI), a minute or two else."""
    if plan.quick:
        return {"jobs": 1_000, "release": 100, "memory": 1_000, "rate": 20}
    return {"jobs": 5_000, "release": 300, "memory": 20_000, "rate": 40}


# The throughput run's shapes: (name in results, jobs a key).
SHAPES = (("", 10), ("_5", 5))


def steps(plan: Plan) -> int:
    return plan.repeats


async def _repeat(url: str, r: int, size: dict[str, int], peer: bool) -> dict[str, Any]:
    got: dict[str, Any] = {"repeat": r}
    for suffix, per_key in SHAPES:
        for limited in (r % 2 == 0, r % 2 == 1):  # the order alternates
            name = ("on" if limited else "off") + suffix
            keys = size["jobs"] // per_key
            got[f"jobs_per_s_{name}"] = await fl.throughput(url, size["jobs"], keys, limited)
    gaps = await fl.release_gaps(url, size["release"])
    got["release_ran"] = len(gaps) + 1
    got["release_ms"] = percentiles(gaps)
    pending, waiting = await fl.memory_per_job(url, size["memory"])
    got["memory_pending_b"], got["memory_waiting_b"] = pending, waiting
    many = size["memory"] // 40
    pending, waiting = await fl.memory_per_job(url, size["memory"], many)
    got["memory_pending_many_b"], got["memory_waiting_many_b"] = pending, waiting
    t0, runs = await fl.rate_runs(url, size["rate"])
    got["rate"] = _rate_row(t0, [s for _, s in runs], size["rate"])
    # 10 ms less than the window: a worker fires at a due by its estimate of Redis's clock.
    got["rate"]["surely_in_1s"] = fl.most_surely_in_window(runs, 990)
    if peer:
        client = client_from_url(url)
        await client.flushall()
        await client.aclose()
        t0, starts = await bullmq_rate(url, size["rate"], *fl.RATE)
        got["bullmq"] = _rate_row(t0, starts, size["rate"])
    return got


def _rate_row(t0: float, starts: list[float], n: int) -> dict[str, Any]:
    return {
        "jobs": n,
        "ran": len(starts),
        "last_start_s": (max(starts) - t0) / 1000 if starts else float("inf"),
        "most_in_1s_by_start": fl.most_in_window(starts, 1000) if starts else 0,
    }


async def _section(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    size = sizes(plan)
    peer = available()
    repeats: list[dict[str, Any]] = []
    with RedisServer() as server:
        for r in range(plan.repeats):
            progress.step(f"limits: repeat {r + 1}/{plan.repeats}")
            repeats.append(await _repeat(server.url, r, size, peer))
    n, windows = size["rate"], (size["rate"] - 1) // fl.RATE[0]
    for got in repeats:
        what = f"limits, repeat {got['repeat'] + 1}"
        rate = got["rate"]
        checks.expect(got["release_ran"] == size["release"], f"{what}: release run lost jobs")
        checks.expect(rate["ran"] == n, f"{what}: {rate['ran']} of {n} rated jobs ran")
        checks.expect(
            rate["surely_in_1s"] <= fl.RATE[0],
            f"{what}: {rate['surely_in_1s']} grants surely in one 1 s window (limit 10)",
        )
        checks.expect(
            rate["last_start_s"] >= windows * fl.RATE[1],
            f"{what}: the last rated start came early ({rate['last_start_s']:.3f} s)",
        )
    figures = [
        Figure(
            SECTION,
            "claim+run+ack, concurrency=4, 10 a key due at once",
            "limits off",
            "jobs/s",
            "higher",
        ),
        Figure(SECTION, "release latency p50", "the 5 ms p99 target", "ms", "lower"),
        Figure(SECTION, "release latency p99", "the 5 ms p99 target", "ms", "lower"),
        Figure(SECTION, "Redis memory per waiting job", "a pending job", "B", "lower"),
        Figure(SECTION, "Redis memory per waiting job, 40 a key", "a pending job", "B", "lower"),
        Figure(
            SECTION,
            "claim+run+ack, concurrency=4, 5 a key due at once",
            "limits off",
            "jobs/s",
            "higher",
        ),
    ]
    for got in repeats:
        figures[0].add(got["jobs_per_s_on"], got["jobs_per_s_off"])
        figures[1].add(got["release_ms"]["p50"], TARGET_P99_MS)
        figures[2].add(got["release_ms"]["p99"], TARGET_P99_MS)
        figures[3].add(got["memory_waiting_b"], got["memory_pending_b"])
        figures[4].add(got["memory_waiting_many_b"], got["memory_pending_many_b"])
        figures[5].add(got["jobs_per_s_on_5"], got["jobs_per_s_off_5"])
    if peer:
        fig = Figure(SECTION, f"rate 10/s, {n} jobs: last start", PEER, "s", "lower")
        for got in repeats:
            fig.add(got["rate"]["last_start_s"], got["bullmq"]["last_start_s"])
        figures.append(fig)
    raw = {
        "sizes": size,
        "repeats": repeats,
        "peer": PEER if peer else f"{PEER}: not installed (pip install -e '.[bench]')",
    }
    return {"figures": figures, "raw": raw}


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    return run_async_section(_section, plan, progress, checks)
