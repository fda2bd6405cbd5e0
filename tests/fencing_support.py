"""A worker process's registry for the fencing test of test_pause.py: ``slow`` marks its
start in the sink's Redis, sleeps ``payload["sleep"]`` seconds, then marks its end."""

from __future__ import annotations

import asyncio

from spill_support import _sink_client  # type: ignore[import-not-found]

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


@registry.task(name="slow")
async def slow(ctx: TaskContext) -> None:
    prefix = ctx.payload["sink"]
    client = _sink_client()
    await client.rpush(f"{prefix}:started", ctx.job_id)
    await asyncio.sleep(ctx.payload["sleep"])
    await client.rpush(f"{prefix}:finished", ctx.job_id)
