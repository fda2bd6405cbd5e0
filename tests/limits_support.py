"""The flow limits' test tasks (issue 35), for in-process workers and for ``tickwheel
worker limits_support:registry`` processes: each run records its start and end, its job
id, flow key and pid in the sink's Redis (as in spill_support). The times are this
host's wall clock (ms), read in the handler with no round trip first: the tests run
Redis on the same host, so it is Redis's clock, and a start is stamped where the
handler starts, not after a call to the sink that may queue behind others.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import defaultdict
from typing import Any

import redis.asyncio
from spill_support import _sink_client

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


async def _record(ctx: TaskContext) -> None:
    """RPUSH ``<prefix>:runs`` [id, key, start ms, end ms, pid, due ms], and [id, key,
    start ms, pid] to ``<prefix>:starts`` at the start (a run whose worker is killed
    has no end). The due is the one the job was claimed at: a rate's grant lies
    between it and the start."""
    prefix, ms = ctx.payload["sink"], ctx.payload.get("ms", 0)
    start = time.time() * 1000
    pid = os.getpid()
    client = _sink_client()
    await client.rpush(f"{prefix}:starts", json.dumps([ctx.job_id, ctx.flow_key, start, pid]))
    if ms:
        await asyncio.sleep(ms / 1000)
    end = time.time() * 1000
    due = ctx.job.due_ms if ctx.job is not None else 0
    run = [ctx.job_id, ctx.flow_key, start, end, pid, due]
    await client.rpush(f"{prefix}:runs", json.dumps(run))


@registry.task(name="keyed", concurrency=2)
async def keyed(ctx: TaskContext) -> None:
    await _record(ctx)


@registry.task(name="rated", rate=(10, 1.0))
async def rated(ctx: TaskContext) -> None:
    await _record(ctx)


async def runs(client: redis.asyncio.Redis, prefix: str) -> list[list[Any]]:
    """The finished runs: [id, key, start, end, pid, due] each."""
    return [json.loads(r) for r in await client.lrange(f"{prefix}:runs", 0, -1)]


async def starts(client: redis.asyncio.Redis, prefix: str) -> list[list[Any]]:
    """Every run's start, finished or not: [id, key, start, pid] each."""
    return [json.loads(r) for r in await client.lrange(f"{prefix}:starts", 0, -1)]


def with_unfinished(
    finished: list[list[Any]], started: list[list[Any]], ends: dict[int, list[float]]
) -> list[list[Any]]:
    """The finished runs plus the runs that started and never ended: each ends at the
    first instant of its process's ``ends`` after its start (a SIGKILL; for a stopped
    process, when its leases were surely found lost), else never (``inf``)."""
    done = {(r[0], r[2]) for r in finished}
    out = list(finished)
    for job_id, key, start, pid in started:
        if (job_id, start) not in done:
            end = min((t for t in ends.get(pid, []) if t >= start), default=math.inf)
            out.append([job_id, key, start, end, pid, 0])
    return out


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (closed intervals: an end at the instant
    another starts counts both)."""
    events = sorted([(s, 0) for s, _ in intervals] + [(e, 1) for _, e in intervals])
    peak = cur = 0
    for _, kind in events:
        cur += 1 if kind == 0 else -1
        peak = max(peak, cur)
    return peak


def at_peak(finished: list[list[Any]], key: str) -> list[list[Any]]:
    """The runs of ``key`` open at the first instant of its peak overlap (for a
    failure's message)."""
    mine = [r for r in finished if r[1] == key]
    best: list[list[Any]] = []
    for r in mine:
        open_then = [x for x in mine if x[2] <= r[2] <= x[3]]
        if len(open_then) > len(best):
            best = open_then
    return best


def peaks_by_key(finished: list[list[Any]]) -> dict[str, int]:
    """Per flow key, the most runs open at one instant."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in finished:
        by[run[1]].append((run[2], run[3]))
    return {key: peak_overlap(spans) for key, spans in by.items()}


def most_surely_in_window(finished: list[list[Any]], window_ms: float) -> int:
    """The most runs whose rate grants are surely in one closed window of
    ``window_ms``: a run's grant lies between its due as claimed and its start, so a
    set of runs is surely in one window when its latest start less its earliest due is
    at most ``window_ms``. Sound whatever a loaded machine's handler lag: a count
    above the limit is a breach of the limit by the grants' clock."""
    spans = [(run[5], run[2]) for run in finished]
    return max(
        (sum(1 for a, b in spans if a >= lo and b <= lo + window_ms) for lo, _ in spans), default=0
    )
