"""The application's own connection, whatever its driver: transactional enqueue through
asyncpg, psycopg 3, SQLAlchemy 2 and Django.

Ground rules:

- One SQL text: every driver runs the statements of ``_writes.py`` (``tickwheel_put``,
  ``tickwheel_put_many``), written in asyncpg's ``$n`` form with every parameter cast;
  :func:`render` turns them into the driver's paramstyle (``%(pN)s`` for psycopg and
  Django, the DB-API's own for SQLAlchemy's ``exec_driver_sql``).
- A driver is recognised by the module of the connection's type and imported only then:
  an application on psycopg never imports SQLAlchemy or Django, and the Redis-only mode
  none of them.
- The job is written in the caller's transaction and nothing else: it exists iff that
  transaction commits, and the outbox relay (every worker runs one) writes it to Redis
  after the commit (the commit notifies the relays).
- Bad input is refused before anything is written: a connection of an unknown type or
  of the wrong kind (a sync one for the asyncio :class:`Scheduler`, an async one for
  :class:`SyncScheduler`) is a ``TypeError``; a closed connection, one whose transaction
  failed already, or one that would commit the job on its own (autocommit with no
  transaction open; Django outside ``transaction.atomic()``) a ``ValueError``.

What each driver accepts:

=========== ================================================ =========================
driver      asyncio (``Scheduler``)                          sync (``SyncScheduler``)
=========== ================================================ =========================
asyncpg     ``Connection`` (or a pool's), in a transaction   --
psycopg 3   ``AsyncConnection``                              ``Connection``
SQLAlchemy  ``AsyncConnection``, ``AsyncSession``            ``Connection``, ``Session``
Django      --                                               ``django.db.connection``
=========== ================================================ =========================
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tickwheel.durable.model import JobSpec, ScheduleResult

from . import _writes
from ._enqueue import encode_jobs, needs_now, results, sorted_by_id
from ._errors import translated
from ._rows import PgJob

if TYPE_CHECKING:
    from ._sync_pool import SyncPgPool

__all__ = [
    "SyncDb",
    "async_connection",
    "enqueue_sync",
    "now_sync",
    "render",
    "schedule_sync",
    "sync_connection",
]

_PARAM = re.compile(r"\$(\d+)")
_ACCEPTED = (
    "an asyncpg, psycopg 3 or SQLAlchemy connection (asyncio), or a psycopg 3,"
    " SQLAlchemy or Django one (sync)"
)


def render(sql: str, args: Sequence[Any], style: str) -> tuple[str, Any]:
    """``sql`` (``$n`` placeholders) and its arguments in the DB-API ``style``.

    Raises:
        TypeError: for a paramstyle no PostgreSQL driver uses here.
    """
    if style == "numeric_dollar":
        return sql, tuple(args)
    text, order = _rendered(sql, style)
    if style == "pyformat":
        return text, {f"p{k + 1}": v for k, v in enumerate(args)}
    return text, tuple(args[n - 1] for n in order)


@functools.lru_cache(maxsize=64)
def _rendered(sql: str, style: str) -> tuple[str, tuple[int, ...]]:
    """The text of ``sql`` in ``style``, and the parameter numbers in their order
    (a handful of statements: cached)."""
    order: list[int] = []
    if style == "pyformat":
        return _PARAM.sub(lambda m: f"%(p{m.group(1)})s", sql.replace("%", "%%")), ()
    if style == "format":

        def positional(m: re.Match[str]) -> str:
            order.append(int(m.group(1)))
            return "%s"

        return _PARAM.sub(positional, sql.replace("%", "%%")), tuple(order)
    raise TypeError(f"conn: the driver's paramstyle {style!r} is not supported")


def _family(conn: object) -> str:
    """The driver family of ``conn`` by its type's module, without importing any."""
    module = type(conn).__module__ or ""
    for family in ("asyncpg", "psycopg", "sqlalchemy", "django"):
        if module == family or module.startswith(family + "."):
            return family
    return ""


def _unknown(conn: object) -> TypeError:
    return TypeError(f"conn must be {_ACCEPTED}, got {type(conn).__module__}.{type(conn).__name__}")


# -- psycopg 3 ---------------------------------------------------------------------


