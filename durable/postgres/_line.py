"""The producer's line: one connection of its own for ``schedule``'s own statement
(and the worker's: one for its claim check and its ack, each one statement too).

A single ``schedule`` of its own is one statement (its own transaction). Taking a
connection from asyncpg's pool and giving it back costs more client CPU than sending
that statement (a timeout and a shielded task per release: about 90 us of the ~320 us
a schedule took, cProfile, 2026-12-06), so the store keeps one connection beside the
pool for it (not from it: a pool of one would starve). A statement while the line is
busy (concurrent producers) takes a pooled connection as before.

Ground rules:

- Only the library's own one-statement writes use the line: each is its own
  transaction, so the line holds no transaction, lock or setting between uses.
- A statement that fails or is cancelled closes the connection (its state is not
  known); the next use opens another.
- :meth:`Line.close` closes it when the store closes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

from tickwheel.durable.store import hidden

from ._errors import translate

__all__ = ["QUIET", "Line", "reset_unless_quiet"]

# Set while a connection that ran only the library's own statements goes back to the
# pool (PgStore._conn, PgStore.schedule): they leave no session state (their locks and
# settings are the transaction's), so the pool's reset round trip is skipped (asyncpg
# still rolls back a transaction left open). Any other use is reset in full.
QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("tickwheel_pg_quiet", default=False)


async def reset_unless_quiet(conn: Any) -> None:
    """The pool's reset: none after the library's own statements (:data:`QUIET`)."""
    if not QUIET.get():
        await conn.reset()


class Line:
    """One connection, held for one statement at a time."""

    __slots__ = ("_busy", "_conn")

    def __init__(self) -> None:
        self._conn: Any = None  # the connection, or None (opened on first use)
        self._busy = False  # a statement is on it now

    @contextlib.asynccontextmanager
    async def use(self, pool: Any, url: str, seconds: float) -> AsyncIterator[Any]:
        """The line for one statement (connected to ``url`` if need be), or a
        connection of ``pool`` while the line is busy."""
        if self._busy:
            async with pool.acquire(timeout=seconds) as conn:
                yield conn
            return
        self._busy = True
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await _connect(url, seconds)
            try:
                yield self._conn
            except BaseException:
                await self.close()
                raise
        finally:
            self._busy = False

    async def close(self) -> None:
        """Close the connection (idempotent; never raises)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.terminate()


async def _connect(url: str, seconds: float) -> Any:
    """A connection as the pool's are made (the same bounds), its error translated
    without the password (asyncpg may quote a piece of it)."""
    import asyncpg  # noqa: PLC0415  (imported already: the pool is open)

    try:
        return await asyncpg.connect(url, command_timeout=seconds, timeout=seconds)
    except Exception as exc:
        err = translate(exc)
        clean = hidden(err, url)
        if clean is not err:
            raise clean from None
        raise err from exc
