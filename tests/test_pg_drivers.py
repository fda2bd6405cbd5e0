"""Transactional enqueue through the drivers applications use (durable/postgres/_drivers.py):
psycopg 3 (sync and async), SQLAlchemy 2 (Connection, Session, AsyncConnection,
AsyncSession) and Django, on a real PostgreSQL and a real Redis.

Per driver: a rolled-back transaction makes no job; a committed one runs once, carried
to Redis by the relay of a worker started only after the commit (so the producer's
process could have died between the commit and any relay); bad input writes nothing in
either store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest
from durable_support import run, snapshot, unique_ns
from pg_support import migrated, pg_scheduler, table_counts
from spill_support import running_worker, until

from tickwheel.durable import Scheduler, SyncScheduler, TaskContext, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

_EMPTY = {"tickwheel_jobs": 0, "tickwheel_done": 0, "tickwheel_outbox": 0}
# An enqueue: (scheduler of the test's namespace, job id, commit?) -> the job in the
# application's transaction, committed or rolled back with an order row.
Produce = Callable[[Scheduler, SyncScheduler, str, bool], Awaitable[None]]


class Declined(Exception):
    pass


async def _orders(pg_url: str) -> None:
    await migrated(pg_url)
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    finally:
        await conn.close()


async def _order_ids(pg_url: str) -> list[str]:
    conn = await asyncpg.connect(pg_url)
    try:
        return sorted(r[0] for r in await conn.fetch("SELECT id FROM orders"))
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _schedulers(
    redis_url: str, pg_url: str
) -> AsyncIterator[tuple[Scheduler, SyncScheduler]]:
    ns = unique_ns()
    async with pg_scheduler(redis_url, pg_url, ns, shards=1) as s:
        sync = SyncScheduler.from_url(redis_url, ns, shards=1, postgres_url=pg_url)
        try:
            yield s, sync
        finally:
            sync.close()


def _check_transactional(redis_url: str, pg_url: str, produce: Produce) -> None:
    """Rollback: no job; commit with no relay running: no Redis entry yet; a worker
    started afterwards relays it and runs it once."""

    async def main() -> None:
        await _orders(pg_url)
        async with _schedulers(redis_url, pg_url) as (s, sync):
            with pytest.raises(Declined):
                await produce(s, sync, "rb", False)
            await produce(s, sync, "ok", True)
            assert await _order_ids(pg_url) == ["ok"]
            counts = await table_counts(pg_url)
            assert counts == {"tickwheel_jobs": 1, "tickwheel_done": 0, "tickwheel_outbox": 1}
            assert await s.get("ok") is None  # nobody relayed it: the producer "died"
            ran: list[tuple[str, Any]] = []
            reg = TaskRegistry()

            @reg.task(name="charge")
            def charge(ctx: TaskContext) -> None:
                ran.append((ctx.job_id, ctx.payload))

            async with running_worker(s, reg, poll_interval=0.05):
                assert await until(lambda: ran, 10)
                await asyncio.sleep(0.3)  # a second run would show by now
            assert ran == [("ok", {"order": "ok"})]
            assert await s.get("rb") is None
            counts = await table_counts(pg_url)
            assert counts["tickwheel_outbox"] == 0 and counts["tickwheel_done"] == 1

    run(main())


def _bad_input(
    redis_url: str, pg_url: str, attempts: Callable[[Scheduler, SyncScheduler], Awaitable[None]]
) -> None:
    async def main() -> None:
        await _orders(pg_url)
        async with _schedulers(redis_url, pg_url) as (s, sync):
            before = await snapshot(s)
            await attempts(s, sync)
            assert await snapshot(s) == before
            assert await table_counts(pg_url) == _EMPTY
            assert await _order_ids(pg_url) == []

    run(main())


# -- psycopg 3 ----------------------------------------------------------------------


def test_psycopg_sync(redis_server: RedisServer, pg_url: str) -> None:
    async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
        with psycopg.connect(pg_url) as conn:
            try:
                with conn.transaction():
                    conn.execute("INSERT INTO orders VALUES (%s)", (job,))
                    sync.schedule(job, "charge", {"order": job}, delay=0, conn=conn)
                    if not commit:
                        raise Declined
            finally:
                if commit:
                    conn.close()  # closed right after the commit, as a dying process

    _check_transactional(redis_server.url, pg_url, produce)


def test_psycopg_async(redis_server: RedisServer, pg_url: str) -> None:
    async def produce(s: Scheduler, _sync: SyncScheduler, job: str, commit: bool) -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn, conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (%s)", (job,))
            await s.schedule(job, "charge", {"order": job}, delay=0, conn=conn)
            if not commit:
                raise Declined

    _check_transactional(redis_server.url, pg_url, produce)


def test_psycopg_implicit_transaction_commits_with_the_app(
    redis_server: RedisServer, pg_url: str
) -> None:
    """Not autocommit (psycopg's default): the statement opens the transaction the
    application commits."""

    async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
        conn = psycopg.connect(pg_url)
        try:
            conn.execute("INSERT INTO orders VALUES (%s)", (job,))
            sync.schedule(job, "charge", {"order": job}, delay=0, conn=conn)
            if not commit:
                conn.rollback()
                raise Declined
            conn.commit()
        finally:
            conn.close()

    _check_transactional(redis_server.url, pg_url, produce)


def test_psycopg_bad_input_writes_nothing(redis_server: RedisServer, pg_url: str) -> None:
    async def attempts(s: Scheduler, sync: SyncScheduler) -> None:
        closed = psycopg.connect(pg_url)
        closed.close()
        with pytest.raises(ValueError, match="conn is closed"):
            sync.schedule("a", "charge", conn=closed)
        with psycopg.connect(pg_url, autocommit=True) as auto:
            with pytest.raises(ValueError, match="autocommit"):
                sync.schedule("a", "charge", conn=auto)
            with pytest.raises(TypeError, match="synchronous psycopg"):
                await s.schedule("a", "charge", conn=auto)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as aauto:
            with pytest.raises(ValueError, match="autocommit"):
                await s.schedule("a", "charge", conn=aauto)
            with pytest.raises(TypeError, match="asyncio psycopg"):
                sync.schedule("a", "charge", conn=aauto)
        with psycopg.connect(pg_url) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
            with pytest.raises(ValueError, match="failed already"):
                sync.schedule("a", "charge", conn=conn)
            conn.rollback()
            conn.execute("INSERT INTO orders VALUES ('x')")
            with pytest.raises(ValueError, match="payload"):  # the spec before the conn
                sync.schedule("a", "charge", b"x" * (sync.max_payload_bytes + 1), conn=conn)
            with pytest.raises(ValueError, match="payload"):  # replace: the same checks
                sync.schedule(
                    "a", "charge", b"x" * (sync.max_payload_bytes + 1), replace=True, conn=conn
                )
            conn.rollback()
        for bad in (object(), "postgresql://x"):
            with pytest.raises(TypeError, match="conn must be"):
                sync.schedule("a", "charge", conn=bad)
            with pytest.raises(TypeError, match="conn must be"):
                await s.schedule("a", "charge", conn=bad)
        # asyncpg's own connection outside a transaction: the same rule.
        conn2 = await asyncpg.connect(pg_url)
        try:
            with pytest.raises(ValueError, match="no transaction open"):
                await s.schedule("a", "charge", conn=conn2)
            with pytest.raises(TypeError, match="asyncpg"):
                sync.schedule("a", "charge", conn=conn2)
        finally:
            await conn2.close()

    _bad_input(redis_server.url, pg_url, attempts)


def test_sync_scheduler_own_transaction_is_relayed(redis_server: RedisServer, pg_url: str) -> None:
    async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
        if not commit:
            raise Declined  # no transaction of the application's to roll back here
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute("INSERT INTO orders VALUES ($1)", job)
        finally:
            await conn.close()
        (result,) = sync.schedule_many([_spec(job)])
        assert result.status.name == "CREATED"

    _check_transactional(redis_server.url, pg_url, produce)


def test_sync_scheduler_cancels_and_reschedules_in_both_stores(
    redis_server: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await _orders(pg_url)
        async with _schedulers(redis_server.url, pg_url) as (s, sync):
            with psycopg.connect(pg_url) as conn, conn.transaction():
                sync.schedule_many([_spec("m"), _spec("c")], conn=conn)
            assert await s.relay() == 2  # in Redis now, as a worker's relay would do
            before = await s.get("m")
            assert before is not None
            assert sync.reschedule("m", delay=3600)
            after = await s.get("m")
            assert after is not None and after.nominal_ms > before.nominal_ms + 3_000_000
            conn2 = await asyncpg.connect(pg_url)
            try:
                due = await conn2.fetchval("SELECT due_ms FROM tickwheel_jobs WHERE id = 'm'")
                assert due == after.nominal_ms  # the row followed Redis
            finally:
                await conn2.close()
            assert sync.cancel("c")
            assert not sync.cancel("c")
            assert await s.get("c") is None
            counts = await table_counts(pg_url)
            assert counts == {"tickwheel_jobs": 1, "tickwheel_done": 0, "tickwheel_outbox": 0}
            assert not sync.reschedule("c", delay=5)  # gone from both
            assert not sync.cancel("never") and not sync.reschedule("never", at=10**12)

    run(main())


def test_sync_scheduler_checks_the_schema_first(redis_server: RedisServer, pg_url: str) -> None:
    from tickwheel.durable import SchemaNotReady

    sync = SyncScheduler.from_url(redis_server.url, unique_ns(), postgres_url=pg_url)
    try:
        with pytest.raises(SchemaNotReady, match="tickwheel pg migrate"):
            sync.schedule("a", "charge", delay=0)
        with psycopg.connect(pg_url) as conn, conn.transaction():
            with pytest.raises(SchemaNotReady):
                sync.schedule("a", "charge", delay=0, conn=conn)
            # The check only read: the application's transaction goes on.
            conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        run(migrated(pg_url))
        assert sync.schedule("a", "charge", delay=0).status.name == "CREATED"
        assert sync.schedule("a", "charge", delay=0).status.name == "KEPT"  # pooled again
    finally:
        sync.close()


def _spec(job: str) -> Any:
    from tickwheel.durable import JobSpec

    return JobSpec(job, "charge", {"order": job}, delay=0)


# -- SQLAlchemy 2 -------------------------------------------------------------------


def _alchemy_url(pg_url: str, driver: str) -> str:
    return pg_url.replace("postgresql://", f"postgresql+{driver}://", 1)


def test_sqlalchemy_connection(redis_server: RedisServer, pg_url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(_alchemy_url(pg_url, "psycopg"))

    async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
        with engine.connect() as conn:  # commit as you go: the schedule opens the transaction
            sync.schedule(job, "charge", {"order": job}, delay=0, conn=conn)
            conn.execute(sa.text("INSERT INTO orders VALUES (:id)"), {"id": job})
            if not commit:
                raise Declined  # closing rolls back
            conn.commit()

    try:
        _check_transactional(redis_server.url, pg_url, produce)
    finally:
        engine.dispose()


def test_sqlalchemy_session(redis_server: RedisServer, pg_url: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    engine = sa.create_engine(_alchemy_url(pg_url, "psycopg"))

    async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.text("INSERT INTO orders VALUES (:id)"), {"id": job})
            sync.schedule(job, "charge", {"order": job}, delay=0, conn=session)
            if not commit:
                raise Declined

    try:
        _check_transactional(redis_server.url, pg_url, produce)
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
def test_sqlalchemy_async_connection(redis_server: RedisServer, pg_url: str, driver: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    async def produce(s: Scheduler, _sync: SyncScheduler, job: str, commit: bool) -> None:
        engine = create_async_engine(_alchemy_url(pg_url, driver))
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text("INSERT INTO orders VALUES (:id)"), {"id": job})
                await s.schedule(job, "charge", {"order": job}, delay=0, conn=conn)
                if not commit:
                    raise Declined
        finally:
            await engine.dispose()

    _check_transactional(redis_server.url, pg_url, produce)


def test_sqlalchemy_async_session(redis_server: RedisServer, pg_url: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def produce(s: Scheduler, _sync: SyncScheduler, job: str, commit: bool) -> None:
        engine = create_async_engine(_alchemy_url(pg_url, "asyncpg"))
        try:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(sa.text("INSERT INTO orders VALUES (:id)"), {"id": job})
                await s.schedule_many([_spec(job)], conn=session)
                if not commit:
                    raise Declined
        finally:
            await engine.dispose()

    _check_transactional(redis_server.url, pg_url, produce)


def test_sqlalchemy_bad_input_writes_nothing(redis_server: RedisServer, pg_url: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    async def attempts(s: Scheduler, sync: SyncScheduler) -> None:
        engine = sa.create_engine(_alchemy_url(pg_url, "psycopg"))
        aengine = create_async_engine(_alchemy_url(pg_url, "asyncpg"))
        lite = sa.create_engine("sqlite://")
        try:
            conn = engine.connect()
            conn.close()
            with pytest.raises(ValueError, match="conn is closed"):
                sync.schedule("a", "charge", conn=conn)
            with engine.connect() as conn2, pytest.raises(TypeError, match="synchronous"):
                await s.schedule("a", "charge", conn=conn2)
            async with aengine.connect() as aconn:
                with pytest.raises(TypeError, match="AsyncConnection or AsyncSession goes"):
                    sync.schedule("a", "charge", conn=aconn)
            with lite.connect() as other, pytest.raises(TypeError, match="sqlite"):
                sync.schedule("a", "charge", conn=other)
            with pytest.raises(TypeError, match="conn must be a SQLAlchemy Connection"):
                sync.schedule("a", "charge", conn=engine)  # an Engine is not a connection
            auto = engine.execution_options(isolation_level="AUTOCOMMIT")
            with auto.connect() as conn3, pytest.raises(ValueError, match="AUTOCOMMIT"):
                sync.schedule("a", "charge", conn=conn3)
            aauto = aengine.execution_options(isolation_level="AUTOCOMMIT")
            async with aauto.connect() as aconn3:
                with pytest.raises(ValueError, match="AUTOCOMMIT"):
                    await s.schedule("a", "charge", conn=aconn3)
        finally:
            engine.dispose()
            lite.dispose()
            await aengine.dispose()

    _bad_input(redis_server.url, pg_url, attempts)


# -- Django -------------------------------------------------------------------------


@contextlib.contextmanager
def django_on(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Django's default connection on the test's database (settings configured here,
    without a project); yields ``django.db.connection``. The test calls it from its
    event loop's thread, which Django refuses unless told (the producer here is sync
    code between awaits, as in a test; an application calls it from sync code)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    import django
    from django.conf import settings
    from django.db import connection, connections

    parts = urlsplit(pg_url)
    db = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "postgres",
        "HOST": parts.hostname,
        "PORT": str(parts.port),
    }
    if not settings.configured:
        settings.configure(DATABASES={"default": db}, USE_TZ=True)
        django.setup()
    else:
        connections.close_all()
        connections.settings["default"].update(db)
    try:
        yield connection
    finally:
        connections.close_all()


def test_django_atomic(
    redis_server: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import transaction

    with django_on(pg_url, monkeypatch) as connection:

        async def produce(_s: Scheduler, sync: SyncScheduler, job: str, commit: bool) -> None:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES (%s)", [job])
                sync.schedule(job, "charge", {"order": job}, delay=0, conn=connection)
                if not commit:
                    raise Declined

        _check_transactional(redis_server.url, pg_url, produce)


def test_django_bad_input_writes_nothing(
    redis_server: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import transaction

    with django_on(pg_url, monkeypatch) as connection:

        async def attempts(s: Scheduler, sync: SyncScheduler) -> None:
            with pytest.raises(ValueError, match="atomic"):
                sync.schedule("a", "charge", conn=connection)
            with pytest.raises(TypeError, match="Django"):
                await s.schedule("a", "charge", conn=connection)
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES ('x')")
                transaction.set_rollback(True)
                with pytest.raises(ValueError, match="marked for rollback"):
                    sync.schedule("a", "charge", conn=connection)

        _bad_input(redis_server.url, pg_url, attempts)


def test_django_atomic_cancel(
    redis_server: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SyncScheduler.cancel(conn=connection)`` inside ``transaction.atomic()``: a
    rollback keeps the job, a commit removes it from both stores once a relay ran;
    outside ``atomic()`` it is refused with nothing written."""
    from django.db import transaction

    with django_on(pg_url, monkeypatch) as connection:

        async def main() -> None:
            await _orders(pg_url)
            async with _schedulers(redis_server.url, pg_url) as (s, sync):
                assert s.pg is not None
                await s.schedule("d", "charge", {"order": "d"}, delay=3600)
                await s.pg.relay_all(s)
                with pytest.raises(ValueError, match="atomic"):
                    sync.cancel("d", conn=connection)
                with pytest.raises(Declined), transaction.atomic():
                    assert sync.cancel("d", conn=connection) is True
                    raise Declined
                assert await s.pg.relay_all(s) == 0 and await s.get("d") is not None
                with transaction.atomic():
                    assert sync.cancel("d", conn=connection) is True
                assert await s.pg.relay_all(s) == 1
                assert await s.get("d") is None
                counts = await table_counts(pg_url)
                assert counts["tickwheel_jobs"] == 0 and counts["tickwheel_outbox"] == 0

        run(main())


# -- the pieces without servers -----------------------------------------------------


def test_render_turns_dollar_placeholders_into_each_paramstyle() -> None:
    from tickwheel.durable.postgres._drivers import render

    sql = "SELECT $2::text, $1, 5 % 2, $2"
    assert render(sql, ["a", "b"], "numeric_dollar") == (sql, ("a", "b"))
    assert render(sql, ["a", "b"], "pyformat") == (
        "SELECT %(p2)s::text, %(p1)s, 5 %% 2, %(p2)s",
        {"p1": "a", "p2": "b"},
    )
    assert render(sql, ["a", "b"], "format") == (
        "SELECT %s::text, %s, 5 %% 2, %s",
        ("b", "a", "b"),
    )
    with pytest.raises(TypeError, match="paramstyle 'qmark'"):
        render(sql, [], "qmark")


def test_other_drivers_errors_translate_by_sqlstate() -> None:
    from tickwheel.durable import Fenced, PostgresUnavailable
    from tickwheel.durable.postgres import translate

    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert isinstance(translate(lost), PostgresUnavailable)
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert isinstance(translate(deadlock), PostgresUnavailable)
    bug = psycopg.errors.UndefinedFunction("function tickwheel_put does not exist")
    assert translate(bug) is bug

    class Wrapped(Exception):  # SQLAlchemy's DBAPIError keeps the driver's in .orig
        orig = deadlock

    assert isinstance(translate(Wrapped("x")), PostgresUnavailable)

    class Refused(Exception):
        sqlstate = "TWFEN"

    assert isinstance(translate(Refused("stale epoch"), 3), Fenced)
