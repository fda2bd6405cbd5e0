"""Pause and resume: a task's (or the whole namespace's) due jobs are not claimed.

Ground rules:

- The state lives in Redis (store/_pauses.py): ``{ns}:paused`` of record, a copy per
  shard that claim.lua reads. It survives worker restarts; nothing in a worker holds it.
- A claim that meets a due job of a paused task moves it, once, from due to the shard's
  parked jobs (keyed by task, in due order: lua/_lib.lua), so the claims after it never
  read it again: a paused task costs the others' claims nothing per parked job. A
  parked job is still scheduled: get, cancel, reschedule, schedule(replace=True) and
  the listings see it. Jobs already running finish; their retries park when due.
- Resume moves the parked jobs back into due at their due times, in bounded batches
  (``RESUME_BATCH`` a shard and call), so claims take them in due order before anything
  due later. A recurring series' occurrence that fell due during the pause runs as after
  any downtime: its missed-run policy decides.
- In the Postgres mode PostgreSQL records the state first (``postgres/_pauses.py``):
  pause and resume write its row, then Redis, in one transaction holding the
  namespace's pause lock, and reconcile writes its pauses back to Redis after a loss.
- A task name that no worker registers yet may be paused (producers and workers deploy
  independently: pausing before the first deploy is useful); it is checked as task names
  are (1 to 128 UTF-8 bytes, no NUL).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from tickwheel.durable.model import check_task_name
from tickwheel.durable.store import Store

__all__ = ["PauseRecord", "Pauses", "pause_field"]

# The Postgres mode's pause and resume (PostgresMode's, bound to the scheduler): they
# write PostgreSQL's row, then Redis (both: Redis is not written again here).
PauseRecord = tuple[Callable[[str, int], Awaitable[None]], Callable[[str], Awaitable[int]]]


def pause_field(task: str | None) -> str:
    """The state's field of ``task``: ``""`` for the whole namespace (None).

    Raises:
        TypeError, ValueError: naming ``task`` for a bad task name.
    """
    return "" if task is None else check_task_name(task, "task")


class Pauses:
    """Pause, resume and read the pause state of one namespace (each after ``opener``).

    Args:
        store: the namespace's store.
        opener: awaited before every call (``Scheduler.open``).
        record: the Postgres mode's pause and resume (None: the Redis-only mode).
    """

    __slots__ = ("_open", "_record", "store")

    def __init__(
        self,
        store: Store,
        opener: Callable[[], Awaitable[object]],
        record: PauseRecord | None = None,
    ) -> None:
        self.store = store
        self._open = opener
        self._record = record

    async def pause(self, task: str | None = None) -> None:
        """Pause ``task`` (None: every task of the namespace): from the return on, no
        claim leases its due jobs; they wait, parked, for :meth:`resume`. Jobs claimed
        already run: those running finish, and those a worker loaded before (up to its
        lookahead ahead of their due time) fire. Pausing what is paused keeps its first
        time. Re-call it after an error: a pause cut short holds on some shards only.

        Raises:
            TypeError, ValueError: naming ``task`` if it is not a valid task name
                (nothing written).
            RedisUnavailable: if Redis cannot be reached.
            PostgresUnavailable: Postgres mode: the pause is not recorded.

        Runtime complexity: O(shards), one round trip per node.
        """
        field = pause_field(task)
        await self._open()
        now = int(time.time() * 1000)
        if self._record is not None:  # PostgreSQL's row first, then Redis
            await self._record[0](field, now)
            return
        await self.store.pauses.pause(field, now)

    async def resume(self, task: str | None = None) -> int:
        """Resume ``task`` (None: the namespace's pause; tasks paused on their own stay
        paused). Its parked jobs go back to due at their due times and run in due order.
        A task stays paused while the whole namespace is. Re-call it after an error.

        Returns:
            The number of parked jobs moved back.

        Raises:
            TypeError, ValueError: naming ``task`` if it is not a valid task name.
            RedisUnavailable: if Redis cannot be reached.
            PostgresUnavailable: Postgres mode: the pause is still recorded.

        Runtime complexity: O(parked jobs released), in batches of ``RESUME_BATCH``
        per shard and round trip.
        """
        field = pause_field(task)
        await self._open()
        if self._record is not None:  # PostgreSQL's row first, then Redis
            return await self._record[1](field)
        return await self.store.pauses.resume(field)

    async def paused(self) -> dict[str | None, int]:
        """The pause state of record: paused task (None: the whole namespace) -> the
        time it was paused (Unix ms). Empty when nothing is paused.

        Runtime complexity: O(paused tasks), one call.
        """
        await self._open()
        state = await self.store.pauses.state()
        return {(t or None): since for t, since in state.items()}
