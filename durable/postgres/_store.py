"""The PostgreSQL side of the Postgres mode: one method per SQL function or query.

Ground rules:

- PostgreSQL is the source of truth: a job exists iff its row committed, an occurrence
  is complete iff its done row committed. Redis is the index (due, leases, claim), and
  follows PostgreSQL: written after a commit, rebuilt from it by reconcile.
- Each write is one call of a function made by the migrations (``tickwheel_schedule``,
  ``tickwheel_claim_check``, ``tickwheel_ack``): one round trip, one transaction (the
  caller's when it passes its own connection).
- Every driver error goes through :func:`translate`: the caller sees
  :class:`PostgresUnavailable` (transient), :class:`Fenced`, or the driver's own error
  for a bug; a failed call rolled back whole.
- The driver (asyncpg, the ``postgres`` extra) is imported on :meth:`PgStore.open`, so
  the Redis-only mode never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tickwheel.durable.model import (
    KIND_CRON,
    KIND_INTERVAL,
    POLICY_CODES,
    Fenced,
    JobSpec,
    PostgresUnavailable,
    encode_payload,
)
from tickwheel.durable.store import ClaimedRef, EncodedJob, pack_record, shown_url

from ._migrate import check_schema

__all__ = [
    "DEFAULT_POOL_SIZE",
    "OutboxRow",
    "PendingRow",
    "PgJob",
    "PgStore",
    "prune",
    "translate",
]

logger = logging.getLogger("tickwheel.durable")

# Connections per store: a worker's loader, relay and acks, and a producer's bursts.
DEFAULT_POOL_SIZE = 10
# SQLSTATE classes a restart, a failover or an overload produces: the same call may
# succeed later. 08 connection exception, 53 insufficient resources, 57 operator
# intervention (admin shutdown, cannot connect now), 40 transaction rollback
# (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "53", "57", "40")
_FENCED = "TWFEN"
# A session-level advisory lock per (namespace, purpose), keyed by a 64-bit hash.
_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended($1, 0))"


def translate(exc: BaseException, shard: int | None = None) -> BaseException:
    """Map what asyncpg (or the socket under it) raised to what the caller should see."""
    import asyncpg  # noqa: PLC0415  (loaded by open() already)

    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        if state == _FENCED:
            return Fenced(str(exc), shard)
        if state[:2] in _TRANSIENT_CLASSES:
            return PostgresUnavailable(f"postgres unavailable: {exc}")
        return exc
    # InternalClientError: a pooled connection left mid-operation when its server died
    # (seen in the chaos test: the pool's reset on release, "cannot switch to state").
    if isinstance(
        exc, OSError | TimeoutError | asyncpg.InterfaceError | asyncpg.InternalClientError
    ):
        return PostgresUnavailable(f"postgres unavailable: {exc!r}")
    return exc


def stored_epoch(exc: BaseException) -> int:
    """The stored epoch a ``TWFEN`` refusal carries (0 if none)."""
    cause = exc.__cause__
    detail = getattr(cause, "detail", None) or "0"
    try:
        return int(detail)
    except ValueError:
        return 0


@contextlib.contextmanager
def _translated(shard: int | None) -> Iterator[None]:
    """Raise the library's error for a driver's, from the body (see :func:`translate`)."""
    try:
        yield
    except (Fenced, PostgresUnavailable):
        raise
    except Exception as exc:
        translated = translate(exc, shard)
        if translated is exc:
            raise
        raise translated from exc


@dataclass(frozen=True, slots=True)
class PgJob:
    """A validated job as ``tickwheel_schedule`` takes it."""

    id: str
    shard: int
    args: tuple[Any, ...]  # task .. record, after ns, id and shard
    record: bytes  # the Redis record (nominal 0, attempt 1)


def encode_pg_job(spec: JobSpec, shard: int, payload_limit: int) -> PgJob:
    """Encode a job spec for ``tickwheel_schedule`` (and its Redis record).

    Raises:
        TypeError, ValueError: if the payload is not encodable or over ``payload_limit``.
    """
    data, flags = encode_payload(spec.payload, payload_limit)
    fields: list[int | bytes] = [spec.task.encode(), data, spec.max_attempts, flags, 0, 1, 0]
    rec = spec.recurrence
    rkind, rspec, policy, cap, grace = 0, "", 0, 0, 0
    if rec is not None:
        rkind, rspec = (KIND_INTERVAL, str(rec.every_ms)) if rec.every_ms else (KIND_CRON, rec.cron)
        policy, cap, grace = POLICY_CODES[rec.missed], rec.max_catch_up, rec.misfire_grace_ms
        fields += [rkind, rspec.encode(), policy, cap, grace]
    record = pack_record(fields)
    args = (
        spec.task,
        data,
        bool(flags & 1),
        spec.max_attempts,
        spec.mode,
        spec.time_ms,
        rkind,
        rspec,
        policy,
        cap,
        grace,
        record,
    )
    return PgJob(spec.id, shard, args, record)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An index entry still to be written to Redis."""

    seq: int
    job: EncodedJob | None  # None: the job is gone or moved on (nothing to write)
    shard: int


