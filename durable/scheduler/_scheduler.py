"""The public facade: a :class:`Scheduler` ties the store, ownership and recurrence.

Ground rules:

- Every state change is one script call (or one MULTI/EXEC of script calls); nothing is
  kept only in this process's memory except the epochs of the shards it owns.
- Arguments are validated before anything is sent: a bad argument writes nothing.
- Scheduling the same id again is idempotent: by default the existing job is *kept*, so
  a client retry after a timeout never moves a due time. ``replace=True`` overwrites a
  job that is due (or dead); a leased (running) job is never replaced.
- Time decisions (due, lease expiry, missed runs) use Redis's clock; the client's clock
  is never read for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_CATCH_UP,
    DEFAULT_MISFIRE_GRACE_MS,
    DeadPage,
    JobInfo,
    JobSpec,
    MissedRun,
    Recurrence,
    RedisUnavailable,
    ScheduleResult,
    SchedulerStats,
    ShardCountMismatch,
    ShardInfo,
    async_client,
    check_job_id,
    finite_seconds_ms,
    int_between,
    when_args,
)
from tickwheel.durable.store import (
    DEFAULT_BUCKETS,
    DEFAULT_CALL_TIMEOUT,
    Client,
    EncodedJob,
    Keys,
    ServerReport,
    Store,
    WorkerBoard,
    check_server,
    encode_job,
)

from ._console import Console
from ._owner import DEFAULT_LEASE, MAX_BATCH, MAX_ERROR_CHARS, OwnerSide
from ._ownership import DEFAULT_OWNER_TTL, Ownership

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode, ReconcileResult

__all__ = ["DEFAULT_LEASE", "DEFAULT_SHARDS", "MAX_BATCH", "MAX_ERROR_CHARS", "Scheduler"]

# The source document's sizing: 16 shards keep each sorted set near 2 GB at 350 M jobs.
DEFAULT_SHARDS = 16
# Payloads live in Redis memory with every pending job: big blobs belong in a database,
# referenced by id from the payload.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
# How long (s) a completed occurrence is remembered for dedup. It must outlast client
# retries of a schedule and redeliveries after a lease expiry; each entry costs ~100 bytes
# of Redis memory, so at 600 jobs/s a day's window would hold 5 GB.
DEFAULT_DEDUP_WINDOW = 3600.0
# Retry backoff: base * 2 ** (attempt - 1), capped, with equal jitter (half fixed, half
# random) so a burst of failures does not retry in lockstep.
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_MAX = 600.0
# How long a producer write waits for its replicas (with replicas > 0): a healthy
# replica on a LAN confirms in about a millisecond; a second means it is far behind.
DEFAULT_REPLICA_TIMEOUT = 1.0


_DEFAULT_GRACE_S = DEFAULT_MISFIRE_GRACE_MS / 1000


class Scheduler(OwnerSide):
    """Durable delayed jobs in Redis: schedule, claim, ack, retry, reap.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` with
            ``decode_responses=False`` (see :func:`connect`).
        namespace: key prefix (hash-tagged per shard).
        shards: number of shards; stored in Redis on first use, a mismatch is refused.
        buckets: record hashes per shard (memory: see ``DEFAULT_BUCKETS``); stored and
            checked like ``shards``.
        max_payload_bytes: largest encoded payload accepted.
        dedup_window: seconds a completed occurrence stays in done.
        owner_ttl: seconds a shard owner's token lives without renewal.
        check: run :func:`check_server` on :meth:`open`.
        strict: make the server check raise instead of warn.
        retry_base: first retry delay (s); doubles per attempt.
        retry_max: cap of the retry delay (s).
        rng: randomness for jitter (a seeded ``random.Random`` in tests).
        replicas: schedule, cancel and reschedule return only once this many replicas
            hold the write (``WAIT``), so a master that dies right after cannot take
            the job with it. 0 (the default) does not wait: Redis replicates
            asynchronously, and a write acknowledged just before a failover can be
            lost.
        replica_timeout: seconds to wait for them; then :class:`ReplicationTimeout`
            (the write is on the master; retrying is safe). With ``replicas``, ack,
            retry and release wait too, so a completed job does not come back after
            a failover.
        call_timeout: seconds one call may wait for Redis (besides ``WAIT``) before it
            raises :class:`RedisUnavailable` (default 10; the clients :func:`connect`
            makes also time out each reply after 5 s).
        postgres_url: a ``postgresql://`` DSN: the Postgres mode (docs/postgres.md).
            Jobs and completed occurrences live in PostgreSQL, Redis indexes them;
            ``schedule`` takes ``conn=`` (the application's asyncpg connection). None
            (the default): Redis only, and the PostgreSQL code is never imported.

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """

    def __init__(
        self,
        client: Client,
        namespace: str = "tickwheel",
        *,
        shards: int = DEFAULT_SHARDS,
        buckets: int = DEFAULT_BUCKETS,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float | timedelta = DEFAULT_DEDUP_WINDOW,
        owner_ttl: float | timedelta = DEFAULT_OWNER_TTL,
        check: bool = True,
        strict: bool = False,
        retry_base: float | timedelta = DEFAULT_RETRY_BASE,
        retry_max: float | timedelta = DEFAULT_RETRY_MAX,
        rng: random.Random | None = None,
        replicas: int = 0,
        replica_timeout: float | timedelta = DEFAULT_REPLICA_TIMEOUT,
        call_timeout: float | timedelta = DEFAULT_CALL_TIMEOUT,
        postgres_url: str | None = None,
    ) -> None:
        async_client("client", client)  # a sync redis.Redis fails here, not in a call
        self.keys = Keys(namespace, shards, buckets)  # key names
        int_between("replicas", replicas, 0)
        self.store = Store(
            client,
            self.keys,
            replicas=replicas,
            replica_timeout_ms=finite_seconds_ms("replica_timeout", replica_timeout),
            call_timeout=finite_seconds_ms("call_timeout", call_timeout, minimum_ms=1) / 1000,
        )  # one method per script
        self.ownership = Ownership(self.store, ttl=owner_ttl)  # shards owned here
        self.max_payload_bytes = int_between("max_payload_bytes", max_payload_bytes, 1)
        self.dedup_window_ms = finite_seconds_ms("dedup_window", dedup_window, minimum_ms=1)
        self.retry_base_ms = finite_seconds_ms("retry_base", retry_base)
        self.retry_max_ms = finite_seconds_ms("retry_max", retry_max)
        self.check = check  # run the server check on open
        self.strict = strict  # server check raises
        self.server_report: ServerReport | None = None  # set by open() when checked
        self._rng = rng or random.Random()  # jitter
        self._opened = False  # shard count verified
        self._claims = {}  # the latest claim per shard (OwnerSide)
        self.ownership.on_fenced(self._forget_claim)
        # The Postgres mode (None: Redis only): PostgreSQL is the source of truth.
        self.pg: PostgresMode | None = None
        if postgres_url is not None:
            from tickwheel.durable.postgres import PgStore, PostgresMode  # noqa: PLC0415

            self.pg = PostgresMode(
                PgStore(postgres_url, namespace, call_timeout=self.store.call_timeout)
            )

    # -- lifecycle -----------------------------------------------------------------

    async def open(self) -> Scheduler:
        """Check the server (unless ``check=False``) and the namespace's shard count.

        Called on first use by every method; call it explicitly to fail early.

        Raises:
            ShardCountMismatch: if the namespace was created with another count.
            ServerCheckFailed: in strict mode, for a server that may lose jobs.
            RedisUnavailable: if Redis cannot be reached.
            SchemaNotReady, PostgresUnavailable: Postgres mode, checked first.
        """
        if self._opened:
            return self
        if self.pg is not None:  # a missing schema is refused before Redis is written
            await self.pg.store.open()
        if self.check:
            self.server_report = await check_server(self.store.client, strict=self.strict)
        shards, buckets = await self.store.init()
        if (shards, buckets) != (self.keys.shards, self.keys.buckets):
            raise ShardCountMismatch(
                self.keys.namespace, (shards, buckets), (self.keys.shards, self.keys.buckets)
            )
        self._opened = True
        return self

    async def close(self) -> None:
        """Give back every owned shard (their epochs are bumped) and close the
        connections this scheduler opened itself (the client given is left open)."""
        try:
            await self.ownership.give_back_all()
        finally:
            await self.store.aclose()
            if self.pg is not None:
                await self.pg.store.aclose()

    async def __aenter__(self) -> Scheduler:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def now(self, shard: int = 0) -> int:
        """Redis's now for ``shard`` (ms): max(TIME, the shard's clock)."""
        await self.open()
        return await self.store.now(shard)

    # -- producers -----------------------------------------------------------------

    async def schedule(
        self,
        job_id: str,
        task: str,
        payload: Any = b"",
        *,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
        replace: bool = False,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        every: float | timedelta | None = None,
        cron: str | None = None,
        missed: MissedRun | str = MissedRun.ONCE,
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        misfire_grace: float | timedelta = _DEFAULT_GRACE_S,
        conn: Any = None,
    ) -> ScheduleResult:
        """Schedule one job by id. One script call.

        Args:
            job_id: stable id (1 to 256 UTF-8 bytes).
            task: task name.
            payload: bytes, or a JSON-serialisable value.
            delay: seconds from Redis's now (added on the server); default now.
            at: absolute due: epoch ms or an aware datetime.
            replace: overwrite an existing job that is due or dead (never a leased one);
                by default an existing job is kept untouched. In the Postgres mode it
                needs both servers up (Redis decides, inside a PostgreSQL transaction
                holding the id) and cannot take ``conn``.
            max_attempts: attempts before the job goes dead.
            every: make it recurring every ``every`` seconds.
            cron: make it recurring on a cron expression (UTC).
            missed: missed-run policy of a recurring job: once, all or skip.
            max_catch_up: at most this many missed runs under ``all``.
            misfire_grace: seconds late before an occurrence counts as missed.
            conn: Postgres mode only: the application's open asyncpg connection. The
                job is written in its current transaction and exists iff that commits;
                the relay indexes it in Redis after the commit.

        Returns:
            The outcome: created, kept, replaced, busy or done.

        Raises:
            TypeError, ValueError: naming a bad parameter (nothing is written).
            ShardCountMismatch, RedisUnavailable: see :meth:`open`.
            PostgresUnavailable: Postgres mode: the transaction rolled back.

        Runtime complexity: O(log N) in the shard's pending jobs.
        """
        rec = self.recurrence(
            every=every,
            cron=cron,
            missed=missed,
            max_catch_up=max_catch_up,
            misfire_grace=misfire_grace,
        )
        spec = JobSpec(job_id, task, payload, delay, at, max_attempts, rec)
        if self.pg is not None or conn is not None:
            return (await self._pg_schedule([spec], replace, conn))[0]
        encoded = encode_job(spec, self.max_payload_bytes)
        if not self._opened:
            await self.open()
        shard = self.keys.shard_of(job_id)
        if rec is not None:  # (an await less for the common one-shot job)
            encoded = await self._first_run(shard, spec, encoded)
        return await self.store.schedule_one(shard, encoded, replace)

    async def _pg_schedule(
        self, specs: Sequence[JobSpec], replace: bool, conn: Any
    ) -> list[ScheduleResult]:
        if self.pg is None:
            raise ValueError("conn needs the Postgres mode (Scheduler(..., postgres_url=...))")
        if replace:
            if conn is not None:
                raise ValueError(
                    "replace=True cannot join the caller's transaction (conn=): whether"
                    " the job is leased is known only to Redis, at the moment of the"
                    " replace; schedule without conn, or without replace"
                )
            return await self.pg.replace(self, specs)
        if not self._opened:
            # The namespace's shard count is checked before anything is written (a
            # mismatch raises); a Redis that is down does not stop the enqueue.
            with contextlib.suppress(RedisUnavailable):
                await self.open()
        return await self.pg.schedule(self, specs, conn)

    @staticmethod
    def recurrence(
        *,
        every: float | timedelta | None = None,
        cron: str | None = None,
        missed: MissedRun | str = MissedRun.ONCE,
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        misfire_grace: float | timedelta = _DEFAULT_GRACE_S,
    ) -> Recurrence | None:
        """Build the recurrence of ``every`` or ``cron`` (None when neither is given).

        Raises:
            TypeError, ValueError: naming a bad parameter.
        """
        if every is not None and cron is not None:
            raise ValueError("give every or cron, not both")
        if every is not None:
            return Recurrence.interval(
                every, missed=missed, max_catch_up=max_catch_up, misfire_grace=misfire_grace
            )
        if cron is not None:
            return Recurrence.cron_expr(
                cron, missed=missed, max_catch_up=max_catch_up, misfire_grace=misfire_grace
            )
        if (
            missed is not MissedRun.ONCE
            or max_catch_up != DEFAULT_MAX_CATCH_UP
            or misfire_grace != _DEFAULT_GRACE_S
        ):
            # Validate the policy arguments even without a recurrence: a typo must not
            # pass. (Skipped at the defaults: single schedules are a hot path.)
            Recurrence.interval(
                1, missed=missed, max_catch_up=max_catch_up, misfire_grace=misfire_grace
            )
        return None

    async def _first_run(self, shard: int, spec: JobSpec, encoded: EncodedJob) -> EncodedJob:
        """A recurring job without delay/at starts at its first occurrence after now."""
        rec = spec.recurrence
        if rec is None or spec.delay is not None or spec.at is not None:
            return encoded
        if rec.every_ms:
            spec = dataclasses.replace(spec, delay=rec.every_ms / 1000)
        else:
            now = await self.store.now(shard)
            spec = dataclasses.replace(spec, at=rec.next_after(now, now))
        return encode_job(spec, self.max_payload_bytes)

    async def schedule_many(
        self, specs: Iterable[JobSpec], *, replace: bool = False, conn: Any = None
    ) -> list[ScheduleResult]:
        """Schedule many jobs in one round trip: one script call per shard (per
        ``MAX_BATCH`` jobs), in one MULTI/EXEC (all or nothing on a single Redis).

        Args:
            specs: the jobs (validated on construction).
            replace: as in :meth:`schedule`.
            conn: as in :meth:`schedule` (Postgres mode: every job in one transaction).

        Returns:
            One result per job, grouped by shard (each carries its id).

        Raises:
            TypeError, ValueError: for an invalid spec or payload (nothing is written).
        """
        groups: dict[int, list[EncodedJob]] = {}
        pending: list[tuple[int, JobSpec, EncodedJob]] = []
        shard_of = self.keys.shard_of
        limit = self.max_payload_bytes
        for spec in specs:
            if not isinstance(spec, JobSpec):
                raise TypeError(f"specs must hold JobSpec values, got {spec!r}")
            pending.append((shard_of(spec.id), spec, encode_job(spec, limit)))
        if self.pg is not None or conn is not None:
            return await self._pg_schedule([spec for _, spec, _ in pending], replace, conn)
        await self.open()
        for shard, spec, encoded in pending:
            group = groups.get(shard)
            if group is None:
                group = groups[shard] = []
            if spec.recurrence is None:  # no first run to find (and no await per job)
                group.append(encoded)
            else:
                group.append(await self._first_run(shard, spec, encoded))
        chunked = {
            shard: [jobs[i : i + MAX_BATCH] for i in range(0, len(jobs), MAX_BATCH)]
            for shard, jobs in groups.items()
        }
        if not chunked:
            return []
        return await self.store.schedule_many(chunked, replace)

    async def cancel(self, job_id: str) -> bool:
        """Remove a job in any state; True if there was one. A leased job's holder
        gets :class:`LeaseLost` on ack. O(log N)."""
        check_job_id(job_id)
        if self.pg is not None:  # both stores, in a transaction holding the id
            found, state = await self.pg.cancel(self, job_id)
            return state is not None or found
        await self.open()
        return await self.store.cancel(self.keys.shard_of(job_id), job_id) is not None

    async def reschedule(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
    ) -> bool:
        """Move a due job to a new due time (a new occurrence, attempt 1). O(log N).

        Returns:
            True if moved; False if there is no such job, it is leased or dead, or the
            new occurrence is done already.

        Raises:
            TypeError, ValueError: naming a bad parameter.
        """
        check_job_id(job_id)
        mode, time_ms = when_args(delay, at)
        if self.pg is not None:  # Redis moves it inside PostgreSQL's lock on the row
            return await self.pg.reschedule(self, job_id, mode, time_ms)
        await self.open()
        status, _ = await self.store.reschedule(self.keys.shard_of(job_id), job_id, mode, time_ms)
        return status == 1

    async def get(self, job_id: str) -> JobInfo | None:
        """One job's state and record, or None if it is done or unknown. O(log N)."""
        check_job_id(job_id)
        await self.open()
        return await self.store.get(self.keys.shard_of(job_id), job_id)

    # -- Postgres mode -------------------------------------------------------------

    async def relay(self) -> int:
        """Postgres mode: write the outbox's committed jobs to Redis (see
        :meth:`PostgresMode.relay`); return the rows handled. Workers run it on
        every commit notification and every second."""
        if self.pg is None:
            raise ValueError("relay needs the Postgres mode (Scheduler(..., postgres_url=...))")
        return await self.pg.relay_all(self)

    async def reconcile(self, *, if_free: bool = False) -> ReconcileResult:
        """Postgres mode: rebuild the Redis index from PostgreSQL (see
        :meth:`PostgresMode.reconcile`). Idempotent; safe beside running workers.
        ``if_free``: skip (``skipped`` set) while another reconcile of the namespace
        runs, as workers do."""
        if self.pg is None:
            raise ValueError("reconcile needs the Postgres mode (Scheduler(..., postgres_url=...))")
        return await self.pg.reconcile(self, if_free=if_free)

    # -- dead letters --------------------------------------------------------------

    async def dead_letters(self, shard: int, *, offset: int = 0, count: int = 100) -> DeadPage:
        """A page of one shard's dead letters, oldest first."""
        self.keys.shard(shard)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        int_between("count", count, 1, MAX_BATCH)
        await self.open()
        return await self.store.dead_list(shard, offset, count)

    async def requeue_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Put dead letters back to due now, attempt 1; return the ids requeued."""
        return await self._undead(job_ids, purge=False)

    async def purge_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Delete dead letters for good; return the ids purged."""
        return await self._undead(job_ids, purge=True)

    async def _undead(self, job_ids: Sequence[str], *, purge: bool) -> list[str]:
        groups = self._by_shard(job_ids)
        await self.open()  # the shard count is checked before anything is written
        act = self.store.dead_purge if purge else self.store.dead_requeue
        out: list[str] = []
        for shard, ids in groups.items():
            out += await act(shard, ids, len(ids))
        if self.pg is not None:
            await self.pg.store.undead(out, purge=purge)
        return out

    async def purge_all_dead(self, shard: int, *, limit: int = MAX_BATCH) -> list[str]:
        """Delete the oldest ``limit`` dead letters of ``shard``."""
        self.keys.shard(shard)
        int_between("limit", limit, 1, MAX_BATCH)
        await self.open()
        out = await self.store.dead_purge(shard, [], limit)
        if self.pg is not None:
            await self.pg.store.undead(out, purge=True)
        return out

    def _by_shard(self, job_ids: Sequence[str]) -> dict[int, list[str]]:
        if isinstance(job_ids, str):
            raise TypeError("job_ids must be a sequence of ids, not a str")
        groups: dict[int, list[str]] = {}
        for job_id in job_ids:
            groups.setdefault(self.keys.shard_of(check_job_id(job_id)), []).append(job_id)
        return groups

    # -- operators -----------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """A snapshot of this scheduler's counters: claims, acks, retries, dead letters,
        reaps, fenced calls, dedup drops and shard moves (its Reaper counts here too).

        Runtime complexity: O(1); no Redis call.
        """
        return self.ownership.counters.snapshot()

    async def inspect(self) -> list[ShardInfo]:
        """One read-only look at every shard: counts, overdue lag, owner, next due.

        Returns:
            One :class:`ShardInfo` per shard, in shard order (one script call each).

        Raises:
            ShardCountMismatch, RedisUnavailable: see :meth:`open`.
        """
        await self.open()
        return [await self.store.inspect(shard) for shard in range(self.keys.shards)]

    async def requeue_all_dead(self, shard: int, *, limit: int = MAX_BATCH) -> list[str]:
        """Put the oldest ``limit`` dead letters of ``shard`` back to due now, attempt 1;
        return the ids requeued.

        Raises:
            ValueError: for a shard out of range or a bad ``limit``.
        """
        self.keys.shard(shard)
        int_between("limit", limit, 1, MAX_BATCH)
        await self.open()
        out = await self.store.dead_requeue(shard, [], limit)
        if self.pg is not None:
            await self.pg.store.undead(out, purge=False)
        return out

    # == For the worker and the operator tools (issue 32) ==============================
    # runtime/ and ops/ reach Redis through the scheduler, never through ``self.store``:
    # the worker's membership and stats, and the dashboard's console.

    @functools.cached_property
    def workers(self) -> WorkerBoard:
        """The namespace's worker set and stats documents (workers write, the dashboard
        reads)."""
        return WorkerBoard(self.store)

    @functools.cached_property
    def console(self) -> Console:
        """The dashboard's reads and acts, which never open the scheduler."""
        return Console(self)

    async def close_connections(self) -> None:
        """Close the connections this scheduler opened itself (the store's, the Postgres
        mode's pool), without giving shards back: :meth:`close` without Redis calls."""
        try:
            await self.store.aclose()
        finally:
            if self.pg is not None:
                await self.pg.store.aclose()
