"""The producer side of the facade: schedule, cancel, reschedule and read jobs by id.

:class:`Producer` takes :class:`JobSpec` values (``Scheduler.schedule`` turns its keyword
arguments into one, with :func:`recurrence`), encodes them, finds a recurring job's first
run, groups them per shard in ``MAX_BATCH`` chunks and makes one store call (which
sends them in bounded rounds: ``Store.schedule_many``). In the
Postgres mode the job goes to PostgreSQL first (``PostgresMode``), which indexes it in
Redis. A bad argument raises before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_CATCH_UP,
    DEFAULT_MISFIRE_GRACE_MS,
    CancelResult,
    JobInfo,
    JobSpec,
    JobState,
    MissedRun,
    Recurrence,
    RedisUnavailable,
    ScheduleResult,
    check_job_id,
    when_args,
)
from tickwheel.durable.store import EncodedJob, Keys, Store, encode_job

from ._flow import check_flow_mode, schedule_flow
from ._leases import MAX_BATCH
from ._spec_checks import check_tasks, known_task
from ._tracing import Tracing

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode
    from tickwheel.durable.postgres._mode import RedisSide

__all__ = [
    "DEFAULT_GRACE_S",
    "Producer",
    "build_spec",
    "check_tasks",
    "chunk_groups",
    "encode_specs",
    "first_run_needs_now",
    "known_task",
    "recurrence",
    "with_first_run",
]

DEFAULT_GRACE_S = DEFAULT_MISFIRE_GRACE_MS / 1000


def recurrence(
    *,
    every: float | timedelta | None = None,
    cron: str | None = None,
    tz: str | None = None,
    missed: MissedRun | str = MissedRun.ONCE,
    max_catch_up: int = DEFAULT_MAX_CATCH_UP,
    misfire_grace: float | timedelta = DEFAULT_GRACE_S,
    jitter: float | timedelta | None = None,
) -> Recurrence | None:
    """Build the recurrence of ``every`` or ``cron`` (None when neither is given).

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """
    if every is not None and cron is not None:
        raise ValueError("give every or cron, not both")
    if tz is not None and cron is None:
        raise ValueError("tz needs cron: a zone applies to a cron expression only")
    if jitter is not None and every is None and cron is None:
        raise ValueError("jitter needs every or cron: it spreads a recurring series' runs")
    spread = 0 if jitter is None else jitter
    if every is not None:
        return Recurrence.interval(
            every,
            missed=missed,
            max_catch_up=max_catch_up,
            misfire_grace=misfire_grace,
            jitter=spread,
        )
    if cron is not None:
        return Recurrence.cron_expr(
            cron,
            tz=tz,
            missed=missed,
            max_catch_up=max_catch_up,
            misfire_grace=misfire_grace,
            jitter=spread,
        )
    if (
        missed is not MissedRun.ONCE
        or max_catch_up != DEFAULT_MAX_CATCH_UP
        or misfire_grace != DEFAULT_GRACE_S
    ):
        # Validate the policy arguments even without a recurrence: a typo must not
        # pass. (Skipped at the defaults: single schedules are a hot path.)
        Recurrence.interval(
            1, missed=missed, max_catch_up=max_catch_up, misfire_grace=misfire_grace
        )
    return None


def build_spec(
    job_id: str,
    task: str,
    payload: Any = b"",
    *,
    delay: float | timedelta | None = None,
    at: int | datetime | None = None,
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
) -> JobSpec:
    """The :class:`JobSpec` of ``schedule()``'s keyword arguments (every producer's:
    ``Scheduler.schedule`` and ``SyncScheduler.schedule`` build theirs here).

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """
    rec = recurrence(
        every=every,
        cron=cron,
        tz=tz,
        missed=missed,
        max_catch_up=max_catch_up,
        misfire_grace=misfire_grace,
        jitter=jitter,
    )
    return JobSpec(
        job_id,
        task,
        payload,
        delay,
        at,
        max_attempts,
        rec,
        timeout,
        debounce=debounce,
        max_wait=max_wait,
        throttle=throttle,
        key=key,
        priority=priority,
    )


def first_run_needs_now(spec: JobSpec) -> bool:
    """True when :func:`with_first_run` needs Redis's now: a cron job without delay/at."""
    rec = spec.recurrence
    return rec is not None and not rec.every_ms and spec.delay is None and spec.at is None


