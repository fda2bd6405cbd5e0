"""The namespace's layout key, read without writing: does the namespace exist, and with
which shard and bucket counts.

Ground rules:

- One GET of ``{ns}:meta`` (``Keys.meta``), bounded by ``call_timeout`` and translated
  like every store call: Redis unreachable is :class:`RedisUnavailable`, an error reply
  (WRONGTYPE) is raised as redis-py's.
- A key that holds something else than ``shards:buckets`` is :class:`LayoutUnreadable`,
  wherever it is read: nobody guesses a layout (a wrong guess would strand jobs).
- ``Store.init`` (init.lua) is the other reader: it stores the layout on first use.
"""

from __future__ import annotations

from typing import Any

from tickwheel.durable.model import DurableError, PostgresModeRequired, RedisUnavailable
from tickwheel.wheel import timeout

from ._connect import Client
from ._errors import REDIS_ERRORS, translate
from ._keys import Keys, parse_layout
from ._transport import DEFAULT_CALL_TIMEOUT

__all__ = ["LayoutUnreadable", "read_layout"]


class LayoutUnreadable(DurableError):
    """The namespace's layout key holds something else than ``shards:buckets``.
    Permanent until an operator repairs (or deletes) the key."""


async def read_layout(
    client: Client,
    namespace: str,
    *,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    postgres: bool | None = None,
) -> tuple[int, int] | None:
    """The ``(shards, buckets)`` stored for ``namespace`` (buckets 0 for a layout stored
    before buckets existed); None if it was never created. Nothing is written.

    With ``postgres`` False, the namespace's mode is read too (a second GET, of
    ``Keys.mode``), and a namespace in the Postgres mode is refused.

    Raises:
        PostgresModeRequired: ``postgres`` is False and the namespace is in the
            Postgres mode.
        LayoutUnreadable: if the key holds something else.
        RedisUnavailable: if Redis cannot be reached within ``call_timeout``.
        TypeError, ValueError: for a malformed namespace.
    """
    keys = Keys(namespace, 1)
    try:
        async with timeout(call_timeout):
            stored: Any = await client.get(keys.meta)
            mode: Any = await client.get(keys.mode) if postgres is False else None
    except REDIS_ERRORS as exc:
        raise translate(exc) from exc
    except TimeoutError:
        raise RedisUnavailable(f"redis unavailable: no reply within {call_timeout:g} s") from None
    if stored is None:
        return None
    if mode:
        raise PostgresModeRequired(namespace)
    try:
        return parse_layout(stored)
    except ValueError:
        raise LayoutUnreadable(f"the namespace's layout key holds {stored!r}") from None