def _check_psycopg(conn: Any) -> None:
    from psycopg.pq import TransactionStatus  # noqa: PLC0415

    if conn.closed:
        raise ValueError("conn is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ValueError("conn's transaction has failed already: roll it back first")
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise ValueError(
            "conn is in autocommit mode with no transaction open: the job would commit on"
            " its own; schedule inside `with conn.transaction():` (or drop conn=)"
        )


class _PsycopgAsync:
    """asyncpg's ``fetch`` over a psycopg 3 ``AsyncConnection``."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        text, params = render(sql, args, "pyformat")
        async with self.conn.cursor() as cur:
            await cur.execute(text, params)
            return list(await cur.fetchall())


class _PsycopgSync:
    """``fetch`` over a psycopg 3 ``Connection`` (or any DB-API cursor source)."""

    __slots__ = ("conn", "style")

    def __init__(self, conn: Any, style: str = "pyformat") -> None:
        self.conn = conn
        self.style = style

    def fetch(self, sql: str, *args: Any) -> list[Any]:
        text, params = render(sql, args, self.style)
        with self.conn.cursor() as cur:
            cur.execute(text, params)
            return list(cur.fetchall())

    def execute(self, sql: str, *args: Any) -> None:
        text, params = render(sql, args, self.style)
        with self.conn.cursor() as cur:
            cur.execute(text, params)


# -- SQLAlchemy 2 ------------------------------------------------------------------


def _alchemy_style(conn: Any) -> str:
    """The DB-API paramstyle of a SQLAlchemy ``Connection``, after checking that it is
    PostgreSQL's and that its DB-API connection is not in autocommit mode (an
    ``isolation_level="AUTOCOMMIT"`` engine: each statement would commit on its own)."""
    dialect = conn.dialect
    if dialect.name != "postgresql":
        raise TypeError(f"conn must be a PostgreSQL connection, got SQLAlchemy's {dialect.name}")
    if getattr(conn.connection.dbapi_connection, "autocommit", False) is True:
        raise ValueError(
            "conn is in AUTOCOMMIT isolation: the job would commit on its own; use a"
            " connection in a transaction (or drop conn=)"
        )
    return str(dialect.paramstyle)


class _AlchemyAsync:
    """``fetch`` through ``AsyncConnection.exec_driver_sql`` (it begins the connection's
    transaction if none is, as any statement of the application would)."""

    __slots__ = ("conn", "style")

    def __init__(self, conn: Any) -> None:
        if conn.closed or conn.invalidated:
            raise ValueError("conn is closed")
        self.conn = conn
        self.style = _alchemy_style(conn.sync_connection)

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        text, params = render(sql, args, self.style)
        return list((await self.conn.exec_driver_sql(text, params)).fetchall())


class _AlchemySync:
    """``fetch`` through ``Connection.exec_driver_sql``."""

    __slots__ = ("conn", "style")

    def __init__(self, conn: Any) -> None:
        if conn.closed or conn.invalidated:
            raise ValueError("conn is closed")
        self.conn = conn
        self.style = _alchemy_style(conn)

    def fetch(self, sql: str, *args: Any) -> list[Any]:
        text, params = render(sql, args, self.style)
        return list(self.conn.exec_driver_sql(text, params).fetchall())

    def execute(self, sql: str, *args: Any) -> None:
        text, params = render(sql, args, self.style)
        self.conn.exec_driver_sql(text, params)


# -- the entry points --------------------------------------------------------------


async def async_connection(conn: Any) -> Any:
    """What ``_writes`` runs on for the asyncio :class:`Scheduler`: an asyncpg connection
    as it is, any other accepted driver behind a ``fetch`` of asyncpg's form.

    Raises:
        TypeError: for a connection of an unknown type or a synchronous one.
        ValueError: for a closed connection, or one outside a transaction.
    """
    if isinstance(conn, _PsycopgAsync | _AlchemyAsync):
        return conn  # checked already
    family = _family(conn)
    if family == "asyncpg":
        import asyncpg  # noqa: PLC0415
        import asyncpg.pool  # noqa: PLC0415

        if not isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            raise _unknown(conn)
        if conn.is_closed():
            raise ValueError("conn is closed")
        if not conn.is_in_transaction():
            raise ValueError(
                "conn has no transaction open: the job would commit on its own; schedule"
                " inside `async with conn.transaction():` (or drop conn=)"
            )
        return conn
    if family == "psycopg":
        import psycopg  # noqa: PLC0415

        if isinstance(conn, psycopg.Connection):
            raise TypeError(
                "conn is a synchronous psycopg connection: use SyncScheduler(...,"
                " postgres_url=...) from synchronous code, or psycopg.AsyncConnection"
            )
        if not isinstance(conn, psycopg.AsyncConnection):
            raise _unknown(conn)
        _check_psycopg(conn)
        return _PsycopgAsync(conn)
    if family == "sqlalchemy":
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession  # noqa: PLC0415

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()  # the session's transaction (begun if not yet)
        if isinstance(conn, AsyncConnection):
            return _AlchemyAsync(conn)
        raise _sync_given(conn)
    if family == "django":
        raise TypeError(
            "conn is Django's connection, which is synchronous: use SyncScheduler(...,"
            " postgres_url=...)"
        )
    raise _unknown(conn)


def _sync_given(conn: object) -> TypeError:
    return TypeError(
        f"conn is a synchronous connection ({type(conn).__name__}) or not one: the asyncio"
        " Scheduler takes AsyncConnection or AsyncSession; use SyncScheduler(...,"
        " postgres_url=...) for a synchronous one"
    )


class SyncDb(Protocol):
    """What the synchronous enqueue runs its statements on."""

    def fetch(self, sql: str, *args: Any) -> list[Any]: ...

    def execute(self, sql: str, *args: Any) -> None: ...


def sync_connection(conn: Any) -> SyncDb:
    """A ``fetch`` over the application's synchronous connection, in its transaction.

    Raises:
        TypeError: for a connection of an unknown type or an asyncio one.
        ValueError: for a closed connection, one whose transaction failed, or one that
            would commit the job on its own (Django outside ``transaction.atomic()``).
    """
    family = _family(conn)
    if family == "psycopg":
        import psycopg  # noqa: PLC0415

        if isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(
                "conn is an asyncio psycopg connection: use Scheduler, not SyncScheduler"
            )
        if not isinstance(conn, psycopg.Connection):
            raise _unknown(conn)
        _check_psycopg(conn)
        return _PsycopgSync(conn)
    if family == "sqlalchemy":
        from sqlalchemy.engine import Connection  # noqa: PLC0415
        from sqlalchemy.orm import Session  # noqa: PLC0415

        if isinstance(conn, Session):
            conn = conn.connection()  # the session's transaction (begun if not yet)
        if isinstance(conn, Connection):
            return _AlchemySync(conn)
        raise TypeError(
            "conn must be a SQLAlchemy Connection or Session for SyncScheduler, got"
            f" {type(conn).__name__} (an AsyncConnection or AsyncSession goes to Scheduler)"
        )
    if family == "django":
        return _django(conn)
    if family == "asyncpg":
        raise TypeError("conn is an asyncpg connection: use Scheduler, not SyncScheduler")
    raise _unknown(conn)


def _django(conn: Any) -> SyncDb:
    from django.db.backends.base.base import BaseDatabaseWrapper  # noqa: PLC0415
    from django.utils.connection import ConnectionProxy  # noqa: PLC0415

    if not isinstance(conn, BaseDatabaseWrapper | ConnectionProxy):
        raise _unknown(conn)
    if conn.vendor != "postgresql":
        raise TypeError(f"conn must be a PostgreSQL connection, got Django's {conn.vendor}")
    if not conn.in_atomic_block and conn.get_autocommit():
        raise ValueError(
            "conn: Django's connection is in autocommit mode outside transaction.atomic():"
            " the job would commit on its own; schedule inside `with transaction.atomic():`"
        )
    if conn.needs_rollback:
        raise ValueError("conn: this transaction.atomic() block is marked for rollback already")
    return _PsycopgSync(conn, "pyformat")  # Django's cursors take pyformat on PostgreSQL


def schedule_sync(db: SyncDb, ns: str, jobs: Sequence[PgJob]) -> list[tuple[int, int, int]]:
    """``_writes.schedule`` on a synchronous connection: the same statements, notifying
    the relays at commit."""
    sql, args = _writes.schedule_statement(ns, jobs, True)
    rows = db.fetch(sql, *args)
    raced = _writes.raced_statement(ns, jobs, rows)
    found = {r[0]: int(r[1]) for r in db.fetch(_writes.RACED, *raced)} if raced else {}
    return _writes.schedule_replies(jobs, rows, found)


def now_sync(db: SyncDb) -> int:
    """PostgreSQL's clock (ms), on a synchronous connection."""
    return int(db.fetch(_writes.NOW)[0][0])