def with_first_run(
    spec: JobSpec, encoded: EncodedJob, limit: int, now_ms: int | None
) -> EncodedJob:
    """A recurring job without delay/at starts at its first occurrence after now
    (``now_ms``: Redis's now, given when :func:`first_run_needs_now`); any other job is
    ``encoded`` as it is."""
    rec = spec.recurrence
    if rec is None or spec.delay is not None or spec.at is not None:
        return encoded
    if rec.every_ms:
        spec = dataclasses.replace(spec, delay=rec.every_ms / 1000)
    else:
        assert now_ms is not None  # the caller read it (first_run_needs_now)
        spec = dataclasses.replace(spec, at=rec.next_after(now_ms, now_ms))
    return encode_job(spec, limit)


def encode_specs(
    specs: Iterable[JobSpec], keys: Keys, limit: int
) -> list[tuple[int, JobSpec, EncodedJob]]:
    """``(shard, spec, encoded)`` per spec of a ``schedule_many``, all validated first.

    Raises:
        TypeError, ValueError: for a value that is not a JobSpec, or a bad payload.
    """
    pending: list[tuple[int, JobSpec, EncodedJob]] = []
    shard_of = keys.shard_of
    for spec in specs:
        if not isinstance(spec, JobSpec):
            raise TypeError(f"specs must hold JobSpec values, got {spec!r}")
        check_flow_mode(spec, False, many=True)
        pending.append((shard_of(spec.id), spec, encode_job(spec, limit)))
    return pending


def chunk_groups(encoded: Iterable[tuple[int, EncodedJob]]) -> dict[int, list[list[EncodedJob]]]:
    """Jobs grouped by shard, in chunks of at most ``MAX_BATCH`` (one script call each)."""
    groups: dict[int, list[EncodedJob]] = {}
    for shard, job in encoded:
        group = groups.get(shard)
        if group is None:
            group = groups[shard] = []
        group.append(job)
    return {
        shard: [jobs[i : i + MAX_BATCH] for i in range(0, len(jobs), MAX_BATCH)]
        for shard, jobs in groups.items()
    }


