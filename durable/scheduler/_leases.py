"""The lease side of the facade: the calls a shard's owner makes under its epoch.

Claim (with the missed-run policy), ack, retry, extend, release, reap and process. Each
is one store call (the Postgres mode adds its half first); a :class:`Fenced` reply goes
through ``Ownership.guard``, which drops the shard and tells its subscribers, so no call
here handles it. A :class:`~tickwheel.durable.Scheduler` builds one :class:`Leases` and
delegates to it; the worker's hot path (``tickwheel.durable.runtime``) calls it directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from tickwheel.durable.model import (
    PRIORITY_AGING,
    ClaimBatch,
    Defer,
    Fenced,
    Job,
    JobState,
    LeaseLost,
    ReapResult,
    aging_ms,
    finite_seconds_ms,
    int_between,
)
from tickwheel.durable.store import ClaimedRef, ClaimLimits, Keys, Store

from ._claim_plan import plan_batch
from ._pg_leases import pg_moved_first, pg_retried
from ._shard_owner import Ownership

if TYPE_CHECKING:
    from tickwheel.durable.postgres import PostgresMode

__all__ = ["DEFAULT_LEASE", "MAX_BATCH", "MAX_ERROR_CHARS", "Leases"]

logger = logging.getLogger("tickwheel.durable")

# Lease (s): long enough for a typical handler; a longer one calls extend().
DEFAULT_LEASE = 30.0
# A script blocks Redis while it runs: ~1000 jobs per call keep each call near 2 ms, and
# bound the Lua stack of the bulk commands.
MAX_BATCH = 1000
# Error text kept with a job: its summary and the tail of its traceback (the worker
# keeps at most ~5 KiB, runtime/_logs.py), without letting a huge text bloat every dead
# letter and every claim of a retried job.
MAX_ERROR_CHARS = 8192


class Leases:
    """The owner-side calls over one namespace's shards (built by a :class:`Scheduler`).

    Args:
        store: the namespace's store (one method per script).
        keys: its key names.
        ownership: the shards owned here, their epochs, and the one Fenced handler.
        dedup_window_ms: how long a done occurrence is remembered.
        retry_base_ms: the first retry delay; doubles per attempt.
        retry_max_ms: the cap of the retry delay.
        rng: randomness for the backoff's jitter.
        pg: the Postgres mode, or None (Redis only).
        after_claim: the Postgres mode's check of a claimed batch under its epoch
            (``PostgresMode.after_claim`` bound to the scheduler); None without it.
    """

    __slots__ = (
        "__weakref__",  # Ownership.on_fenced holds _forget_claim weakly
        "_claims",
        "_rng",
        "after_claim",
        "dedup_window_ms",
        "keys",
        "ownership",
        "pg",
        "retry_base_ms",
        "retry_max_ms",
        "store",
    )

    def __init__(
        self,
        store: Store,
        keys: Keys,
        ownership: Ownership,
        *,
        dedup_window_ms: int,
        retry_base_ms: int,
        retry_max_ms: int,
        rng: random.Random,
        pg: PostgresMode | None = None,
        after_claim: Callable[[ClaimBatch, int], Awaitable[ClaimBatch]] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.ownership = ownership
        self.dedup_window_ms = dedup_window_ms
        self.retry_base_ms = retry_base_ms
        self.retry_max_ms = retry_max_ms
        self._rng = rng
        self.pg = pg
        self.after_claim = after_claim
        # shard -> (epoch, token, received) of the latest claim: a claim that failed is
        # sent again with its token (its reply may be lost, its leases held), one that
        # was received is forgotten by the next claim (claim.lua keeps replies).
        self._claims: dict[int, tuple[int, str, bool]] = {}
        ownership.on_fenced(self._forget_claim)

    async def claim(
        self,
        shard: int,
        *,
        limit: int = 100,
        lookahead: float | timedelta = 0.0,
        lease: float | timedelta = DEFAULT_LEASE,
        prestart: bool = False,
        priority_aging: float | timedelta | None = PRIORITY_AGING,
        limits: ClaimLimits | None = None,
    ) -> ClaimBatch:
        """Lease the owned shard's jobs due by now + lookahead (at most ``limit``).

        Among them, a higher priority first (``JobSpec.priority``), then due order;
        but a job late by more than ``priority_aging`` seconds goes before any
        priority, oldest first (None: no aging, a low priority may wait as long as
        higher ones keep coming).

        With ``prestart`` the leases are pre-start leases: ``lease`` is short (the
        worker's lookahead plus its start margin), and the run's start extends each
        (:meth:`extend`, which marks it started). The reaper returns an expired
        pre-start lease to due at the same attempt: a worker that died with jobs
        claimed but not started costs them no attempt, and they are back within
        ``lease``, not a whole run's lease.

        Recurring jobs get their missed-run policy applied here, with the claim's Redis
        time: a job the policy does not run now is moved (unrun) to its next occurrence.

        With ``limits`` (a worker's flow limits, docs/limits.md), on one Redis in the
        Redis-only mode, the claim takes the permits of those tasks' one-shot jobs
        (``ClaimBatch.held``) and leaves the jobs over their key's limit waiting
        (``ClaimBatch.waited``). The Postgres mode and a cluster ignore it: their
        limited jobs take their permits at the worker's gate.

        Raises:
            NotOwner: if this scheduler does not own ``shard``.
            Fenced: if another owner took it (it is dropped).

        Runtime complexity: O(limit log N).
        """
        int_between("limit", limit, 1, MAX_BATCH)
        lookahead_ms = finite_seconds_ms("lookahead", lookahead)
        lease_ms = finite_seconds_ms("lease", lease, minimum_ms=1)
        aging = aging_ms(priority_aging)
        epoch = self.ownership.epoch(shard)
        counters = self.ownership.counters
        token, forget = self._claim_token(shard, epoch)
        if self.pg is not None and self.pg.behind.busy:  # this process's jobs in Redis first
            await self.pg.behind.settled()
        with self.ownership.guard(shard, epoch):
            batch = await self.store.claim(
                shard,
                epoch,
                lookahead_ms,
                limit,
                lease_ms,
                token=token,
                forget=forget,
                prestart=prestart,
                aging_ms=aging,
                # The Postgres mode checks a claim after it (it may drop jobs): the gate.
                limits=limits if self.pg is None else None,
            )
            received = time.monotonic()
            counters.claim_calls += 1
            planned = await self._plan(batch, epoch)
            if self.after_claim is not None:
                checked = await self.after_claim(planned, epoch)
                counters.dedup_dropped += checked.dropped - planned.dropped  # done in PostgreSQL
                planned = checked
            # now_ms as of our return, not of the script: a caller converts due times
            # with the moment claim() returned (the loader does), and the round trips
            # after the script (PostgreSQL's, a missed-run move) would otherwise make
            # every job that late. Whole ms, rounded down: later, never earlier.
            spent_ms = int((time.monotonic() - received) * 1000)
            if spent_ms > 0:
                planned = dataclasses.replace(planned, now_ms=planned.now_ms + spent_ms)
        self._claims[shard] = (epoch, token, True)
        counters.claimed += len(planned.jobs)
        # Dropped in the script (one-shot) or acked unrun in _plan (recurring).
        counters.dedup_dropped += batch.dropped + sum(j.duplicate for j in batch.jobs)
        return planned

    def _forget_claim(self, shard: int, epoch: int) -> None:
        """A call under ``epoch`` was fenced: a claim made under it is not sent again."""
        last = self._claims.get(shard)
        if last is not None and last[0] <= epoch:
            del self._claims[shard]

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
        jobs, moves, runs_as, as_jobs, dups, waits = plan_batch(batch)
        if self.pg is not None and (runs_as or moves):  # PostgreSQL first (_pg_leases.py)
            await pg_moved_first(self.pg, self.store, batch, epoch, [*runs_as, *moves])
        if runs_as:
            moved = await self.store.release(batch.shard, epoch, runs_as)
            # A lease lost meanwhile is not run (the reaper's, or another holder's).
            jobs += [j for j, ok in zip(as_jobs, moved, strict=True) if ok]
        if moves:
            await self.store.release(batch.shard, epoch, moves)
        if dups:
            await self.store.ack(batch.shard, epoch, dups, self.dedup_window_ms)
        if waits:
            await self.store.release(batch.shard, epoch, waits)
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
        bucket_of = self.keys.bucket_of
        items = [
            (
                j.id.encode(),
                j.attempt,
                j.nominal_ms,
                j.next_due_ms,
                j.bucket if j.bucket >= 0 else bucket_of(j.id),
            )
            for j in jobs
        ]
        out: list[bool] = []
        with self.ownership.guard(shard, epoch):
            if self.pg is not None:  # the source of truth first, under the same epoch
                refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, j.next_due_ms) for j in jobs]
                for i in range(0, len(refs), MAX_BATCH):
                    await self.pg.ack(shard, epoch, refs[i : i + MAX_BATCH])
            for i in range(0, len(items), MAX_BATCH):
                out += await self.store.ack_items(
                    shard, epoch, items[i : i + MAX_BATCH], self.dedup_window_ms
                )
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

        In the Postgres mode PostgreSQL records the outcome first (the dead job, or the
        next attempt, which never goes down), then Redis: a PostgreSQL failure raises
        with nothing changed in Redis (the lease runs out and the reaper returns it).

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
        with self.ownership.guard(job.shard, job.epoch):
            if self.pg is not None:  # the source of truth first, under the epoch
                if final or job.attempt >= job.max_attempts:
                    await self.pg.store.dead(
                        job.shard, job.epoch, job.id, job.attempt, job.nominal_ms
                    )
                else:  # the next attempt (never lowered), at this host's estimate of when
                    await self.pg.store.retried(
                        job.shard,
                        job.epoch,
                        job.id,
                        job.nominal_ms,
                        attempt=job.attempt + 1,
                        run_ms=int(time.time() * 1000) + delay_ms,
                    )
            status, when = await self.store.retry(
                job.shard,
                job.epoch,
                job_id=job.id,
                attempt=job.attempt,
                nominal_ms=job.nominal_ms,
                delay_ms=delay_ms,
                error=error[:MAX_ERROR_CHARS],
                final=final,
            )
            if self.pg is not None and status == 1:
                await pg_retried(self.pg, job, when)
        if status == 0:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")
        if status == 1:
            self.ownership.counters.retries += 1
            return JobState.DUE
        self.ownership.counters.dead_letters += 1
        return JobState.DEAD

    async def defer(self, job: Job, delay: float | timedelta) -> int:
        """Hand a claimed job back to due at Redis's now + ``delay``, unspent: the same
        attempt and occurrence (what a handler's :class:`Defer` asks for).

        Returns:
            Its new due time (ms).

        Raises:
            TypeError, ValueError: naming ``delay`` (not > 0, or over a year).
            LeaseLost: if the lease is gone.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        delay_ms = Defer(delay).delay_ms
        with self.ownership.guard(job.shard, job.epoch):
            status, when = await self.store.retry(
                job.shard,
                job.epoch,
                job_id=job.id,
                attempt=job.attempt,
                nominal_ms=job.nominal_ms,
                delay_ms=delay_ms,
                error="",
                defer=True,
            )
            if self.pg is not None and status == 3:
                # Recorded as a retry at the same attempt: reconcile brings it back then.
                await pg_retried(self.pg, job, when, job.attempt)
        if status == 0:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")
        return when

    async def extend(self, job: Job, lease: float | timedelta = DEFAULT_LEASE) -> int:
        """Extend a lease to Redis's now + ``lease`` for a long handler.

        Returns:
            The new lease deadline (ms).

        Raises:
            LeaseLost: if the lease is gone.
            Fenced: if this owner's epoch is stale (the shard is dropped).
        """
        lease_ms = finite_seconds_ms("lease", lease, minimum_ms=1)
        with self.ownership.guard(job.shard, job.epoch):
            deadline = await self.store.extend(
                job.shard,
                job.epoch,
                job_id=job.id,
                attempt=job.attempt,
                nominal_ms=job.nominal_ms,
                lease_ms=lease_ms,
            )
        if not deadline:
            raise LeaseLost(f"lease of job {job.id!r} attempt {job.attempt} is lost")
        return deadline

    async def release(self, jobs: Sequence[Job], *, due_ms: int | None = None) -> list[bool]:
        """Hand claimed jobs of one shard back to due, unrun, at the same attempt (a
        graceful shutdown; a publish the broker did not confirm). ``due_ms``: due
        again then (Redis's clock; each keeps its nominal due), else at its own due.

        Raises:
            ValueError: if the jobs are of several shards or epochs.
            Fenced: if this owner's epoch is stale.
        """
        if not jobs:
            return []
        shard, epoch = jobs[0].shard, jobs[0].epoch
        if any(j.shard != shard or j.epoch != epoch for j in jobs):
            raise ValueError("jobs must all come from one claim (one shard and epoch)")
        refs = [ClaimedRef(j.id, j.attempt, j.nominal_ms, due_ms or j.due_ms) for j in jobs]
        with self.ownership.guard(shard, epoch):
            return await self.store.release(shard, epoch, refs)

    async def reap(self, shard: int, *, limit: int = 1000) -> ReapResult:
        """Return the owned shard's expired leases to due (attempt + 1) or dead.

        Raises:
            NotOwner, Fenced: as :meth:`claim`.
        """
        int_between("limit", limit, 1, MAX_BATCH)
        return await self.ownership.reap(shard, self.ownership.epoch(shard), limit)

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
                except Defer as d:
                    with contextlib.suppress(LeaseLost, Fenced):
                        await self.defer(job, d.seconds)
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
