"""tickwheel.durable.postgres: PostgreSQL as the source of truth, Redis as the index.

``Scheduler(client, namespace, postgres_url=...)`` turns it on; see docs/postgres.md.
The driver (asyncpg, the ``postgres`` extra) is imported only when a store connects.

Owns: the schema and its migrations (``migrations/``, ``_migrate.py``); the PostgreSQL
store, in rooms: ``_pg_store.py`` (``PgStore``: the pool, each call's connection and
transaction, the advisory locks), ``_errors.py`` (every driver error translated once),
``_rows.py`` (a job as rows and back in Redis's form), ``_writes.py`` (the job writes),
``_relay.py`` (the outbox and reconcile's reads), ``_pauses.py`` (the pause state),
``_prune.py`` (retention); and the mode that joins the two stores (``_mode.py``:
transactional enqueue, outbox relay, reconcile).

Invariants: PostgreSQL is written first; Redis is an index rebuilt from it, so a Redis
failure after a commit is repaired by the relay or by reconcile, never lost.

May import: ``tickwheel.durable.store`` and ``.model``. It names what it needs of the
scheduler above it (``RedisSide``) instead of importing it.
"""

from __future__ import annotations

from ._clock import ClockSkew, measure, pg_redis_skew
from ._drivers import enqueue_sync
from ._errors import translate
from ._migrate import SCHEMA_VERSION, check_schema, migrate, migrations, schema_version
from ._mode import PostgresMode, ReconcileResult
from ._pauses import pause_sync, resume_sync
from ._pg_store import PgStore
from ._prune import prune
from ._replacing import replace_sync
from ._sync_ops import cancel_in_sync, cancel_sync, reschedule_sync
from ._sync_pool import SyncPgPool

__all__ = [
    "SCHEMA_VERSION",
    "ClockSkew",
    "PgStore",
    "PostgresMode",
    "ReconcileResult",
    "SyncPgPool",
    "cancel_in_sync",
    "cancel_sync",
    "check_schema",
    "enqueue_sync",
    "measure",
    "migrate",
    "migrations",
    "pause_sync",
    "pg_redis_skew",
    "prune",
    "replace_sync",
    "reschedule_sync",
    "resume_sync",
    "schema_version",
    "translate",
]
