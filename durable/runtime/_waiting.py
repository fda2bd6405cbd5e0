"""Fired jobs that wait for a slot of the :class:`Runner`, in due order, and the
shedding of those that waited too long.

Ground rules:

- A job waits until half a lease is left (its shed timer, set by the runner when it
  queues the job); then it is shed: released (same attempt) for this or another worker
  to claim again. Without that, a backlog outlived its leases in the queue and went to
  the dead letters unrun, an attempt at a time.
- The jobs shed in one loop turn are released together, one call per shard and epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tickwheel.durable.model import Job
from tickwheel.wheel import Timer

from ._loader_stats import LoaderStats

__all__ = ["Waiting"]


class Waiting:
    """The jobs fired while every slot was taken.

    Args:
        stats: where the shed jobs are counted.
        release: hands jobs of one shard and epoch back to due; how many were.
    """

    def __init__(
        self, stats: LoaderStats, release: Callable[[int, list[Job]], Awaitable[int]]
    ) -> None:
        self.stats = stats
        self._release = release
        # (shard, job id) -> (job, lease end, its shed timer, its due or None); FIFO.
        # Filled, and taken from as slots free, by the runner itself (its hot path).
        self.ready: dict[tuple[int, str], tuple[Job, float, Timer, float | None]] = {}
        self._to_shed: list[Job] = []  # waited too long for a slot: to be released
        self._shedding: set[asyncio.Task[None]] = set()  # their release calls

    def shed(self, key: tuple[int, str]) -> None:
        """The shed timer of job ``key`` fired: release it (with the others of this
        loop turn), unless it got its slot meanwhile."""
        entry = self.ready.pop(key, None)
        if entry is None:
            return
        self._to_shed.append(entry[0])
        if len(self._to_shed) == 1:  # the first of this loop turn: one release call
            task = asyncio.ensure_future(self._release_shed())
            self._shedding.add(task)
            task.add_done_callback(self._shedding.discard)

    async def _release_shed(self) -> None:
        await asyncio.sleep(0)  # one loop turn: the jobs of a batch shed together
        jobs, self._to_shed = self._to_shed, []
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.shard, job.epoch), []).append(job)
        for (shard, _), group in groups.items():
            self.stats.shed += await self._release(shard, group)

    def forget(self, key: tuple[int, str]) -> bool:
        """Forget the waiting job ``key`` (it was cancelled); True if it waited."""
        entry = self.ready.pop(key, None)
        if entry is None:
            return False
        entry[2].cancel()
        return True

    def shards(self) -> set[int]:
        """The shards that have a job waiting for a slot."""
        return {shard for shard, _ in self.ready}

    def take(self, shard: int) -> list[Job]:
        """Take the jobs of ``shard`` out of the queue (in order), to be handed back."""
        jobs = []
        for key in [k for k in self.ready if k[0] == shard]:
            job, _, shed, _ = self.ready.pop(key)
            shed.cancel()
            jobs.append(job)
        return jobs

    def drop(
        self, shard: int, epoch: int | None, forget: Callable[[Job], None] | None = None
    ) -> int:
        """Forget the jobs of ``shard`` (all, or those leased under ``epoch`` or
        before), each told to ``forget``; how many."""
        ready = [
            key
            for key, (job, *_) in self.ready.items()
            if key[0] == shard and (epoch is None or job.epoch <= epoch)
        ]
        for key in ready:
            job, _, shed, _ = self.ready.pop(key)
            shed.cancel()
            if forget is not None:
                forget(job)
        return len(ready)