@dataclass(frozen=True, slots=True)
class PendingRow:
    """A pending job as reconcile puts it back in Redis."""

    shard: int
    due_ms: int
    job: EncodedJob


def redis_job(job_id: str, due_ms: int, record: bytes) -> EncodedJob:
    """The schedule.lua form of a stored job: its own id at its nominal due."""
    return EncodedJob(job_id, (job_id.encode(), 0, due_ms, record))


def _retried_job(row: Any) -> EncodedJob:
    """The schedule.lua form of a retried occurrence, from the columns of
    :meth:`PgStore.pending`: due at its next run, its record carrying the occurrence's
    nominal due and the attempt it runs as (the nominal is the occurrence's identity:
    an ack of it completes the row, a done row of it drops it at its claim)."""
    fields: list[int | bytes] = [
        row["task"].encode(),
        bytes(row["payload"]),
        int(row["max_attempts"]),
        1 if row["json_payload"] else 0,
        int(row["due_ms"]),
        int(row["attempt"]),
        0,
    ]
    if row["rkind"]:
        fields += [
            int(row["rkind"]),
            row["rspec"].encode(),
            int(row["policy"]),
            int(row["max_catch_up"]),
            int(row["grace_ms"]),
        ]
    return EncodedJob(row["id"], (row["id"].encode(), 0, int(row["run_ms"]), pack_record(fields)))


# $16: notify the relays at commit (migration 0005): only when they are the indexers.
_SCHEDULE = (
    "SELECT status, when_ms, seq FROM tickwheel_put"
    "($16, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
)
# A batch in one statement: the function per row of the arrays, in their order.
_SCHEDULE_MANY = """
SELECT s.status, s.when_ms, s.seq
FROM unnest($2::text[], $3::integer[], $4::text[], $5::bytea[], $6::boolean[],
            $7::integer[], $8::integer[], $9::bigint[], $10::smallint[], $11::text[],
            $12::smallint[], $13::integer[], $14::bigint[], $15::bytea[])
     WITH ORDINALITY AS u(id, shard, task, payload, json, max, mode, t, rkind, rspec,
                          policy, cap, grace, record, k)
CROSS JOIN LATERAL tickwheel_put($16, $1, u.id, u.shard, u.task, u.payload, u.json, u.max,
    u.mode, u.t, u.rkind, u.rspec, u.policy, u.cap, u.grace, u.record) AS s
ORDER BY u.k
"""
# A batch of distinct ids: one set-based statement (migration 0004).
_SCHEDULE_DISTINCT = (
    "SELECT status, when_ms, seq FROM tickwheel_put_many"
    "($16, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
)
_NOW = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# locked(): the ids' advisory locks (transaction-level), then their rows' locks, in id
# order (migration 0003 says why that order). Ids per locked() transaction: a replace
# batch is split into these, since advisory locks live in PostgreSQL's shared lock table.
MAX_LOCKED = 500
_LOCK_IDS = (
    "SELECT count(pg_advisory_xact_lock(hashtextextended($1 || ':' || i, 0)))"
    " FROM unnest($2::text[]) WITH ORDINALITY AS u(i, k)"
)
_LOCKED_ROWS = (
    "SELECT id, due_ms, state FROM tickwheel_jobs WHERE ns = $1 AND id = ANY($2::text[])"
    ' ORDER BY id COLLATE "C" FOR UPDATE'
)
_OVERWRITE = """
INSERT INTO tickwheel_jobs AS j (ns, id, shard, task, payload, json_payload, max_attempts,
    due_ms, rkind, rspec, policy, max_catch_up, grace_ms, record)
SELECT $1, u.* FROM unnest($2::text[], $3::integer[], $4::text[], $5::bytea[],
    $6::boolean[], $7::integer[], $8::bigint[], $9::smallint[], $10::text[],
    $11::smallint[], $12::integer[], $13::bigint[], $14::bytea[]) AS u
ON CONFLICT (ns, id) DO UPDATE SET shard = excluded.shard, task = excluded.task,
    payload = excluded.payload, json_payload = excluded.json_payload,
    max_attempts = excluded.max_attempts, due_ms = excluded.due_ms, rkind = excluded.rkind,
    rspec = excluded.rspec, policy = excluded.policy, max_catch_up = excluded.max_catch_up,
    grace_ms = excluded.grace_ms, record = excluded.record, state = 0, attempt = 1,
    run_ms = 0, epoch = 0, updated_at = now()
"""


