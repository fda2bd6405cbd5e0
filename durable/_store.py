"""The store: one awaitable method per Lua script, and nothing else.

Ground rules:

- Each method is one script call (or one pipeline of the same script over shards): no
  loops over time, no sleeping, no retries. The loops live in ``_ownership.py``,
  ``_reaper.py`` and ``_scheduler.py``.
- redis-py's untyped replies stop here: every method returns typed values.
- Every Redis error goes through :func:`._errors.translate`, so callers see
  :class:`RedisUnavailable`, :class:`Fenced`, or redis-py's own error.
- The client must not decode responses: payloads are bytes.
- The client is one Redis or a Redis Cluster (``_connect.py``). Each script touches
  one shard's slot; nothing spans slots, so nothing needs a cross-slot transaction.
  Only :meth:`Store.schedule_many` on one Redis uses MULTI (all or nothing); on a
  cluster it is atomic per script call (per shard chunk), and idempotent to retry.
- Every call is bounded by ``call_timeout`` (plus the WAIT timeout when it waits),
  whatever the client's own socket timeout: a Redis that stops answering gives
  :class:`RedisUnavailable`, never a hang. The call may have run (a lost reply); each
  script is safe to send again (docs/reliability.md), and nothing here re-sends one
  whose reply was lost: the per-node clients this store makes never retry.
- With ``replicas`` > 0 the writes that must survive a failover (schedule, cancel,
  reschedule, and the end states ack, retry, release) are followed
  by ``WAIT replicas timeout`` *on the connection that wrote*: WAIT counts the replicas
  that have that connection's writes, so it must share the write's connection. One
  pipeline per node carries the script calls and then WAIT.
- redis-py's cluster pipeline refuses EVALSHA, and could not put WAIT on the write's
  connection anyway; so pipelined writes to a cluster go through a plain client per
  master (``_node_client``), routed by the cluster client's slot map. A reply of MOVED
  or ASK means the call did not run there: the slot map is refreshed and it is resent.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from tickwheel.wheel import timeout

from ._connect import Client, no_retry
from ._direct import Direct
from ._errors import REDIS_ERRORS, RedisUnavailable, ReplicationTimeout, translate
from ._keys import Keys, parse_layout
from ._model import (
    ClaimBatch,
    DeadPage,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    ReapResult,
    ScheduleResult,
    ScheduleStatus,
    ShardInfo,
    decode_payload,
    encode_payload,
)
from ._record import pack_ack_batch, pack_oneshot, pack_record, pack_schedule_batch
from ._recurrence import (
    KIND_CRON,
    KIND_INTERVAL,
    POLICY_BY_CODE,
    POLICY_CODES,
    Recurrence,
)
from ._scripts import Scripts

__all__ = ["ClaimedRef", "EncodedJob", "Store", "encode_job"]

# Status codes of schedule.lua by value: indexing beats the enum's call in a hot loop.
_STATUSES: tuple[ScheduleStatus, ...] = (ScheduleStatus.CREATED, *ScheduleStatus)  # [0] unused

# Values per job in the replies of claim.lua (id, due, deadline, dup + 13 record fields)
# and of get.lua / dead_list.lua (2 + 13).
_CLAIM_STRIDE = 17
_ROW_STRIDE = 15
# Rounds of a pipelined write whose calls came back NOSCRIPT (a fresh master after a
# failover) or MOVED/ASK (a stale slot map): each round loads or refreshes, then resends
# only those calls, which did not run.
_MAX_ROUNDS = 4
# Replies after which a call is resent: it did not run on the node that answered.
_RESEND = (
    redis.exceptions.NoScriptError,
    redis.exceptions.AskError,  # MovedError too
    redis.exceptions.TryAgainError,
)


# Seconds one call may take before it gives RedisUnavailable. Above the default socket
# timeout of the clients connect() makes (5 s), so those fail first with redis-py's own
# error; this bound is for a client made without one.
DEFAULT_CALL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class _Call:
    """One script call of a pipelined write."""

    script: Any  # the AsyncScript
    keys: Sequence[str]  # KEYS (all in one slot)
    args: Sequence[Any]  # ARGV
    shard: int  # for error translation


@dataclass(frozen=True, slots=True)
class EncodedJob:
    """A validated job as schedule.lua takes it: id, mode, time and packed record."""

    id: str  # job id
    values: tuple[bytes, int, int, bytes]  # id (UTF-8), mode, time (ms), record


@dataclass(frozen=True, slots=True)
class ClaimedRef:
    """What ack/release need to name a lease."""

    id: str  # job id
    attempt: int  # the attempt held
    nominal_ms: int  # the occurrence held
    time_ms: int  # ack: next occurrence (0 none); release: the due to go back to
    renominate: bool = False  # release: time_ms is also the new nominal due


def encode_job(spec: JobSpec, payload_limit: int) -> EncodedJob:
    """Encode a job spec for schedule.lua.

    Raises:
        TypeError, ValueError: if the payload is not encodable or over ``payload_limit``.
    """
    data, flags = encode_payload(spec.payload, payload_limit)
    rec = spec.recurrence
    if rec is None:  # the common case, without building the field list
        record = pack_oneshot(spec.task.encode(), data, spec.max_attempts, flags)
        return EncodedJob(spec.id, (spec.id.encode(), spec.mode, spec.time_ms, record))
    kind, spec_text = (KIND_INTERVAL, str(rec.every_ms)) if rec.every_ms else (KIND_CRON, rec.cron)
    fields: list[int | bytes] = [
        *(spec.task.encode(), data, spec.max_attempts, flags, 0, 1, 0),
        *(kind, spec_text.encode(), POLICY_CODES[rec.missed], rec.max_catch_up),
        rec.misfire_grace_ms,
    ]
    return EncodedJob(spec.id, (spec.id.encode(), spec.mode, spec.time_ms, pack_record(fields)))


@functools.lru_cache(maxsize=1024)
def _recurrence(kind: int, spec: bytes, policy: int, cap: int, grace: int) -> Recurrence | None:
    if kind == KIND_INTERVAL:
        return Recurrence(int(spec), "", POLICY_BY_CODE[policy], cap, grace)
    if kind == KIND_CRON:
        return Recurrence(0, spec.decode(), POLICY_BY_CODE[policy], cap, grace)
    return None


def _info(job_id: str, shard: int, state: JobState, when: int, f: Sequence[Any]) -> JobInfo:
    """A JobInfo from the 13 record fields of a reply row."""
    return JobInfo(
        id=job_id,
        shard=shard,
        state=state,
        when_ms=when,
        task=f[0].decode(),
        payload=decode_payload(f[1], f[3]),
        nominal_ms=f[4],
        attempt=f[5],
        max_attempts=f[2],
        epoch=f[6],
        recurrence=_recurrence(f[7], f[8], f[9], f[10], f[11]),
        last_error=f[12].decode(errors="replace"),
    )


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

    __slots__ = (
        "_client",
        "_cluster",
        "_direct",
        "_nodes",
        "_scripts",
        "_wait_timeout",
        "call_timeout",
        "keys",
        "replica_timeout_ms",
        "replicas",
    )

    def __init__(
        self,
        client: Client,
        keys: Keys,
        *,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        if client.get_encoder().decode_responses:
            raise ValueError("client must be created with decode_responses=False")
        if replicas < 0 or replica_timeout_ms < 0:
            raise ValueError(
                f"replicas and replica_timeout must be >= 0, got {replicas}, {replica_timeout_ms}"
            )
        if not call_timeout > 0:  # also refuses NaN
            raise ValueError(f"call_timeout must be > 0 seconds, got {call_timeout!r}")
        self._client = client  # the redis-py client (one Redis or a cluster)
        self.call_timeout = float(call_timeout)  # bound of one call (s)
        self._wait_timeout = self.call_timeout + replica_timeout_ms / 1000  # with WAIT
        self._cluster = isinstance(client, RedisCluster)  # scripts routed by slot
        self._scripts = Scripts(client)  # the registered scripts
        self.keys = keys  # key names of the namespace
        self.replicas = replicas  # WAIT for this many replicas after producer writes
        self.replica_timeout_ms = replica_timeout_ms  # WAIT's timeout
        self._nodes: dict[str, redis.asyncio.Redis] = {}  # cluster node name -> plain client
        # One Redis: single script calls skip redis-py's command machinery (_direct.py).
        self._direct = Direct(client) if Direct.usable(client) else None  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Close the per-node clients and the held connections this store made (never
        the caller's client)."""
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.aclose()
        if self._direct is not None:
            await self._direct.aclose()

    def _node_client(self, node: Any) -> redis.asyncio.Redis:
        """A plain client of one cluster node, with the cluster client's settings."""
        client = self._nodes.get(node.name)
        if client is None:
            # Never re-send: a lost reply is the caller's to recover (see claim.lua).
            options = {**node.connection_kwargs, "retry": no_retry()}
            pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **options)
            client = self._nodes[node.name] = redis.asyncio.Redis(connection_pool=pool)
        return client

    @property
    def client(self) -> Client:
        """The redis-py client (a ``Redis`` or a ``RedisCluster``)."""
        return self._client

    async def _run(self, script: Any, keys: Sequence[str], args: Sequence[Any], shard: int) -> Any:
        try:
            async with timeout(self.call_timeout):
                if self._direct is not None:
                    return await self._direct.evalsha(script, keys, args)
                return await script(keys, args)
        except REDIS_ERRORS as exc:
            raise translate(exc, shard) from exc
        except TimeoutError:
            raise self._no_reply(self.call_timeout) from None

    @staticmethod
    def _no_reply(seconds: float) -> RedisUnavailable:
        return RedisUnavailable(
            f"redis unavailable: no reply within {seconds:g} s (the call may have run)"
        )

    async def _write(
        self, script: Any, keys: Sequence[str], args: Sequence[Any], shard: int
    ) -> Any:
        """A producer write: one script call, then WAIT when replicas are asked for."""
        if not self.replicas:
            return await self._run(script, keys, args, shard)
        (reply,) = await self._pipelined([_Call(script, keys, args, shard)], wait=True)
        return reply

    async def _pipelined(self, calls: Sequence[_Call], *, wait: bool) -> list[Any]:
        """Script calls in one pipeline (one round trip per node, no MULTI); with
        ``wait``, then ``WAIT`` on each node's connection. Replies in call order.

        Raises:
            ReplicationTimeout: if a node's WAIT saw fewer than ``replicas``.
            RedisUnavailable, Fenced, ...: the first failed call's error, translated.
        """
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        bound = self._wait_timeout if wait else self.call_timeout
        for _ in range(_MAX_ROUNDS):
            try:
                async with timeout(bound):
                    got = await self._send(calls, todo, wait)
            except REDIS_ERRORS as exc:
                raise translate(exc) from exc
            except TimeoutError:
                raise self._no_reply(bound) from None
            resend: list[int] = []
            for i, reply in zip(todo, got, strict=False):
                if isinstance(reply, _RESEND):
                    resend.append(i)
                elif isinstance(reply, REDIS_ERRORS):
                    raise translate(reply, calls[i].shard) from reply
                else:
                    replies[i] = reply
            for acked in got[len(todo) :]:
                if acked is None:
                    continue
                if isinstance(acked, REDIS_ERRORS):
                    raise translate(acked) from acked
                if int(acked) < self.replicas:
                    raise ReplicationTimeout(
                        f"{acked} of {self.replicas} replicas confirmed the write within "
                        f"{self.replica_timeout_ms} ms",
                        int(acked),
                        self.replicas,
                    )
            if not resend:
                return replies
            try:
                async with timeout(self.call_timeout):
                    await self._recover(
                        [calls[i] for i in resend], [got[todo.index(i)] for i in resend]
                    )
            except TimeoutError:
                raise self._no_reply(self.call_timeout) from None
            todo = resend
        raise translate(redis.exceptions.TryAgainError("slot map kept moving; try again"))

    async def _send(self, calls: Sequence[_Call], todo: Sequence[int], wait: bool) -> list[Any]:
        """Replies of ``calls[i]`` for i in ``todo``, then one WAIT reply per node."""
        if not self._cluster:
            return await self._send_node(self._client, calls, todo, wait)
        cluster: Any = self._client
        await cluster.initialize()  # routing needs the slot map (no-op once loaded)
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i in todo:
            node = cluster.get_node_from_key(calls[i].keys[0])
            by_node.setdefault(node.name, (node, []))[1].append(i)
        parts = await asyncio.gather(
            *(
                self._send_node(self._node_client(node), calls, ids, wait)
                for node, ids in by_node.values()
            ),
            return_exceptions=True,
        )
        replies: dict[int, Any] = {}
        waits: list[Any] = []
        for (_, ids), part in zip(by_node.values(), parts, strict=True):
            if isinstance(part, BaseException):
                if not isinstance(part, Exception):
                    raise part
                got = [part] * (len(ids) + wait)  # the node failed: every call with it
            else:
                got = part
            replies.update(zip(ids, got, strict=False))
            waits += got[len(ids) :]
        return [replies[i] for i in todo] + waits

    async def _send_node(
        self, client: Any, calls: Sequence[_Call], todo: Sequence[int], wait: bool
    ) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for i in todo:
            call = calls[i]
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        if wait:
            pipe.execute_command("WAIT", self.replicas, self.replica_timeout_ms)
        got = list(await pipe.execute(raise_on_error=False))
        if wait and all(isinstance(r, _RESEND) for r in got[:-1]):
            got[-1] = None  # nothing ran on this connection: nothing for WAIT to confirm
        return got

    async def _recover(self, calls: Sequence[_Call], errors: Sequence[Any]) -> None:
        """Load missing scripts and refresh the slot map before a resend."""
        loaded: set[str] = set()
        for call, error in zip(calls, errors, strict=True):
            try:
                if isinstance(error, redis.exceptions.NoScriptError):
                    if call.script.sha not in loaded:
                        await self._client.script_load(call.script.script)
                        loaded.add(call.script.sha)
                else:
                    # A keyed read through the cluster client follows MOVED/ASK and
                    # updates its slot map.
                    await self._client.exists(call.keys[0])
            except REDIS_ERRORS as exc:
                raise translate(exc, call.shard) from exc

    # -- namespace -----------------------------------------------------------------

    async def init(self) -> tuple[int, int]:
        """Store the shard and bucket counts on first use (init.lua); return the stored."""
        layout = f"{self.keys.shards}:{self.keys.buckets}"
        reply = await self._run(self._scripts.init, [self.keys.meta], [layout], shard=-1)
        return parse_layout(reply)

    async def now(self, shard: int) -> int:
        """Redis's now for ``shard`` in ms: max(TIME, clock) (now.lua)."""
        k = self.keys.shard(shard)
        return int(await self._run(self._scripts.now, [k.clock], [], shard))

    # -- producers -----------------------------------------------------------------

    def _schedule_call(
        self, shard: int, jobs: Sequence[EncodedJob], replace: bool
    ) -> tuple[list[str], list[Any]]:
        k = self.keys.shard(shard)
        args = [1 if replace else 0, pack_schedule_batch([job.values for job in jobs])]
        # One job needs its own bucket only (the script then skips hashing the id).
        buckets = [self.keys.jobs_key(shard, jobs[0].id)] if len(jobs) == 1 else k.jobs
        return [k.due, k.leased, k.done, k.dead, k.clock, *buckets], args

    @staticmethod
    def _schedule_results(jobs: Sequence[EncodedJob], reply: Sequence[Any]) -> list[ScheduleResult]:
        statuses = _STATUSES
        return [
            ScheduleResult(job.id, statuses[reply[1 + 2 * i]], reply[2 + 2 * i])
            for i, job in enumerate(jobs)
        ]

    async def schedule(
        self, shard: int, jobs: Sequence[EncodedJob], replace: bool
    ) -> list[ScheduleResult]:
        """Create, keep or replace jobs of one shard (schedule.lua). O(n log N)."""
        keys, args = self._schedule_call(shard, jobs, replace)
        reply = await self._write(self._scripts.schedule, keys, args, shard)
        return self._schedule_results(jobs, reply)

    async def schedule_many(
        self, groups: Mapping[int, Sequence[Sequence[EncodedJob]]], replace: bool
    ) -> list[ScheduleResult]:
        """Schedule.lua once per chunk, in one pipeline (one round trip per node).

        On one Redis without ``replicas`` the pipeline is MULTI/EXEC: the batch is
        applied whole or not at all. On a cluster, or with ``replicas`` (WAIT cannot
        follow EXEC on one connection), each chunk is atomic on its own; a failure may
        leave some chunks written, and retrying the batch is safe (idempotent).
        """
        if self._cluster or self.replicas:
            chunks: list[Sequence[EncodedJob]] = []
            calls: list[_Call] = []
            for shard, shard_chunks in groups.items():
                for chunk in shard_chunks:
                    keys, args = self._schedule_call(shard, chunk, replace)
                    calls.append(_Call(self._scripts.schedule, keys, args, shard))
                    chunks.append(chunk)
            replies = await self._pipelined(calls, wait=bool(self.replicas))
            return [
                result
                for chunk, reply in zip(chunks, replies, strict=True)
                for result in self._schedule_results(chunk, reply)
            ]
        return await self._schedule_multi(groups, replace)

    async def _schedule_multi(
        self, groups: Mapping[int, Sequence[Sequence[EncodedJob]]], replace: bool
    ) -> list[ScheduleResult]:
        done: list[Sequence[EncodedJob]] = []
        client: Any = self._client  # one Redis (the cluster takes the other path)
        if self._direct is not None:
            calls = []
            for shard, chunks in groups.items():
                for chunk in chunks:
                    calls.append(self._schedule_call(shard, chunk, replace))
                    done.append(chunk)
            try:
                async with timeout(self.call_timeout):
                    replies = await self._direct.transaction(self._scripts.schedule, calls)
            except REDIS_ERRORS as exc:
                raise translate(exc) from exc
            except TimeoutError:
                raise self._no_reply(self.call_timeout) from None
            return [
                result
                for chunk, reply in zip(done, replies, strict=True)
                for result in self._schedule_results(chunk, reply)
            ]
        try:
            async with timeout(self.call_timeout), client.pipeline(transaction=True) as pipe:
                for shard, chunks in groups.items():
                    for chunk in chunks:
                        keys, args = self._schedule_call(shard, chunk, replace)
                        await self._scripts.schedule(keys, args, client=pipe)
                        done.append(chunk)
                replies = await pipe.execute()
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        except TimeoutError:
            raise self._no_reply(self.call_timeout) from None
        out: list[ScheduleResult] = []
        for chunk, reply in zip(done, replies, strict=True):
            out.extend(self._schedule_results(chunk, reply))
        return out

    async def cancel(self, shard: int, job_id: str) -> JobState | None:
        """Remove a job in any state (cancel.lua); return the state it had. O(log N)."""
        k = self.keys.shard(shard)
        jobs = self.keys.jobs_key(shard, job_id)
        reply = await self._write(
            self._scripts.cancel, [k.due, k.leased, k.dead, jobs], [job_id], shard
        )
        return JobState(reply) if reply else None

    async def reschedule(self, shard: int, job_id: str, mode: int, time_ms: int) -> tuple[int, int]:
        """Move a due job (reschedule.lua); return ``(status, when_ms)``. O(log N)."""
        k = self.keys.shard(shard)
        reply = await self._write(
            self._scripts.reschedule,
            [k.due, k.done, k.clock, self.keys.jobs_key(shard, job_id)],
            [job_id, mode, time_ms],
            shard,
        )
        return int(reply[0]), int(reply[1])

    async def get(self, shard: int, job_id: str) -> JobInfo | None:
        """One job's state and record (get.lua). O(log N)."""
        k = self.keys.shard(shard)
        jobs = self.keys.jobs_key(shard, job_id)
        reply = await self._run(self._scripts.get, [k.due, k.leased, k.dead, jobs], [job_id], shard)
        if reply is None:
            return None
        return _info(job_id, shard, JobState(reply[0]), reply[1], reply[2:])

    async def get_and_now(self, shard: int, job_id: str) -> tuple[JobInfo | None, int]:
        """:meth:`get` and :meth:`now` of the id's shard in one pipeline (one round
        trip): the job, and Redis's now to show its times against."""
        k = self.keys.shard(shard)
        jobs = self.keys.jobs_key(shard, job_id)
        reply, now = await self._pipelined(
            [
                _Call(self._scripts.get, [k.due, k.leased, k.dead, jobs], [job_id], shard),
                _Call(self._scripts.now, [k.clock], [], shard),
            ],
            wait=False,
        )
        if reply is None:
            return None, int(now)
        return _info(job_id, shard, JobState(reply[0]), reply[1], reply[2:]), int(now)

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
    ) -> ClaimBatch:
        """Lease jobs due by now + lookahead (claim.lua). O(limit log N).

        The same ``token`` again returns the same batch while its leases last, so a
        claim whose reply was lost is recovered by sending it again (see claim.lua).

        Args:
            token: names this claim; reuse it only to recover a claim that failed.
            forget: the token of the caller's previous claim on this shard, whose reply
                arrived: its kept reply is deleted.

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        reply_key = self.keys.claim_reply(shard, token)
        forget_key = reply_key if forget is None else self.keys.claim_reply(shard, forget)
        reply = await self._run(
            self._scripts.claim,
            [k.due, k.leased, k.done, k.epoch, k.clock, reply_key, forget_key, *k.jobs],
            [epoch, lookahead_ms, limit, lease_ms],
            shard,
        )
        jobs: list[Job] = []
        append = jobs.append
        # Positional Job(...) and no slice per row: this loop runs once per claimed job.
        for i in range(2, len(reply), _CLAIM_STRIDE):
            (ident, due, deadline, dup, task, data, mx, flags, nominal, attempt, ep, kind) = reply[
                i : i + 12
            ]
            error = reply[i + 16]
            append(
                Job(
                    ident.decode(),
                    shard,
                    task.decode(),
                    data if flags == 0 else decode_payload(data, flags),
                    nominal,
                    due,
                    deadline,
                    attempt,
                    mx,
                    ep,
                    _recurrence(kind, *reply[i + 12 : i + 16]) if kind else None,
                    0,
                    bool(dup),
                    error.decode(errors="replace") if error else "",
                )
            )
        return ClaimBatch(shard, int(reply[0]), jobs, int(reply[1]))

    async def ack(
        self, shard: int, epoch: int, refs: Sequence[ClaimedRef], keep_done_ms: int
    ) -> list[bool]:
        """Complete leases; record each occurrence in done (ack.lua). O(n log N).

        Returns:
            Per job, True if acked, False if its lease was lost.

        Raises:
            Fenced: if ``epoch`` is stale (nothing written).
        """
        items = [(r.id.encode(), r.attempt, r.nominal_ms, r.time_ms) for r in refs]
        return await self.ack_items(shard, epoch, items, keep_done_ms)

    async def ack_items(
        self,
        shard: int,
        epoch: int,
        items: Sequence[tuple[bytes, int, int, int]],
        keep_done_ms: int,
    ) -> list[bool]:
        """:meth:`ack` of ``(id as UTF-8, attempt, nominal_ms, next_ms)`` per job."""
        k = self.keys.shard(shard)
        args = [epoch, keep_done_ms, pack_ack_batch(items)]
        one = items[0][0].decode() if len(items) == 1 else ""
        buckets = [self.keys.jobs_key(shard, one)] if one else k.jobs
        reply = await self._write(
            self._scripts.ack, [k.leased, k.due, k.done, k.epoch, k.clock, *buckets], args, shard
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
    ) -> tuple[int, int]:
        """Back to due after ``delay_ms``, or dead (retry.lua); ``(status, when_ms)``.

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        reply = await self._write(
            self._scripts.retry,
            [k.leased, k.due, k.dead, k.epoch, k.clock, self.keys.jobs_key(shard, job_id)],
            [epoch, job_id, attempt, nominal_ms, delay_ms, error, 1 if final else 0],
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
        reply = await self._run(
            self._scripts.extend,
            [k.leased, k.epoch, k.clock, self.keys.jobs_key(shard, job_id)],
            [epoch, job_id, attempt, nominal_ms, lease_ms],
            shard,
        )
        return int(reply)

    async def release(self, shard: int, epoch: int, refs: Sequence[ClaimedRef]) -> list[bool]:
        """Hand leases back to due unrun, same attempt (release.lua).

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        args: list[Any] = [epoch, len(refs)]
        for ref in refs:
            args += (ref.id, ref.attempt, ref.nominal_ms, ref.time_ms, 1 if ref.renominate else 0)
        reply = await self._write(
            self._scripts.release, [k.leased, k.due, k.epoch, k.clock, *k.jobs], args, shard
        )
        return [bool(s) for s in reply]

    async def reap(self, shard: int, epoch: int, limit: int) -> ReapResult:
        """Expired leases back to due or to dead (reap.lua). O(limit log N).

        Raises:
            Fenced: if ``epoch`` is stale.
        """
        k = self.keys.shard(shard)
        reply = await self._run(
            self._scripts.reap,
            [k.leased, k.due, k.dead, k.epoch, k.clock, *k.jobs],
            [epoch, limit],
            shard,
        )
        n = int(reply[1])
        ids = [b.decode() for b in reply[2:]]
        return ReapResult(shard, int(reply[0]), ids[:n], ids[n:])

    # -- dead letters --------------------------------------------------------------

    async def dead_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of dead letters, oldest first (dead_list.lua)."""
        k = self.keys.shard(shard)
        reply = await self._run(self._scripts.dead_list, [k.dead, *k.jobs], [offset, count], shard)
        return DeadPage(int(reply[0]), self._rows(shard, JobState.DEAD, reply))

    @staticmethod
    def _rows(shard: int, state: JobState, reply: Sequence[Any]) -> list[JobInfo]:
        """The rows of a dead_list.lua reply (after its total)."""
        return [
            _info(reply[i].decode(), shard, state, reply[i + 1], reply[i + 2 : i + _ROW_STRIDE])
            for i in range(1, len(reply), _ROW_STRIDE)
        ]

    async def dead_requeue(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """Dead letters back to due now (dead_requeue.lua); ``ids`` empty: oldest ``limit``."""
        k = self.keys.shard(shard)
        reply = await self._run(
            self._scripts.dead_requeue, [k.dead, k.due, k.clock, *k.jobs], [limit, *ids], shard
        )
        return [b.decode() for b in reply]

    async def dead_purge(self, shard: int, ids: Sequence[str], limit: int) -> list[str]:
        """Delete dead letters (dead_purge.lua); ``ids`` empty: the oldest ``limit``."""
        k = self.keys.shard(shard)
        reply = await self._run(self._scripts.dead_purge, [k.dead, *k.jobs], [limit, *ids], shard)
        return [b.decode() for b in reply]

    # -- ownership -----------------------------------------------------------------

    async def take(self, shard: int, token: str, ttl_ms: int) -> int:
        """Take a shard (take.lua); return its new epoch, or 0 if another owner holds it."""
        k = self.keys.shard(shard)
        reply = await self._run(self._scripts.take, [k.owner, k.epoch], [token, ttl_ms], shard)
        return int(reply[0])

    async def renew(self, shard: int, token: str, epoch: int, ttl_ms: int) -> None:
        """Renew the owner token (renew.lua).

        Raises:
            Fenced: if the epoch moved on or another token holds the shard.
        """
        k = self.keys.shard(shard)
        await self._run(self._scripts.renew, [k.owner, k.epoch], [token, epoch, ttl_ms], shard)

    async def give_back(self, shard: int, token: str, epoch: int) -> bool:
        """Give a shard back and bump its epoch (give_back.lua); False if not held."""
        k = self.keys.shard(shard)
        reply = await self._run(self._scripts.give_back, [k.owner, k.epoch], [token, epoch], shard)
        return bool(reply)

    async def raise_epoch(self, shard: int, floor: int) -> bool:
        """Lift the shard's epoch to ``floor + 1`` if it is below ``floor``
        (raise_epoch.lua): after a Redis that lost its data, epochs start again from 0,
        and PostgreSQL still refuses acks below the highest one it recorded."""
        k = self.keys.shard(shard)
        return bool(await self._run(self._scripts.raise_epoch, [k.epoch], [floor], shard))

    # -- operators -----------------------------------------------------------------

    async def inspect_all(self) -> list[ShardInfo]:
        """:meth:`inspect` of every shard in one pipeline (one round trip per node).

        Read only; the calls are not atomic together (each shard is read at its own
        instant)."""
        calls = [
            _Call(self._scripts.inspect, self._inspect_keys(shard), [], shard)
            for shard in range(self.keys.shards)
        ]
        replies = await self._pipelined(calls, wait=False)
        return [_shard_info(shard, reply) for shard, reply in enumerate(replies)]

    async def due_list(self, shard: int, offset: int, count: int) -> DeadPage:
        """A page of one shard's due jobs in due order, from rank ``offset`` (read only;
        dead_list.lua over the due set). Each row's ``when_ms`` is its due time."""
        k = self.keys.shard(shard)
        reply = await self._run(self._scripts.dead_list, [k.due, *k.jobs], [offset, count], shard)
        return DeadPage(int(reply[0]), self._rows(shard, JobState.DUE, reply))

    async def due_rank(self, shard: int, time_ms: int) -> int:
        """How many of the shard's due jobs are due before ``time_ms`` (ZCOUNT)."""
        k = self.keys.shard(shard)
        return int(await self.bounded(lambda: self._client.zcount(k.due, "-inf", f"({time_ms}")))

    # -- worker stats (the dashboard's charts) -------------------------------------

    async def put_worker_stats(self, token: str, document: str, ttl_ms: int) -> None:
        """Write a worker's stats document under ``{ns}:wstats:<token>`` (SET PX)."""
        key = self.keys.worker_stats(token)
        await self.bounded(lambda: self._client.set(key, document, px=ttl_ms))

    async def delete_worker_stats(self, token: str) -> None:
        """Remove a worker's stats document (it is leaving)."""
        key = self.keys.worker_stats(token)
        await self.bounded(lambda: self._client.delete(key))

    async def bounded(self, call: Callable[[], Awaitable[Any]], shard: int = -1) -> Any:
        """Await ``call()`` (one plain command, or a script the caller holds) within
        ``call_timeout``, its errors translated to the library's."""
        try:
            async with timeout(self.call_timeout):
                return await call()
        except REDIS_ERRORS as exc:
            raise translate(exc, shard) from exc
        except TimeoutError:
            raise self._no_reply(self.call_timeout) from None

    def _inspect_keys(self, shard: int) -> list[str]:
        k = self.keys.shard(shard)
        return [k.due, k.leased, k.dead, k.owner, k.epoch, k.clock]

    async def inspect(self, shard: int) -> ShardInfo:
        """Counts, overdue lag, owner and next due of one shard (inspect.lua, read only).
        O(log N)."""
        reply = await self._run(self._scripts.inspect, self._inspect_keys(shard), [], shard)
        return _shard_info(shard, reply)


def _shard_info(shard: int, reply: Sequence[Any]) -> ShardInfo:
    """A ShardInfo from inspect.lua's reply."""
    now, due, overdue, oldest, next_due, leased, expired, dead, owner, ttl, epoch = reply
    return ShardInfo(
        shard=shard,
        now_ms=int(now),
        due=int(due),
        overdue=int(overdue),
        oldest_overdue_ms=int(oldest),
        next_due_ms=int(next_due),
        leased=int(leased),
        expired=int(expired),
        dead=int(dead),
        owner=owner.decode(errors="replace"),
        owner_ttl_ms=int(ttl),
        epoch=int(epoch),
    )
