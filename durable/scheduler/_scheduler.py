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

import functools
import random
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_CATCH_UP,
    MissedRun,
    ScheduleResult,
    SchedulerStats,
    ShardCountMismatch,
    async_client,
    finite_seconds_ms,
    int_between,
)
from tickwheel.durable.store import (
    DEFAULT_BUCKETS,
    DEFAULT_CALL_TIMEOUT,
    Client,
    HistoryBoard,
    Keys,
    ServerReport,
    Store,
    WorkerBoard,
    check_server,
)

from ._console import Console
from ._forwarding import forward_to as _forward
from ._leases import DEFAULT_LEASE, MAX_BATCH, MAX_ERROR_CHARS, Leases
from ._operator import Operator
from ._pause import Pauses
from ._producer import DEFAULT_GRACE_S, Producer, build_spec, check_tasks, recurrence
from ._shard_owner import DEFAULT_OWNER_TTL, Ownership
from ._tracing import Tracing, make_tracing

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


class Scheduler:
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
        owner_ttl: seconds a shard owner's token lives without renewal (renewed every
            fifth of it): a dead worker's shards are taken over within ``owner_ttl``
            plus a fifth of it.
        worker_id: a stable owner token (and worker id) for this process, e.g. the
            name of its deployment slot; None (the default): a random one. A process
            restarted with the same ``worker_id`` takes its predecessor's shards at
            once (each under a new epoch, so the predecessor is fenced), instead of
            waiting ``owner_ttl`` for its tokens to expire. Give each process running
            at the same time its own: two live processes with one id keep taking
            shards from each other (fenced, so no job is lost, but nothing runs well).
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
        tasks: opt-in check of task names: a collection of the names a worker runs
            (the worker's ``TaskRegistry``, or a set of names). A schedule naming
            another task is a ``ValueError`` naming it, and nothing is written. Kept by
            reference: tasks registered later are known. None (the default): any
            name is scheduled (a producer need not import the worker's code).
        tracing: OpenTelemetry spans (docs/tracing.md; needs ``tickwheel[otel]``):
            schedules are ``PRODUCER`` spans whose trace context the jobs carry, and a
            worker on this scheduler makes each run a ``CONSUMER`` span in that trace,
            and its claim and reap rounds spans. False (the default): no span, and
            OpenTelemetry is never imported.

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
        tasks: Collection[str] | None = None,
        worker_id: str | None = None,
        tracing: bool = False,
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
        self.ownership = Ownership(self.store, token=worker_id, ttl=owner_ttl)  # shards owned here
        self.max_payload_bytes = int_between("max_payload_bytes", max_payload_bytes, 1)
        self.dedup_window_ms = finite_seconds_ms("dedup_window", dedup_window, minimum_ms=1)
        retry_base_ms = finite_seconds_ms("retry_base", retry_base)
        retry_max_ms = finite_seconds_ms("retry_max", retry_max)
        self.check = check  # run the server check on open
        self.strict = strict  # server check raises
        self.server_report: ServerReport | None = None  # set by open() when checked
        self._opened = False  # shard count verified
        # The Postgres mode (None: Redis only): PostgreSQL is the source of truth.
        self.pg: PostgresMode | None = None
        if postgres_url is not None:
            from tickwheel.durable.postgres import PgStore, PostgresMode  # noqa: PLC0415

            self.pg = PostgresMode(
                PgStore(postgres_url, namespace, call_timeout=self.store.call_timeout)
            )
        # OpenTelemetry spans (the producer's, a worker's), or None: off.
        self.tracer: Tracing | None = make_tracing(tracing, namespace)
        # Jobs by id (Producer): schedule, cancel, reschedule, get.
        self.producer = Producer(
            self.store,
            self.keys,
            self.open,
            max_payload_bytes=self.max_payload_bytes,
            redis_side=self,
            pg=self.pg,
            tasks=check_tasks(tasks),
            tracer=self.tracer,
        )
        # The calls a shard's owner makes under its epoch (the worker calls it directly).
        self.leases = Leases(
            self.store,
            self.keys,
            self.ownership,
            dedup_window_ms=self.dedup_window_ms,
            retry_base_ms=retry_base_ms,
            retry_max_ms=retry_max_ms,
            rng=rng or random.Random(),
            pg=self.pg,
            after_claim=None if self.pg is None else functools.partial(self.pg.after_claim, self),
        )
        if self.pg is not None:  # a reap is recorded in PostgreSQL before Redis makes it
            self.ownership.before_reap = functools.partial(self.pg.before_reap, self)

    # -- lifecycle -----------------------------------------------------------------

    async def open(self) -> Scheduler:
        """Check the server (unless ``check=False``) and the namespace's shard count.

        Called on first use by every method; call it explicitly to fail early.

        Raises:
            ShardCountMismatch: if the namespace was created with another count.
            PostgresModeRequired: if the namespace is in the Postgres mode and this
                scheduler has no ``postgres_url`` (the Postgres mode records it on
                its first open). Nothing is written.
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
        shards, buckets = await self.store.init(postgres=self.pg is not None)
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
            if self.pg is not None:  # the writes behind, bounded (else the relays')
                await self.pg.behind.aclose(self.store.call_timeout)
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
        tz: str | None = None,
        missed: MissedRun | str = MissedRun.ONCE,
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        misfire_grace: float | timedelta = DEFAULT_GRACE_S,
        jitter: float | timedelta | None = None,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the job's, not the call's)
        debounce: float | timedelta | None = None,
        max_wait: float | timedelta | None = None,
        throttle: float | timedelta | None = None,
        key: str | None = None,
        priority: int = 0,
        conn: Any = None,
    ) -> ScheduleResult:
        """Schedule one job by id. One script call.

        Args:
            job_id: stable id (1 to 256 UTF-8 bytes).
            task: task name.
            payload: bytes, or a JSON value that comes back equal (str keys, no tuple,
                at most MAX_PAYLOAD_DEPTH deep: see model/_payload.py).
            delay: seconds from Redis's now (added on the server); default now.
            at: absolute due: epoch ms or an aware datetime.
            replace: overwrite an existing job that is due or dead (never a leased one);
                by default an existing job is kept untouched. In the Postgres mode it
                needs both servers up (Redis decides, inside a PostgreSQL transaction
                holding the id) and cannot take ``conn``.
            max_attempts: attempts before the job goes dead.
            every: make it recurring every ``every`` seconds.
            cron: make it recurring on a cron expression (UTC unless ``tz``).
            tz: the IANA zone ``cron`` reads in (``"Europe/Paris"``); DST changes
                follow Debian cron's rules (docs/timezones.md).
            missed: missed-run policy of a recurring job: once, all or skip.
            max_catch_up: at most this many missed runs under ``all``.
            misfire_grace: seconds late before an occurrence counts as missed.
            jitter: a recurring job only (else a ValueError): each run is up to this
                many seconds after its occurrence, by a hash of (id, occurrence), never
                before it; the occurrence stays the nominal instant (dedup, missed-run
                policy). At most a week. docs/timezones.md, "Jitter".
            timeout: seconds this job's handler may run before it is stopped (the
                attempt fails with reason timeout), before its task's ``timeout`` and
                the worker's ``default_timeout``; None: theirs.
            debounce: seconds: each schedule of this id while its job waits moves its
                due to now + ``debounce`` (the payload is the latest one); one-shot
                jobs without ``delay``/``at`` only; not in the Postgres mode.
            max_wait: with ``debounce``: due at most this long after the burst's first
                schedule.
            throttle: seconds: at most one run of this id per ``throttle`` (by due
                time); a schedule while its job waits coalesces into it
                (``COALESCED``, payload replaced). docs/durable.md, "Debounce and
                throttle".
            key: the flow key (``"merchant:42"``, at most 200 UTF-8 bytes): the
                task's ``concurrency`` and ``rate`` limits count per key
                (docs/limits.md); None: the task's single key.
            priority: 0 (the default and lowest) to 9: among the jobs that are due, a
                higher priority is claimed first, never before its due; a job late by
                more than the workers' ``priority_aging`` (60 s) goes before any
                priority. docs/durable.md, "Priorities".
            conn: Postgres mode only: the application's open asyncpg connection. The
                job is written in its current transaction and exists iff that commits;
                the relay indexes it in Redis after the commit. With ``replace`` the
                replacement is written there and a relay applies it after the commit
                (a leased job's once its run ended; docs/postgres.md).

        Returns:
            The outcome: created, kept, replaced, busy or done.

        Raises:
            TypeError, ValueError: naming a bad parameter (nothing is written).
            ShardCountMismatch, RedisUnavailable: see :meth:`open`.
            PostgresUnavailable: Postgres mode: the transaction rolled back.

        Runtime complexity: O(log N) in the shard's pending jobs.
        """
        spec = build_spec(
            job_id,
            task,
            payload,
            delay=delay,
            at=at,
            max_attempts=max_attempts,
            every=every,
            cron=cron,
            tz=tz,
            missed=missed,
            max_catch_up=max_catch_up,
            misfire_grace=misfire_grace,
            jitter=jitter,
            timeout=timeout,
            debounce=debounce,
            max_wait=max_wait,
            throttle=throttle,
            key=key,
            priority=priority,
        )
        return await self.producer.schedule(spec, replace, conn)

    recurrence = staticmethod(recurrence)
    schedule_many = _forward("producer", Producer.schedule_many)
    cancel = _forward("producer", Producer.cancel)
    cancel_job = _forward("producer", Producer.cancel_job)
    reschedule = _forward("producer", Producer.reschedule)
    get = _forward("producer", Producer.get)

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

    # -- owners: delegated to self.leases (Leases; the worker calls it directly) -----

    async def take(self, shard: int) -> int | None:
        """Take a shard if free; return its new epoch, or None if another owner holds it."""
        self.keys.shard(shard)
        await self.open()
        return await self.ownership.take(shard)

    claim = _forward("leases", Leases.claim)
    ack = _forward("leases", Leases.ack)
    ack_many = _forward("leases", Leases.ack_many)
    retry = _forward("leases", Leases.retry)
    extend = _forward("leases", Leases.extend)
    release = _forward("leases", Leases.release)
    reap = _forward("leases", Leases.reap)
    process = _forward("leases", Leases.process)

    def backoff_ms(self, attempt: int) -> int:
        """The retry delay after failed attempt ``attempt``: :meth:`Leases.backoff_ms`."""
        return self.leases.backoff_ms(attempt)

    # -- operators: delegated to self.operator (Operator) ---------------------------

    @functools.cached_property
    def operator(self) -> Operator:
        """Inspect and the dead-letter calls, each after :meth:`open`."""
        return Operator(self.store, self.keys, self.open, pg=self.pg)

    inspect = _forward("operator", Operator.inspect)
    dead_letters = _forward("operator", Operator.dead_letters)
    requeue_dead = _forward("operator", Operator.requeue_dead)
    purge_dead = _forward("operator", Operator.purge_dead)
    requeue_all_dead = _forward("operator", Operator.requeue_all_dead)
    purge_all_dead = _forward("operator", Operator.purge_all_dead)
    limits, key_state = (
        _forward("operator", Operator.limits),
        _forward("operator", Operator.key_state),
    )
    limit_waiting = _forward("operator", Operator.limit_waiting)

    # -- pause and resume: delegated to self.pauses (Pauses) ----------------------------

    @functools.cached_property
    def pauses(self) -> Pauses:
        """Pause, resume and the pause state, each after :meth:`open` (in the Postgres
        mode, recorded in PostgreSQL first)."""
        pg = self.pg
        if pg is None:
            return Pauses(self.store, self.open)
        record = (functools.partial(pg.pause, self), functools.partial(pg.resume, self))
        return Pauses(self.store, self.open, record)

    pause = _forward("pauses", Pauses.pause)
    resume = _forward("pauses", Pauses.resume)
    paused = _forward("pauses", Pauses.paused)

    def stats(self) -> SchedulerStats:
        """A snapshot of this scheduler's counters: claims, acks, retries, dead letters,
        reaps, fenced calls, dedup drops and shard moves (its Reaper counts here too).

        Runtime complexity: O(1); no Redis call.
        """
        return self.ownership.counters.snapshot()

    # == For the worker and the operator tools (issue 32) ==============================
    # runtime/ and ops/ reach Redis through the scheduler, never through ``self.store``:
    # the worker's membership and stats, and the dashboard's console.

    @functools.cached_property
    def workers(self) -> WorkerBoard:
        """The namespace's worker set and stats documents (workers write, the dashboard
        reads)."""
        return WorkerBoard(self.store)

    @functools.cached_property
    def history(self) -> HistoryBoard:
        """The shards' histories of finished attempts (workers write, the dashboard
        reads)."""
        return HistoryBoard(self.store)

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
