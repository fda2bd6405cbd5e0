"""The registry of the zoned worker-process tests: a sink that records every call of a
recurring series as ``<nominal>:<pid>`` in a Redis list (read from the environment, as
``spill_support``'s sink does), so a test can tell each occurrence's runs and runners."""

from __future__ import annotations

import asyncio
import os
import weakref

import redis.asyncio
from spill_support import SINK_ENV

from tickwheel.durable import TaskContext, TaskRegistry
from tickwheel.durable.store._connect import client_from_url

registry = TaskRegistry()
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


@registry.task(name="zsink")
async def zsink(ctx: TaskContext) -> None:
    """RPUSH ``<nominal>:<pid>`` to ``<payload["sink"]>:runs``."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = client_from_url(os.environ[SINK_ENV])
    await client.rpush(f"{ctx.payload['sink']}:runs", f"{ctx.nominal_ms}:{os.getpid()}")
