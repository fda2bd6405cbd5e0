"""The namespace the dashboard looks at: its Redis client and its scheduler.

Ground rules:

- The client is made on first use and kept; while Redis is unreachable every call
  raises :class:`RedisUnavailable` and the next one tries again.
- The scheduler is built from the namespace's stored layout (``store.read_layout``: one
  GET, nothing written) and never opened: the pages read and act through its
  ``console`` and ``workers``, so looking at a namespace never creates it.
- Lists that have no index (dead letters by task or reason, recurring series) are read
  in pages of :data:`PAGE` from their sorted sets, up to a stated bound
  (:data:`SCAN_LIMIT` per shard), and the answer says how far it looked.
- The Redis URL's password never appears in a message (``store.shown_url``).
"""

from __future__ import annotations

from tickwheel.durable.model import PostgresModeRequired
from tickwheel.durable.scheduler import MAX_BATCH, Scheduler
from tickwheel.durable.store import Client, Keys, LayoutUnreadable, connect, read_layout, shown_url

from ._refusals import ActionError, NotFound

__all__ = ["PAGE", "SCAN_LIMIT", "Namespace"]

# Entries read per script call when paging a sorted set (the scripts' batch cap).
PAGE = MAX_BATCH
# How many entries per shard a filtered list looks at before it stops and says so.
SCAN_LIMIT = 20_000


class Namespace:
    """The dashboard's view of one namespace on one Redis or Redis Cluster.

    Args:
        url: the Redis URL (its password is never shown).
        namespace: the tickwheel namespace.
        postgres_url: the Postgres mode's PostgreSQL, or None.

    Raises:
        TypeError, ValueError: for a malformed namespace.
    """

    def __init__(self, url: str, namespace: str, postgres_url: str | None = None) -> None:
        Keys(namespace, 1)  # validates the name
        self.url = url  # where Redis is
        self.namespace = namespace  # the namespace
        self.postgres_url = postgres_url  # the Postgres mode's source of truth, or None
        self._client: Client | None = None  # made on first use
        self._scheduler: Scheduler | None = None  # made once the namespace exists

    @property
    def where(self) -> str:
        """The URL without its password."""
        return shown_url(self.url)

    async def aclose(self) -> None:
        """Close the client (and the scheduler's own connections)."""
        client, self._client, sched, self._scheduler = self._client, None, self._scheduler, None
        if sched is not None:
            await sched.close_connections()
        if client is not None:
            await client.aclose()

    async def client(self) -> Client:
        """The Redis client, connected on first use.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._client is None:
            try:
                self._client = await connect(self.url)
            except (TypeError, ValueError):  # it may quote the URL: say less
                raise ActionError("the Redis URL is malformed (check --redis-url)", 500) from None
        return self._client

    async def scheduler(self) -> Scheduler | None:
        """The namespace's scheduler with its stored layout; None if it was never
        created (nothing is written to find out: one GET of its layout key).

        Raises:
            RedisUnavailable: if Redis cannot be reached.
            ActionError: (500) if the layout key holds something else than a layout.
        """
        if self._scheduler is not None:
            return self._scheduler
        client = await self.client()
        try:
            layout = await read_layout(
                client, self.namespace, postgres=self.postgres_url is not None
            )
        except LayoutUnreadable as exc:
            raise ActionError(str(exc), 500) from None
        except PostgresModeRequired as exc:  # a plain dashboard would show it wrong
            raise ActionError(str(exc), 409) from None
        if layout is None:
            return None
        shards, buckets = layout
        sched = Scheduler(
            client,
            self.namespace,
            shards=shards,
            buckets=buckets,
            check=False,
            postgres_url=self.postgres_url,
        )
        self._scheduler = sched
        return sched

    async def need(self) -> Scheduler:
        """:meth:`scheduler`, for a page that has nothing to show without one.

        Raises:
            NotFound: if the namespace was never created.
        """
        sched = await self.scheduler()
        if sched is None:
            raise NotFound(
                f"namespace {self.namespace!r} does not exist yet: nothing was ever scheduled "
                "in it (check --namespace and --redis-url)"
            )
        return sched
