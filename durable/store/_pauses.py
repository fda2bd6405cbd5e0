"""The calls of a pause: the namespace's state of record and every shard's copy.

Ground rules:

- ``{ns}:paused`` (:attr:`Keys.paused`) is the state of record: task name -> the time
  it was paused (ms), the field ``""`` for the whole namespace. Each shard holds a copy
  (:attr:`ShardKeys.paused`) that claim.lua reads in its own slot, so a Redis Cluster
  never sees a script touch two slots, and a pause holds from the moment its copies are
  written, for every claim, without a worker having to learn of it first.
- A pause writes the state of record, then the copies; a resume the copies (moving
  each shard's parked jobs back in bounded batches), then the state of record. A pause
  or resume cut short (Redis gone midway) is finished by calling it again: both are
  idempotent.
- Every call is bounded and translated like the rest of the store (its ``Transport``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._keys import Keys
from ._scripts import ScriptCalls
from ._transport import Call

__all__ = ["RESUME_BATCH", "PauseCalls", "pause_state_call", "paused_state", "shard_pause_call"]

# Parked jobs moved back into due per script call of a resume (per shard): bounds how
# long one call holds Redis (about a millisecond a thousand jobs).
RESUME_BATCH = 1000


def paused_state(reply: Sequence[Any]) -> dict[str, int]:
    """pause_state.lua's reply (HGETALL's, flat) as {task: since_ms}."""
    return {reply[i].decode(errors="replace"): int(reply[i + 1]) for i in range(0, len(reply), 2)}


def pause_state_call(
    keys: Keys, op: int, task: str = "", since_ms: int = 0
) -> tuple[list[str], list[Any]]:
    """pause_state.lua: op 1 pause, 0 resume, 2 read (of the state of record)."""
    return [keys.paused], [op, task, since_ms]


def shard_pause_call(
    keys: Keys, shard: int, op: int, task: str, *, since_ms: int = 0, limit: int = 0
) -> tuple[list[str], list[Any]]:
    """pause.lua on ``shard``: op 1 pause, 0 resume (moving at most ``limit`` back)."""
    k = keys.shard(shard)
    keys_ = [k.paused, k.parked, k.parkedx, k.due, k.prio, *k.jobs]
    return keys_, [op, task, since_ms, limit]


class PauseCalls(ScriptCalls):
    """pause.lua and pause_state.lua over one namespace."""

    __slots__ = ()

    async def state(self) -> dict[str, int]:
        """The state of record: task (``""``: the whole namespace) -> since (ms)."""
        keys, args = pause_state_call(self.keys, 2)
        return paused_state(await self.transport.run(self._scripts.pause_state, keys, args, -1))

    async def pause(self, task: str, since_ms: int) -> dict[str, int]:
        """Record the pause of ``task`` (``""``: all), then write every shard's copy.
        Returns the state of record after it."""
        keys, args = pause_state_call(self.keys, 1, task, since_ms)
        state = paused_state(await self.transport.run(self._scripts.pause_state, keys, args, -1))
        since = state.get(task, since_ms)
        calls = [
            Call(
                self._scripts.pause,
                *shard_pause_call(self.keys, shard, 1, task, since_ms=since),
                shard,
            )
            for shard in range(self.keys.shards)
        ]
        await self.transport.pipelined(calls, wait=False)
        return state

    async def resume(self, task: str, limit: int = RESUME_BATCH) -> int:
        """Clear ``task``'s pause (``""``: the namespace's) on every shard, moving the
        parked jobs it releases back into due, ``limit`` per shard and call, then in the
        state of record. Returns the jobs moved."""
        moved = 0
        todo = list(range(self.keys.shards))
        while todo:
            calls = [
                Call(
                    self._scripts.pause,
                    *shard_pause_call(self.keys, shard, 0, task, limit=limit),
                    shard,
                )
                for shard in todo
            ]
            replies = await self.transport.pipelined(calls, wait=False)
            moved += sum(int(r) for r in replies)
            todo = [shard for shard, r in zip(todo, replies, strict=True) if int(r) >= limit]
        keys, args = pause_state_call(self.keys, 0, task)
        await self.transport.run(self._scripts.pause_state, keys, args, -1)
        return moved