def enqueue_sync(
    conn: Any,
    pool: SyncPgPool,
    namespace: str,
    specs: Sequence[JobSpec],
    *,
    shard_of: Callable[[str], int],
    limit: int,
    before_write: Callable[[], object] = lambda: None,
) -> list[ScheduleResult]:
    """The Postgres mode's schedule for :class:`SyncScheduler`: the job rows and their
    outbox rows in ``conn``'s transaction (the job exists iff it commits), or, with
    ``conn`` None, in a transaction of its own on a connection of ``pool``. Either way
    the relays, notified at the commit, write the jobs to Redis. ``before_write`` runs
    once the specs and ``conn`` passed their checks, before the first write (the
    producer's check of the namespace's layout).

    Raises:
        TypeError, ValueError: for bad specs or a bad ``conn`` (nothing written).
        SchemaNotReady: if the database lacks the current schema.
        PostgresUnavailable: if PostgreSQL cannot be reached or fails transiently.
    """
    jobs = encode_jobs(specs, shard_of, limit, None)  # bad specs raise before conn is used
    if conn is not None:
        db = sync_connection(conn)
        pool.check_schema(db)
        before_write()
        return _enqueue_on(db, namespace, specs, jobs, shard_of=shard_of, limit=limit)
    before_write()
    with pool.transaction() as own:
        return _enqueue_on(own, namespace, specs, jobs, shard_of=shard_of, limit=limit)


def _enqueue_on(
    db: SyncDb,
    namespace: str,
    specs: Sequence[JobSpec],
    jobs: list[PgJob],
    *,
    shard_of: Callable[[str], int],
    limit: int,
) -> list[ScheduleResult]:
    with translated(None):
        if needs_now(specs):
            jobs = encode_jobs(specs, shard_of, limit, now_sync(db))
        order = sorted_by_id(jobs)
        replies = schedule_sync(db, namespace, [jobs[k] for k in order])
    return [result for _, result, _ in results(jobs, order, replies)]
