"""A Redis Stream, its consumer groups, and the occurrence records consumers dedup with.

Ground rules:

- One method per command (XADD, XGROUP CREATE, XAUTOCLAIM, XREADGROUP, XACK), and one
  per batch of ``lua/dedup.lua`` calls. Each method's redis-py errors are translated
  (``_errors.translate``): callers see :class:`RedisUnavailable` or the error reply,
  and get typed values back (entry ids as ``str``, fields as ``bytes``).
- What an entry means (a job's fields, which entry is a duplicate) is the caller's:
  ``runtime/_stream.py`` publishes and consumes jobs over this.
- A blocking read waits in slices of at most :data:`BLOCK_SLICE`, each bounded by its
  block plus :data:`READ_GRACE`; so it never outwaits the client's socket timeout, and
  a Redis that stops answering is noticed within a slice and the grace. XADD, XACK and
  the rest wait as long as the client's socket timeout (``connect()`` sets 5 s).
- The stream key is the caller's: any name, on any Redis (not necessarily the
  scheduler's). The record of who owns an occurrence is
  ``<stream>:owner:<group>:<job id>:<nominal ms>``, built by :meth:`Stream.owner_key`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from tickwheel.durable.model import RedisUnavailable
from tickwheel.wheel import timeout

from ._connect import Client
from ._errors import REDIS_ERRORS, translate
from ._scripts import register

__all__ = ["BLOCK_SLICE", "READ_GRACE", "RawEntry", "Stream"]

# A blocking read waits in slices of at most this many seconds: below the socket
# timeout of the clients connect() makes (5 s), so a long block is not cut by it.
BLOCK_SLICE = 1.0
# Seconds a read may take beyond its block before RedisUnavailable (a black hole).
READ_GRACE = 5.0

# One entry as read: its id, and its fields (names and values as bytes).
RawEntry: TypeAlias = tuple[str, dict[bytes, bytes]]


def _entries(raw: Sequence[Any]) -> list[RawEntry]:
    """Entries of an XREADGROUP or XAUTOCLAIM reply, without those deleted meanwhile
    (XAUTOCLAIM gives a deleted entry's fields as nil)."""
    return [
        (eid.decode() if isinstance(eid, bytes) else eid, fields)
        for eid, fields in raw
        if fields is not None
    ]


class Stream:
    """The commands on one stream key, over one client.

    Args:
        client: a ``Redis`` or ``RedisCluster`` with ``decode_responses=False``.
        key: the stream key.
    """

    __slots__ = ("_claim", "_client", "key")

    def __init__(self, client: Client, key: str) -> None:
        self._client = client  # where the stream lives
        self.key = key  # the stream key
        self._claim = register(client, "dedup")  # lua/dedup.lua

    def owner_key(self, group: str, job_id: str, nominal_ms: int) -> str:
        """The key recording which entry owns the occurrence ``(job_id, nominal_ms)``
        for ``group``."""
        return f"{self.key}:owner:{group}:{job_id}:{nominal_ms}"

    async def add(self, fields: Mapping[str, bytes | int | str], maxlen: int | None) -> str:
        """XADD one entry (trimmed to about ``maxlen`` entries; None keeps all); return
        its id.

        Raises:
            RedisUnavailable: if Redis cannot be reached (the entry may exist or not).
        """
        entry: dict[Any, Any] = dict(fields)
        try:
            eid: Any = await self._client.xadd(self.key, entry, maxlen=maxlen, approximate=True)
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        return eid.decode() if isinstance(eid, bytes) else str(eid)

    async def create_group(self, group: str) -> None:
        """Create ``group`` at the stream's start (and the stream, if missing); a group
        that exists already is left as it is."""
        try:
            await self._client.xgroup_create(self.key, group, id="0", mkstream=True)
        except REDIS_ERRORS as exc:
            if isinstance(exc, redis.exceptions.ResponseError) and "BUSYGROUP" in str(exc):
                return
            raise translate(exc) from exc

    async def claim_idle(
        self, group: str, consumer: str, min_idle_ms: int, count: int
    ) -> list[RawEntry]:
        """Take over up to ``count`` of the group's pending entries idle at least
        ``min_idle_ms`` (XAUTOCLAIM from the start): a dead consumer's."""
        try:
            reply: Any = await self._client.xautoclaim(
                self.key, group, consumer, min_idle_ms, count=count
            )
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        return _entries(reply[1])

    async def read_new(
        self, group: str, consumer: str, count: int, block: float | None
    ) -> list[RawEntry]:
        """Up to ``count`` entries never delivered to the group (XREADGROUP ``>``),
        waiting up to ``block`` seconds for one (None: no wait).

        Raises:
            RedisUnavailable: if Redis cannot be reached, or a slice of the wait got no
                reply within its block plus :data:`READ_GRACE`.
        """
        loop = asyncio.get_running_loop()
        end = None if block is None else loop.time() + block
        try:
            while True:
                left = None if end is None else min(end - loop.time(), BLOCK_SLICE)
                ms = None if left is None else max(1, int(left * 1000))
                async with timeout((ms or 0) / 1000 + READ_GRACE):
                    streams: Any = await self._client.xreadgroup(
                        group, consumer, {self.key: ">"}, count=count, block=ms
                    )
                raw = _entries([e for _, entries in streams or [] for e in entries])
                if raw or end is None or loop.time() >= end:
                    return raw
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        except TimeoutError:
            raise RedisUnavailable(
                f"redis unavailable: no reply within {READ_GRACE:g} s beyond the block"
            ) from None

    async def claim_occurrences(
        self, group: str, claims: Sequence[tuple[str, int, str]], ttl_ms: int
    ) -> list[str]:
        """For each ``(job_id, nominal_ms, entry_id)``: record ``entry_id`` as the owner
        of that occurrence for ``ttl_ms`` unless one is recorded (dedup.lua); return the
        owner's entry id, per claim.

        One round trip on one Redis (a pipeline); on a cluster, concurrent calls (the
        keys span slots, and redis-py's cluster pipeline refuses EVALSHA). Give each
        occurrence once: two claims of one occurrence in a call may land in any order.
        """
        if not claims:
            return []
        keys = [self.owner_key(group, job_id, nominal) for job_id, nominal, _ in claims]
        try:
            if isinstance(self._client, RedisCluster):
                got: list[Any] = await asyncio.gather(
                    *(
                        self._claim(keys=[key], args=[eid, ttl_ms])
                        for key, (_, _, eid) in zip(keys, claims, strict=True)
                    )
                )
            else:
                async with self._client.pipeline(transaction=False) as pipe:
                    for key, (_, _, eid) in zip(keys, claims, strict=True):
                        await self._claim(keys=[key], args=[eid, ttl_ms], client=pipe)
                    got = await pipe.execute()
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        # nil: the claiming entry owns it now; else the owner's entry id.
        return [
            eid if owner is None else owner.decode()
            for (_, _, eid), owner in zip(claims, got, strict=True)
        ]

    async def set_owner(
        self, group: str, job_id: str, nominal_ms: int, owner: str, ttl_ms: int
    ) -> None:
        """Record ``owner`` for the occurrence ``(job_id, nominal_ms)`` of ``group``,
        whatever was recorded (a consumer marks an occurrence done this way)."""
        try:
            await self._client.set(self.owner_key(group, job_id, nominal_ms), owner, px=ttl_ms)
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc

    async def ack(self, group: str, entry_ids: Sequence[str]) -> None:
        """XACK the entries: processed (or dropped) by ``group``."""
        if not entry_ids:
            return
        try:
            await self._client.xack(self.key, group, *entry_ids)
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
