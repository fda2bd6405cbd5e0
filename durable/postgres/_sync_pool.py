"""The psycopg connections of :class:`SyncScheduler`'s own, in the Postgres mode.

:class:`SyncPgPool` lends one connection per call (a ``schedule`` without ``conn=``, a
``cancel``, a ``reschedule``) in a transaction of its own, committed when the call's body
returns and rolled back if it raises; the connection goes back to the pool if it is
still sound. Thread-safe: each call has its connection to itself. Every statement is
bounded by ``statement_timeout`` (the scheduler's ``call_timeout``: a lock wait or a
stuck server gives ``PostgresUnavailable``), and the connect by ``connect_timeout``.

It also checks the schema version once, on the first connection it is shown (the
pool's, or the application's: two reads that cannot fail its transaction).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

from ._drivers import SyncDb, _PsycopgSync
from ._errors import translated
from ._migrate import SCHEMA_MAX, SCHEMA_TABLE, schema_not_ready

__all__ = ["DEFAULT_SYNC_POOL_SIZE", "SyncPgPool"]

# Idle connections kept (more may be open at once: one per concurrent call).
DEFAULT_SYNC_POOL_SIZE = 4


class SyncPgPool:
    """psycopg connections to ``url`` for one SyncScheduler (opened on first use).

    Raises:
        ImportError: on first use without psycopg (the ``psycopg`` extra).
    """

    def __init__(self, url: str, call_timeout: float, size: int = DEFAULT_SYNC_POOL_SIZE) -> None:
        self.url = url
        self.call_timeout = call_timeout
        self.size = size
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._schema_ok = False

    def check_schema(self, db: SyncDb) -> None:
        """Raise :class:`SchemaNotReady` if the database lacks the current schema
        (looked at once; later calls return at once)."""
        if self._schema_ok:
            return
        with translated(None):
            found = 0
            if db.fetch(SCHEMA_TABLE)[0][0] is not None:
                found = int(db.fetch(SCHEMA_MAX)[0][0] or 0)
        error = schema_not_ready(found)
        if error is not None:
            raise error
        self._schema_ok = True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncDb]:
        """A pooled connection in a transaction of its own for the body."""
        conn = self._take()
        try:
            with translated(None), conn.transaction():
                db = _PsycopgSync(conn)
                self.check_schema(db)
                yield db
        finally:
            self._give(conn)

    def _take(self) -> Any:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            return conn
        try:
            import psycopg  # noqa: PLC0415
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise ImportError(
                "SyncScheduler's Postgres mode needs psycopg: pip install 'tickwheel[psycopg]'"
            ) from exc
        ms = max(1, math.ceil(self.call_timeout * 1000))
        with translated(None):
            return psycopg.connect(
                self.url,
                connect_timeout=max(1, math.ceil(self.call_timeout)),
                options=f"-c statement_timeout={ms}",
            )

    def _give(self, conn: Any) -> None:
        from psycopg.pq import TransactionStatus  # noqa: PLC0415

        sound = not conn.closed and not conn.broken
        if sound and conn.info.transaction_status == TransactionStatus.IDLE:
            with self._lock:
                if len(self._idle) < self.size:
                    self._idle.append(conn)
                    return
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
