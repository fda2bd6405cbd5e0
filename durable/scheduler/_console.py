"""What an operator's console (the dashboard) reads and does over a namespace, through
the scheduler it built for it (``Scheduler.console``).

The console builds that scheduler from the layout it read (``store.read_layout``) and
never opens it: nothing here runs :meth:`Scheduler.open`, so looking writes nothing.
Each call is one store call; a cancel in the Postgres mode changes both stores, as
:meth:`Scheduler.cancel` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tickwheel.durable.model import DeadPage, JobInfo, JobState, ShardInfo

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["Console"]


class Console:
    """The operator's reads and acts over one scheduler's namespace, without open().

    Args:
        scheduler: the namespace's scheduler (its store, keys and Postgres mode).
    """

    __slots__ = ("_sched",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._sched = scheduler

    async def inspect_all(self) -> list[ShardInfo]:
        """Every shard's counts, lag, owner and next due, in one pipeline (one round
        trip per node); each shard is read at its own instant."""
        return await self._sched.store.inspect_all()

    async def now(self, shard: int) -> int:
        """Redis's now for ``shard`` (ms): max(TIME, the shard's clock)."""
        return await self._sched.store.now(shard)

    async def get(self, job_id: str) -> JobInfo | None:
        """One job's state and record; None if it is done or unknown."""
        sched = self._sched
        return await sched.store.get(sched.keys.shard_of(job_id), job_id)

    async def get_and_now(self, job_id: str) -> tuple[JobInfo | None, int]:
        """:meth:`get` and the job's shard's :meth:`now`, in one round trip."""
        sched = self._sched
        return await sched.store.get_and_now(sched.keys.shard_of(job_id), job_id)

    async def due_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of ``shard``'s scheduled jobs in due order, from rank ``offset``.

        Raises:
            ListingTooLong: if the page would read too much of the far index.
        """
        return await self._sched.store.due_list(shard, offset, count)

    async def due_rank(self, shard: int, time_ms: int) -> int:
        """How many of ``shard``'s scheduled jobs are due before ``time_ms``.

        Raises:
            ListingTooLong: as :meth:`due_list`.
        """
        return await self._sched.store.due_rank(shard, time_ms)

    async def dead_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of ``shard``'s dead letters, oldest first."""
        return await self._sched.store.dead_list(shard, offset, count)

    async def paused(self) -> dict[str | None, int]:
        """The pause state of record: task (None: the whole namespace) -> since (ms)."""
        state = await self._sched.store.pauses.state()
        return {(t or None): since for t, since in state.items()}

    async def cancel(self, job_id: str) -> JobState | None:
        """Cancel a job in any state; return the state it had (None: there was none)."""
        sched = self._sched
        if sched.pg is not None:  # both stores, as Scheduler.cancel does
            _, state = await sched.pg.cancel(sched, job_id)
            return state
        return await sched.store.cancel(sched.keys.shard_of(job_id), job_id)
