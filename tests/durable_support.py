"""Shared helpers of the durable tests: schedulers on a real redis-server, a clock the
test pushes forward, and an executable check of a shard's invariants."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from tickwheel.durable import Client, JobState, Scheduler
from tickwheel.durable.store._connect import client_from_url
from tickwheel.durable.store._msgpack import FAR_SLOT_MS, unpack_far_chunk, unpack_far_ids

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh event loop (the suite has no asyncio plugin)."""
    return asyncio.run(coro)


def unique_ns() -> str:
    """A namespace of this test's own, so tests share a server without interfering."""
    return f"t{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def open_scheduler(
    url: str, namespace: str | None = None, **kwargs: Any
) -> AsyncIterator[Scheduler]:
    """A Scheduler on its own client and namespace (server check off unless asked)."""
    kwargs.setdefault("check", False)
    client = client_from_url(url)
    sched = Scheduler(client, namespace or unique_ns(), **kwargs)
    try:
        yield sched
    finally:
        await client.aclose()


def client_of(sched: Scheduler) -> Client:
    """The redis-py client a scheduler uses (tests read Redis directly through it)."""
    return sched.store.client


async def push_clock(sched: Scheduler, shard: int, ms: int) -> int:
    """Move shard's clock forward by ``ms``: now = max(TIME, clock), so time jumps.

    Returns:
        The shard's new now.
    """
    now = await sched.store.now(shard)
    await client_of(sched).set(sched.keys.shard(shard).clock, now + ms)
    return now + ms


async def push_all_clocks(sched: Scheduler, ms: int) -> None:
    """:func:`push_clock` on every shard."""
    for shard in range(sched.keys.shards):
        await push_clock(sched, shard, ms)


async def snapshot(sched: Scheduler) -> dict[bytes, bytes | None]:
    """Every key of the namespace with its DUMP, to assert that nothing was written."""
    client = client_of(sched)
    out: dict[bytes, bytes | None] = {}
    async for key in client.scan_iter(match=f"*{sched.keys.namespace}*"):
        out[key] = await client.dump(key)
    return out


async def far_jobs(sched: Scheduler, shard: int) -> dict[str, int]:
    """The live jobs of a shard's far index, each with its due time: a job whose record
    is in none of due, leased, dead and parked, with an entry in the slot of its nominal."""
    client = client_of(sched)
    k = sched.keys.shard(shard)
    taken = set()
    for ks in (k.due, k.leased, k.dead, k.parked):
        taken |= {m.decode() for m in await client.zrange(ks, 0, -1)}
    out: dict[str, int] = {}
    for member in await client.zrange(k.far, 0, -1):
        slot, is_open, ids = unpack_far_chunk(member)
        if is_open:  # the slot's open chunk: its ids are in faro
            blob = await client.hget(k.faro, str(slot))
            assert blob is not None, (member, "no open chunk in faro")
            ids = unpack_far_ids(blob)
        for job_id in ids:
            if job_id in taken or job_id in out:
                continue
            info = await sched.store.get(shard, job_id)
            if info is not None and info.nominal_ms - info.nominal_ms % FAR_SLOT_MS == slot:
                out[job_id] = info.nominal_ms
    return out


async def check_shard(sched: Scheduler, shard: int) -> dict[str, JobState]:
    """Assert a shard's invariants and return each job's state.

    - due, leased and dead are disjoint, and their union is exactly the record keys;
    - a leased record carries a lease epoch, a due or dead one none.
    """
    client = client_of(sched)
    k = sched.keys.shard(shard)
    due = {m.decode() for m in await client.zrange(k.due, 0, -1)}
    leased = {m.decode() for m in await client.zrange(k.leased, 0, -1)}
    dead = {m.decode() for m in await client.zrange(k.dead, 0, -1)}
    parked = {m.decode() for m in await client.zrange(k.parked, 0, -1)}
    records: set[str] = set()
    async with client.pipeline(transaction=False) as pipe:
        for bucket in k.jobs:
            pipe.hkeys(bucket)
        per_bucket = await pipe.execute()
    for b, names in enumerate(per_bucket):
        fields = {m.decode() for m in names}
        assert not (records & fields), (b, records & fields)  # one bucket per id
        assert all(sched.keys.bucket_of(f) == b for f in fields), (b, fields)
        records |= fields
    far = await far_jobs(sched, shard)
    dump = (
        f"due={sorted(due)} far={sorted(far)} leased={sorted(leased)} dead={sorted(dead)} "
        f"jobs={sorted(records)}"
    )
    assert not (due & leased) and not (due & dead) and not (leased & dead), dump
    assert not (parked & (due | leased | dead)), (sorted(parked), dump)
    # parkedx holds one member per parked job, "<task>\0<due>\0<id>".
    index = [m.split(b"\0") for m in await client.zrange(k.parkedx, 0, -1)]
    assert sorted(p[2].decode() for p in index) == sorted(parked), dump
    # A job with a record in none of due, leased, dead and parked is in the far index,
    # or waits for a permit of its flow key (in no index: docs/limits.md).
    waiting = set()
    for job_id in records - due - leased - dead - parked - set(far):
        info = await sched.store.get(shard, job_id)
        if info is not None and info.state is JobState.WAITING:
            waiting.add(job_id)
    assert set(far) == records - due - leased - dead - parked - waiting, dump
    # Every open chunk in faro has its marker in far.
    opened = {int(f) for f in await client.hkeys(k.faro)}
    markers = {
        unpack_far_chunk(m)[0] for m in await client.zrange(k.far, 0, -1) if m.endswith(b":0")
    }
    assert opened == markers, (opened, markers)
    states = dict.fromkeys(due, JobState.DUE)
    states.update(dict.fromkeys(far, JobState.DUE))
    states.update(dict.fromkeys(parked, JobState.DUE))
    states.update(dict.fromkeys(leased, JobState.LEASED))
    states.update(dict.fromkeys(dead, JobState.DEAD))
    states.update(dict.fromkeys(waiting, JobState.WAITING))
    for job_id, state in states.items():
        info = await sched.store.get(shard, job_id)
        # A job due at its booked start waits for a start of its key (the rate).
        rated = state is JobState.DUE and info is not None and info.state is JobState.WAITING
        assert info is not None and (info.state is state or rated), (job_id, info, dump)
        if job_id in far:  # due at its nominal, within its entry's slot
            assert info.when_ms == info.nominal_ms == far[job_id], (job_id, info, far[job_id])
        assert (info.epoch > 0) == (state is JobState.LEASED), (job_id, info, dump)
    return states


async def check_all(sched: Scheduler) -> dict[str, JobState]:
    """:func:`check_shard` over every shard."""
    out: dict[str, JobState] = {}
    for shard in range(sched.keys.shards):
        out.update(await check_shard(sched, shard))
    return out
