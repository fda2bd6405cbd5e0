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
import random
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._check import ServerReport, check_server
from ._connect import Client
from ._errors import Fenced, LeaseLost, ShardCountMismatch
from ._keys import DEFAULT_BUCKETS, Keys
from ._model import (
    DEFAULT_MAX_ATTEMPTS,
    ClaimBatch,
    DeadPage,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    ReapResult,
    ScheduleResult,
    ShardInfo,
    check_job_id,
    finite_seconds_ms,
    when_args,
)
from ._ownership import DEFAULT_OWNER_TTL, Ownership
from ._reaper import count_reap
from ._recurrence import (
    DEFAULT_MAX_CATCH_UP,
    DEFAULT_MISFIRE_GRACE_MS,
    MissedRun,
    Recurrence,
)
from ._stats import SchedulerStats
from ._store import DEFAULT_CALL_TIMEOUT, ClaimedRef, EncodedJob, Store, encode_job

if TYPE_CHECKING:
    from .postgres import PostgresMode, ReconcileResult

__all__ = ["DEFAULT_SHARDS", "Scheduler"]

# The source document's sizing: 16 shards keep each sorted set near 2 GB at 350 M jobs.
DEFAULT_SHARDS = 16
# Payloads live in Redis memory with every pending job: big blobs belong in a database,
# referenced by id from the payload.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
# How long (s) a completed occurrence is remembered for dedup. It must outlast client
# retries of a schedule and redeliveries after a lease expiry; each entry costs ~100 bytes
# of Redis memory, so at 600 jobs/s a day's window would hold 5 GB.
DEFAULT_DEDUP_WINDOW = 3600.0
# Lease (s): long enough for a typical handler; a longer one calls extend().
DEFAULT_LEASE = 30.0
# A script blocks Redis while it runs: ~1000 jobs per call keep each call near 2 ms, and
# bound the Lua stack of the bulk commands.
MAX_BATCH = 1000
# Retry backoff: base * 2 ** (attempt - 1), capped, with equal jitter (half fixed, half
# random) so a burst of failures does not retry in lockstep.
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_MAX = 600.0
# How long a producer write waits for its replicas (with replicas > 0): a healthy
# replica on a LAN confirms in about a millisecond; a second means it is far behind.
DEFAULT_REPLICA_TIMEOUT = 1.0
# Error text kept with a job: enough for a message and a short traceback line, without
# letting a huge repr() bloat every dead letter.
MAX_ERROR_CHARS = 1024


_DEFAULT_GRACE_S = DEFAULT_MISFIRE_GRACE_MS / 1000


