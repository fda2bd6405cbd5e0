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
import os
import time
from collections import defaultdict
from typing import Any

import redis.asyncio
from spill_support import _sink_client

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


async def _record(ctx: TaskContext) -> None:
    """RPUSH ``<prefix>:runs`` [id, key, start ms, end ms, pid], the start also to
    ``<prefix>:starts`` at once (a run whose worker is killed has no end)."""
    prefix, ms = ctx.payload["sink"], ctx.payload.get("ms", 0)
    start = time.time() * 1000
    client = _sink_client()
    await client.rpush(f"{prefix}:starts", json.dumps([ctx.job_id, ctx.flow_key, start]))
    if ms:
        await asyncio.sleep(ms / 1000)
    end = time.time() * 1000
    run = [ctx.job_id, ctx.flow_key, start, end, os.getpid()]
    await client.rpush(f"{prefix}:runs", json.dumps(run))


@registry.task(name="keyed", concurrency=2)
async def keyed(ctx: TaskContext) -> None:
    await _record(ctx)


@registry.task(name="rated", rate=(10, 1.0))
async def rated(ctx: TaskContext) -> None:
    await _record(ctx)


async def runs(client: redis.asyncio.Redis, prefix: str) -> list[list[Any]]:
    """The finished runs: [id, key, start, end, pid] each."""
    return [json.loads(r) for r in await client.lrange(f"{prefix}:runs", 0, -1)]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (closed intervals: an end at the instant
    another starts counts both)."""
    events = sorted([(s, 0) for s, _ in intervals] + [(e, 1) for _, e in intervals])
    peak = cur = 0
    for _, kind in events:
        cur += 1 if kind == 0 else -1
        peak = max(peak, cur)
    return peak


def peaks_by_key(finished: list[list[Any]]) -> dict[str, int]:
    """Per flow key, the most runs open at one instant."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, key, start, end, _ in finished:
        by[key].append((start, end))
    return {key: peak_overlap(spans) for key, spans in by.items()}


def most_in_window(starts: list[float], window_ms: float) -> int:
    """The most starts in any closed window of ``window_ms``."""
    starts = sorted(starts)
    most, j = 0, 0
    for i, s in enumerate(starts):
        while starts[j] < s - window_ms:
            j += 1
        most = max(most, i - j + 1)
    return most
