"""The safety net of a lost wake (issue 35; docs/limits.md): a worker's rechecks of the
flow keys whose recheck timer is due in a shard it owns (the Limiter's, split from
``_limiter.py``).

A job waiting for a permit is in no index of its shard: only its key's waiters and its
record hold it. Its waker killed between the release and the wake would leave it there;
so each (shard, task, key) with waiters has one timer (``{ns:s}:krecheck``), and after
each claim round (at most once per ``RECHECK_PACE`` s) the owner of a shard rechecks
the keys whose timer is due: permits past their deadline freed, free ones handed to
the first waiters, and every handed permit not taken yet woken (again).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tickwheel.durable.model import Limits, PostgresUnavailable, RedisUnavailable

if TYPE_CHECKING:
    from ._limiter import Limiter

__all__ = ["RECHECK_IDLE", "RECHECK_KEYS", "RECHECK_PACE", "Rechecks"]

logger = logging.getLogger("tickwheel.durable")

# Seconds between two looks at the owned shards' recheck timers, and flow keys
# rechecked per shard per look.
RECHECK_PACE = 1.0
RECHECK_KEYS = 100
# Seconds between two looks while no task has limits of record (a limit removed while
# jobs waited for it leaves them to these looks; a namespace without limits pays one
# read per owned shard this often).
RECHECK_IDLE = 30.0


class Rechecks:
    """The rechecks of one worker's :class:`Limiter` (``lim``)."""

    def __init__(self, lim: Limiter) -> None:
        self.lim = lim
        self._rechecking: asyncio.Task[None] | None = None  # the owned shards' rechecks
        self._recheck_at = 0.0  # loop time of the last look at the recheck timers

    def soon(self) -> None:
        """After a claim round: at most once per ``RECHECK_PACE`` s, the flow keys
        whose recheck timer is due in an owned shard are rechecked in the background
        (:meth:`_recheck`). O(1) here."""
        loop = asyncio.get_running_loop()
        pace = RECHECK_PACE if self.lim.current else RECHECK_IDLE
        if self._rechecking is not None or loop.time() - self._recheck_at < pace:
            return
        self._recheck_at = loop.time()
        self._rechecking = self.lim.spawn(self._recheck())

    async def _recheck(self) -> None:
        """Recheck each owned shard's due flow keys: limits.lua 'K' frees the permits
        past their deadline and hands the free ones to the first waiters; every waiter
        holding a handed permit is woken (again: a wake is idempotent), and each key's
        timer is set again while it has waiters. A failure leaves the timers due: the
        next look tries again."""
        lim = self.lim
        try:
            await lim.ready()
            owned = list(lim.scheduler.ownership.owned)
            if owned:
                for shard, due in (await lim.calls.rechecks_due(owned, RECHECK_KEYS)).items():
                    await self._recheck_keys(shard, due)
        except (RedisUnavailable, PostgresUnavailable) as exc:
            lim.stats.unavailable += 1
            logger.debug("flow key recheck left to the next look (%s)", exc)
        except Exception:
            lim.stats.errors += 1
            logger.exception("flow key recheck left to the next look")
        finally:
            self._rechecking = None

    async def _recheck_keys(self, shard: int, due: list[tuple[str, str, int]]) -> None:
        lim = self.lim
        lims = [lim.current.get(task) for task, _, _ in due]
        items = [(task, key, li) for (task, key, _), li in zip(due, lims, strict=True)]
        results = await lim.calls.recheck_many(items, lim.hold_ms)
        woken: list[tuple[str, str]] = []
        new: list[bool] = []
        for (task, _, _), (_, now, before) in zip(due, results, strict=True):
            woken += [(task, m) for m in now + before]
            new += [True] * len(now) + [False] * len(before)
        if woken:
            codes = await lim.calls.wake_many(woken)
            owner = [i for i, (_, now, before) in enumerate(results) for _ in now + before]
            freed = []
            for (task, member), code, fresh, i in zip(woken, codes, new, owner, strict=True):
                li = lims[i]
                if code == 0 and (fresh or li is None):
                    # Handed now to a job that no longer waits: freed again. (One handed
                    # before is left to its deadline: its job may be due, not claimed
                    # yet. Without limits of record, every such permit goes: it gates
                    # nothing, and it would be handed around again at its deadline.)
                    freed.append((task, due[i][1], member, "", li or Limits()))
                elif code != 0:
                    lim.stats.limit_wakes += 1
            lim.release_later(freed)
            if lim.poke is not None:
                lim.poke()
        left = [(t, k, when, r[0]) for (t, k, when), r in zip(due, results, strict=True)]
        await lim.calls.rechecked(shard, lim.recheck_ms, left)
