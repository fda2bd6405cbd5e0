"""Shard ownership in Redis: take, renew and give back a shard, and lift its fencing epoch.

Ground rules:

- One owner per shard: ``{ns:s}:owner`` holds its token with a TTL, ``{ns:s}:epoch`` the
  fencing epoch that every owner-side script checks (docs/design.md, ownership and
  fencing). Each call here is one script over those two keys.
- Off the job's hot path: the scheduler's ownership loop calls these every few seconds.
  :class:`~._store.Store` keeps one method for each, which hands it here.
"""

from __future__ import annotations

from ._scripts import ScriptCalls

__all__ = ["FencingCalls"]


class FencingCalls(ScriptCalls):
    """The ownership scripts over one namespace (what :class:`Store` hands them to)."""

    __slots__ = ()

    async def take(self, shard: int, token: str, ttl_ms: int, fresh: bool = False) -> int:
        """Take a shard (take.lua); return its new epoch, or 0 if another owner holds it.
        ``fresh``: the caller does not hold it, so its own token found set (a previous
        process with the same token) is taken over at once, under a new epoch."""
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.take, [k.owner, k.epoch], [token, ttl_ms, "1" if fresh else ""], shard
        )
        return int(reply[0])

    async def renew(self, shard: int, token: str, epoch: int, ttl_ms: int) -> None:
        """Renew the owner token (renew.lua).

        Raises:
            Fenced: if the epoch moved on or another token holds the shard.
        """
        k = self.keys.shard(shard)
        await self.transport.run(
            self._scripts.renew, [k.owner, k.epoch], [token, epoch, ttl_ms], shard
        )

    async def give_back(self, shard: int, token: str, epoch: int) -> bool:
        """Give a shard back and bump its epoch (give_back.lua); False if not held."""
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.give_back, [k.owner, k.epoch], [token, epoch], shard
        )
        return bool(reply)

    async def raise_epoch(self, shard: int, floor: int) -> bool:
        """Lift the shard's epoch to ``floor + 1`` if it is below ``floor``
        (raise_epoch.lua): after a Redis that lost its data, epochs start again from 0,
        and PostgreSQL still refuses acks below the highest one it recorded."""
        k = self.keys.shard(shard)
        return bool(await self.transport.run(self._scripts.raise_epoch, [k.epoch], [floor], shard))
