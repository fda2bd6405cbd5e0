"""The store: one awaitable method per Lua script, and nothing else.

Ground rules:

- Each method is one script call (or one pipeline of the same script over shards): no
  loops over time, no sleeping, no retries. The loops live in ``runtime/``; the
  owner-side calls that make them, in ``scheduler/``.
- redis-py's untyped replies (bytes: the client must not decode them, payloads are bytes)
  stop here: every method returns typed values; the codec (``_codec.py``) decodes records.
- Every call goes through the store's transport (``self.transport``, ``_transport.py``):
  bounded, its errors translated, so callers see :class:`RedisUnavailable`,
  :class:`Fenced`, or redis-py's own. The store *has* a transport; it is not one.
- Here: the job's lifecycle (schedule, claim, ack, retry, extend, release, reap). Shard
  ownership is ``_fencing.py``'s, the operator's calls ``_operator_calls.py``'s (the
  store hands each on, so the other layers see one Store); pause and flow limits are
  ``store.pauses`` (``_pauses.py``) and ``store.limits`` (``_limits.py``).
- The client is one Redis or a Redis Cluster (``_connect.py``). Each script touches
  one shard's slot; nothing spans slots, so nothing needs a cross-slot transaction.
  Only :meth:`Store.schedule_many` on one Redis uses MULTI, one per bounded round (all
  or nothing per round); on a cluster it is atomic per script call (per shard chunk).
  Either way it is safe to retry whole.
- With ``replicas`` > 0 the writes that must survive a failover (schedule, cancel,
  reschedule, ack, retry, release) go through ``transport.write``, which follows them by
  ``WAIT`` on the connection that wrote; the rest, ``transport.run`` (``_transport.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tickwheel.durable.model import (
    ClaimBatch,
    DeadPage,
    DurableError,
    Job,
    JobInfo,
    JobState,
    ReapResult,
    ScheduleResult,
    ShardInfo,
)

from . import _calls as calls
from ._codec import (
    CLAIM_SHORT_ROW,
    CLAIM_TIMED_ROW,
    CLAIM_VERSIONED_ROW,
    DUPLICATE,
    ClaimedRef,
    EncodedJob,
    claimed_extras,
    decode_payload,
    init_job,
    new_job,
    recurrence_of,
)
from ._connect import Client
from ._fencing import FencingCalls
from ._keys import Keys
from ._limits import LimitCalls
from ._msgpack import pack_ack_batch, unpack_reply
from ._operator_calls import OperatorCalls
from ._pauses import PauseCalls
from ._reaping import ReapCalls
from ._scripts import Scripts
from ._transport import DEFAULT_CALL_TIMEOUT, Transport

__all__ = ["Store"]


class Store:
    """One awaitable method per script, over one namespace.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` created with
            ``decode_responses=False``.
        keys: the namespace's key names.
        replicas: producer writes return only once this many replicas have them
            (``WAIT``); 0 does not wait.
        replica_timeout_ms: how long to wait for them; then :class:`ReplicationTimeout`.
        call_timeout: seconds a call may wait for Redis (besides WAIT); then
            :class:`RedisUnavailable`.

    Raises:
        ValueError: if ``client`` decodes responses, a replica setting is negative or
            ``call_timeout`` is not positive.
    """

    __slots__ = ("_fencing", "_operator", "_reaping", "_scripts", "keys", "limits", "pauses", "transport")  # fmt: skip  # noqa: E501

    def __init__(
        self,
        client: Client,
        keys: Keys,
        *,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        # Bounded, translated script calls: every method below is one call of it.
        self.transport = Transport(
            client,
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
            call_timeout=call_timeout,
        )
        self._scripts = Scripts(client)  # the registered scripts
        self.keys = keys  # key names of the namespace
        # The ownership and operator calls, which the methods at the end hand on to.
        self._fencing = FencingCalls(self.transport, self._scripts, keys)  # _fencing.py
        self._operator = OperatorCalls(self.transport, self._scripts, keys)  # _operator_calls.py
        self._reaping = ReapCalls(self.transport, self._scripts, keys)  # _reaping.py
        self.pauses = PauseCalls(self.transport, self._scripts, keys)  # _pauses.py
        self.limits = LimitCalls(self.transport, self._scripts, keys)  # _limits.py

    @property
    def client(self) -> Client:
        """The redis-py client (a ``Redis`` or a ``RedisCluster``)."""
        return self.transport.client

    @property
    def call_timeout(self) -> float:
        """Seconds a call may wait for Redis (besides WAIT)."""
        return self.transport.call_timeout

    async def aclose(self) -> None:
        """Close what the transport made (never the caller's client)."""
        await self.transport.aclose()

    # -- namespace -----------------------------------------------------------------

    async def init(self, postgres: bool = False) -> tuple[int, int]:
        """Store the shard and bucket counts on first use (init.lua), and the Postgres
        mode when ``postgres``; return the stored counts.

        Raises:
            PostgresModeRequired: the namespace is in the Postgres mode and ``postgres``
                is False (nothing was written).
        """
        keys, args = calls.init_call(self.keys, postgres)
        reply = await self.transport.run(self._scripts.init, keys, args, -1)
        return calls.init_result(self.keys, reply, postgres)

    async def now(self, shard: int) -> int:
        """Redis's now for ``shard`` in ms: max(TIME, clock) (now.lua)."""
        keys, args = calls.now_call(self.keys, shard)
        return int(await self.transport.run(self._scripts.now, keys, args, shard))

    # -- producers -----------------------------------------------------------------

    def _schedule_call(
        self, shard: int, jobs: Sequence[EncodedJob], replace: bool
    ) -> tuple[list[str], list[Any]]:
        return calls.schedule_call(self.keys, shard, jobs, replace)

    @staticmethod
    def _schedule_results(jobs: Sequence[EncodedJob], reply: Sequence[Any]) -> list[ScheduleResult]:
        return calls.schedule_results(jobs, reply)

    async def schedule(
        self, shard: int, jobs: Sequence[EncodedJob], replace: bool
    ) -> list[ScheduleResult]:
        """Create, keep or replace jobs of one shard (schedule.lua; schedule_one.lua for
        one job). O(n log N)."""
        if len(jobs) == 1:
            return [await self.schedule_one(shard, jobs[0], replace)]
        keys, args = self._schedule_call(shard, jobs, replace)
        reply = await self.transport.write(self._scripts.schedule, keys, args, shard)
        return self._schedule_results(jobs, reply)

    async def schedule_one(
        self, shard: int, job: EncodedJob, replace: bool, flow: tuple[str, int, int] | None = None
    ) -> ScheduleResult:
        """Create, keep or replace one job (schedule_one.lua); with ``flow`` (a
        ``JobSpec.flow``), under its debounce or throttle (flow.lua). O(log N)."""
        if flow is not None:
            keys, args = calls.flow_call(self.keys, shard, job, flow)
            reply = await self.transport.write(self._scripts.flow, keys, args, shard)
        else:
            keys, args = calls.schedule_one_call(self.keys, shard, job, replace)
            reply = await self.transport.write(self._scripts.schedule_one, keys, args, shard)
        return calls.schedule_one_result(job, reply)

    async def schedule_many(
        self, groups: Mapping[int, Sequence[Sequence[EncodedJob]]], replace: bool
    ) -> list[ScheduleResult]:
        """Schedule.lua once per chunk, in bounded rounds (``calls.schedule_rounds``):
        one ``transport.batch`` (one round trip per node) per round, one round after
        the other. Results in the order of ``groups`` (by shard, then chunk).

        A round holds at most ``ROUND_JOBS`` jobs and ``ROUND_BYTES`` packed bytes, so
        no MULTI/EXEC or script call blocks Redis for more than about 50 ms, and
        ``call_timeout`` bounds each round, not the batch. A batch that fits one round
        is one round trip, as it always was.

        On one Redis without ``replicas`` each round is one MULTI/EXEC: applied whole
        or not at all. On a cluster, or with ``replicas``, each chunk is atomic on its
        own. If a round fails, the rounds before it are written, the ones after it are
        not sent, and the failed one may be written in part or whole (a lost reply).
        Retrying the whole batch is safe (``Scheduler.schedule_many``).
        """
        script = self._scripts.schedule
        batch = self.transport.batch
        results: list[ScheduleResult] = []
        for round_calls in calls.schedule_rounds(self.keys, groups, replace):
            replies = await batch(script, [(c.keys, c.args, c.shard) for c in round_calls])
            for call, reply in zip(round_calls, replies, strict=True):
                results += self._schedule_results(call.jobs, reply)
        return results

    async def cancel(self, shard: int, job_id: str) -> JobState | None:
        """Remove a job in any state (cancel.lua); return the state it had. O(log N)."""
        keys, args = calls.cancel_call(self.keys, shard, job_id)
        return calls.cancel_result(
            await self.transport.write(self._scripts.cancel, keys, args, shard)
        )

    async def reschedule(
        self, shard: int, job_id: str, mode: int, time_ms: int, version: int = 0
    ) -> tuple[int, int]:
        """Move a due job (reschedule.lua; a Postgres row's ``version``): ``(status, when)``."""
        keys, args = calls.reschedule_call(self.keys, shard, job_id, mode, time_ms, version=version)
        reply = await self.transport.write(self._scripts.reschedule, keys, args, shard)
        return calls.reschedule_result(reply)

    # -- owners --------------------------------------------------------------------

    async def claim(
        self,
        shard: int,
        epoch: int,
        lookahead_ms: int,
        limit: int,
        lease_ms: int,
        *,
        token: str,
        forget: str | None = None,
        prestart: bool = False,
        aging_ms: int = 60_000,
        limits: calls.ClaimLimits | None = None,
    ) -> ClaimBatch:
        """Lease jobs due by now + lookahead (claim.lua). O(limit log N).

        The same ``token`` again returns the same batch while its leases last, so a
        claim whose reply was lost is recovered by sending it again (see claim.lua).

        Args:
            token: names this claim; reuse it only to recover a claim that failed.
            forget: the token of the caller's previous claim on this shard, whose reply
                arrived: its kept reply is deleted.
            prestart: the leases are pre-start leases (``lease_ms`` short): the reaper
                returns one never started (no :meth:`extend`) at the same attempt.
            aging_ms: a job late by this much goes before any priority (-1: never).
            limits: take these tasks' permits (not on a cluster; ``ClaimBatch.held``).

        Raises:
            Fenced: if ``epoch`` is stale.
            DurableError: if the reply is not claim.lua's (a msgpack array).
        """
        reply_key = self.keys.claim_reply(shard, token)
        forget_key = reply_key if forget is None else self.keys.claim_reply(shard, forget)
        args = [epoch, lookahead_ms, limit, lease_ms, "1" if prestart else "", aging_ms]
        limits = None if self.transport.cluster else limits  # a cluster: the worker's gate
        keys, args = calls.claim_call(self.keys, shard, (reply_key, forget_key), args, limits)
        packed = await self.transport.run(self._scripts.claim, keys, args, shard)
        try:
            reply = unpack_reply(packed)
        except ValueError as exc:  # not claim.lua's reply: a script of another version?
            raise DurableError(f"claim on shard {shard}: {exc}") from None
        # The rows, decoded with _codec.py's pieces (see there): one slice and one Job a row.
        jobs: list[Job] = []
        held: list[Job] = []  # the jobs whose permit the claim took (tag bit 2)
        append = jobs.append
        new, init, duplicate, short = new_job, init_job, DUPLICATE, CLAIM_SHORT_ROW
        timed, versioned = CLAIM_TIMED_ROW, CLAIM_VERSIONED_ROW
        i, end = 3 if limits is None else 4, len(reply)
        while i < end:
            (ident, due, deadline, tag, count, task, data, mx, flags, nominal, attempt) = reply[
                i : i + 11
            ]
            if count == short:
                # Three names a tuple: a fourth measured ~390 more instructions a job (callgrind).
                ep, recurrence, error = epoch, None, ""
                limit, trace, key, version = 0, b"", "", 0  # constants: no tuple built
            elif count in (timed, versioned):  # the timeout (and the row version)
                ep, recurrence, error = epoch, None, ""
                limit, trace, key = reply[i + 11], b"", ""
                version = reply[i + 12] if count == versioned else 0
            else:  # all 19: a recurring job, one with an error, a trace, a key or a version
                ep, kind, version = reply[i + 11], reply[i + 12], reply[i + 23]
                recurrence = recurrence_of(kind, *reply[i + 13 : i + 17]) if kind else None
                error = reply[i + 17].decode(errors="replace")
                limit = reply[i + 18]
                trace, key = claimed_extras(reply, i, count)
            i += 5 + count
            job = new(Job)
            init(
                job,
                ident.decode(),  # id
                shard,  # shard
                task.decode(),  # task
                data if flags == 0 else decode_payload(data, flags),  # payload
                nominal,  # nominal_ms
                due,  # due_ms
                deadline,  # deadline_ms
                attempt,  # attempt
                mx,  # max_attempts
                ep,  # epoch
                recurrence,  # recurrence
                0,  # next_due_ms
                duplicate[tag & 1],  # duplicate
                error,  # last_error
                tag >> 2,  # bucket
                limit,  # timeout_ms
                trace,  # trace
                key,  # key
                version,  # version
            )
            append(job)
            if tag & 2:
                held.append(job)
        return ClaimBatch(
            shard=shard,
            now_ms=int(reply[0]),
            jobs=jobs,
            dropped=int(reply[1]),
            parked=int(reply[2]),
            waited=0 if limits is None else int(reply[3]),
            held=held,
        )

    async def ack(
        self, shard: int, epoch: int, refs: Sequence[ClaimedRef], keep_done_ms: int
    ) -> list[bool]:
        """Complete leases; record each occurrence in done (ack.lua). O(n log N).

        Returns:
            Per job, True if acked, False if its lease was lost.

        Raises:
            Fenced: if ``epoch`` is stale (nothing written).
        """
        bucket_of = self.keys.bucket_of
        items = [(r.id.encode(), r.attempt, r.nominal_ms, r.time_ms, bucket_of(r.id)) for r in refs]
        return await self.ack_items(shard, epoch, items, keep_done_ms)

    async def ack_items(
        self,
        shard: int,
        epoch: int,
        items: Sequence[tuple[bytes, int, int, int, int]],
        keep_done_ms: int,
    ) -> list[bool]:
        """:meth:`ack` of ``(id as UTF-8, attempt, nominal_ms, next_ms, bucket)`` per job,
        ``bucket`` the index of its record hash (:meth:`Keys.bucket_of`, or what the
        claim returned in :attr:`Job.bucket`)."""
        k = self.keys.shard(shard)
        buckets: Sequence[str] = k.jobs
        if len(items) == 1:  # its own record hash only, at index 0
            ident, attempt, nominal, nxt, bucket = items[0]
            if not 0 <= bucket < len(k.jobs):
                raise ValueError(f"bucket must be in 0 .. {len(k.jobs) - 1}, got {bucket}")
            buckets, items = [k.jobs[bucket]], [(ident, attempt, nominal, nxt, 0)]
        args = [epoch, keep_done_ms, pack_ack_batch(items)]
        reply = await self.transport.write(
            self._scripts.ack,
            [k.leased, k.due, k.done, k.epoch, k.clock, k.far, k.faro, k.prio, k.trail, *buckets],
            args,
            shard,
        )
        return [bool(s) for s in reply]

    async def retry(
        self,
        shard: int,
        epoch: int,
        *,
        job_id: str,
        attempt: int,
        nominal_ms: int,
        delay_ms: int,
        error: str,
        final: bool = False,
        defer: bool = False,
    ) -> tuple[int, int]:
        """Back to due after ``delay_ms``, or dead (retry.lua); ``(status, when_ms)``.
        With ``defer``: back to due after ``delay_ms`` as the same attempt (status 3).

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        reply = await self.transport.write(
            self._scripts.retry,
            [k.leased, k.due, k.dead, k.epoch, k.clock, self.keys.jobs_key(shard, job_id), k.prio],
            [epoch, job_id, attempt, nominal_ms, delay_ms, error, 2 if defer else int(final)],
            shard,
        )
        return int(reply[0]), int(reply[1])

    async def extend(
        self, shard: int, epoch: int, *, job_id: str, attempt: int, nominal_ms: int, lease_ms: int
    ) -> int:
        """Push a lease deadline to now + lease (extend.lua); 0 if the lease is lost.

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        reply = await self.transport.run(
            self._scripts.extend,
            [k.leased, k.epoch, k.clock, self.keys.jobs_key(shard, job_id)],
            [epoch, job_id, attempt, nominal_ms, lease_ms],
            shard,
        )
        return int(reply)

    async def release(self, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[bool]:
        """Hand leases back to due unrun, same attempt (release.lua); or, for a ref
        with ``keep_leased``, move the lease to the occurrence ``time_ms`` in place.

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        args: list[Any] = [epoch, len(refs)]
        for ref in refs:
            mode = 2 if ref.keep_leased else 1 if ref.renominate else 0
            args += (ref.id, ref.attempt, ref.nominal_ms, ref.time_ms, mode)
        reply = await self.transport.write(
            self._scripts.release, [k.leased, k.due, k.epoch, k.clock, k.prio, *k.jobs], args, shard
        )
        return [bool(s) for s in reply]

    async def reap(self, shard: int, epoch: int, limit: int, *, upto_ms: int = 0) -> ReapResult:
        """:meth:`ReapCalls.reap`: expired leases back to due or to dead."""
        return await self._reaping.reap(shard, epoch, limit, upto_ms=upto_ms)

    async def reap_look(
        self, shard: int, epoch: int, limit: int
    ) -> tuple[int, list[tuple[str, int, int, int]]]:
        """:meth:`ReapCalls.look`: what :meth:`reap` would do now, writing nothing."""
        return await self._reaping.look(shard, epoch, limit)

    # -- ownership: one call each, handed to _fencing.py ---------------------------

    async def take(self, shard: int, token: str, ttl_ms: int, fresh: bool = False) -> int:
        """:meth:`FencingCalls.take`: the new epoch, or 0 if another owner holds it."""
        return await self._fencing.take(shard, token, ttl_ms, fresh)

    async def renew(self, shard: int, token: str, epoch: int, ttl_ms: int) -> None:
        """:meth:`FencingCalls.renew` (raises :class:`Fenced` if the shard moved on)."""
        await self._fencing.renew(shard, token, epoch, ttl_ms)

    async def give_back(self, shard: int, token: str, epoch: int) -> bool:
        """:meth:`FencingCalls.give_back`: False if not held."""
        return await self._fencing.give_back(shard, token, epoch)

    async def raise_epoch(self, shard: int, floor: int) -> bool:
        """:meth:`FencingCalls.raise_epoch`: lift the epoch to ``floor + 1`` if below."""
        return await self._fencing.raise_epoch(shard, floor)

    # -- operators: one call each, handed to _operator_calls.py -------------------------

    async def get(self, shard: int, job_id: str) -> JobInfo | None:
        """:meth:`OperatorCalls.get`: one job's state and record, or None."""
        return await self._operator.get(shard, job_id)

    async def get_and_now(self, shard: int, job_id: str) -> tuple[JobInfo | None, int]:
        """:meth:`OperatorCalls.get_and_now`: the job and Redis's now, one round trip."""
        return await self._operator.get_and_now(shard, job_id)

    async def dead_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """:meth:`OperatorCalls.dead_list`: a page of dead letters, oldest first."""
        return await self._operator.dead_list(shard, offset, count)

    async def dead_requeue(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """:meth:`OperatorCalls.dead_requeue`: dead letters back to due now."""
        return await self._operator.dead_requeue(shard, ids, limit)

    async def dead_purge(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """:meth:`OperatorCalls.dead_purge`: delete dead letters."""
        return await self._operator.dead_purge(shard, ids, limit)

    async def inspect(self, shard: int) -> ShardInfo:
        """:meth:`OperatorCalls.inspect`: counts, lag, owner and next due of a shard."""
        return await self._operator.inspect(shard)

    async def inspect_all(self) -> list[ShardInfo]:
        """:meth:`OperatorCalls.inspect_all`: every shard, one round trip per node."""
        return await self._operator.inspect_all()

    async def due_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """:meth:`OperatorCalls.due_list`: a page of scheduled jobs in due order."""
        return await self._operator.due_list(shard, offset, count)

    async def due_rank(self, shard: int, time_ms: int) -> int:
        """:meth:`OperatorCalls.due_rank`: how many jobs are due before ``time_ms``."""
        return await self._operator.due_rank(shard, time_ms)
