"""Versioned schema migrations, applied only on request (``tickwheel pg migrate``).

Ground rules:

- Each migration is a file ``migrations/NNNN_name.sql`` of this package; its number is
  its version. A database records what it has in ``tickwheel_schema_version``.
- :func:`migrate` applies the missing ones in order, in one transaction, under a
  transaction-level advisory lock: two concurrent runs serialise, the second finds
  nothing left to do. A failing migration rolls back whole.
- Nothing else runs DDL: a store that finds the schema missing or older than
  :data:`SCHEMA_VERSION` raises :class:`SchemaNotReady`. A newer schema is accepted
  (migrations only add), so workers of the previous release keep running during an
  upgrade.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from tickwheel.durable.model import SchemaNotReady

__all__ = [
    "SCHEMA_MAX",
    "SCHEMA_TABLE",
    "SCHEMA_VERSION",
    "Migration",
    "check_schema",
    "migrate",
    "migrations",
    "schema_not_ready",
    "schema_version",
]

# pg_advisory_xact_lock key of migrate(): a fixed 63-bit number of its own.
_LOCK_KEY = 0x2D0B6E3A5F1C4A77
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS tickwheel_schema_version (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file."""

    version: int  # its number
    name: str  # the file's name without number and suffix
    sql: str  # its text


def migrations() -> list[Migration]:
    """The package's migrations in version order."""
    out: list[Migration] = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        found = _NAME.match(entry.name)
        if found:
            out.append(Migration(int(found.group(1)), found.group(2), entry.read_text()))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if not versions or versions[0] != 1 or len(set(versions)) != len(versions):
        raise RuntimeError(f"migrations are not numbered 1, then up, once each: {versions}")
    return out


# The version this library needs: its last migration.
SCHEMA_VERSION = migrations()[-1].version


# schema_version(): whether the version table exists, then the highest version applied.
SCHEMA_TABLE = "SELECT to_regclass('tickwheel_schema_version')"
SCHEMA_MAX = "SELECT max(version) FROM tickwheel_schema_version"


async def schema_version(conn: Any) -> int:
    """The schema version of the database ``conn`` is connected to (0: none)."""
    if await conn.fetchval(SCHEMA_TABLE) is None:
        return 0
    found = await conn.fetchval(SCHEMA_MAX)
    return int(found or 0)


def schema_not_ready(found: int) -> SchemaNotReady | None:
    """The error for a database at schema version ``found``, or None if usable."""
    if found >= SCHEMA_VERSION:
        return None
    what = "has no tickwheel schema" if found == 0 else f"has schema version {found}"
    return SchemaNotReady(
        f"the PostgreSQL database {what}; this tickwheel needs version "
        f"{SCHEMA_VERSION}: run `tickwheel pg migrate --postgres-url URL`",
        found,
        SCHEMA_VERSION,
    )


async def check_schema(conn: Any) -> int:
    """Return the database's schema version if this library can use it.

    Raises:
        SchemaNotReady: if it is missing or older than :data:`SCHEMA_VERSION`.
    """
    found = await schema_version(conn)
    error = schema_not_ready(found)
    if error is not None:
        raise error
    return found


async def migrate(conn: Any) -> list[int]:
    """Apply the migrations ``conn``'s database lacks, in one transaction.

    Args:
        conn: an open asyncpg connection, not inside a transaction.

    Returns:
        The versions applied now (empty when the schema was current).
    """
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(_VERSION_TABLE)
        have = {r[0] for r in await conn.fetch("SELECT version FROM tickwheel_schema_version")}
        for m in migrations():
            if m.version in have:
                continue
            await conn.execute(m.sql)
            await conn.execute(
                "INSERT INTO tickwheel_schema_version (version, name) VALUES ($1, $2)",
                m.version,
                m.name,
            )
            applied.append(m.version)
    return applied
