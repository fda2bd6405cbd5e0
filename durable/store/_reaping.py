"""The reaper's script: expired leases back to due (attempt + 1, or the same attempt for
a run that never started) or to dead (reap.lua), and its look-only form, which the
Postgres mode reads to record each outcome in PostgreSQL before Redis takes it.

:class:`~._store.Store` keeps one method for each, which hands it here.
"""

from __future__ import annotations

from typing import Any

from tickwheel.durable.model import ReapResult

from ._scripts import ScriptCalls

__all__ = ["ReapCalls"]


class ReapCalls(ScriptCalls):
    """reap.lua over one namespace's shards."""

    __slots__ = ()

    async def reap(self, shard: int, epoch: int, limit: int, *, upto_ms: int = 0) -> ReapResult:
        """Expired leases (by ``upto_ms`` when set) back to due or to dead.

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        reply = await self._reap(shard, [epoch, limit, 0, upto_ms])
        n = int(reply[1])
        ids = [b.decode() for b in reply[2:]]
        return ReapResult(shard, int(reply[0]), ids[:n], ids[n:])

    async def look(
        self, shard: int, epoch: int, limit: int
    ) -> tuple[int, list[tuple[str, int, int, int]]]:
        """What :meth:`reap` would do now, writing nothing: Redis's now and, per expired
        lease, (id, nominal, attempt after, 0 same attempt / 1 attempt + 1 / 2 dead)."""
        r = await self._reap(shard, [epoch, limit, 1])
        return int(r[0]), [
            (r[i].decode(), int(r[i + 1]), int(r[i + 2]), int(r[i + 3]))
            for i in range(1, len(r), 4)
        ]

    async def _reap(self, shard: int, args: list[Any]) -> Any:
        k = self.keys.shard(shard)
        keys = [k.leased, k.due, k.dead, k.epoch, k.clock, k.prio, *k.jobs]
        return await self.transport.run(self._scripts.reap, keys, args, shard)
