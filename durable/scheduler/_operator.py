"""The operator's calls over a namespace: one look at every shard, and the dead letters
(list, requeue, purge), one shard or a set of ids at a time.

They open the scheduler first (its ``open``, given here), so the shard count is checked
before anything is written. In the Postgres mode PostgreSQL decides a requeue or purge
first (``undead``), and Redis follows for the ids it returned.
:class:`~tickwheel.durable.Scheduler` delegates its methods of the same names here. The
dashboard's reads, which never open, are the :class:`~._console.Console`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from tickwheel.durable.model import (
    DeadPage,
    Limits,
    ShardInfo,
    check_job_id,
    check_key,
    check_task_name,
    int_between,
)
from tickwheel.durable.store import Keys, KeyState, Store

from ._leases import MAX_BATCH

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode

__all__ = ["Operator"]


class Operator:
    """Inspect and the dead-letter calls over one namespace (built by a Scheduler).

    Args:
        store: the namespace's store.
        keys: its key names (the shard count, an id's shard).
        open: the scheduler's ``open`` (the layout check), awaited before each call.
        pg: the Postgres mode, or None (Redis only).
    """

    __slots__ = ("_open", "keys", "pg", "store")

    def __init__(
        self,
        store: Store,
        keys: Keys,
        open: Callable[[], Awaitable[object]],
        *,
        pg: PostgresMode | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self._open = open
        self.pg = pg

    async def limits(self) -> dict[str, Limits]:
        """The flow limits Redis holds, by task (the workers' declarations: the last
        writer wins; docs/limits.md). O(tasks).

        Raises:
            ShardCountMismatch, RedisUnavailable: see :meth:`Scheduler.open`.
        """
        await self._open()
        return await self.store.limits.read()

    async def key_state(self, task: str, key: str | None = None) -> KeyState:
        """One flow key of ``task`` (None: the task's single key): runs holding its
        permits, jobs waiting for one, permits handed to woken waiters, the next
        permit deadline and booked start, the starts in the rate window. One read in
        the key's slot, O(log N) (plus the limits of record, O(tasks)).

        Raises:
            TypeError, ValueError: naming a bad ``task`` or ``key``.
            ShardCountMismatch, RedisUnavailable: see :meth:`Scheduler.open`.
        """
        check_task_name(task, "task")
        if key is not None:
            check_key(key)
        lim = (await self.limits()).get(task, Limits())
        return await self.store.limits.look(task, key or "", lim)

    async def limit_waiting(self) -> dict[str, int]:
        """Jobs waiting for a permit or a start of their flow key, by limited task
        (the metrics' totals: per task, never per key). O(tasks x shards).

        Raises:
            ShardCountMismatch, RedisUnavailable: see :meth:`Scheduler.open`.
        """
        tasks = sorted(await self.limits())
        return await self.store.limits.waiting(tasks)

    async def inspect(self) -> list[ShardInfo]:
        """One read-only look at every shard: counts, overdue lag, owner, next due.

        Returns:
            One :class:`ShardInfo` per shard, in shard order (one script call each).

        Raises:
            ShardCountMismatch, RedisUnavailable: see :meth:`Scheduler.open`.
        """
        await self._open()
        if self.pg is not None:  # this process's jobs written behind are in Redis first
            await self.pg.behind.settled()
        return [await self.store.inspect(shard) for shard in range(self.keys.shards)]

    async def dead_letters(self, shard: int, *, offset: int = 0, count: int = 100) -> DeadPage:
        """A page of one shard's dead letters, oldest first."""
        self.keys.shard(shard)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        int_between("count", count, 1, MAX_BATCH)
        await self._open()
        return await self.store.dead_list(shard, offset, count)

    async def requeue_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Put dead letters back to due now, attempt 1; return the ids requeued."""
        return await self._undead(job_ids, purge=False)

    async def purge_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Delete dead letters for good; return the ids purged."""
        return await self._undead(job_ids, purge=True)

    async def _undead(self, job_ids: Sequence[str], *, purge: bool) -> list[str]:
        groups = self._by_shard(job_ids)
        await self._open()  # the shard count is checked before anything is written
        act = self.store.dead_purge if purge else self.store.dead_requeue
        changed: list[str] = []
        if self.pg is not None:  # PostgreSQL decides; Redis follows for what it returned
            changed, follow = await self.pg.store.undead(
                [i for ids in groups.values() for i in ids], purge=purge
            )
            groups = self._by_shard(follow)
        out: list[str] = []
        for shard, ids in groups.items():
            out += await act(shard, ids, len(ids))
        seen = set(out)
        return out + [i for i in changed if i not in seen]  # changed in PostgreSQL only

    async def requeue_all_dead(self, shard: int, *, limit: int = MAX_BATCH) -> list[str]:
        """Put the oldest ``limit`` dead letters of ``shard`` back to due now, attempt 1;
        return the ids requeued.

        Raises:
            ValueError: for a shard out of range or a bad ``limit``.
        """
        return await self._all_dead(shard, limit, purge=False)

    async def purge_all_dead(self, shard: int, *, limit: int = MAX_BATCH) -> list[str]:
        """Delete the oldest ``limit`` dead letters of ``shard``."""
        return await self._all_dead(shard, limit, purge=True)

    async def _all_dead(self, shard: int, limit: int, *, purge: bool) -> list[str]:
        self.keys.shard(shard)
        int_between("limit", limit, 1, MAX_BATCH)
        await self._open()
        if self.pg is not None:  # Redis's oldest, then as by id: PostgreSQL decides
            page = await self.store.dead_list(shard, 0, limit)
            return await self._undead([j.id for j in page.jobs], purge=purge)
        act = self.store.dead_purge if purge else self.store.dead_requeue
        return await act(shard, [], limit)

    def _by_shard(self, job_ids: Sequence[str]) -> dict[int, list[str]]:
        if isinstance(job_ids, str):
            raise TypeError("job_ids must be a sequence of ids, not a str")
        groups: dict[int, list[str]] = {}
        for job_id in job_ids:
            groups.setdefault(self.keys.shard_of(check_job_id(job_id)), []).append(job_id)
        return groups
