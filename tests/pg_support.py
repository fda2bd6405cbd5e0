"""Helpers of the Postgres-mode tests: schedulers on a real redis-server and a real
PostgreSQL (both started by the tests), and direct reads of the tables."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from durable_support import unique_ns

from tickwheel.durable import Scheduler
from tickwheel.durable.postgres import migrate
from tickwheel.durable.postgres._migrate import migrations
from tickwheel.durable.store._connect import client_from_url


async def migrated(url: str) -> None:
    """Apply the migrations to the database at ``url``."""
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def migrated_to(conn: Any, last: int) -> None:
    """The migrations up to ``last`` on ``conn``, recorded as ``migrate`` records them
    (a database as an older release left it; ``migrate`` applies the rest later)."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS tickwheel_schema_version (version integer PRIMARY KEY,"
        " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for m in migrations():
        if m.version <= last:
            await conn.execute(m.sql)
            await conn.execute(
                "INSERT INTO tickwheel_schema_version (version, name) VALUES ($1, $2)",
                m.version,
                m.name,
            )


@contextlib.asynccontextmanager
async def pg_scheduler(
    redis_url: str, pg_url: str, namespace: str | None = None, **kwargs: Any
) -> AsyncIterator[Scheduler]:
    """A Postgres-mode Scheduler on its own Redis client and namespace."""
    kwargs.setdefault("check", False)
    client = client_from_url(redis_url)
    sched = Scheduler(client, namespace or unique_ns(), postgres_url=pg_url, **kwargs)
    try:
        yield sched
    finally:
        with contextlib.suppress(Exception):
            await sched.close()
        await client.aclose()


async def rows(pg_url: str, sql: str, *args: Any) -> list[Any]:
    """The rows of one query."""
    conn = await asyncpg.connect(pg_url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def table_counts(pg_url: str) -> dict[str, int]:
    """Rows per tickwheel table (to assert that nothing was written)."""
    out = {}
    for table in ("tickwheel_jobs", "tickwheel_done", "tickwheel_outbox"):
        (row,) = await rows(pg_url, f"SELECT count(*) FROM {table}")
        out[table] = int(row[0])
    return out


@contextlib.asynccontextmanager
async def table_locked(pg_url: str, table: str) -> AsyncIterator[None]:
    """Hold ``table`` in ACCESS EXCLUSIVE mode for the body: every statement of the
    library that reads or writes it waits (a slow PostgreSQL, made real)."""
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()
