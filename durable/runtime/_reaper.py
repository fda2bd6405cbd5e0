"""The reaper loop: return expired leases of the owned shards to due (or to dead).

Ground rules:

- It acts only on shards this process owns, with their epoch: a fenced reap writes
  nothing, and the shard is dropped.
- Expiry is judged by Redis time inside reap.lua; this loop only sets the pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from tickwheel.durable.model import (
    Fenced,
    ReapResult,
    finite_seconds_ms,
    int_between,
)
from tickwheel.durable.scheduler import Ownership, Tracing

from ._rounds import run_rounds

__all__ = ["DEFAULT_REAP_INTERVAL", "DEFAULT_REAP_LIMIT", "Reaper"]

logger = logging.getLogger("tickwheel.durable")

# Leases are tens of seconds; reaping every second bounds the extra delay of a crashed
# claimer's jobs to a second past their lease.
DEFAULT_REAP_INTERVAL = 1.0
# A script blocks Redis while it runs: ~1000 leases keep one reap call near a millisecond.
DEFAULT_REAP_LIMIT = 1000


class Reaper:
    """Reap the shards an :class:`Ownership` owns.

    Args:
        ownership: whose shards to reap.
        interval: seconds between rounds.
        limit: leases per shard per call.
        tracer: a span per reap that moved leases (``Scheduler.tracer``); None: none.
    """

    def __init__(
        self,
        ownership: Ownership,
        *,
        interval: float | timedelta = DEFAULT_REAP_INTERVAL,
        limit: int = DEFAULT_REAP_LIMIT,
        tracer: Tracing | None = None,
    ) -> None:
        int_between("limit", limit, 1)
        self.ownership = ownership  # whose shards to reap
        self.interval_ms = finite_seconds_ms("interval", interval, minimum_ms=1)  # pace
        self.limit = limit  # leases per shard per call
        self.tracer = tracer  # reap spans, or None
        self._stop = asyncio.Event()  # set by stop(): run() returns

    async def reap_once(self) -> list[ReapResult]:
        """One round over the owned shards; a fenced shard is dropped.

        Returns:
            One result per shard reaped.
        """
        results = []
        tracer = self.tracer
        for shard, epoch in list(self.ownership.owned.items()):
            with contextlib.suppress(Fenced):  # dropped by the ownership
                started_ns = 0 if tracer is None else tracer.now_ns()
                results.append(await self.ownership.reap(shard, epoch, self.limit))
                if tracer is not None:
                    tracer.reaped(results[-1], started_ns)
        return results

    async def run(self) -> None:
        """Until :meth:`stop`: :meth:`reap_once`, then wait ``interval``. A failed round
        (Redis unreachable, or anything else) is logged and the next one runs.

        Stop it with :meth:`stop` rather than by cancelling the task: redis-py 8 can
        swallow a cancellation that lands while a command is in flight, and the loop
        would go on.
        """
        self._stop.clear()

        async def round_() -> bool:  # again at once while a shard had a full batch
            results = await self.reap_once()
            return any(len(r.requeued) + len(r.dead) == self.limit for r in results)

        await run_rounds(round_, stop=self._stop, interval=self.interval_ms / 1000, what="reaper")

    def stop(self) -> None:
        """Make :meth:`run` return after the call in flight, if any."""
        self._stop.set()
