"""The calls of the flow limits (issue 35; docs/limits.md): a key's permits
(limits.lua, in the key's own slot), the waits and wakes of its jobs (retry.lua mode 3
and wake.lua, in the job's shard) and the limits of record (``{ns}:limits``).

Ground rules:

- A key's permits live in one slot of their own (``Keys.limit_keys``): never in a
  job's shard, so a key's jobs may be in every shard, a job keeps its shard by id
  (lookup by id stays O(1)) and no script touches two slots.
- A job's permit is named by ``"<shard>|<id>"`` and held under ``"<epoch>:<attempt>"``
  (the fencing of its lease): a release by a run that lost its lease frees nothing.
- Every call is bounded and translated like the rest of the store (its ``Transport``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tickwheel.durable.model import ClaimBatch, DurableError, Job, Limits

from ._codec import DEFAULTS, KEY_FIELD, claimed_key, claimed_trace, decode_payload
from ._msgpack import unpack_reply
from ._scripts import ScriptCalls
from ._transport import Call

__all__ = [
    "ACQUIRED",
    "BATCH_CALLS",
    "PERMIT_WAIT",
    "RATE_WAIT",
    "WAKE_HOLD_MS",
    "KeyState",
    "LimitCalls",
    "member_of",
]

ACQUIRED, PERMIT_WAIT, RATE_WAIT = 1, 2, 3  # limits.lua acquire's codes
# Script calls in one pipeline of the batched permit calls: a round of 4,000 limited
# jobs goes in a few pipelines in flight at once, each well inside the call bound.
BATCH_CALLS = 200
# Jobs in one limits.lua batch call on one Redis (its own cost paid once per call):
# small enough that a call holds Redis for a few ms at most.
BATCH_JOBS = 200
# How long a wake that found its job still leased is kept for the job's wait (ms).
WAKE_HOLD_MS = 60_000


def _counts(lim: Limits) -> tuple[int, int, int]:
    """limits.lua's conc, rate_n and rate_ms of ``lim``."""
    return (lim.concurrency, lim.rate_n, lim.rate_ms)


# One job of a batch: (task, key, its limits' counts, its values: 'A' member, holder,
# occurrence; 'R' member, holder).
_Item = tuple[str, str, tuple[int, int, int], list[object]]


def member_of(job: Job) -> str:
    """The permit's member of a job: ``"<shard>|<id>"``."""
    return f"{job.shard}|{job.id}"


@dataclass(frozen=True, slots=True)
class KeyState:
    """One flow key of one task, as ``inspect --key`` and the dashboard show it."""

    task: str
    key: str  # "" for the task's single key
    limits: Limits
    running: int  # permits held by runs
    waiting: int  # jobs queued for a permit (waiting for the rate: not counted here)
    handed: int  # permits handed to woken waiters, not taken yet
    next_release_ms: int  # the earliest permit deadline (ms), or -1 (none held)
    next_start_ms: int  # the earliest start booked for a rate waiter (ms), or -1
    window_starts: int  # starts within the current rate window
    now_ms: int  # the key slot's clock when read


