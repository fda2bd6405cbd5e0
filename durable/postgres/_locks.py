"""A namespace's advisory locks in PostgreSQL: one pooled connection holds a session lock
for the length of a body (the relay, reconcile and prune take turns with it).

Ground rules:

- A session lock, not a transaction's: no transaction stays open to hold back vacuum.
- It is unlocked after the body, and dies with the session if the connection breaks
  (the pool's reset also releases every advisory lock before the connection is reused).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ._errors import translated

__all__ = ["advisory_lock"]

_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended($1, 0))"


@contextlib.asynccontextmanager
async def advisory_lock(pool: Any, key: str, call_timeout: float) -> AsyncIterator[bool]:
    """Hold the advisory lock ``key`` on one connection of ``pool`` for the body if no
    other session holds it; yields whether it was taken (False: another holder is at it).
    Each call to the server is bounded by ``call_timeout`` seconds.

    Raises:
        PostgresUnavailable: if the lock cannot be asked for.
    """
    with translated(None):
        conn = await pool.acquire(timeout=call_timeout)
    try:
        with translated(None):
            got = bool(await conn.fetchval(_TRY_LOCK, key))
        try:
            yield got
        finally:
            if got:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.fetchval(_UNLOCK, key), call_timeout)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.release(conn), call_timeout)