def _positive_int(name: str, value: object, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1 or (maximum is not None and value > maximum):
        bound = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be >= 1{bound}, got {value}")
    return value


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
        self.keys = Keys(namespace, shards, buckets)  # key names
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise TypeError(f"replicas must be an int, got {type(replicas).__name__}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.store = Store(
            client,
            self.keys,
            replicas=replicas,
            replica_timeout_ms=finite_seconds_ms("replica_timeout", replica_timeout),
            call_timeout=finite_seconds_ms("call_timeout", call_timeout, minimum_ms=1) / 1000,
        )  # one method per script
        self.ownership = Ownership(self.store, ttl=owner_ttl)  # shards owned here
        self.max_payload_bytes = _positive_int("max_payload_bytes", max_payload_bytes)
        self.dedup_window_ms = finite_seconds_ms("dedup_window", dedup_window, minimum_ms=1)
        self.retry_base_ms = finite_seconds_ms("retry_base", retry_base)
        self.retry_max_ms = finite_seconds_ms("retry_max", retry_max)
        self.check = check  # run the server check on open
        self.strict = strict  # server check raises
        self.server_report: ServerReport | None = None  # set by open() when checked
        self._rng = rng or random.Random()  # jitter
        self._opened = False  # shard count verified
        # shard -> (epoch, token, received) of the latest claim: a claim that failed is
        # sent again with its token (its reply may be lost, its leases held), one that
        # was received is forgotten by the next claim (claim.lua keeps replies).
        self._claims: dict[int, tuple[int, str, bool]] = {}
        # The Postgres mode (None: Redis only): PostgreSQL is the source of truth.
        self.pg: PostgresMode | None = None
        if postgres_url is not None:
            from .postgres import PgStore, PostgresMode  # noqa: PLC0415

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
                by default an existing job is kept untouched.
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
        await self.open()
        shard = self.keys.shard_of(job_id)
        encoded = await self._first_run(shard, spec, encoded)
        (result,) = await self.store.schedule(shard, [encoded], replace)
        return result

    async def _pg_schedule(
        self, specs: Sequence[JobSpec], replace: bool, conn: Any
    ) -> list[ScheduleResult]:
        if self.pg is None:
            raise ValueError("conn needs the Postgres mode (Scheduler(..., postgres_url=...))")
        if replace:
            raise ValueError("replace=True is not supported in the Postgres mode yet")
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
            groups.setdefault(shard, []).append(await self._first_run(shard, spec, encoded))
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
        if self.pg is not None:  # the source of truth first: a crash between leaves none
            found = await self.pg.store.cancel(job_id)
            await self.open()
            return await self.store.cancel(self.keys.shard_of(job_id), job_id) is not None or found
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
        if self.pg is not None:
            raise ValueError("reschedule is not supported in the Postgres mode yet")
        await self.open()
        status, _ = await self.store.reschedule(self.keys.shard_of(job_id), job_id, mode, time_ms)
        return status == 1

    async def get(self, job_id: str) -> JobInfo | None:
        """One job's state and record, or None if it is done or unknown. O(log N)."""
        check_job_id(job_id)
        await self.open()
        return await self.store.get(self.keys.shard_of(job_id), job_id)

    # -- owners --------------------------------------------------------------------

    async def take(self, shard: int) -> int | None:
        """Take a shard if free; return its new epoch, or None if another owner holds it."""
        self.keys.shard(shard)
        await self.open()
        return await self.ownership.take(shard)

    async def claim(
        self,
        shard: int,
        *,
        limit: int = 100,
        lookahead: float | timedelta = 0.0,
        lease: float | timedelta = DEFAULT_LEASE,
    ) -> ClaimBatch:
        """Lease the owned shard's jobs due by now + lookahead (at most ``limit``).

        Recurring jobs get their missed-run policy applied here, with the claim's Redis
        time: a job the policy does not run now is moved (unrun) to its next occurrence.

        Raises:
            NotOwner: if this scheduler does not own ``shard``.
            Fenced: if another owner took it (it is dropped).

        Runtime complexity: O(limit log N).
        """
        _positive_int("limit", limit, MAX_BATCH)
        lookahead_ms = finite_seconds_ms("lookahead", lookahead)
        lease_ms = finite_seconds_ms("lease", lease, minimum_ms=1)
        epoch = self.ownership.epoch(shard)
        counters = self.ownership.counters
        token, forget = self._claim_token(shard, epoch)
        try:
            batch = await self.store.claim(
                shard, epoch, lookahead_ms, limit, lease_ms, token=token, forget=forget
            )
            counters.claim_calls += 1
            planned = await self._plan(batch, epoch)
            if self.pg is not None:
                planned = await self.pg.after_claim(self, planned, epoch)
        except Fenced:
            self._claims.pop(shard, None)
            self.ownership.drop(shard, epoch)
            raise
        self._claims[shard] = (epoch, token, True)
        counters.claimed += len(planned.jobs)
        # Dropped in the script (one-shot) or acked unrun in _plan (recurring).
        counters.dedup_dropped += batch.dropped + sum(j.duplicate for j in batch.jobs)
        return planned

    def _claim_token(self, shard: int, epoch: int) -> tuple[str, str | None]:
        """(token, forget) for the next claim of ``shard``: the last claim's token
        again if it failed under this epoch (a lost reply is recovered whole: same jobs,
        same attempt), else a new one, forgetting the last received claim's reply."""
        last = self._claims.get(shard)
        if last is not None and last[0] == epoch and not last[2]:
            return last[1], None
        token = secrets.token_hex(8)
        self._claims[shard] = (epoch, token, False)
        return token, None if last is None else last[1]

    async def _plan(self, batch: ClaimBatch, epoch: int) -> ClaimBatch:
        jobs: list[Job] = []
        moves: list[ClaimedRef] = []
        dups: list[ClaimedRef] = []
        for job in batch.jobs:
            rec = job.recurrence
            if rec is None:
                if not job.duplicate:
                    jobs.append(job)
                continue
            if job.duplicate:
                dups.append(
                    ClaimedRef(
                        job.id,
                        job.attempt,
                        job.nominal_ms,
                        rec.next_after(job.nominal_ms, job.nominal_ms),
                    )
                )
                continue
            if job.attempt > 1:  # a retry of this occurrence, not a missed run
                jobs.append(
                    dataclasses.replace(
                        job, next_due_ms=rec.next_after(job.nominal_ms, job.nominal_ms)
                    )
                )
                continue
            plan = rec.plan(job.nominal_ms, batch.now_ms)
            if plan.deliver:
                jobs.append(dataclasses.replace(job, next_due_ms=plan.next_due_ms))
            else:
                moves.append(
                    ClaimedRef(
                        job.id, job.attempt, job.nominal_ms, plan.advance_to_ms, renominate=True
                    )
                )
        if moves:
            await self.store.release(batch.shard, epoch, moves)
        if dups:
            await self.store.ack(batch.shard, epoch, dups, self.dedup_window_ms)
        if len(jobs) == len(batch.jobs) and all(j.recurrence is None for j in jobs):
            return batch  # the common case: one-shot jobs only, nothing to rebuild
        return dataclasses.replace(batch, jobs=jobs, moved=len(moves))

    async def ack(self, job: Job) -> None:
        """Complete a claimed job: clear its lease, record the occurrence as done,
        re-insert a recurring job at its next occurrence. O(log N).

        The occurrence is recorded as done even when the lease was lost (the handler did
        run), so a copy of it that the reaper put back is dropped at its claim rather
        than run again.

        Raises:
            LeaseLost: if the lease expired and was reaped, or the job was cancelled.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        (ok,) = await self.ack_many([job])
        if not ok:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")

    async def ack_many(self, jobs: Sequence[Job]) -> list[bool]:
        """Ack claimed jobs of one shard in one script call; per job, False if its lease
        was lost.

        Raises:
            ValueError: if the jobs are of several shards or epochs.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        if not jobs:
            return []
        shard, epoch = jobs[0].shard, jobs[0].epoch
        if any(j.shard != shard or j.epoch != epoch for j in jobs):
            raise ValueError("jobs must all come from one claim (one shard and epoch)")
        items = [(j.id.encode(), j.attempt, j.nominal_ms, j.next_due_ms) for j in jobs]
        out: list[bool] = []
        try:
            if self.pg is not None:  # the source of truth first, under the same epoch
                refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, j.next_due_ms) for j in jobs]
                for i in range(0, len(refs), MAX_BATCH):
                    await self.pg.ack(shard, epoch, refs[i : i + MAX_BATCH])
            for i in range(0, len(items), MAX_BATCH):
                out += await self.store.ack_items(
                    shard, epoch, items[i : i + MAX_BATCH], self.dedup_window_ms
                )
        except Fenced:
            self.ownership.drop(shard, epoch)
            raise
        acked = sum(out)
        self.ownership.counters.acked += acked
        self.ownership.counters.ack_lost += len(out) - acked
        return out

    def backoff_ms(self, attempt: int) -> int:
        """The retry delay after failed attempt ``attempt``: exponential, equal jitter."""
        full: int = min(self.retry_max_ms, self.retry_base_ms << min(max(attempt - 1, 0), 62))
        return full // 2 + int(self._rng.random() * (full - full // 2))

    async def retry(
        self,
        job: Job,
        error: str = "",
        *,
        delay: float | timedelta | None = None,
        final: bool = False,
    ) -> JobState:
        """Give a failed job back for another attempt after a backoff, or kill it after
        its last attempt. The delay is added to Redis's now.

        Args:
            job: the claimed job.
            error: text kept with the job (shown in dead letters).
            delay: seconds to wait instead of the exponential backoff.
            final: dead-letter it now, whatever attempts remain (a failure no retry can
                mend, such as a task name no worker knows).

        Returns:
            ``JobState.DUE`` (retried) or ``JobState.DEAD``.

        Raises:
            LeaseLost: if the lease is gone.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        delay_ms = (
            self.backoff_ms(job.attempt) if delay is None else finite_seconds_ms("delay", delay)
        )
        try:
            if self.pg is not None and (final or job.attempt >= job.max_attempts):
                # The end state goes to the source of truth first, under the epoch.
                await self.pg.store.dead(job.shard, job.epoch, job.id, job.attempt)
            status, _ = await self.store.retry(
                job.shard,
                job.epoch,
                job_id=job.id,
                attempt=job.attempt,
                nominal_ms=job.nominal_ms,
                delay_ms=delay_ms,
                error=error[:MAX_ERROR_CHARS],
                final=final,
            )
        except Fenced:
            self.ownership.drop(job.shard, job.epoch)
            raise
        if status == 0:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")
        if status == 1:
            self.ownership.counters.retries += 1
            return JobState.DUE
        self.ownership.counters.dead_letters += 1
        return JobState.DEAD

    async def extend(self, job: Job, lease: float | timedelta = DEFAULT_LEASE) -> int:
        """Extend a lease to Redis's now + ``lease`` for a long handler.

        Returns:
            The new lease deadline (ms).

        Raises:
            LeaseLost: if the lease is gone.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        lease_ms = finite_seconds_ms("lease", lease, minimum_ms=1)
        try:
            deadline = await self.store.extend(
                job.shard,
                job.epoch,
                job_id=job.id,
                attempt=job.attempt,
                nominal_ms=job.nominal_ms,
                lease_ms=lease_ms,
            )
        except Fenced:
            self.ownership.drop(job.shard, job.epoch)
            raise
        if not deadline:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")
        return deadline

    async def release(self, jobs: Sequence[Job]) -> list[bool]:
        """Hand claimed jobs of one shard back to due, unrun (a graceful shutdown).

        Raises:
            ValueError: if the jobs are of several shards or epochs.
            Fenced: if this owner's epoch is stale.
        """
        if not jobs:
            return []
        shard, epoch = jobs[0].shard, jobs[0].epoch
        if any(j.shard != shard or j.epoch != epoch for j in jobs):
            raise ValueError("jobs must all come from one claim (one shard and epoch)")
        refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, j.due_ms) for j in jobs]
        return await self.store.release(shard, epoch, refs)

    async def reap(self, shard: int, *, limit: int = 1000) -> ReapResult:
        """Return the owned shard's expired leases to due (attempt + 1) or dead.

        Raises:
            NotOwner, Fenced: as :meth:`claim`.
        """
        _positive_int("limit", limit, MAX_BATCH)
        epoch = self.ownership.epoch(shard)
        try:
            result = await self.store.reap(shard, epoch, limit)
        except Fenced:
            self.ownership.drop(shard, epoch)
            raise
        count_reap(self.ownership.counters, result)
        return result

    async def process(
        self,
        handler: Callable[[Job], Awaitable[object]],
        *,
        limit: int = 100,
        lease: float | timedelta = DEFAULT_LEASE,
    ) -> int:
        """Claim due jobs of every owned shard, run ``handler`` on each, ack or retry.

        A handler that raises gets the job retried with backoff (dead after max
        attempts). A fenced shard is dropped and skipped.

        Returns:
            How many jobs were handled.
        """
        handled = 0
        for shard in list(self.ownership.owned):
            try:
                batch = await self.claim(shard, limit=limit, lease=lease)
            except Fenced:
                continue
            ok: list[Job] = []
            for job in batch.jobs:
                try:
                    await handler(job)
                except Exception as exc:
                    with contextlib.suppress(LeaseLost, Fenced):
                        await self.retry(job, error=repr(exc))
                else:
                    ok.append(job)
                handled += 1
            if ok:
                try:
                    await self.ack_many(ok)
                except Fenced:
                    continue
        return handled

    # -- Postgres mode -------------------------------------------------------------

    async def relay(self) -> int:
        """Postgres mode: write the outbox's committed jobs to Redis (see
        :meth:`PostgresMode.relay`); return the rows handled. Workers run it on
        every commit notification and every second."""
        if self.pg is None:
            raise ValueError("relay needs the Postgres mode (Scheduler(..., postgres_url=...))")
        return await self.pg.relay_all(self)

    async def reconcile(self) -> ReconcileResult:
        """Postgres mode: rebuild the Redis index from PostgreSQL (see
        :meth:`PostgresMode.reconcile`). Idempotent; safe beside running workers."""
        if self.pg is None:
            raise ValueError("reconcile needs the Postgres mode (Scheduler(..., postgres_url=...))")
        return await self.pg.reconcile(self)

    # -- dead letters --------------------------------------------------------------

    async def dead_letters(self, shard: int, *, offset: int = 0, count: int = 100) -> DeadPage:
        """A page of one shard's dead letters, oldest first."""
        self.keys.shard(shard)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        _positive_int("count", count, MAX_BATCH)
        await self.open()
        return await self.store.dead_list(shard, offset, count)

    async def requeue_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Put dead letters back to due now, attempt 1; return the ids requeued."""
        groups = self._by_shard(job_ids)
        await self.open()  # the shard count is checked before anything is written
        out: list[str] = []
        for shard, ids in groups.items():
            out += await self.store.dead_requeue(shard, ids, len(ids))
        if self.pg is not None:
            await self.pg.store.undead(out, purge=False)
        return out

    async def purge_dead(self, job_ids: Sequence[str]) -> list[str]:
        """Delete dead letters for good; return the ids purged."""
        groups = self._by_shard(job_ids)
        await self.open()  # the shard count is checked before anything is written
        out: list[str] = []
        for shard, ids in groups.items():
            out += await self.store.dead_purge(shard, ids, len(ids))
        if self.pg is not None:
            await self.pg.store.undead(out, purge=True)
        return out

    async def purge_all_dead(self, shard: int, *, limit: int = MAX_BATCH) -> list[str]:
        """Delete the oldest ``limit`` dead letters of ``shard``."""
        self.keys.shard(shard)
        _positive_int("limit", limit, MAX_BATCH)
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
        _positive_int("limit", limit, MAX_BATCH)
        await self.open()
        out = await self.store.dead_requeue(shard, [], limit)
        if self.pg is not None:
            await self.pg.store.undead(out, purge=False)
        return out
