"""The synchronous producer: :class:`SyncScheduler`, for code without an event loop.

It has the producer methods of :class:`Scheduler` (schedule, schedule_many, cancel,
reschedule, get, now) with the same arguments, results and errors, and runs the same
code for everything but the I/O: the arguments become a :class:`JobSpec` by
``_producer.build_spec``, jobs are encoded by the store's codec, grouped by
``_producer.chunk_groups``, and each call's keys, arguments and reply come from
``store/_calls.py``; only the sending (``store/_sync_store.py``'s :class:`SyncStore`) differs.

The Postgres mode (``postgres_url=``, docs/postgres.md) covers enqueue only:
``schedule`` and ``schedule_many`` write the job rows and outbox rows in the
application's transaction (``conn=``: a psycopg 3 ``Connection``, a SQLAlchemy
``Connection`` or ``Session``, Django's connection inside ``transaction.atomic()``), or in
a transaction of their own on a psycopg connection. The job exists iff that transaction
commits; the workers' relays write it to Redis (the commit notifies them). ``cancel``
and ``reschedule`` act on both stores in a PostgreSQL transaction of their own holding
the id, as the asyncio :class:`Scheduler`'s do. ``replace=True`` writes the replacement
(in ``conn``'s transaction, or one of its own) and the relays apply it after the commit
(``postgres/_replacing.py``): a leased job is replaced once its run has ended.

Thread-safe: one SyncScheduler may be shared by every thread of a process (redis-py's
pool hands each call a connection); the only state it changes is whether the layout
was checked, under a lock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_CATCH_UP,
    JobInfo,
    JobSpec,
    MissedRun,
    RedisUnavailable,
    ScheduleResult,
    ShardCountMismatch,
    check_job_id,
    finite_seconds_ms,
    int_between,
    when_args,
)
from tickwheel.durable.store import (
    DEFAULT_BUCKETS,
    DEFAULT_CALL_TIMEOUT,
    Keys,
    SyncClient,
    SyncStore,
    encode_job,
    sync_client_from_url,
)

from ._flow import check_flow_mode
from ._pause import pause_field
from ._producer import (
    DEFAULT_GRACE_S,
    build_spec,
    check_tasks,
    chunk_groups,
    encode_specs,
    first_run_needs_now,
    known_task,
    recurrence,
    with_first_run,
)
from ._scheduler import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_SHARDS
from ._tracing import Tracing, make_tracing

if TYPE_CHECKING:
    from tickwheel.durable.postgres import SyncPgPool

__all__ = ["SyncScheduler"]


def _no_conn(conn: object) -> None:
    if conn is not None:
        raise ValueError("conn needs the Postgres mode (SyncScheduler(..., postgres_url=...))")


class SyncScheduler:
    """Schedule, cancel, reschedule and read durable jobs from synchronous code.

    The producer half of :class:`Scheduler`, blocking: each method is one Redis round
    trip (a recurring cron job's first schedule two). Workers still run on asyncio.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` with
            ``decode_responses=False`` (see :meth:`from_url`). A plain client's calls go
            through a pool of the scheduler's own with the same settings, its socket
            timeouts capped at ``call_timeout``; a cluster client needs a socket timeout.
        namespace: as for :class:`Scheduler`.
        shards: as for :class:`Scheduler`; a namespace's shard count is checked on
            first use.
        buckets: as for :class:`Scheduler`; checked on first use as the shard count is.
        max_payload_bytes: as for :class:`Scheduler`.
        call_timeout: seconds one call may wait for Redis before it raises
            :class:`RedisUnavailable` (default 10).
        tasks: as for :class:`Scheduler`: the task names a schedule may name (a
            ``TaskRegistry`` or a set), or None for any.
        postgres_url: a ``postgresql://`` DSN: the Postgres mode's enqueue (see above);
            ``schedule`` and ``schedule_many`` then take ``conn=``.
        tracing: OpenTelemetry ``PRODUCER`` spans, the jobs carrying their trace
            context (:class:`Scheduler`'s ``tracing``; needs ``tickwheel[otel]``).

    Raises:
        TypeError, ValueError: naming a bad parameter (an asyncio client is a TypeError).
    """

    def __init__(
        self,
        client: SyncClient,
        namespace: str = "tickwheel",
        *,
        shards: int = DEFAULT_SHARDS,
        buckets: int = DEFAULT_BUCKETS,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        call_timeout: float | timedelta = DEFAULT_CALL_TIMEOUT,
        tasks: Collection[str] | None = None,
        postgres_url: str | None = None,
        tracing: bool = False,
    ) -> None:
        self.keys = Keys(namespace, shards, buckets)
        self.tasks = check_tasks(tasks)  # the known task names, or None: any
        self.tracer: Tracing | None = make_tracing(tracing, namespace)  # None: off
        self.max_payload_bytes = int_between("max_payload_bytes", max_payload_bytes, 1)
        seconds = finite_seconds_ms("call_timeout", call_timeout, minimum_ms=1) / 1000
        self.postgres_url = postgres_url
        self._pg_pool: SyncPgPool | None = None
        if postgres_url is not None:
            from tickwheel.durable.postgres import PgStore, SyncPgPool  # noqa: PLC0415

            PgStore(postgres_url, namespace)  # checks the URL; opens nothing
            self._pg_pool = SyncPgPool(postgres_url, seconds)
        self.store = SyncStore(client, self.keys, call_timeout=seconds)
        self._lock = threading.Lock()  # guards _opened
        self._opened = False

    @classmethod
    def from_url(cls, url: str, namespace: str = "tickwheel", **kwargs: Any) -> SyncScheduler:
        """A SyncScheduler on a client of its own for ``url`` (one Redis, or a cluster
        named as :func:`connect` takes it: ``redis+cluster://`` or several hosts), with
        socket timeouts and no retries. :meth:`close` closes that client."""
        seconds = kwargs.get("call_timeout", DEFAULT_CALL_TIMEOUT)
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        client = sync_client_from_url(url, socket_timeout=seconds, socket_connect_timeout=seconds)
        sched = cls(client, namespace, **kwargs)
        sched._client = client
        return sched

    _client: SyncClient | None = None  # made by from_url: closed by close()

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> SyncScheduler:
        """Check the namespace's shard and bucket counts (storing them on first use).

        Called on first use by every method. Unlike :meth:`Scheduler.open` it does not
        run the server check (``tickwheel check`` does).

        Raises:
            ShardCountMismatch: if the namespace was created with other counts.
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._opened:
            return self
        with self._lock:
            if not self._opened:
                stored = self.store.init(postgres=self._pg_pool is not None)
                wanted = (self.keys.shards, self.keys.buckets)
                if stored != wanted:
                    raise ShardCountMismatch(self.keys.namespace, stored, wanted)
                self._opened = True
        return self

    def close(self) -> None:
        """Close the connections this scheduler opened (never the client given)."""
        self.store.close()
        if self._pg_pool is not None:
            self._pg_pool.close()
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> SyncScheduler:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self, shard: int = 0) -> int:
        """Redis's now for ``shard`` (ms): max(TIME, the shard's clock)."""
        self.keys.shard(shard)
        self.open()
        return self.store.now(shard)

    # -- producers: the arguments, results and errors of Scheduler's -----------------

    recurrence = staticmethod(recurrence)

    def schedule(
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
        timeout: float | timedelta | None = None,
        debounce: float | timedelta | None = None,
        max_wait: float | timedelta | None = None,
        throttle: float | timedelta | None = None,
        key: str | None = None,
        priority: int = 0,
        conn: Any = None,
    ) -> ScheduleResult:
        """Schedule one job by id: :meth:`Scheduler.schedule`, blocking. ``conn``: the
        application's connection in its transaction (Postgres mode only, see the class).

        Raises:
            TypeError, ValueError: naming a bad parameter (nothing is written).
            ShardCountMismatch, RedisUnavailable: see :meth:`open`.
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
        known_task(self.tasks, spec.task)
        if spec.flow[0]:
            check_flow_mode(spec, self.postgres_url is not None or conn is not None)
            self.open()
            encoded = encode_job(spec, self.max_payload_bytes)
            return self.store.schedule_flow(self.keys.shard_of(spec.id), encoded, spec.flow)
        if self.postgres_url is None:
            _no_conn(conn)
        if self.tracer is not None:
            with self.tracer.producing("schedule", [spec.id]) as header:
                (spec,) = self.tracer.traced([spec], header)
                return self._schedule_one(spec, replace, conn)
        return self._schedule_one(spec, replace, conn)

    def _schedule_one(self, spec: JobSpec, replace: bool, conn: Any) -> ScheduleResult:
        if self.postgres_url is not None:
            return self._pg_schedule([spec], replace, conn)[0]
        encoded = encode_job(spec, self.max_payload_bytes)
        self.open()
        shard = self.keys.shard_of(spec.id)
        if spec.recurrence is not None:
            now = self.store.now(shard) if first_run_needs_now(spec) else None
            encoded = with_first_run(spec, encoded, self.max_payload_bytes, now)
        return self.store.schedule_one(shard, encoded, replace)

    def schedule_many(
        self, specs: Iterable[JobSpec], *, replace: bool = False, conn: Any = None
    ) -> list[ScheduleResult]:
        """Many jobs: :meth:`Scheduler.schedule_many`, blocking, in the same bounded
        rounds (at most 2,000 jobs and 2 MiB each, one round trip each, bounded by
        ``call_timeout``). On one Redis each round is one MULTI/EXEC (a batch that
        fits one round is all or nothing); on a cluster each shard chunk is one call,
        atomic on its own. On an error the rounds before the failed one are written,
        the failed one perhaps, the rest not; retrying the whole call is safe, with
        the outcomes :meth:`Scheduler.schedule_many` describes.

        Raises:
            TypeError, ValueError: for an invalid spec or payload (nothing is written).
        """
        if self.tasks is not None:
            specs = list(specs)
            for spec in specs:
                if isinstance(spec, JobSpec):  # anything else: encode_specs' TypeError
                    known_task(self.tasks, spec.task)
        if self.postgres_url is None:
            _no_conn(conn)
        if self.tracer is not None:
            specs = list(specs)
            ids = [s.id if isinstance(s, JobSpec) else "" for s in specs]
            with self.tracer.producing("schedule_many", ids) as header:
                return self._schedule_many(self.tracer.traced(specs, header), replace, conn)
        return self._schedule_many(specs, replace, conn)

    def _schedule_many(
        self, specs: Iterable[JobSpec], replace: bool, conn: Any
    ) -> list[ScheduleResult]:
        pending = encode_specs(specs, self.keys, self.max_payload_bytes)
        if self.postgres_url is not None:
            return self._pg_schedule([spec for _, spec, _ in pending], replace, conn)
        self.open()
        limit = self.max_payload_bytes
        chunked = chunk_groups(
            [
                (
                    shard,
                    encoded
                    if spec.recurrence is None
                    else with_first_run(
                        spec,
                        encoded,
                        limit,
                        self.store.now(shard) if first_run_needs_now(spec) else None,
                    ),
                )
                for shard, spec, encoded in pending
            ]
        )
        if not chunked:
            return []
        return self.store.schedule_many(chunked, replace)

    def _pg_schedule(self, specs: list[JobSpec], replace: bool, conn: Any) -> list[ScheduleResult]:
        from tickwheel.durable.postgres import enqueue_sync, replace_sync  # noqa: PLC0415

        assert self._pg_pool is not None
        return (replace_sync if replace else enqueue_sync)(
            conn,
            self._pg_pool,
            self.keys.namespace,
            specs,
            shard_of=self.keys.shard_of,
            limit=self.max_payload_bytes,
            before_write=self._open_for_pg,
        )

    def _open_for_pg(self) -> None:
        """The namespace's shard count checked (and its mode recorded) before a Postgres
        enqueue writes; a Redis that is down does not stop the enqueue (the relay's)."""
        with contextlib.suppress(RedisUnavailable):
            self.open()

    def cancel(self, job_id: str, *, conn: Any = None) -> bool:
        """Remove a job in any state; True if there was one (:meth:`Scheduler.cancel`).
        In the Postgres mode, from both stores in one PostgreSQL transaction holding the
        id, as the asyncio :class:`Scheduler` does (docs/postgres.md).

        ``conn`` (Postgres mode): the application's synchronous connection in its
        transaction (psycopg 3, a SQLAlchemy ``Connection`` or ``Session``, or Django's
        ``connection`` inside ``transaction.atomic()``): the job is removed iff that
        transaction commits (its row in it, Redis by the relays after the commit); True
        if PostgreSQL had it pending.

        Raises:
            TypeError, ValueError: naming a bad id or ``conn`` (nothing written).
        """
        check_job_id(job_id)
        if conn is not None:
            if self._pg_pool is None:
                raise ValueError(
                    "conn needs the Postgres mode (SyncScheduler(..., postgres_url=...))"
                )
            from tickwheel.durable.postgres import cancel_in_sync  # noqa: PLC0415

            return cancel_in_sync(conn, self._pg_pool, self.keys.namespace, job_id)
        self.open()
        shard = self.keys.shard_of(job_id)
        if self._pg_pool is not None:
            from tickwheel.durable.postgres import cancel_sync  # noqa: PLC0415

            found, state = cancel_sync(
                self._pg_pool, self.keys.namespace, job_id, lambda: self.store.cancel(shard, job_id)
            )
            return state is not None or found
        return self.store.cancel(shard, job_id) is not None

    def reschedule(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: int | datetime | None = None,
    ) -> bool:
        """Move a due job to a new due time (:meth:`Scheduler.reschedule`).

        Returns:
            True if moved; False if there is no such job, it is leased or dead, or the
            new occurrence is done already.
        """
        check_job_id(job_id)
        mode, time_ms = when_args(delay, at)
        self.open()
        shard = self.keys.shard_of(job_id)
        if self._pg_pool is not None:  # Redis moves it inside PostgreSQL's row lock
            from tickwheel.durable.postgres import reschedule_sync  # noqa: PLC0415

            return reschedule_sync(
                self._pg_pool,
                self.keys.namespace,
                job_id,
                (mode, time_ms),
                lambda version: self.store.reschedule(shard, job_id, mode, time_ms, version),
            )
        status, _ = self.store.reschedule(shard, job_id, mode, time_ms)
        return status == 1

    def pause(self, task: str | None = None) -> None:
        """Pause ``task`` (None: the whole namespace): :meth:`Scheduler.pause`.

        Raises:
            TypeError, ValueError: naming ``task`` (nothing written).
        """
        field = pause_field(task)
        self.open()
        now = int(time.time() * 1000)
        if self._pg_pool is not None:  # PostgreSQL's row, then Redis inside its transaction
            from tickwheel.durable.postgres import pause_sync  # noqa: PLC0415

            ns = self.keys.namespace
            pause_sync(self._pg_pool, ns, field, now, lambda since: self.store.pause(field, since))
            return
        self.store.pause(field, now)

    def resume(self, task: str | None = None) -> int:
        """Resume ``task`` (None: the namespace's pause): :meth:`Scheduler.resume`.
        Returns the parked jobs moved back to due.

        Raises:
            TypeError, ValueError: naming ``task``.
        """
        field = pause_field(task)
        self.open()
        if self._pg_pool is not None:  # PostgreSQL's row, then Redis inside its transaction
            from tickwheel.durable.postgres import resume_sync  # noqa: PLC0415

            ns = self.keys.namespace
            return resume_sync(self._pg_pool, ns, field, lambda: self.store.resume(field))
        return self.store.resume(field)

    def paused(self) -> dict[str | None, int]:
        """The pause state: task (None: the whole namespace) -> since (Unix ms)."""
        self.open()
        return {(t or None): since for t, since in self.store.paused().items()}

    def get(self, job_id: str) -> JobInfo | None:
        """One job's state and record, or None if it is done or unknown."""
        check_job_id(job_id)
        self.open()
        return self.store.get(self.keys.shard_of(job_id), job_id)