class PgStore:
    """The namespace's tables in one PostgreSQL database.

    Args:
        url: a ``postgresql://`` DSN.
        namespace: the scheduler's namespace (a column of every table).
        pool_size: connections of the pool (opened on :meth:`open`).
        call_timeout: seconds a call may take; then :class:`PostgresUnavailable`.

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        call_timeout: float = 10.0,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"postgres_url must be a str, got {type(url).__name__}")
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"postgres_url must start with postgresql://, got {shown_url(url)!r}")
        if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        self.url = url
        self.namespace = namespace
        self.pool_size = pool_size
        self.call_timeout = call_timeout
        self._pool: Any = None
        self._lock = asyncio.Lock()
        self._to_forget: list[int] = []  # outbox rows to delete (relayed_later)
        self._forgetting: asyncio.Task[None] | None = None  # the task deleting them

    async def open(self) -> PgStore:
        """Connect the pool and check the schema version.

        Raises:
            SchemaNotReady: if the database lacks the current schema (run migrate).
            PostgresUnavailable: if PostgreSQL cannot be reached.
        """
        if self._pool is None:
            await self._connect()
        return self

    async def _connect(self) -> None:
        async with self._lock:
            if self._pool is not None:
                return
            try:
                import asyncpg  # noqa: PLC0415
            except ImportError as exc:  # pragma: no cover - the extra is missing
                raise ImportError(
                    "the Postgres mode needs asyncpg: pip install 'tickwheel[postgres]'"
                ) from exc
            try:
                pool = await asyncpg.create_pool(
                    self.url,
                    min_size=1,
                    max_size=self.pool_size,
                    command_timeout=self.call_timeout,
                    timeout=self.call_timeout,
                )
            except Exception as exc:
                raise translate(exc) from exc
            try:
                async with self._conn(pool) as conn:
                    await check_schema(conn)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool

    async def aclose(self) -> None:
        """Delete the outbox rows :meth:`relayed_later` holds (bounded), close the pool."""
        forgetting = self._forgetting
        if forgetting is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(forgetting), self.call_timeout)
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), self.call_timeout)

    @contextlib.asynccontextmanager
    async def _conn(self, pool: Any = None, shard: int | None = None) -> AsyncIterator[Any]:
        """A pooled connection; every driver error translated."""
        with _translated(shard):
            async with (pool or self._pool).acquire(timeout=self.call_timeout) as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def _on(
        self, conn: Any, shard: int | None = None, *, own_transaction: bool = True
    ) -> AsyncIterator[Any]:
        """The caller's connection, or a pooled one (in a transaction of its own unless
        the body is one statement, which is its own transaction)."""
        if conn is not None:
            with _translated(shard):
                yield conn
            return
        await self.open()
        async with self._conn(shard=shard) as own:
            if not own_transaction:
                yield own
                return
            async with own.transaction():
                yield own

    @contextlib.asynccontextmanager
    async def exclusive(self, what: str) -> AsyncIterator[bool]:
        """Hold this namespace's advisory lock ``what`` for the body if no other session
        holds it; yields whether it was taken (False: another holder is at it, skip).

        The lock lives on one pooled connection for the body's length: a session lock,
        so no transaction stays open to hold back vacuum. It is unlocked after the body,
        and dies with the session if the connection breaks (the pool's reset also
        releases every advisory lock before the connection is reused).

        Raises:
            PostgresUnavailable: if the lock cannot be asked for.
        """
        await self.open()
        key = f"tickwheel:{self.namespace}:{what}"
        with _translated(None):
            conn = await self._pool.acquire(timeout=self.call_timeout)
        try:
            with _translated(None):
                got = bool(await conn.fetchval(_TRY_LOCK, key))
            try:
                yield got
            finally:
                if got:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.fetchval(_UNLOCK, key), self.call_timeout)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.release(conn), self.call_timeout)

    # -- producers -----------------------------------------------------------------

    async def now(self, conn: Any = None) -> int:
        """PostgreSQL's clock (ms): a delay in Postgres mode is added to it."""
        async with self._on(conn) as c:
            return int(await c.fetchval(_NOW))

    async def schedule(
        self, jobs: Sequence[PgJob], conn: Any = None, *, notify: bool = True
    ) -> list[tuple[int, int, int]]:
        """Create jobs (and their outbox rows) in one statement, so one transaction:
        the caller's when ``conn`` is given (committed or rolled back with it), else
        its own. ``notify``: wake the relays at commit; a caller that writes the jobs
        to Redis itself passes False (a relay's periodic round is its safety net).

        Returns:
            Per job, (status, when_ms, outbox seq) with schedule.lua's status codes:
            1 created (seq set), 2 kept, 5 done.

        Pass a batch sorted by id (rows are locked in that order): a batch of distinct
        ids is one set-based statement, one that names an id twice runs the job-by-job
        function (each copy sees the ones before it).
        """
        ns = self.namespace
        async with self._on(conn, own_transaction=False) as c:
            if len(jobs) == 1:
                job = jobs[0]
                rows = [await c.fetchrow(_SCHEDULE, ns, job.id, job.shard, *job.args, notify)]
                return [(int(r[0]), int(r[1]), int(r[2] or 0)) for r in rows]
            ids = [job.id for job in jobs]
            distinct = len(set(ids)) == len(ids)
            columns = list(zip(*(job.args for job in jobs), strict=True))
            rows = await c.fetch(
                _SCHEDULE_DISTINCT if distinct else _SCHEDULE_MANY,
                ns,
                ids,
                [job.shard for job in jobs],
                *(list(col) for col in columns),
                notify,
            )
            # when_ms NULL: kept, created by a concurrent producer after the statement
            # began; its due is read now.
            raced = [ids[k] for k, r in enumerate(rows) if r[1] is None]
            found: dict[str, int] = {}
            if raced:
                found = dict(
                    await c.fetch(
                        "SELECT id, due_ms FROM tickwheel_jobs WHERE ns = $1 AND id = ANY($2)",
                        ns,
                        raced,
                    )
                )
        return [
            (int(r[0]), int(found.get(ids[k], 0) if r[1] is None else r[1]), int(r[2] or 0))
            for k, r in enumerate(rows)
        ]

    @contextlib.asynccontextmanager
    async def locked(self, ids: Sequence[str]) -> AsyncIterator[tuple[Any, dict[str, int]]]:
        """A transaction of its own holding the jobs ``ids`` for the body: a
        transaction-level advisory lock per id (so an id with no row yet is held too)
        and the row locks of the rows there are, whatever their state, both taken in id
        order (two callers never deadlock). Yields the connection and the pending rows'
        due times by id. Keep ``ids`` to a batch (``MAX_LOCKED``): advisory locks live
        in PostgreSQL's shared lock table.
        Committed when the body returns, rolled back if it raises.

        Raises:
            PostgresUnavailable: if PostgreSQL fails.
        """
        ns = self.namespace
        order = sorted(set(ids))
        await self.open()
        async with self._conn() as c, c.transaction():
            await c.execute(_LOCK_IDS, ns, order)
            rows = await c.fetch(_LOCKED_ROWS, ns, order)
            yield c, {r[0]: int(r[1]) for r in rows if r[2] == 0}

    async def done_of(
        self, conn: Any, occurrences: Sequence[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """The ``(id, nominal)`` pairs whose occurrence is done."""
        if not occurrences:
            return set()
        rows = await conn.fetch(
            "SELECT d.id, d.nominal_ms FROM unnest($2::text[], $3::bigint[]) AS o(id, nominal)"
            " JOIN tickwheel_done d ON d.ns = $1 AND d.id = o.id AND d.nominal_ms = o.nominal",
            self.namespace,
            [i for i, _ in occurrences],
            [n for _, n in occurrences],
        )
        return {(r[0], int(r[1])) for r in rows}

    async def overwrite(self, conn: Any, jobs: Sequence[tuple[PgJob, int]]) -> None:
        """Write ``(job, due)`` rows as pending at attempt 1, creating or overwriting
        (whatever state the rows had): what a replace that Redis accepted leaves."""
        if not jobs:
            return
        jobs = sorted(jobs, key=lambda item: item[0].id)  # rows locked in id order
        columns = list(zip(*(job.args for job, _ in jobs), strict=True))
        await conn.execute(
            _OVERWRITE,
            self.namespace,
            [job.id for job, _ in jobs],
            [job.shard for job, _ in jobs],
            list(columns[0]),  # task
            list(columns[1]),  # payload
            list(columns[2]),  # json
            list(columns[3]),  # max attempts
            [due for _, due in jobs],
            *(list(col) for col in columns[6:]),  # rkind .. record
        )

    async def moved(self, conn: Any, job_id: str, due_ms: int) -> None:
        """A pending job's current occurrence is now at ``due_ms`` (attempt 1)."""
        await conn.execute(
            "UPDATE tickwheel_jobs SET due_ms = $3, attempt = 1, run_ms = 0, updated_at = now()"
            " WHERE ns = $1 AND id = $2 AND state = 0",
            self.namespace,
            job_id,
            due_ms,
        )

    def relayed_later(self, seqs: Sequence[int]) -> None:
        """Delete outbox rows whose jobs the producer wrote to Redis itself, from a task
        of this loop, together with the others that come meanwhile (one delete in
        flight): the producer does not wait for it. A delete that is lost (a crash,
        PostgreSQL down) is harmless: the relay writes the job to Redis again, which
        keeps it as it is, and deletes the row."""
        self._to_forget.extend(seqs)
        if self._forgetting is None:
            self._forgetting = asyncio.ensure_future(self._forget())

    async def _forget(self) -> None:
        try:
            while self._to_forget:
                seqs, self._to_forget = self._to_forget, []
                try:
                    await self.relayed(seqs)
                except Exception as exc:  # the relay deletes them instead
                    logger.warning("%d outbox row(s) left to the relay (%r)", len(seqs), exc)
        finally:
            self._forgetting = None  # in the step that found the list empty

    async def relayed(self, seqs: Sequence[int]) -> None:
        """Delete outbox rows whose jobs the producer wrote to Redis itself."""
        await self.open()
        async with self._conn() as c:
            await c.execute("SELECT tickwheel_relayed($1, $2::bigint[])", self.namespace, seqs)

    async def cancel(self, job_id: str, conn: Any = None) -> bool:
        """Delete a job's row (and its outbox rows); True if there was a pending one."""
        async with self._on(conn) as c:
            await c.execute(
                "DELETE FROM tickwheel_outbox WHERE ns = $1 AND id = $2", self.namespace, job_id
            )
            state = await c.fetchval(
                "DELETE FROM tickwheel_jobs WHERE ns = $1 AND id = $2 RETURNING state",
                self.namespace,
                job_id,
            )
        return bool(state == 0)

    # -- workers -------------------------------------------------------------------

    async def claimed(
        self, shard: int, epoch: int, ids: Sequence[str], nominals: Sequence[int]
    ) -> tuple[set[int], set[int]]:
        """Record ``epoch`` as the shard's (it only moves up) and return the 0-based
        positions of the claimed occurrences that are done already, and of those whose
        job has no row (cancelled: not to be run). An id without a row is looked at
        again once no replace of it is still committing (migration 0006).

        Raises:
            Fenced: if PostgreSQL holds a higher epoch for the shard (its stored epoch
                is in :func:`stored_epoch` of the exception).
        """
        await self.open()
        async with self._conn(shard=shard) as c:
            rows = await c.fetch(
                "SELECT pos, gone FROM tickwheel_claim_check($1, $2, $3, $4, $5)",
                self.namespace,
                shard,
                epoch,
                list(ids),
                list(nominals),
            )
        done = {int(r[0]) - 1 for r in rows if not r[1]}
        gone = {int(r[0]) - 1 for r in rows if r[1]}
        return done, gone

    async def ack(self, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[int]:
        """Record occurrences done (and move recurring jobs on) in one transaction.

        Returns:
            Per ref: 1 acked, 2 acked and moved to its next occurrence, 3 done already,
            4 acked but the job had moved on to another occurrence (its row untouched).

        Raises:
            Fenced: if ``epoch`` is not the shard's stored epoch (nothing written).
        """
        await self.open()
        # In id order: the function locks each id as PgStore.locked does (see 0003).
        order = sorted(range(len(refs)), key=lambda k: (refs[k].id, refs[k].nominal_ms))
        ordered = [refs[k] for k in order]
        async with self._conn(shard=shard) as c:
            reply = await c.fetchval(
                "SELECT tickwheel_ack($1, $2, $3, $4, $5, $6, $7)",
                self.namespace,
                shard,
                epoch,
                [r.id for r in ordered],
                [r.attempt for r in ordered],
                [r.nominal_ms for r in ordered],
                [r.time_ms for r in ordered],
            )
        out = [0] * len(refs)
        for k, v in zip(order, reply, strict=True):
            out[k] = int(v)
        return out

    async def skipped(self, shard: int, epoch: int, moves: Sequence[tuple[str, int, int]]) -> None:
        """Record recurring jobs a claim moved on unrun: ``(id, from, to)`` occurrences
        (a row moves only from its current one). Part of a claim under ``epoch``: a
        higher epoch is recorded, as :meth:`claimed` does.

        Raises:
            Fenced: if PostgreSQL holds a higher epoch for the shard (nothing written).
        """
        ordered = sorted(moves)  # in id order: locked as PgStore.locked locks
        await self.open()
        async with self._conn(shard=shard) as c:
            await c.execute(
                "SELECT tickwheel_moved($1, $2, $3, $4, $5, $6)",
                self.namespace,
                shard,
                epoch,
                [m[0] for m in ordered],
                [m[1] for m in ordered],
                [m[2] for m in ordered],
            )

    async def dead(
        self, shard: int, epoch: int, job_id: str, attempt: int, nominal_ms: int
    ) -> None:
        """Record a job dead (the last attempt of its occurrence ``nominal_ms`` failed)
        under ``epoch``; a job moved on to another occurrence since is left alone.

        Raises:
            Fenced: if ``epoch`` is not the shard's stored epoch (nothing written).
        """
        await self.open()
        async with self._conn(shard=shard) as c:
            await c.execute(
                "SELECT tickwheel_dead($1, $2, $3, $4, $5, $6)",
                self.namespace,
                shard,
                epoch,
                job_id,
                attempt,
                nominal_ms,
            )

    async def retried(
        self, shard: int, epoch: int, job_id: str, nominal_ms: int, *, attempt: int, run_ms: int
    ) -> None:
        """Record that occurrence ``nominal_ms`` of a job runs next at ``run_ms`` as
        ``attempt`` (a retry Redis took), so reconcile restores the attempt and the
        backoff after a Redis loss.

        Raises:
            Fenced: if ``epoch`` is not the shard's stored epoch (nothing written).
        """
        await self.open()
        async with self._conn(shard=shard) as c:
            await c.execute(
                "SELECT tickwheel_retried($1, $2, $3, $4, $5, $6, $7)",
                self.namespace,
                shard,
                epoch,
                job_id,
                nominal_ms,
                attempt,
                run_ms,
            )

    async def undead(self, ids: Sequence[str], *, purge: bool) -> None:
        """Dead letters that Redis requeued (pending again) or purged (deleted)."""
        if not ids:
            return
        await self.open()
        sql = (
            "DELETE FROM tickwheel_jobs WHERE ns = $1 AND state = 2 AND id = ANY($2::text[])"
            if purge
            else "UPDATE tickwheel_jobs SET state = 0, attempt = 1, run_ms = 0, epoch = 0,"
            " updated_at = now() WHERE ns = $1 AND state = 2 AND id = ANY($2::text[])"
        )
        async with self._conn() as c:
            await c.execute(sql, self.namespace, list(ids))

    async def shard_epochs(self) -> dict[int, int]:
        """The highest epoch recorded per shard."""
        await self.open()
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT shard, epoch FROM tickwheel_shard_epochs WHERE ns = $1", self.namespace
            )
        return {int(r[0]): int(r[1]) for r in rows}

    # -- relay and reconcile -------------------------------------------------------

    @contextlib.asynccontextmanager
    async def outbox(self, limit: int) -> AsyncIterator[list[OutboxRow]]:
        """Lock up to ``limit`` outbox rows (oldest first, skipping rows another relay
        holds) for the body to write to Redis; delete them when the body returns. If it
        raises, the transaction rolls back and the rows stay for the next relay."""
        await self.open()
        async with self._conn() as c, c.transaction():
            rows = await c.fetch(
                """
                SELECT o.seq, o.id, o.due_ms, j.shard, j.record,
                       coalesce(j.state = 0 AND j.due_ms = o.due_ms, false) AS live
                FROM (SELECT seq, id, due_ms FROM tickwheel_outbox
                      WHERE ns = $1 ORDER BY seq LIMIT $2
                      FOR UPDATE SKIP LOCKED) o
                LEFT JOIN tickwheel_jobs j ON j.ns = $1 AND j.id = o.id
                ORDER BY o.seq
                """,
                self.namespace,
                limit,
            )
            batch = [
                OutboxRow(
                    int(r[0]),
                    redis_job(r[1], int(r[2]), bytes(r[4])) if r[5] else None,
                    int(r[3]) if r[3] is not None else -1,
                )
                for r in rows
            ]
            yield batch
            if batch:
                await c.execute(
                    "DELETE FROM tickwheel_outbox WHERE seq = ANY($1::bigint[])",
                    [b.seq for b in batch],
                )

    async def pending(self, after: tuple[int, str] | None, limit: int) -> list[PendingRow]:
        """A page of pending jobs in (due, id) order, after ``after`` (the partial
        index on pending rows serves it)."""
        await self.open()
        due, last = after if after is not None else (-(2**63), "")
        async with self._conn() as c:
            rows = await c.fetch(
                """
                SELECT id, shard, due_ms, record, run_ms, attempt, task, payload,
                       json_payload, max_attempts, rkind, rspec, policy, max_catch_up,
                       grace_ms
                FROM tickwheel_jobs
                WHERE ns = $1 AND state = 0 AND (due_ms, id) > ($2, $3)
                ORDER BY due_ms, id LIMIT $4
                """,
                self.namespace,
                due,
                last,
                limit,
            )
        return [
            PendingRow(
                int(r[1]),
                int(r[2]),
                redis_job(r[0], int(r[2]), bytes(r[3])) if not r[4] else _retried_job(r),
            )
            for r in rows
        ]


# Rows deleted per statement by prune(): short transactions, so autovacuum and
# replication keep up, and no long lock on the tables.
_PRUNE_BATCH = 10_000


async def prune(conn: Any, older_than_s: float) -> tuple[int, int]:
    """Delete done rows, and completed (state 1) job rows, older than ``older_than_s``,
    in batches of their own transactions.

    A done row only matters while a copy of its occurrence can still turn up (a Redis
    restored from an old backup); reconcile never brings a completed occurrence back.

    Returns:
        (done rows deleted, job rows deleted).

    Raises:
        ValueError: if ``older_than_s`` is negative or not finite.
    """
    if not isinstance(older_than_s, int | float) or not 0 <= older_than_s < float("inf"):
        raise ValueError(f"older_than must be a finite number >= 0, got {older_than_s!r}")
    counts = [0, 0]
    statements = (
        "DELETE FROM tickwheel_done WHERE ctid = ANY(ARRAY(SELECT ctid FROM tickwheel_done"
        " WHERE done_at < now() - make_interval(secs => $1) LIMIT $2))",
        "DELETE FROM tickwheel_jobs WHERE ctid = ANY(ARRAY(SELECT ctid FROM tickwheel_jobs"
        " WHERE state = 1 AND updated_at < now() - make_interval(secs => $1) LIMIT $2))",
    )
    for k, sql in enumerate(statements):
        while True:
            status = await conn.execute(sql, float(older_than_s), _PRUNE_BATCH)
            n = int(status.rsplit(" ", 1)[-1])
            counts[k] += n
            if n < _PRUNE_BATCH:
                break
    return counts[0], counts[1]
