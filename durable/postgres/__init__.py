"""tickwheel.durable.postgres: PostgreSQL as the source of truth, Redis as the index.

``Scheduler(client, namespace, postgres_url=...)`` turns it on; see docs/postgres.md.
The driver (asyncpg, the ``postgres`` extra) is imported only when a store connects.
"""

from __future__ import annotations

from ._migrate import SCHEMA_VERSION, check_schema, migrate, migrations, schema_version
from ._mode import PostgresMode, ReconcileResult
from ._store import PgStore, prune, translate

__all__ = [
    "SCHEMA_VERSION",
    "PgStore",
    "PostgresMode",
    "ReconcileResult",
    "check_schema",
    "migrate",
    "migrations",
    "prune",
    "schema_version",
    "translate",
]
