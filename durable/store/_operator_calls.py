"""The calls an operator makes: read a job, list and inspect shards, handle dead letters.

Ground rules:

- Off the hot path: the CLI, the dashboard and :meth:`Scheduler.get` use these; the
  loops never do. :class:`~._store.Store` keeps one method per call, which hands it here.
- Each call is one script (or one pipeline of the same read script over shards), through
  the store's transport, so it is bounded and its errors translated like the rest.
- Reads are read only (get, due_list, due_rank, inspect); dead_requeue and dead_purge
  are the two writes, each atomic per shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tickwheel.durable.model import DeadPage, JobInfo, JobState, ShardInfo

from ._calls import get_call, get_result
from ._codec import info_rows, job_info
from ._scripts import ScriptCalls
from ._transport import Call

__all__ = ["OperatorCalls"]


class OperatorCalls(ScriptCalls):
    """The operator's scripts over one namespace (what :class:`Store` hands them to)."""

    __slots__ = ()

    # -- one job -------------------------------------------------------------------

    async def get(self, shard: int, job_id: str) -> JobInfo | None:
        """One job's state and record (get.lua). O(log N)."""
        keys, args = get_call(self.keys, shard, job_id)
        reply = await self.transport.run(self._scripts.get, keys, args, shard)
        return get_result(shard, job_id, reply)

    async def get_and_now(self, shard: int, job_id: str) -> tuple[JobInfo | None, int]:
        """:meth:`get` and now.lua of the id's shard in one pipeline (one round trip):
        the job, and Redis's now to show its times against."""
        k = self.keys.shard(shard)
        jobs = self.keys.jobs_key(shard, job_id)
        reply, now = await self.transport.pipelined(
            [
                Call(self._scripts.get, [k.due, k.leased, k.dead, jobs, k.parked], [job_id], shard),
                Call(self._scripts.now, [k.clock], [], shard),
            ],
            wait=False,
        )
        if reply is None:
            return None, int(now)
        return job_info(job_id, shard, JobState(reply[0]), reply[1], reply[2:]), int(now)

    # -- dead letters --------------------------------------------------------------

    async def dead_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of dead letters, oldest first (dead_list.lua)."""
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.dead_list, [k.dead, *k.jobs], [offset, count], shard
        )
        return DeadPage(int(reply[0]), info_rows(shard, JobState.DEAD, reply))

    async def dead_requeue(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """Dead letters back to due now (dead_requeue.lua); ``ids`` empty: oldest ``limit``."""
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.dead_requeue,
            [k.dead, k.due, k.clock, k.prio, *k.jobs],
            [limit, *ids],
            shard,
        )
        return [b.decode() for b in reply]

    async def dead_purge(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """Delete dead letters (dead_purge.lua); ``ids`` empty: the oldest ``limit``."""
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.dead_purge, [k.dead, k.trail, *k.jobs], [limit, *ids], shard
        )
        return [b.decode() for b in reply]

    # -- listing and inspection ----------------------------------------------------

    async def due_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of one shard's scheduled jobs in due order, from rank ``offset``
        (due_list.lua, read only). Each row's ``when_ms`` is its due time.

        O(log N + count) within the jobs due in the next minute or two; a page reaching
        into the far index (jobs due later) reads it from its start, O(offset).

        Raises:
            ListingTooLong: if that would read more than 50,000 far entries.
        """
        keys = self._listing_keys(shard)
        reply = await self.transport.run(self._scripts.due_list, keys, [offset, count], shard)
        return DeadPage(int(reply[0]), info_rows(shard, JobState.DUE, reply))

    async def due_rank(self, shard: int, time_ms: int) -> int:
        """How many of the shard's scheduled jobs are due before ``time_ms``
        (due_rank.lua, read only). O(log N) plus the far entries of slots starting
        before ``time_ms``.

        Raises:
            ListingTooLong: if that would read more than 50,000 far entries.
        """
        keys = self._listing_keys(shard)
        return int(await self.transport.run(self._scripts.due_rank, keys, [time_ms], shard))

    def _listing_keys(self, shard: int) -> list[str]:
        """due_list.lua's and due_rank.lua's keys."""
        k = self.keys.shard(shard)
        return [k.due, k.leased, k.dead, k.far, k.faro, k.parked, k.waiting, *k.jobs]

    def _inspect_keys(self, shard: int) -> list[str]:
        k = self.keys.shard(shard)
        return [
            *(k.due, k.leased, k.dead, k.owner, k.epoch, k.clock, k.far, k.faro),
            *(k.parked, k.paused, k.waiting, *k.jobs),
        ]

    async def inspect(self, shard: int) -> ShardInfo:
        """Counts, overdue lag, owner and next due of one shard (inspect.lua, read only).
        O(log N)."""
        reply = await self.transport.run(
            self._scripts.inspect, self._inspect_keys(shard), [], shard
        )
        return _shard_info(shard, reply)

    async def inspect_all(self) -> list[ShardInfo]:
        """:meth:`inspect` of every shard in one pipeline (one round trip per node);
        each shard is read at its own instant."""
        calls = [
            Call(self._scripts.inspect, self._inspect_keys(shard), [], shard)
            for shard in range(self.keys.shards)
        ]
        replies = await self.transport.pipelined(calls, wait=False)
        return [_shard_info(shard, reply) for shard, reply in enumerate(replies)]


def _shard_info(shard: int, reply: Sequence[Any]) -> ShardInfo:
    """A ShardInfo from inspect.lua's reply."""
    now, due, overdue, oldest, next_due, leased, expired, dead, owner, ttl, epoch = reply[:11]
    parked, paused, waiting = reply[11:14]
    return ShardInfo(
        shard=shard,
        now_ms=int(now),
        due=int(due),
        overdue=int(overdue),
        oldest_overdue_ms=int(oldest),
        next_due_ms=int(next_due),
        leased=int(leased),
        expired=int(expired),
        dead=int(dead),
        owner=owner.decode(errors="replace"),
        owner_ttl_ms=int(ttl),
        epoch=int(epoch),
        parked=int(parked),
        paused=tuple(sorted(t.decode(errors="replace") for t in paused)),
        waiting=int(waiting),
    )