class LimitCalls(ScriptCalls):
    """limits.lua, wake.lua and retry.lua's permit wait over one namespace."""

    __slots__ = ()

    # -- limits of record ------------------------------------------------------------

    async def declare(self, declared: dict[str, Limits | None]) -> None:
        """Write a worker's declarations: each task's limits, or none (its field
        deleted). The last writer wins (docs/limits.md, "Deploys")."""
        client = self.transport.client
        sets: dict[Any, Any] = {t: lim.encode() for t, lim in declared.items() if lim}
        gone = [t for t, lim in declared.items() if lim is None]
        if sets:
            await self.transport.bounded(lambda: client.hset(self.keys.limits, mapping=sets))
        if gone:
            await self.transport.bounded(lambda: client.hdel(self.keys.limits, *gone))

    async def read(self) -> dict[str, Limits]:
        """The limits of record: task -> limits (tasks without limits absent)."""
        client = self.transport.client
        raw = await self.transport.bounded(lambda: client.hgetall(self.keys.limits))
        out = {}
        for task, text in raw.items():
            limits = Limits.decode(text)
            if limits.on:
                out[task.decode(errors="replace")] = limits
        return out

    # -- permits (the key's slot) -----------------------------------------------------

    async def _call(self, task: str, key: str, args: list[object]) -> object:
        """limits.lua on ``key`` of ``task`` with ``args`` (op, member, holder, then
        hold_ms and the occurrence; the limits are put between)."""
        lim = args.pop(3)
        assert isinstance(lim, Limits)
        args[3:3] = [lim.concurrency, lim.rate_n, lim.rate_ms]
        return await self.transport.run(
            self._scripts.limits, self.keys.limit_keys(task, key), args, -1
        )

    async def acquire(self, job: Job, lim: Limits, hold_ms: int) -> tuple[int, int]:
        """Take a permit for ``job``'s run: ``(ACQUIRED, 0)``; ``(PERMIT_WAIT, 0)``, it is
        queued for one; ``(RATE_WAIT, delay_ms)``, a start is booked in ``delay_ms``."""
        holder = f"{job.epoch}:{job.attempt}"
        occurrence = f"{job.nominal_ms}|{job.attempt}"
        args: list[object] = ["a", member_of(job), holder, lim, hold_ms, occurrence]
        reply = await self._call(job.task, job.key, args)
        assert isinstance(reply, list)
        return int(reply[0]), int(reply[1])

    async def release(
        self, task: str, key: str, member: str, holder: str, *, lim: Limits, hold_ms: int
    ) -> list[str]:
        """Free the permit of ``member`` if ``holder`` holds it (``""``: one handed to it
        that it did not take), and hand the free ones to the first waiters: their
        members, for :meth:`wake`."""
        reply = await self._call(task, key, ["r", member, holder, lim, hold_ms, ""])
        assert isinstance(reply, list)
        return [m.decode(errors="replace") for m in reply]

    async def extend(self, job: Job, lim: Limits, hold_ms: int, holder: str | None = None) -> bool:
        """Push ``job``'s permit deadline to now + ``hold_ms`` (with its lease), if
        ``holder`` holds it (default: the run's ``"<epoch>:<attempt>"``; ``""``: a run
        started on the permit a release handed to its job)."""
        if holder is None:
            holder = f"{job.epoch}:{job.attempt}"
        args: list[object] = ["x", member_of(job), holder, lim, hold_ms, ""]
        return bool(await self._call(job.task, job.key, args))

    async def look(self, task: str, key: str, lim: Limits) -> KeyState:
        """One key's permits, waiters and next release (read only). O(log N)."""
        r = await self._call(task, key, ["l", "", "", lim, 0, ""])
        assert isinstance(r, list)
        return KeyState(task, key, lim, *(int(v) for v in r))

    # -- batches: one pipeline of limits.lua calls, one round trip per node ----------

    async def _pipelined(self, calls: list[Call]) -> list[Any]:
        """``calls`` in pipelines of at most ``BATCH_CALLS`` (each call atomic alone;
        one round trip per node each): their replies in order."""
        if len(calls) <= BATCH_CALLS:
            return await self.transport.pipelined(calls, wait=False)
        # In flight together, on as many connections: Redis runs one while the next is
        # packed and sent.
        parts = await asyncio.gather(
            *(
                self.transport.pipelined(calls[i : i + BATCH_CALLS], wait=False)
                for i in range(0, len(calls), BATCH_CALLS)
            )
        )
        return [reply for part in parts for reply in part]

    async def _batched(self, op: str, hold_ms: int, items: Sequence[_Item]) -> list[list[Any]]:
        """limits.lua batch calls (``op`` 'A' or 'R') of ``items`` (task, key, its
        limits' three counts, the job's values), pipelined: on one Redis up to
        ``BATCH_JOBS`` jobs a call, whatever their keys; on a cluster one call per flow
        key (one slot). A key's jobs go as one group (its limits once). Each job's part
        of its call's reply, in the order of ``items``."""
        by_key: dict[tuple[str, str, tuple[int, int, int]], list[int]] = {}
        for i, (task, key, counts, _) in enumerate(items):
            by_key.setdefault((task, key, counts), []).append(i)
        calls: list[Call] = []
        order: list[list[int]] = []  # per call, the items it carries
        keys: list[str] = []
        args: list[object] = []
        for (task, key, counts), members in by_key.items():
            full = len(order) and len(order[-1]) + len(members) > BATCH_JOBS
            if not args or self.transport.cluster or full:
                keys, args = [], [op, hold_ms]
                calls.append(Call(self._scripts.limits, keys, args, -1))
                order.append([])
            keys += self.keys.limit_keys(task, key)
            args += [len(members), *counts]
            for i in members:
                args += items[i][3]
                order[-1].append(i)
        out: list[list[Any]] = [[] for _ in items]
        for ids, reply in zip(order, await self._pipelined(calls), strict=True):
            k = 0
            for i in ids:  # 'A': code, delay; 'R': count, then that many members
                if op == "A":
                    n = 2
                elif op == "K":  # waiters left, new, all, then all members
                    n = 3 + int(reply[k + 2])
                else:
                    n = 1 + int(reply[k])
                out[i] = reply[k : k + n]
                k += n
        return out

    async def acquire_many(
        self, jobs: Sequence[tuple[Job, Limits]], hold_ms: int
    ) -> list[tuple[int, int]]:
        """:meth:`acquire` for each ``(job, limits)``, in batches (limits.lua 'A'): one
        round trip per node. Each acquire is atomic in its key's slot. The codes in
        order."""
        items: list[_Item] = []
        for job, lim in jobs:
            holder = f"{job.epoch}:{job.attempt}"
            occurrence = f"{job.nominal_ms}|{job.attempt}"
            items.append((job.task, job.key, _counts(lim), [member_of(job), holder, occurrence]))
        return [(int(r[0]), int(r[1])) for r in await self._batched("A", hold_ms, items)]

    async def release_many(
        self, items: Sequence[tuple[str, str, str, str, Limits]], hold_ms: int
    ) -> list[list[str]]:
        """:meth:`release` for each ``(task, key, member, holder, limits)``, in batches
        (limits.lua 'R'): for each, the members handed a permit (to wake)."""
        batch: list[_Item] = [
            (task, key, _counts(lim), [member, holder]) for task, key, member, holder, lim in items
        ]
        replies = await self._batched("R", hold_ms, batch)
        return [[m.decode(errors="replace") for m in r[1:]] for r in replies]

    async def recheck_many(
        self, items: Sequence[tuple[str, str, Limits | None]], hold_ms: int
    ) -> list[tuple[int, list[str], list[str]]]:
        """The recheck of each ``(task, key, limits)`` (limits.lua 'K', in batches):
        permits past their deadline freed, free ones handed to the first waiters. For
        each: the waiters left, the members handed a permit now, and those handed one
        before and not taken yet (each to be woken)."""
        batch: list[_Item] = []
        for task, key, lim in items:
            conc = lim.concurrency if lim is not None and lim.concurrency else -1
            batch.append((task, key, (conc, 0, 0), []))
        out = []
        for r in await self._batched("K", hold_ms, batch):
            members = [m.decode(errors="replace") for m in r[3:]]
            new = int(r[1])
            out.append((int(r[0]), members[:new], members[new:]))
        return out

    async def rechecks_due(
        self, shards: Sequence[int], limit: int
    ) -> dict[int, list[tuple[str, str, int]]]:
        """The flow keys of each shard's permit waiters whose recheck time has come
        (waits.lua 'r', read only; one pipeline): ``(task, key, when_ms)``, at most
        ``limit`` a shard; shards with none left out."""
        calls = [self._shard_call(shard, "r", limit)[0] for shard in shards]
        out: dict[int, list[tuple[str, str, int]]] = {}
        for shard, reply in zip(shards, await self._pipelined(calls), strict=True):
            for i in range(0, len(reply), 2):
                task, _, key = reply[i].partition(b"\0")
                when = int(reply[i + 1])
                out.setdefault(shard, []).append((task.decode(), key.decode(), when))
        return out

    async def rechecked(
        self, shard: int, recheck_ms: int, done: Sequence[tuple[str, str, int, int]]
    ) -> int:
        """After :meth:`recheck_many`: each ``(task, key, when_ms, waiters left)``'s
        timer is set ``recheck_ms`` ahead while its key has waiters, else removed
        (waits.lua 't'). The count set again."""
        call, _ = self._shard_call(shard, "t", recheck_ms)
        assert isinstance(call.args, list)
        for task, key, when_ms, left in done:
            call.args.extend((f"{task}\0{key}", when_ms, left))
        return int(await self.transport.run(call.script, call.keys, call.args, shard))

    def _shard_call(self, shard: int, op: str, first: object) -> tuple[Call, dict[str, int]]:
        """An empty waits.lua call on ``shard`` (``op``, ``first`` its ARGV[2]), and the
        index of each key added to it past the shard's own eight."""
        k = self.keys.shard(shard)
        keys = [k.leased, k.due, k.epoch, k.clock, k.prio, k.wakes, k.waiting, k.rechecks]
        return Call(self._scripts.waits, keys, [op, first], shard), {}

    @staticmethod
    def _index(call: Call, index: dict[str, int], key: str) -> int:
        """The index of ``key`` among ``call``'s KEYS (added once)."""
        i = index.get(key)
        if i is None:
            assert isinstance(call.keys, list)
            call.keys.append(key)
            i = index[key] = len(call.keys)
        return i

    async def wake_many(self, members: Sequence[tuple[str, str]]) -> list[int]:
        """:meth:`wake` for each ``(task, member)``: one waits.lua call per shard (of at
        most ``BATCH_JOBS``), pipelined. The codes in order."""
        by_shard: dict[int, list[int]] = {}
        parsed = []
        for i, (task, member) in enumerate(members):
            text, _, job_id = member.partition("|")
            parsed.append((task, int(text), job_id))
            by_shard.setdefault(int(text), []).append(i)
        calls: list[Call] = []
        order: list[list[int]] = []
        for shard, ids in by_shard.items():
            for c in range(0, len(ids), BATCH_JOBS):
                call, index = self._shard_call(shard, "k", WAKE_HOLD_MS)
                for i in ids[c : c + BATCH_JOBS]:
                    _, _, job_id = parsed[i]
                    bucket = self._index(call, index, self.keys.jobs_key(shard, job_id))
                    assert isinstance(call.args, list)
                    call.args.extend((job_id, bucket))
                calls.append(call)
                order.append(ids[c : c + BATCH_JOBS])
        out = [0] * len(members)
        for ids, reply in zip(order, await self._pipelined(calls), strict=True):
            for i, code in zip(ids, reply, strict=True):
                out[i] = int(code)
        return out

    async def claim_woken(
        self,
        shard: int,
        epoch: int,
        woken: Sequence[tuple[str, str]],
        lease_ms: int,
        *,
        token: str,
        forget: str | None = None,
        prestart: bool = False,
    ) -> tuple[list[int], ClaimBatch]:
        """:meth:`wake_many` for the waiters ``woken`` (``(task, job id)``) of ``shard``,
        leasing to ``epoch`` at once those now due (woken.lua; one call per
        ``BATCH_JOBS``, pipelined). Per job a code (1 leased: in the batch; 2 still
        leased, its wait in flight; 3 due now, a claim's to take; 0 not waiting) and the
        batch of the jobs leased, as :meth:`Store.claim` returns it. ``token`` and
        ``forget`` are claim.lua's: a call whose reply was lost is sent again with its
        token and returns the same jobs.

        Raises:
            Fenced: if ``epoch`` is stale (nothing written).
            DurableError: if a reply is not woken.lua's.
        """
        k = self.keys.shard(shard)
        reply_key = self.keys.claim_reply(shard, token)
        forget_key = reply_key if forget is None else self.keys.claim_reply(shard, forget)
        head = [k.due, k.leased, k.epoch, k.clock, k.prio, k.wakes, k.done, k.paused]
        calls: list[Call] = []
        for c in range(0, len(woken), BATCH_JOBS):
            # One reply key a call: the token's, with the call's index past the first.
            key = reply_key if not c else f"{reply_key}:{c}"
            keys: list[str] = [*head, key, forget_key if not c else key, k.waiting]
            args: list[object] = [epoch, lease_ms, "1" if prestart else "", WAKE_HOLD_MS]
            call = Call(self._scripts.woken, keys, args, shard)
            index: dict[str, int] = {}
            for _, job_id in woken[c : c + BATCH_JOBS]:
                bucket = self.keys.bucket_of(job_id)
                args += [job_id, self._index(call, index, k.jobs[bucket]), bucket]
            calls.append(call)
        codes: list[int] = []
        jobs: list[Job] = []
        now_ms = 0
        for codes_part, packed in await self._pipelined(calls):
            codes += [int(c) for c in codes_part]
            try:
                reply = unpack_reply(packed)
            except ValueError as exc:
                raise DurableError(f"woken claim on shard {shard}: {exc}") from None
            now_ms = max(now_ms, int(reply[0]))
            jobs += _woken_jobs(reply, shard)
        return codes, ClaimBatch(shard=shard, now_ms=now_ms, jobs=jobs, dropped=0)

    async def wait_many(self, shard: int, waits: Sequence[tuple[Job, int, bool]]) -> None:
        """:meth:`wait` for each ``(job, delay_ms, permit)`` of one ``shard`` and one
        epoch: waits.lua calls of at most ``BATCH_JOBS``, pipelined.

        Raises:
            Fenced: if the shard's epoch moved on (the jobs are the new owner's).
        """
        calls: list[Call] = []
        for c in range(0, len(waits), BATCH_JOBS):
            call, index = self._shard_call(shard, "w", waits[0][0].epoch)
            assert isinstance(call.args, list)
            buckets = self.keys.shard(shard).jobs
            for job, delay_ms, permit in waits[c : c + BATCH_JOBS]:
                # A claimed job's bucket is the claim's (its reply's tag), not hashed again.
                b = job.bucket if job.bucket >= 0 else self.keys.bucket_of(job.id)
                bucket = self._index(call, index, buckets[b])
                args = [job.id, job.attempt, job.nominal_ms, delay_ms, "1" if permit else ""]
                call.args.extend((*args, bucket))
            calls.append(call)
        await self._pipelined(calls)

    # -- the job's shard ----------------------------------------------------------------

    async def wait(self, job: Job, delay_ms: int, *, permit: bool) -> tuple[int, int]:
        """Hand ``job`` back, unspent, to wait (retry.lua mode 3): for a ``permit``, in no
        index, its key's recheck timer at most ``delay_ms`` ahead (due at once when a
        wake came first); for a start, due in ``delay_ms``. ``(status, due_ms)``,
        status 3 done, 0 its lease is lost."""
        shard = job.shard
        k = self.keys.shard(shard)
        keys = [k.leased, k.due, k.dead, k.epoch, k.clock, self.keys.jobs_key(shard, job.id)]
        keys += [k.prio, k.waiting, k.wakes, k.rechecks]
        reply = await self.transport.run(
            self._scripts.retry,
            keys,
            [
                job.epoch,
                job.id,
                job.attempt,
                job.nominal_ms,
                delay_ms,
                "",
                3,
                "1" if permit else "",
            ],
            shard,
        )
        return int(reply[0]), int(reply[1])

    async def wake(self, task: str, member: str) -> int:
        """Make the waiter ``member`` (``"<shard>|<id>"``) of ``task`` due now: 1 done, 2
        it is still leased (its wait makes it due at once), 0 it no longer waits."""
        text, _, job_id = member.partition("|")
        shard = int(text)
        k = self.keys.shard(shard)
        bucket = self.keys.jobs_key(shard, job_id)
        return int(
            await self.transport.run(
                self._scripts.wake,
                [*(k.due, k.leased, k.clock, k.waiting, k.wakes, k.prio), bucket],
                [job_id, WAKE_HOLD_MS],
                shard,
            )
        )

    async def waiting(self, tasks: list[str]) -> dict[str, int]:
        """Jobs per task that wait for a permit or a start of their key, over every
        shard (one pipeline): the metrics' totals, each shard's counts
        (``{ns:s}:kwaitn``, kept by the scripts that start and end a wait). O(tasks x
        shards)."""
        if not tasks:
            return {}
        client = self.transport.client

        async def count() -> list[int]:
            pipe = client.pipeline(transaction=False)
            for task in tasks:
                for shard in range(self.keys.shards):
                    pipe.hget(self.keys.shard(shard).waiting, task)
            return [max(int(n or 0), 0) for n in await pipe.execute()]

        counts = await self.transport.bounded(count)
        n = self.keys.shards
        return {t: sum(counts[i * n : (i + 1) * n]) for i, t in enumerate(tasks)}


def _woken_jobs(reply: list[Any], shard: int) -> list[Job]:
    """The jobs of woken.lua's claim reply (``{now, 0, 0, rows}``): each row is id, due,
    deadline, tag, count and the record's first count fields, the trailing defaults
    left out (one-shot jobs only)."""
    jobs = []
    i = 3
    while i < len(reply):
        ident, due, deadline, tag, count = reply[i : i + 5]
        f = reply[i + 5 : i + 5 + count]
        i += 5 + count
        if count <= KEY_FIELD:  # the trailing defaults are left out, as in the record
            f += DEFAULTS[count : KEY_FIELD + 1]
        jobs.append(
            Job(
                id=ident.decode(),
                shard=shard,
                task=f[0].decode(),
                payload=f[1] if f[3] == 0 else decode_payload(f[1], f[3]),
                nominal_ms=f[4],
                due_ms=due,
                deadline_ms=deadline,
                attempt=f[5],
                max_attempts=f[2],
                epoch=f[6],
                recurrence=None,
                last_error=f[12].decode(errors="replace"),
                bucket=tag >> 1,
                timeout_ms=f[13],
                trace=claimed_trace(f[14]),
                key=claimed_key(f[15]),
            )
        )
    return jobs
