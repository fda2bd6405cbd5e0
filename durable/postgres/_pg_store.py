"""The PostgreSQL side of the Postgres mode: :class:`PgStore`, one method per SQL call.

Ground rules:

- PostgreSQL is the source of truth: a job exists iff its row committed, an occurrence
  is complete iff its done row committed. Redis is the index (due, leases, claim), and
  follows PostgreSQL: written after a commit, rebuilt from it by reconcile.
- Each write is one call of a function made by the migrations (``tickwheel_put``,
  ``tickwheel_claim_check``, ``tickwheel_ack``): one round trip, one transaction (the
  caller's when it passes its own connection).
- Every driver error goes through :func:`translate` (``_errors.py``): the caller sees
  :class:`PostgresUnavailable`, :class:`Fenced`, or a bug's own error; a failed call
  rolled back whole.
- The driver (asyncpg, the ``postgres`` extra) is imported on :meth:`PgStore.open`, so
  the Redis-only mode never loads it.

This module holds the connections (the pool, which connection and transaction a call
runs on) and the namespace's advisory locks; the SQL is in ``_writes.py`` and ``_relay.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tickwheel.durable.model import JobSpec, ScheduleResult
from tickwheel.durable.store import ClaimedRef, hidden, shown_url

from . import _relay, _replacing, _writes
from ._errors import translate, translated
from ._line import QUIET as _QUIET
from ._line import Line, reset_unless_quiet
from ._locks import advisory_lock
from ._migrate import check_schema
from ._rows import OutboxRow, PendingRow, PgJob

__all__ = ["DEFAULT_POOL_SIZE", "MAX_LOCKED", "PgStore"]

logger = logging.getLogger("tickwheel.durable")

# Connections per store: a worker's loader, relay and acks, and a producer's bursts.
DEFAULT_POOL_SIZE = 10
# Ids per locked() transaction (advisory locks live in PostgreSQL's shared lock table).
MAX_LOCKED = 500
# Seconds the delete task waits before it deletes what no statement took (_forget).
_FORGET_AFTER = 0.05


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
        self._line = Line()  # the connection held for schedule's own statement
        self._wline = Line()  # and the one for a worker's claim check and ack

    # -- connections ---------------------------------------------------------------

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
                    reset=reset_unless_quiet,  # asyncpg >= 0.30
                )
            except Exception as exc:
                err = translate(exc)
                clean = hidden(err, self.url)  # asyncpg may quote a piece of the password
                if clean is not err:
                    raise clean from None
                raise err from exc
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
        await self._line.close()
        await self._wline.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), self.call_timeout)

    @contextlib.asynccontextmanager
    async def _conn(self, pool: Any = None, shard: int | None = None) -> AsyncIterator[Any]:
        """A pooled connection for the library's own statements (released without the
        pool's reset: :data:`_QUIET`); every driver error translated."""
        token = _QUIET.set(True)
        try:
            with translated(shard):
                async with (pool or self._pool).acquire(timeout=self.call_timeout) as conn:
                    yield conn
        finally:
            _QUIET.reset(token)

    @contextlib.asynccontextmanager
    async def _held(self, line: Line, shard: int | None) -> AsyncIterator[Any]:
        """``line``'s connection for one own statement, or a pooled one (``_line.py``)."""
        await self.open()
        token = _QUIET.set(True)
        try:
            with translated(shard):
                async with line.use(self._pool, self.url, self.call_timeout) as c:
                    yield c
        finally:
            _QUIET.reset(token)

    @contextlib.asynccontextmanager
    async def _on(
        self, conn: Any, shard: int | None = None, *, own_transaction: bool = True
    ) -> AsyncIterator[Any]:
        """The caller's connection, or a pooled one (in a transaction of its own unless
        the body is one statement, which is its own transaction)."""
        if conn is not None:
            with translated(shard):
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
        holds it; yields whether it was taken (False: skip). See
        :func:`._locks.advisory_lock`.

        Raises:
            PostgresUnavailable: if the lock cannot be asked for.
        """
        await self.open()
        key = f"tickwheel:{self.namespace}:{what}"
        async with advisory_lock(self._pool, key, self.call_timeout) as got:
            yield got

    # -- producers -----------------------------------------------------------------

    async def now(self, conn: Any = None) -> int:
        """PostgreSQL's clock (ms): a delay in Postgres mode is added to it."""
        async with self._on(conn) as c:
            return await _writes.now(c)

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

        Pass a batch sorted by id (rows are locked in that order): distinct ids are one
        set-based statement, an id named twice runs the function job by job. Our own
        statement goes on the held connection (``_line.py``).
        """
        if conn is not None:
            async with self._on(conn, own_transaction=False) as c:
                return await _writes.schedule(c, self.namespace, jobs, notify)
        # Our own commit also deletes the outbox rows relayed_later() holds (lost with a
        # failed statement, they are the relay's: harmless).
        forget, self._to_forget = self._to_forget, []
        async with self._held(self._line, None) as c:
            return await _writes.schedule(c, self.namespace, jobs, notify, forget)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A pooled connection in a transaction of its own for the body: committed when
        the body returns, rolled back if it raises.

        Raises:
            PostgresUnavailable: if PostgreSQL fails.
        """
        await self.open()
        with translated(None):
            async with self._pool.acquire(timeout=self.call_timeout) as c, c.transaction():
                yield c

    @contextlib.asynccontextmanager
    async def locked(self, ids: Sequence[str]) -> AsyncIterator[tuple[Any, dict[str, int]]]:
        """A transaction of its own holding the jobs ``ids`` for the body (committed
        when it returns, rolled back if it raises): a transaction-level advisory lock
        per id (an id with no row yet is held too), then the row locks there are, both
        in id order (no deadlock). Yields the connection and the pending rows' due
        times by id. At most ``MAX_LOCKED`` ids (advisory locks are in shared memory).

        Raises:
            PostgresUnavailable: if PostgreSQL fails.
        """
        await self.open()
        async with self._conn() as c, c.transaction():
            yield c, await _writes.lock(c, self.namespace, ids)

    async def done_of(
        self, conn: Any, occurrences: Sequence[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """The ``(id, nominal)`` pairs whose occurrence is done."""
        return await _writes.done_of(conn, self.namespace, occurrences)

    async def overwrite(self, conn: Any, jobs: Sequence[tuple[PgJob, int]]) -> None:
        """Write ``(job, due)`` rows as pending at attempt 1 and their jobs' versions,
        creating or overwriting (whatever state the rows had): what a replace Redis
        accepted leaves."""
        await _writes.overwrite(conn, self.namespace, jobs)

    async def moved(self, conn: Any, job_id: str, due_ms: int, version: int) -> None:
        """A pending job's current occurrence is now at ``due_ms`` (attempt 1), ``version``."""
        await _writes.moved(conn, self.namespace, job_id, due_ms, version)

    def relayed_later(self, seqs: Sequence[int]) -> None:
        """Delete outbox rows whose jobs the producer wrote to Redis itself: in the next
        :meth:`schedule` of our own (the same statement, so no round trip of its own)
        when one comes before this loop runs a task, else from a task of this loop,
        together with the others that come meanwhile (one delete in flight): the
        producer does not wait for it. A delete that is lost (a crash, PostgreSQL down)
        is harmless: the relay writes the job to Redis again, which keeps it as it is,
        and deletes the row."""
        self._to_forget.extend(seqs)
        if self._forgetting is None:
            self._forgetting = asyncio.ensure_future(self._forget())

    async def _forget(self) -> None:
        try:
            # The write behind a schedule (_behind.py) hands its rows over while the
            # producer's next statement is on its way: let that one take them first.
            await asyncio.sleep(_FORGET_AFTER)
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
            await _relay.relayed(c, self.namespace, seqs)

    async def cancel_in(self, job_id: str, conn: Any) -> bool:
        """``cancel(conn=)``: remove the job iff the caller's transaction commits. Its
        row and outbox rows are deleted in that transaction, which holds the id to its
        end, beside a cancel mark; after the commit a relay (notified) removes the job
        from Redis, holding the id. Until then a claim of it finds no row and removes it
        unrun. A rollback leaves both stores as they were. True if the row was pending
        (Redis's state is not known in the transaction).

        Raises:
            PostgresUnavailable: if PostgreSQL fails.
        """
        async with self._on(conn) as c:
            found = await _writes.cancel_in(c, self.namespace, job_id)
            dropped = await c.fetch(_replacing.DROP, self.namespace, [job_id])  # superseded
            return found or bool(dropped and dropped[0][0])

    async def replace_in(
        self, conn: Any, specs: Sequence[JobSpec], shard_of: Any, limit: int
    ) -> list[ScheduleResult]:
        """``schedule(..., replace=True, conn=)`` in the caller's transaction
        (``_replacing.replace_in``)."""
        async with self._on(conn) as c:
            return await _replacing.replace_in(c, self.namespace, specs, shard_of, limit)

    async def cancel(self, job_id: str, conn: Any = None) -> bool:
        """Delete a job's row (and its outbox rows); True if there was a pending one."""
        async with self._on(conn) as c:
            return await _writes.cancel(c, self.namespace, job_id)

    # -- workers -------------------------------------------------------------------

    async def claimed(
        self, shard: int, epoch: int, ids: Sequence[str], nominals: Sequence[int], *cols: Any
    ) -> tuple[set[int], set[int]]:
        """Record ``epoch`` as the shard's (it only moves up) and return the 0-based
        positions of the claimed occurrences that are done already, and of those whose
        job has no row (cancelled: not to be run) or, given the entries' versions and
        attempts (``cols``), a row ahead of them (stale: 0012, 0013). An id without a row
        is looked at again once no replace of it is still committing (0006).

        Raises:
            Fenced: if PostgreSQL holds a higher epoch for the shard (its stored epoch
                is in :func:`stored_epoch` of the exception).
        """
        async with self._held(self._wline, shard) as c:  # as schedule's (_line.py)
            return await _writes.claim_check(
                c, self.namespace, shard, epoch, ids=ids, nominals=nominals, cols=cols
            )

    async def ack(self, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[int]:
        """Record occurrences done (and move recurring jobs on) in one transaction.

        Returns:
            Per ref: 1 acked, 2 acked and moved to its next occurrence, 3 done already,
            4 acked but the job had moved on to another occurrence (its row untouched).

        Raises:
            Fenced: if ``epoch`` is not the shard's stored epoch (nothing written).
        """
        async with self._held(self._wline, shard) as c:
            return await _writes.ack(c, self.namespace, shard, epoch, refs)

    async def skipped(self, shard: int, epoch: int, moves: Sequence[tuple[str, int, int]]) -> None:
        """Record recurring jobs a claim moved on unrun: ``(id, from, to)`` occurrences
        (a row moves only from its current one). Part of a claim under ``epoch``: a
        higher epoch is recorded, as :meth:`claimed` does.

        Raises:
            Fenced: if PostgreSQL holds a higher epoch for the shard (nothing written).
        """
        await self.open()
        async with self._conn(shard=shard) as c:
            await _writes.skipped(c, self.namespace, shard, epoch, moves)

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
            await _writes.dead(
                c,
                self.namespace,
                shard,
                epoch,
                job_id=job_id,
                attempt=attempt,
                nominal_ms=nominal_ms,
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
            await _writes.retried(
                c,
                self.namespace,
                shard,
                epoch,
                job_id=job_id,
                nominal_ms=nominal_ms,
                attempt=attempt,
                run_ms=run_ms,
            )

    async def reaped(
        self, shard: int, epoch: int, plan: Sequence[tuple[str, int, int, bool]], run_ms: int
    ) -> None:
        """Record, before Redis does it, what a reap is about to do: per ``(id, nominal,
        attempt, dead)`` lease, its occurrence runs next at ``run_ms`` as ``attempt``
        (never lowered), or it is dead. One round trip (migration 0007).

        Raises:
            Fenced: if ``epoch`` is not the shard's stored epoch (nothing written).
        """
        await self.open()
        async with self._conn(shard=shard) as c:
            await _writes.reaped(c, self.namespace, shard, epoch, plan=plan, run_ms=run_ms)

    async def undead(self, ids: Sequence[str], *, purge: bool) -> tuple[list[str], list[str]]:
        """Requeue (pending again at attempt 1) or purge (delete) the dead rows of
        ``ids``, before Redis. One round trip.

        Returns:
            The ids whose rows changed, and the ids Redis is to requeue or purge: those,
            and the ones a call that died between the stores left behind (a pending row
            for a requeue, no row for a purge). A dead letter that is not dead in
            PostgreSQL is never requeued or purged in Redis.
        """
        if not ids:
            return [], []
        await self.open()
        async with self._conn() as c:
            return await _writes.undead(c, self.namespace, ids, purge)

    # -- relay and reconcile -------------------------------------------------------

    async def shard_epochs(self) -> dict[int, int]:
        """The highest epoch recorded per shard."""
        await self.open()
        async with self._conn() as c:
            return await _relay.shard_epochs(c, self.namespace)

    @contextlib.asynccontextmanager
    async def outbox(self, limit: int) -> AsyncIterator[list[OutboxRow]]:
        """Lock up to ``limit`` outbox rows (oldest first, skipping rows another relay
        holds) for the body to write to Redis; delete them when the body returns. If it
        raises, the transaction rolls back and the rows stay for the next relay. A
        cancel mark comes with its id in ``cancel`` when the job has no row (the body
        removes it from Redis, holding the id), without it when the job has one again,
        and not at all (kept) while another transaction holds the id."""
        await self.open()
        async with self._conn() as c, c.transaction():
            batch = await _relay.take_outbox(c, self.namespace, limit)
            ids = [b.cancel for b in batch if b.cancel]
            if ids:  # cancel marks: kept while the id is held, dropped if it has a row
                locked, gone = await _relay.marks(c, self.namespace, ids)
                batch = [
                    b if b.cancel in gone else dataclasses.replace(b, cancel="")
                    for b in batch
                    if not b.cancel or b.cancel in locked
                ]
            yield batch
            if batch:
                await _relay.delete_outbox(c, [b.seq for b in batch])

    async def pending(self, after: tuple[int, str] | None, limit: int) -> list[PendingRow]:
        """A page of pending jobs in (due, id) order, after ``after`` (a partial index)."""
        await self.open()
        async with self._conn() as c:
            return await _relay.pending(c, self.namespace, after, limit)
