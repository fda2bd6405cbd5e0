"""Shard ownership: take, renew and give back shards, fenced by epochs.

Ground rules:

- An owner holds a shard while its token (``{ns:s}:owner``, with a TTL) is set and the
  shard's epoch (``{ns:s}:epoch``) is the one it got when it took the shard. Every
  take INCRs the epoch, so a stalled owner's writes carry a stale epoch and the scripts
  refuse them (:class:`Fenced`).
- An owner that sees :class:`Fenced` drops the shard at once: ``owned`` never holds an
  epoch the owner knows to be stale.
- Renewal runs every ``ttl / RENEW_FRACTION``, so a token survives four missed renewals.
- A dead owner's shards are free once its token expires (at most ``ttl`` after its last
  renewal) and taken at the next round of another owner: within ``ttl + ttl /
  RENEW_FRACTION`` of the death (6 s by default).
- A process restarted with the same token (a stable worker id, ``Scheduler(worker_id=
  ...)``) takes its previous shards at once: a take of a shard this process does not
  hold in memory bumps the epoch even when the token found is its own, so the previous
  process, were it still alive, is fenced as by any other taker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import timedelta

from tickwheel.durable.model import (
    Counters,
    Fenced,
    NotOwner,
    ReapResult,
    RedisUnavailable,
    count_reap,
    finite_seconds_ms,
)
from tickwheel.durable.store import Store

__all__ = ["DEFAULT_OWNER_TTL", "RENEW_FRACTION", "Ownership"]

logger = logging.getLogger("tickwheel.durable")

# Long enough to ride out a GC pause or a slow renewal round trip (and a plain task
# function that blocks the loop for a while: longer ones belong in thread=True); short
# enough that a crashed owner's shards are taken over within seconds: within ttl + ttl /
# RENEW_FRACTION = 6 s (docs/reliability.md has the measured figures). 10 s before
# issue 40, when a dead owner's shards waited up to 13 s.
DEFAULT_OWNER_TTL = 5.0
# Renew five times per TTL (every second by default): four renewals may fail (a blip)
# before the token expires, and a free shard is found within a fifth of the TTL.
RENEW_FRACTION = 5


class Ownership:
    """The shards one process owns, with their epochs.

    Args:
        store: the store of the namespace.
        token: this owner's token; a random one when None.
        ttl: seconds the token lives without renewal.

    Raises:
        TypeError, ValueError: for a bad ``ttl`` or ``token``.
    """

    def __init__(
        self, store: Store, *, token: str | None = None, ttl: float | timedelta = DEFAULT_OWNER_TTL
    ) -> None:
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError(f"token must be a non-empty str, got {token!r}")
        self.store = store  # the store of the namespace
        self.token = token or uuid.uuid4().hex  # this owner's token
        self.ttl_ms = finite_seconds_ms("ttl", ttl, minimum_ms=1)  # token TTL in ms
        self.owned: dict[int, int] = {}  # shard -> epoch taken
        # Shards whose take's reply was lost (it may have taken them): taken again
        # without a new epoch, so a re-sent take is idempotent.
        self._sent: set[int] = set()
        self._stop = asyncio.Event()  # set by stop(): run() returns
        # Counters of this owner's calls; the Scheduler and Reaper built on it count here.
        self.counters = Counters()
        # Told fn(shard, epoch) at every Fenced refusal of a call made under that epoch:
        # the loader forgets the shard's loaded jobs, the scheduler its claim token.
        # Bound methods are held weakly: a loader that is dropped stops being told.
        self._on_fenced: list[Callable[[], Callable[[int, int], None] | None]] = []
        # The Postgres mode's record of a reap before Redis makes it (its
        # ``before_reap``, bound to the scheduler): (shard, epoch, now, plan); None: off.
        self.before_reap: (
            Callable[[int, int, int, list[tuple[str, int, int, int]]], Awaitable[None]] | None
        ) = None

    def on_fenced(self, fn: Callable[[int, int], None]) -> Callable[[], None]:
        """Call ``fn(shard, epoch)`` whenever a call made under ``epoch`` is refused as
        :class:`Fenced` (after the shard is dropped). One event, one place: every layer
        that holds state per shard subscribes here instead of catching it.

        A bound method is held by a weak reference, so subscribing does not keep its
        object alive (a scheduler outlives the loaders built on it); any other callable
        is held as it is. Returns a function that unsubscribes ``fn``.
        """
        ref: Callable[[], Callable[[int, int], None] | None]
        if hasattr(fn, "__self__") and hasattr(fn, "__func__"):
            ref = weakref.WeakMethod(fn)
        else:
            ref = lambda: fn  # noqa: E731  (a strong reference, called like a weak one)
        self._on_fenced.append(ref)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._on_fenced.remove(ref)

        return unsubscribe

    @property
    def fenced_subscribers(self) -> int:
        """How many subscribers :meth:`drop` tells (those still alive)."""
        return sum(ref() is not None for ref in self._on_fenced)

    @contextlib.contextmanager
    def guard(self, shard: int, epoch: int) -> Iterator[None]:
        """Around a call made under ``epoch``: a :class:`Fenced` reply drops the shard
        (:meth:`drop`, which tells the subscribers) and is raised on."""
        try:
            yield
        except Fenced:
            self.drop(shard, epoch)
            raise

    def epoch(self, shard: int) -> int:
        """The epoch this owner holds ``shard`` under.

        Raises:
            NotOwner: if it does not own ``shard``.
        """
        try:
            return self.owned[shard]
        except KeyError:
            raise NotOwner(f"shard {shard} is not owned by {self.token}; take it first") from None

    def drop(self, shard: int, epoch: int) -> None:
        """Forget ``shard`` after a call made under ``epoch`` was refused as
        :class:`Fenced`; no Redis call.

        Only that epoch is forgotten: a late refusal of a call made before the shard was
        taken again (under a newer epoch) leaves the newer ownership alone. Every refusal
        is counted (``fenced``); losing an owned shard also counts as ``shards_lost``.
        """
        self.counters.fenced += 1
        if self.owned.get(shard) == epoch:
            del self.owned[shard]
            self.counters.shards_lost += 1
            logger.warning(
                "dropped shard %d epoch %d (fenced)", shard, epoch, extra={"shard": shard}
            )
        for ref in list(self._on_fenced):  # a subscriber may (un)subscribe meanwhile
            fn = ref()
            if fn is not None:
                fn(shard, epoch)
        self._on_fenced[:] = [ref for ref in self._on_fenced if ref() is not None]

    async def take(self, shard: int) -> int | None:
        """Take ``shard`` if it is free (or already ours); return the epoch, or None.
        A shard not held here whose token is this owner's own (a previous process with
        the same token) is taken under a new epoch."""
        # Fresh unless held here (or maybe taken by a take whose reply was lost): a
        # token of ours found set is then a previous process's.
        fresh = shard not in self.owned and shard not in self._sent
        self._sent.add(shard)
        epoch = await self.store.take(shard, self.token, self.ttl_ms, fresh)
        self._sent.discard(shard)
        if epoch:
            if self.owned.get(shard) != epoch:
                self.counters.shards_taken += 1
            self.owned[shard] = epoch
            return epoch
        if self.owned.pop(shard, None) is not None:
            self.counters.shards_lost += 1
            logger.warning("lost shard %d to another owner", shard, extra={"shard": shard})
        return None

    async def renew(self, shard: int) -> bool:
        """Renew ``shard``'s token; on :class:`Fenced` drop it and return False.

        Raises:
            NotOwner: if it does not own ``shard``.
        """
        epoch = self.epoch(shard)
        try:
            with self.guard(shard, epoch):
                await self.store.renew(shard, self.token, epoch, self.ttl_ms)
        except Fenced:
            return False
        return True

    async def reap(self, shard: int, epoch: int, limit: int) -> ReapResult:
        """Return ``shard``'s expired leases to due (attempt + 1) or dead, under ``epoch``;
        counted. The one reap call of the scheduler and the reaper. With
        ``before_reap`` (the Postgres mode) the leases expired by Redis's now are read
        first, handed to it, then reaped (those only: a lease that expires meanwhile
        waits for the next round).

        Raises:
            Fenced: if ``epoch`` is stale (the shard is dropped first).
        """
        with self.guard(shard, epoch):
            if self.before_reap is None:
                result = await self.store.reap(shard, epoch, limit)
            else:  # look, record in PostgreSQL, then reap what was looked at only
                now, plan = await self.store.reap_look(shard, epoch, limit)
                if not plan:
                    return ReapResult(shard, now, [], [])
                await self.before_reap(shard, epoch, now, plan)
                result = await self.store.reap(shard, epoch, limit, upto_ms=now)
        count_reap(self.counters, result)
        return result

    async def give_back(self, shard: int) -> bool:
        """Give ``shard`` back (its epoch is bumped, fencing late writes)."""
        epoch = self.owned.pop(shard, None)
        if epoch is None:
            return False
        self.counters.shards_given_back += 1
        return await self.store.give_back(shard, self.token, epoch)

    async def give_back_all(self) -> None:
        """Give every owned shard back."""
        for shard in list(self.owned):
            await self.give_back(shard)

    async def renew_leaving(self, shard: int, epoch: int) -> None:
        """Renew ``shard``'s token under ``epoch`` while it is being given back: out of
        ``owned`` already, still held while its running tasks drain (their acks need the
        epoch unchanged).

        Raises:
            Fenced: if the epoch moved on or another token holds the shard.
        """
        await self.store.renew(shard, self.token, epoch, self.ttl_ms)

    async def give_back_leaving(self, shard: int, epoch: int) -> bool:
        """Give back ``shard``, held under ``epoch`` but out of ``owned`` (its tasks
        drained); False if it was not held. Counted as given back."""
        self.counters.shards_given_back += 1
        return await self.store.give_back(shard, self.token, epoch)

    async def run(
        self, shards: Iterable[int] | None = None, *, max_shards: int | None = None
    ) -> None:
        """Forever: renew owned shards and take free ones, every ``ttl / 3``.

        Args:
            shards: the shards to try to own; all of the namespace when None.
            max_shards: own at most this many (share shards between processes).

        A failed round (Redis unreachable, or anything else) is logged and the next one
        runs. Stop it with :meth:`stop` (cancelling can be swallowed by redis-py 8
        mid-command); the caller gives the shards back.
        """
        wanted = list(range(self.store.keys.shards) if shards is None else shards)
        period = self.ttl_ms / 1000 / RENEW_FRACTION
        self._stop.clear()
        while not self._stop.is_set():
            try:
                for shard in list(self.owned):
                    await self.renew(shard)
                for shard in wanted:
                    if max_shards is not None and len(self.owned) >= max_shards:
                        break
                    if shard not in self.owned:
                        await self.take(shard)
            except RedisUnavailable as exc:  # the next round renews what is still ours
                logger.warning("owner cannot reach Redis (%s)", exc)
            except Exception:
                logger.exception("ownership round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), period)

    def stop(self) -> None:
        """Make :meth:`run` return after the call in flight, if any."""
        self._stop.set()
