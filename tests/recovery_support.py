"""The registry of the recovery tests' worker processes (``recovery_support:registry``):
one task that records each run in the sink's Redis (job id, attempt, pid, Redis time
at the start) and then sleeps ``payload["sleep"]`` seconds."""

from __future__ import annotations

import asyncio
import os

from spill_support import _sink_client, redis_ms

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


@registry.task(name="record")
async def record(ctx: TaskContext) -> None:
    """RPUSH ``<prefix>:runs`` "id attempt pid ms", then sleep as the payload says."""
    prefix = ctx.payload["sink"]
    client = _sink_client()
    now = redis_ms(await client.time())
    await client.rpush(f"{prefix}:runs", f"{ctx.job_id} {ctx.attempt} {os.getpid()} {now:.0f}")
    await asyncio.sleep(float(ctx.payload.get("sleep", 0)))


async def runs(client: object, prefix: str) -> list[tuple[str, int, int, float]]:
    """The runs recorded: (id, attempt, pid, Redis ms at its start), in order."""
    rows = await client.lrange(f"{prefix}:runs", 0, -1)  # type: ignore[attr-defined]
    out = []
    for row in rows:
        job_id, attempt, pid, ms = row.decode().split()
        out.append((job_id, int(attempt), int(pid), float(ms)))
    return out