class Producer:
    """The job operations by id over one namespace (built by a :class:`Scheduler`).

    Args:
        store: the namespace's store.
        keys: its key names (an id's shard).
        open: the scheduler's ``open`` (the layout check), awaited before a write.
        max_payload_bytes: largest encoded payload accepted.
        redis_side: what the Postgres mode is handed as the Redis side (the
            scheduler: ``RedisSide``, its store, keys and ``open``).
        pg: the Postgres mode, or None (Redis only).
        tasks: the task names a schedule may name (``Scheduler(tasks=...)``), or None.
        tracer: the scheduler's spans, or None (tracing off).
    """

    __slots__ = (
        "_open",
        "_opened",
        "_side",
        "keys",
        "max_payload_bytes",
        "pg",
        "store",
        "tasks",
        "tracer",
    )

    def __init__(
        self,
        store: Store,
        keys: Keys,
        open: Callable[[], Awaitable[object]],
        *,
        max_payload_bytes: int,
        redis_side: RedisSide,
        pg: PostgresMode | None = None,
        tasks: Collection[str] | None = None,
        tracer: Tracing | None = None,
    ) -> None:
        self.store = store
        self.tasks = tasks  # the known task names, or None: any
        self.tracer = tracer
        self.keys = keys
        self._open = open
        self._opened = False  # open() returned once here: the layout is checked
        self.max_payload_bytes = max_payload_bytes
        self.pg = pg
        self._side = redis_side

    def schedule(
        self, spec: JobSpec, replace: bool = False, conn: Any = None
    ) -> Awaitable[ScheduleResult]:
        """Schedule one job (:meth:`Scheduler.schedule`, its arguments in ``spec``).

        Returns an awaitable, not a coroutine of its own: in the common case (Redis
        only, a one-shot job, the scheduler opened) it is the store's call itself, so
        a single schedule costs no extra frame on its way to Redis and back. A bad
        spec or payload raises here, before anything is sent.
        """
        if self.tasks is not None:
            known_task(self.tasks, spec.task)
        if spec.flow[0]:
            return schedule_flow(self, spec)
        if self.tracer is not None:
            return self._traced_one(self.tracer, spec, replace, conn)
        if self.pg is not None or conn is not None:
            return self._pg_schedule_one(spec, replace, conn)
        encoded = encode_job(spec, self.max_payload_bytes)
        if self._opened and spec.recurrence is None:
            return self.store.schedule_one(self.keys.shard_of(spec.id), encoded, replace)
        return self._schedule_one(spec, encoded, replace)

    async def _traced_one(
        self, tracer: Tracing, spec: JobSpec, replace: bool, conn: Any
    ) -> ScheduleResult:
        """:meth:`schedule` in a PRODUCER span, the job carrying its trace context."""
        with tracer.producing("schedule", [spec.id]) as header:
            (spec,) = tracer.traced([spec], header)
            if self.pg is not None or conn is not None:
                return await self._pg_schedule_one(spec, replace, conn)
            return await self._schedule_one(spec, encode_job(spec, self.max_payload_bytes), replace)

    async def _schedule_one(
        self, spec: JobSpec, encoded: EncodedJob, replace: bool
    ) -> ScheduleResult:
        await self.opened()
        shard = self.keys.shard_of(spec.id)
        encoded = await self._first_run(shard, spec, encoded)
        return await self.store.schedule_one(shard, encoded, replace)

    async def opened(self) -> None:
        if not self._opened:
            await self._open()
            self._opened = True  # open() is idempotent: no need to await it again

    async def _pg_schedule_one(self, spec: JobSpec, replace: bool, conn: Any) -> ScheduleResult:
        return (await self._pg_schedule([spec], replace, conn))[0]

    async def _pg_schedule(
        self, specs: Sequence[JobSpec], replace: bool, conn: Any
    ) -> list[ScheduleResult]:
        if self.pg is None:
            raise ValueError("conn needs the Postgres mode (Scheduler(..., postgres_url=...))")
        if replace:
            if conn is not None:  # applied by a relay after the commit (_replacing.py)
                return await self.pg.replace_in(self._side, specs, conn)
            return await self.pg.replace(self._side, specs)
        if conn is not None:
            conn = await self.pg.connection(conn)  # a bad one is refused before any write
        if not self._opened:
            # The namespace's shard count is checked before anything is written (a
            # mismatch raises); a Redis that is down does not stop the enqueue.
            with contextlib.suppress(RedisUnavailable):
                await self._open()
                self._opened = True
        return await self.pg.schedule(self._side, specs, conn)

    async def _first_run(self, shard: int, spec: JobSpec, encoded: EncodedJob) -> EncodedJob:
        """A recurring job without delay/at starts at its first occurrence after now."""
        now = await self.store.now(shard) if first_run_needs_now(spec) else None
        return with_first_run(spec, encoded, self.max_payload_bytes, now)

    async def schedule_many(
        self, specs: Iterable[JobSpec], *, replace: bool = False, conn: Any = None
    ) -> list[ScheduleResult]:
        """Schedule many jobs: one script call per shard chunk (at most ``MAX_BATCH``
        jobs and 1 MiB), sent in bounded rounds.

        A round holds at most 2,000 jobs and 2 MiB of packed jobs (``ROUND_JOBS``,
        ``ROUND_BYTES`` in ``store/_calls.py``): about 30 ms of Redis time at most, so
        no single command or MULTI/EXEC blocks Redis for more than ~50 ms, and other
        clients' commands run between rounds. A batch that fits one round (1,000
        small jobs, say) is one round trip, and on a single Redis without ``replicas``
        one MULTI/EXEC: all or nothing. A bigger batch is one round trip per round, one
        after the other, each bounded by ``call_timeout`` (the batch as a whole is
        not: a batch of R rounds may take up to R times it).

        A partly written batch: if a round fails (``RedisUnavailable``, ...), the
        rounds before it are written, the rounds after it were not sent, and the
        failed round may be written whole, in part (a cluster, or ``replicas``: per
        chunk) or not at all: its reply was lost. Rounds go in the order of the
        results (grouped by shard), not of ``specs``. Retrying the whole call is safe:
        a job written by the first try comes back ``KEPT`` (its due unchanged) with
        ``replace=False``; with ``replace=True`` it is ``REPLACED`` by the same job,
        except that a ``delay=`` (and a recurring job's first run found from now: an
        ``every=`` series's first run is now + every; a cron one's the next occurrence
        after now) is counted again from the retry's now. A job already leased comes
        back ``KEPT`` (``BUSY`` with replace). A job that ran and was acked in
        between is ``DONE`` if it named its occurrence with ``at=`` (within the dedup
        window), but created again if it was a one-shot ``delay=`` job: producers
        that retry should pass ``at=``.

        Args:
            specs: the jobs (validated on construction).
            replace: as in :meth:`Scheduler.schedule`.
            conn: as in :meth:`Scheduler.schedule` (Postgres mode: every job in one transaction).

        Returns:
            One result per job, grouped by shard (each carries its id).

        Raises:
            TypeError, ValueError: for an invalid spec or payload (nothing is written).
            RedisUnavailable, ReplicationTimeout, ...: a round failed (see above).
        """
        if self.tasks is not None:
            specs = list(specs)
            for spec in specs:
                if isinstance(spec, JobSpec):  # anything else: encode_specs' TypeError
                    known_task(self.tasks, spec.task)
        if self.tracer is not None:
            specs = list(specs)
            ids = [s.id if isinstance(s, JobSpec) else "" for s in specs]
            with self.tracer.producing("schedule_many", ids) as header:
                return await self._schedule_many(self.tracer.traced(specs, header), replace, conn)
        return await self._schedule_many(specs, replace, conn)

    async def _schedule_many(
        self, specs: Iterable[JobSpec], replace: bool, conn: Any
    ) -> list[ScheduleResult]:
        pending = encode_specs(specs, self.keys, self.max_payload_bytes)
        if self.pg is not None or conn is not None:
            return await self._pg_schedule([spec for _, spec, _ in pending], replace, conn)
        await self._open()
        chunked = chunk_groups(
            [
                # no first run to find (and no await) for a one-shot job
                (
                    shard,
                    encoded
                    if spec.recurrence is None
                    else await self._first_run(shard, spec, encoded),
                )
                for shard, spec, encoded in pending
            ]
        )
        if not chunked:
            return []
        return await self.store.schedule_many(chunked, replace)

    async def cancel(self, job_id: str, *, conn: Any = None) -> bool:
        """Remove a job in any state; True if there was one. A leased job's holder
        gets :class:`LeaseLost` on ack. O(log N).

        ``conn`` (Postgres mode): the application's connection in its transaction
        (asyncpg, or async psycopg 3 / SQLAlchemy): the job is removed iff that
        transaction commits (its row in it, Redis by the relays after the commit);
        True if PostgreSQL had it pending.

        Raises:
            TypeError, ValueError: naming a bad id or ``conn`` (nothing written).
        """
        check_job_id(job_id)
        if conn is not None:
            if self.pg is None:
                raise ValueError("conn needs the Postgres mode (Scheduler(..., postgres_url=...))")
            return await self.pg.store.cancel_in(job_id, await self.pg.connection(conn))
        if self.pg is not None:  # both stores, in a transaction holding the id
            found, state = await self.pg.cancel(self._side, job_id)
            return state is not None or found
        await self._open()
        return await self.store.cancel(self.keys.shard_of(job_id), job_id) is not None

    async def cancel_job(self, job_id: str) -> CancelResult:
        """Remove a job in any state, and say what that did: ``NOT_FOUND``,
        ``REMOVED`` (it had not run: due, or dead), or ``STOPPED`` (it was leased: the
        worker running it is told to stop its handler, which then ends neither acked
        nor retried; a recurring series is cancelled whole). O(log N).

        Raises:
            TypeError, ValueError: naming a bad id.
        """
        check_job_id(job_id)
        if self.pg is not None:
            found, state = await self.pg.cancel(self._side, job_id)
        else:
            await self._open()
            found, state = False, await self.store.cancel(self.keys.shard_of(job_id), job_id)
        if state is JobState.LEASED:
            return CancelResult.STOPPED
        if state is not None or found:
            return CancelResult.REMOVED
        return CancelResult.NOT_FOUND

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
            return await self.pg.reschedule(self._side, job_id, mode, time_ms)
        await self._open()
        status, _ = await self.store.reschedule(self.keys.shard_of(job_id), job_id, mode, time_ms)
        return status == 1

    async def get(self, job_id: str) -> JobInfo | None:
        """One job's state and record, or None if it is done or unknown. O(log N)."""
        check_job_id(job_id)
        await self._open()
        if self.pg is not None:  # this process's jobs written behind are in Redis first
            await self.pg.behind.settled()
        return await self.store.get(self.keys.shard_of(job_id), job_id)
