"""Durable scheduler behaviour against a real redis-server: one test per rule."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.durable_support import (
    check_all,
    check_shard,
    client_of,
    open_scheduler,
    push_clock,
    run,
    snapshot,
)
from tickwheel.durable import (
    DurableError,
    Fenced,
    JobSpec,
    JobState,
    LeaseLost,
    NotOwner,
    Scheduler,
    ScheduleStatus,
)
from tickwheel.durable.model import MIN_AT_MS
from tickwheel.durable.store._codec import DEFAULTS, pack_record
from tickwheel.durable.store._msgpack import unpack_reply

pytestmark = pytest.mark.redis


async def _owned(sched: Scheduler, job_id: str) -> int:
    shard = sched.keys.shard_of(job_id)
    assert await sched.take(shard)
    return shard


def test_schedule_keeps_by_default_and_replaces_when_asked(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            first = await s.schedule("j", "t", b"one", delay=60)
            assert first.status is ScheduleStatus.CREATED
            again = await s.schedule("j", "t", b"two", delay=600)
            assert again.status is ScheduleStatus.KEPT
            assert again.when_ms == first.when_ms
            info = await s.get("j")
            assert info is not None and info.payload == b"one" and info.when_ms == first.when_ms
            rep = await s.schedule("j", "t", {"x": 2}, delay=600, replace=True)
            assert rep.status is ScheduleStatus.REPLACED
            info = await s.get("j")
            assert info is not None and info.payload == {"x": 2} and info.when_ms == rep.when_ms
            await check_all(s)

    run(main())


def test_delay_is_added_on_the_server(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            shard = s.keys.shard_of("d")
            before = await s.now(shard)
            res = await s.schedule("d", "t", delay=timedelta(seconds=10))
            after = await s.now(shard)
            assert before + 10_000 <= res.when_ms <= after + 10_000

    run(main())


def test_absolute_time_as_ms_or_datetime(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            r1 = await s.schedule("a", "t", at=1_900_000_000_123)
            assert r1.when_ms == 1_900_000_000_123
            when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
            r2 = await s.schedule("b", "t", at=when)
            assert r2.when_ms == int(when.timestamp() * 1000)

    run(main())


def test_claim_lease_ack_and_lookahead(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            assert await s.take(0) == 1
            await s.schedule("now", "t", b"p")
            await s.schedule("soon", "t", b"p", delay=5)
            await s.schedule("later", "t", b"p", delay=500)
            batch = await s.claim(0)
            assert [j.id for j in batch.jobs] == ["now"]
            batch2 = await s.claim(0, lookahead=10)
            assert [j.id for j in batch2.jobs] == ["soon"]
            job = batch2.jobs[0]
            # A job claimed ahead of time holds its lease until due + lease.
            assert job.deadline_ms == job.due_ms + 30_000
            assert (await check_shard(s, 0)) == {
                "now": JobState.LEASED,
                "soon": JobState.LEASED,
                "later": JobState.DUE,
            }
            await s.ack(batch.jobs[0])
            await s.ack(job)
            assert await s.get("now") is None
            # A second ack of a completed occurrence (a re-send whose first reply was
            # lost) is recognised by its done entry: acked, and nothing changes.
            await s.ack(job)
            assert await check_shard(s, 0) == {"later": JobState.DUE}

    run(main())


def test_a_claim_returns_each_jobs_record_bucket_and_the_ack_uses_it(redis_url: str) -> None:
    """The claim says which record hash each job is in (so the ack does not hash the id
    again in Redis); a batch ack with a bucket out of range is refused and writes nothing,
    and a job whose bucket is not known (-1) is acked by hashing its id."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, buckets=8) as s:
            await s.take(0)
            ids = [f"b{i}" for i in range(40)]
            await s.schedule_many(JobSpec(job_id, "t") for job_id in ids)
            jobs = (await s.claim(0, limit=len(ids))).jobs
            assert sorted(j.id for j in jobs) == sorted(ids)
            assert [j.bucket for j in jobs] == [s.keys.bucket_of(j.id) for j in jobs]
            assert len({j.bucket for j in jobs}) > 1 and not any(j.duplicate for j in jobs)
            bad = [*jobs[:2], dataclasses.replace(jobs[2], bucket=8)]
            before = await snapshot(s)
            with pytest.raises(DurableError, match="bucket 8 of b"):
                await s.ack_many(bad)
            with pytest.raises(ValueError, match=r"bucket must be in 0 \.\. 7, got 8"):
                await s.ack_many(bad[2:])
            assert await snapshot(s) == before
            unknown = [dataclasses.replace(j, bucket=-1) for j in jobs[:10]]
            assert await s.ack_many(unknown) == [True] * 10
            assert await s.ack_many(jobs[10:]) == [True] * 30
            assert await s.ack_many([jobs[0], jobs[5]]) == [True, True]  # found done
            assert await check_shard(s, 0) == {}

    run(main())


# What claim.lua must store for a record it leases, done the long way: decode, resolve
# the nominal against the due score, set the epoch, encode.
_LEASED = """local r = rec_decode(ARGV[1])
if r[F_NOMINAL] == 0 then r[F_NOMINAL] = tonumber(ARGV[2]) end
r[F_EPOCH] = tonumber(ARGV[3])
return rec_encode(r)"""


@pytest.mark.parametrize(
    "fields",
    [
        [b""],  # no field at all (every one at its default)
        [b"t"],  # task only
        [b"t", b"p"],
        [b"t", b"p", 9],  # a max
        [b"t", b"[1, 2]", 5, 1],  # JSON
        [b"t", b"x" * 300, 200],  # a str16 payload, a max past a fixint
        [b"t", b"p", 5, 0, 1_700_000_000_123],  # nominal explicit (far, promoted)
        [b"t", b"p", 5, 0, 1_700_000_000_123, 3],  # a later attempt
        [b"t", b"p", 5, 0, 0, 3],  # nominal still the due score, past the first attempt
        [b"t", b"p", 5, 0, 0, 2, 0, 0, b"", 0, 0, 0, b"boom"],  # an error kept
        [b"t", b"p", 5, 0, 0, 1, 0, 1, b"60000"],  # recurring
        [b"t", b"p", 5, 0, 0, 1, 0, 0, b"", 0, 0, 0, b"", 1500],  # its own timeout
        [b"t", b"[1]", 7, 1, 1_700_000_000_123, 2, 0, 0, b"", 0, 0, 0, b"", 90_000],
        [b"t", b"p", 5, 0, 0, 2, 0, 0, b"", 0, 0, 0, b"boom", 1500],  # and an error
        [b"t", b"p", 5, 0, 0, 1, 0, 0, b"", 0, 0, 0, b"", 1500, b"00-" + b"a" * 52],
        [b"t", b"p", 5, 0, 0, 1, 0, 1, b"60000", 0, 0, 0, b"", 1500],  # recurring
    ],
    ids=[
        "empty",
        "task",
        "payload",
        "max",
        "json",
        "str16",
        "nominal",
        "attempt",
        "zero-nominal",
        "error",
        "recurring",
        "timeout",
        "timeout-nominal",
        "timeout-error",
        "timeout-trace",
        "timeout-recurring",
    ],
)
def test_a_claim_stores_each_record_as_decoding_and_encoding_it_would(
    redis_url: str, fields: list[int | bytes]
) -> None:
    """claim.lua leases most records by appending to them (rec_tails); the bytes
    must be those of the decode-and-encode it replaces, for every record shape."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            epoch = await s.take(0)
            client = client_of(s)
            raw = pack_record(fields)
            due = await s.now(0) - 5
            await client.hset(s.keys.jobs_key(0, "j"), "j", raw)
            await client.zadd(s.keys.shard(0).due, {"j": due})
            [job] = (await s.claim(0)).jobs
            lib = resources.files("tickwheel.durable.store").joinpath("lua/_lib.lua").read_text()
            want = await client.eval(lib + "\n" + _LEASED, 0, raw, due, epoch)
            assert await client.hget(s.keys.jobs_key(0, "j"), "j") == want
            full = [*fields, *DEFAULTS[len(fields) :]]
            payload = json.loads(full[1]) if full[3] == 1 else full[1]
            assert (job.task, job.payload, job.max_attempts) == (full[0].decode(), payload, full[2])
            assert (job.nominal_ms, job.attempt, job.due_ms) == (full[4] or due, full[5], due)
            assert job.last_error == full[12].decode() and job.epoch == epoch
            assert job.timeout_ms == full[13]
            assert await s.ack_many([job]) == [True]

    run(main())


def test_a_reply_that_is_not_a_msgpack_array_is_refused() -> None:
    assert unpack_reply(b"\x93\x01\xa1a\xcf" + (2**40).to_bytes(8, "big")) == [1, b"a", 2**40]
    bad_replies = ((b"\x01", "not a msgpack array"), (b"\xc1", "not msgpack"), (b"", "not"))
    for bad, why in (*bad_replies, ([1, 2], "not msgpack")):
        with pytest.raises(ValueError, match=why):
            unpack_reply(bad)


def test_a_claim_reply_is_one_msgpack_string_kept_for_its_resend(redis_url: str) -> None:
    """claim.lua returns its reply packed (no RESP array built in Redis), and a re-send
    with the same token gets the kept bytes back as they were, leasing nothing more."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            epoch = await s.take(0)
            await s.schedule_many(JobSpec(f"j{i}", "t", b"p") for i in range(3))
            k = s.keys.shard(0)
            reply_key = s.keys.claim_reply(0, "tok")
            keys = [k.due, k.leased, k.done, k.epoch, k.clock, reply_key, reply_key]
            keys += [k.dead, k.far, k.faro, k.paused, k.parked, k.parkedx, k.prio, k.waiting]
            keys += k.jobs
            client = client_of(s)
            sha = await client.script_load(s.store._scripts.claim.script)
            first = await client.evalsha(sha, len(keys), *keys, epoch, 0, 2, 30_000)
            assert isinstance(first, bytes)
            rows = unpack_reply(first)
            assert rows[1] == 0 and len(rows) == 3 + 2 * 11  # two short rows
            assert await client.get(reply_key) == first
            again = await client.evalsha(sha, len(keys), *keys, epoch, 0, 2, 30_000)
            assert again == first and await client.zcard(k.leased) == 2
            assert len((await s.claim(0)).jobs) == 1  # the third, under another token
            # A one-shot job with its own timeout: the short row and the timeout.
            await s.schedule("timed", "t", b"p", timeout=1.5)
            other = s.keys.claim_reply(0, "tok2")
            keys[5] = keys[6] = other
            rows = unpack_reply(await client.evalsha(sha, len(keys), *keys, epoch, 0, 2, 30_000))
            assert len(rows) == 3 + 12 and rows[3] == b"timed"
            assert rows[7] == 7 and rows[-1] == 1500  # count, then the timeout last

    run(main())


def test_claim_limit_and_due_order(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            base = 1_700_000_000_000
            await s.schedule_many(JobSpec(f"j{i}", "t", at=base + (9 - i)) for i in range(10))
            batch = await s.claim(0, limit=4)
            assert [j.id for j in batch.jobs] == ["j9", "j8", "j7", "j6"]
            assert [j.nominal_ms for j in batch.jobs] == [base, base + 1, base + 2, base + 3]

    run(main())


def test_lease_expiry_returns_the_job_with_attempt_plus_one(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("crash", "t", b"p", max_attempts=2)
            (job,) = (await s.claim(0, lease=5)).jobs
            # The claimer "crashes": it never acks. Time passes beyond the lease.
            assert (await s.reap(0)).requeued == []
            await push_clock(s, 0, 5_001)
            reaped = await s.reap(0)
            assert reaped.requeued == ["crash"] and reaped.dead == []
            (again,) = (await s.claim(0)).jobs
            assert again.attempt == 2 and again.nominal_ms == job.nominal_ms
            with pytest.raises(LeaseLost):  # the crashed claimer's late ack is refused
                await s.ack(job)
            await push_clock(s, 0, 30_001)
            reaped = await s.reap(0)
            assert reaped.dead == ["crash"]
            page = await s.dead_letters(0)
            assert page.total == 1 and page.jobs[0].last_error == "lease expired"
            await check_all(s)

    run(main())


def test_a_late_ack_still_marks_the_occurrence_done(redis_url: str) -> None:
    """A slow handler finishes after its lease was reaped: its ack is refused (LeaseLost)
    but the occurrence is remembered, so the reaped copy is dropped, not run again."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("slow", "t", b"p")
            (job,) = (await s.claim(0, lease=5)).jobs
            await push_clock(s, 0, 5_001)
            assert (await s.reap(0)).requeued == ["slow"]
            with pytest.raises(LeaseLost):
                await s.ack(job)
            batch = await s.claim(0)
            assert batch.jobs == []
            assert batch.dropped == 1
            assert await s.get("slow") is None
            await check_all(s)

    run(main())


def test_retry_backoff_then_dead_then_requeue_and_purge(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, retry_base=2.0, rng=random.Random(7)) as s:
            await s.take(0)
            await s.schedule("r", "t", {"n": 1}, max_attempts=3)
            for attempt in (1, 2):
                (job,) = (await s.claim(0)).jobs
                assert job.attempt == attempt
                now = await s.now(0)
                assert await s.retry(job, "boom") is JobState.DUE
                info = await s.get("r")
                assert info is not None and info.last_error == "boom"
                full = 2000 * 2 ** (attempt - 1)
                # Equal jitter: between half the full delay and the full delay.
                assert now + full // 2 <= info.when_ms <= now + full + 50
                assert not (await s.claim(0)).jobs
                await push_clock(s, 0, full + 1)
            (job,) = (await s.claim(0)).jobs
            assert job.attempt == 3
            assert await s.retry(job, "final") is JobState.DEAD
            page = await s.dead_letters(0)
            assert [(j.id, j.attempt, j.last_error) for j in page.jobs] == [("r", 3, "final")]
            assert await s.requeue_dead(["r", "nope"]) == ["r"]
            (job,) = (await s.claim(0)).jobs
            assert job.attempt == 1 and job.payload == {"n": 1}
            assert await s.retry(job, delay=0) is JobState.DUE
            await s.schedule("x", "t", max_attempts=1)
            for j in (await s.claim(0)).jobs:
                await s.retry(j, "e")
            assert sorted(j.id for j in (await s.dead_letters(0)).jobs) == ["x"]
            assert await s.purge_dead(["x"]) == ["x"]
            assert (await s.dead_letters(0)).total == 0
            assert await s.get("x") is None
            await check_all(s)

    run(main())


def test_final_retry_dead_letters_at_once(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("f", "t", max_attempts=5)
            (job,) = (await s.claim(0)).jobs
            assert await s.retry(job, "no such task", final=True) is JobState.DEAD
            info = await s.get("f")
            assert info is not None
            assert (info.state, info.attempt, info.last_error) == (
                JobState.DEAD,
                1,
                "no such task",
            )
            await check_all(s)

    run(main())


def test_extend_lease(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("long", "t")
            (job,) = (await s.claim(0, lease=1)).jobs
            deadline = await s.extend(job, lease=60)
            assert deadline >= job.deadline_ms + 59_000
            await push_clock(s, 0, 2_000)
            assert (await s.reap(0)).requeued == []
            await s.ack(job)
            with pytest.raises(LeaseLost):
                await s.extend(job)

    run(main())


def test_extend_needs_the_epoch_the_lease_was_claimed_under(redis_url: str) -> None:
    """A lease is extended only under the epoch it was claimed under, and that epoch must
    be the shard's current one: a stale owner is Fenced, the new owner extending the old
    owner's lease loses it (LeaseLost), an epoch the shard never had is Fenced. None of
    them moves the lease deadline."""

    async def main() -> None:
        async with (
            open_scheduler(redis_url, shards=1) as a,
            open_scheduler(redis_url, a.keys.namespace, shards=1) as b,
        ):
            assert await a.take(0) == 1
            await a.schedule("x", "t")
            (job,) = (await a.claim(0, lease=5)).jobs
            leased = a.keys.shard(0).leased

            async def deadline() -> float | None:
                return await client_of(a).zscore(leased, "x")

            assert await deadline() == job.deadline_ms
            # a's token expired: b takes the shard (epoch 2), a's lease is not reaped.
            await client_of(a).delete(a.keys.shard(0).owner)
            assert await b.take(0) == 2
            with pytest.raises(Fenced):
                await a.extend(job, lease=60)
            assert await deadline() == job.deadline_ms
            with pytest.raises(LeaseLost):  # the shard's epoch, not the lease's
                await b.extend(dataclasses.replace(job, epoch=2), lease=60)
            assert await deadline() == job.deadline_ms
            for epoch in (1, 3):
                with pytest.raises(Fenced):
                    await b.store.extend(
                        0,
                        epoch,
                        job_id="x",
                        attempt=job.attempt,
                        nominal_ms=job.nominal_ms,
                        lease_ms=60_000,
                    )
                assert await deadline() == job.deadline_ms
            info = await b.get("x")
            assert info is not None and info.state is JobState.LEASED and info.epoch == 1
            # The lease runs out at its first deadline: b reaps it and runs the job.
            await push_clock(b, 0, 5_001)
            assert (await b.reap(0)).requeued == ["x"]
            (again,) = (await b.claim(0)).jobs
            assert (again.id, again.epoch) == ("x", 2)

    run(main())


def test_cancel_and_reschedule(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            await s.schedule("c", "t", delay=100)
            assert await s.reschedule("c", delay=1)
            info = await s.get("c")
            assert info is not None and info.nominal_ms == info.when_ms
            assert await s.cancel("c")
            assert not await s.cancel("c")
            assert not await s.reschedule("c", delay=1)
            await s.schedule("busy", "t")
            (job,) = (await s.claim(0)).jobs
            assert not await s.reschedule("busy", delay=5)  # leased: untouched
            assert (await s.schedule("busy", "t", replace=True)).status is ScheduleStatus.BUSY
            assert await s.cancel("busy")
            with pytest.raises(LeaseLost):
                await s.ack(job)
            assert await check_all(s) == {}

    run(main())


def test_fencing_stale_epoch_writes_nothing(redis_url: str) -> None:
    async def main() -> None:
        async with (
            # a's token "expires" when the test deletes it, not by its TTL: a 1 s TTL ran
            # out between a's take and b's on a loaded machine, and b took the shard.
            open_scheduler(redis_url, shards=1, owner_ttl=60) as a,
            open_scheduler(redis_url, a.keys.namespace, shards=1) as b,
        ):
            assert await a.take(0) == 1
            assert await b.take(0) is None  # held by a
            await a.schedule("f1", "t")
            await a.schedule("f2", "t")
            (j1,) = (await a.claim(0, limit=1)).jobs
            await push_clock(a, 0, 1)
            await client_of(a).delete(a.keys.shard(0).owner)  # a's token expired
            assert await b.take(0) == 2
            before = await snapshot(a)
            for op in (
                a.ack(j1),
                a.retry(j1, "x"),
                a.extend(j1),
                a.release([j1]),
            ):
                with pytest.raises(Fenced):
                    await op
            assert await snapshot(a) == before
            with pytest.raises(NotOwner):  # a dropped the shard on Fenced
                await a.claim(0)
            a.ownership.owned[0] = 1  # even if it insists
            with pytest.raises(Fenced):
                await a.claim(0)
            a.ownership.owned[0] = 1
            with pytest.raises(Fenced):
                await a.reap(0)
            a.ownership.owned[0] = 1
            assert not await a.ownership.give_back(0)
            assert await snapshot(a) == before
            # b reaps a's lease once it expires, and runs the job.
            await push_clock(b, 0, 31_000)
            assert (await b.reap(0)).requeued == ["f1"]
            ids = sorted(j.id for j in (await b.claim(0)).jobs)
            assert ids == ["f1", "f2"]

    run(main())


def test_renew_and_give_back(redis_url: str) -> None:
    async def main() -> None:
        async with (
            open_scheduler(redis_url, shards=2) as a,
            open_scheduler(redis_url, a.keys.namespace, shards=2) as b,
        ):
            e = await a.take(0)
            assert e == 1
            assert await a.take(0) == 1  # re-take by the holder keeps the epoch
            assert await a.ownership.renew(0)
            await a.close()  # gives back: epoch bumped, token gone
            assert a.ownership.owned == {}
            assert await b.take(0) == 3
            a.ownership.owned[0] = 1
            assert not await a.ownership.renew(0)  # fenced: dropped
            assert 0 not in a.ownership.owned

    run(main())


def test_dedup_on_id_and_nominal_due(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            at = 1_700_000_000_000
            await s.schedule("once", "t", at=at)
            (job,) = (await s.claim(0)).jobs
            await s.ack(job)
            # A client retry of the same schedule after the run: the occurrence is done.
            again = await s.schedule("once", "t", at=at)
            assert again.status is ScheduleStatus.DONE
            assert await s.get("once") is None
            # Even if the job reappears (another writer bypassing the check), claim drops it.
            k = s.keys.shard(0)
            client = client_of(s)
            await s.schedule("once", "t", at=at + 1)
            await client.zadd(k.due, {"once": at})  # same id, same nominal as the done one
            batch = await s.claim(0)
            assert batch.jobs == [] and batch.dropped == 1
            assert await check_all(s) == {}
            # A new occurrence of the same id is a new job.
            assert (await s.schedule("once", "t", at=at + 5)).status is ScheduleStatus.CREATED

    run(main())


def test_done_is_trimmed_by_age(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, dedup_window=10) as s:
            await s.take(0)
            await s.schedule("a", "t", at=MIN_AT_MS + 1)
            await s.ack((await s.claim(0)).jobs[0])
            done = s.keys.shard(0).done
            assert await client_of(s).zcard(done) == 1
            await push_clock(s, 0, 10_001)
            await s.schedule("b", "t", at=MIN_AT_MS + 2)
            await s.ack((await s.claim(0)).jobs[0])
            members = [m.decode() for m in await client_of(s).zrange(done, 0, -1)]
            assert members == [f"{MIN_AT_MS + 2}:b"]

    run(main())


def test_release_hands_jobs_back_unrun(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            at = MIN_AT_MS + 1234
            await s.schedule("h", "t", at=at)
            (job,) = (await s.claim(0)).jobs
            assert await s.release([job]) == [True]
            info = await s.get("h")
            assert info is not None and info.state is JobState.DUE
            assert (info.when_ms, info.nominal_ms, info.attempt) == (at, at, 1)

    run(main())


def test_batch_schedule_spans_shards_in_one_transaction(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=8) as s:
            specs = [JobSpec(f"b{i}", "t", {"i": i}, delay=i) for i in range(2500)]
            results = await s.schedule_many(specs)
            assert len(results) == 2500
            assert {r.status for r in results} == {ScheduleStatus.CREATED}
            states = await check_all(s)
            assert len(states) == 2500 and set(states.values()) == {JobState.DUE}
            results = await s.schedule_many(specs)
            assert {r.status for r in results} == {ScheduleStatus.KEPT}
            assert await s.schedule_many([]) == []

    run(main())


def test_process_runs_handlers_acks_and_retries(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2, retry_base=0) as s:
            for shard in range(2):
                await s.take(shard)
            for i in range(6):
                await s.schedule(f"p{i}", "t", {"fail": i % 3 == 0}, max_attempts=1)
            seen: list[str] = []

            async def handler(job: object) -> None:
                assert hasattr(job, "payload")
                seen.append(job.id)  # type: ignore[attr-defined]
                if job.payload["fail"]:  # type: ignore[attr-defined]
                    raise RuntimeError("no")

            assert await s.process(handler) == 6
            assert sorted(seen) == [f"p{i}" for i in range(6)]
            states = await check_all(s)
            assert states == {"p0": JobState.DEAD, "p3": JobState.DEAD}

    run(main())


def test_script_flush_falls_back_to_script_load(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            await s.take(0)
            await client_of(s).script_flush()
            await s.schedule("sf", "t")  # EVALSHA -> NOSCRIPT -> SCRIPT LOAD
            await client_of(s).script_flush()
            await s.schedule_many([JobSpec(f"m{i}", "t") for i in range(10)])  # pipeline
            await client_of(s).script_flush()
            await s.claim(0)
            assert len(await check_all(s)) == 11

    run(main())


def test_client_clock_skew_changes_nothing(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    hour = 3600.0
    real_time, real_mono, real_ns = time.time, time.monotonic, time.time_ns
    results: dict[str, tuple[int, int]] = {}

    async def measure(tag: str) -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            now = await s.now(0)
            res = await s.schedule("skew", "t", delay=30)
            batch = await s.claim(0, lookahead=29)
            assert batch.jobs == []  # not due by Redis's clock, whatever ours says
            batch = await s.claim(0, lookahead=31)
            results[tag] = (res.when_ms - now, batch.jobs[0].deadline_ms - res.when_ms)

    run(measure("true"))
    for sign in (1, -1):
        monkeypatch.setattr(time, "time", lambda s=sign: real_time() + s * hour)
        monkeypatch.setattr(time, "time_ns", lambda s=sign: real_ns() + int(s * hour * 1e9))
        # The monotonic clock has no shared origin to be skewed from; move it to another
        # origin, forward only: it counts from boot, so an hour back is negative on a
        # machine up for less than an hour, which no real clock is.
        monkeypatch.setattr(time, "monotonic", lambda s=sign: real_mono() + (2 + s) * hour)
        run(measure(f"skew{sign}"))
    for tag, (delay, lease) in results.items():
        assert 30_000 <= delay <= 30_050, tag
        assert lease == 30_000, tag


def test_unreachable_redis_raises_transient_error() -> None:
    from tickwheel.durable import RedisUnavailable
    from tickwheel.durable.servers._redis import free_port

    async def main() -> None:
        # No client-side retries: the error must surface at once (redis-py retries
        # connection errors three times by default, with backoff).
        client = redis.asyncio.Redis(
            port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        s = Scheduler(client, "down", check=False)
        with pytest.raises(RedisUnavailable) as info:
            await s.schedule("x", "t")
        assert info.value.transient
        with pytest.raises(RedisUnavailable):
            await s.schedule_many([JobSpec("x", "t")])
        await client.aclose()

    run(main())


def test_paused_redis_times_out_and_batch_is_all_or_nothing(private_redis: object) -> None:
    from tickwheel.durable import RedisUnavailable
    from tickwheel.durable.servers._redis import RedisServer

    assert isinstance(private_redis, RedisServer)
    server = private_redis

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(server.url, socket_timeout=0.3)
        s = Scheduler(client, "pause", shards=4, check=False)
        await s.open()
        specs = [JobSpec(f"p{i}", "t", delay=60) for i in range(200)]
        server.pause()
        try:
            with pytest.raises(RedisUnavailable):
                await s.schedule_many(specs)
        finally:
            server.resume()
        await client.aclose()
        client = redis.asyncio.Redis.from_url(server.url)
        s = Scheduler(client, "pause", shards=4, check=False)
        n = sum([await client.zcard(s.keys.shard(i).due) for i in range(4)])
        assert n in (0, 200)  # MULTI/EXEC: whole or nothing
        results = await s.schedule_many(specs)  # the retry is safe: keep semantics
        n = sum([await client.zcard(s.keys.shard(i).due) for i in range(4)])
        assert n == 200 and len(results) == 200
        await client.aclose()

    run(main())


def test_a_single_schedule_checks_its_time_as_a_batch_does(redis_url: str) -> None:
    """The store's single path sends the time as text: it refuses what the batch's
    packer refuses (the Scheduler refuses it earlier, naming at or delay)."""
    from tickwheel.durable.store._codec import EncodedJob

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            before = await snapshot(s)
            for values in ((b"j", 0, 2**64, b""), (b"j", 2, 5, b""), (b"j", 0, -1, b"")):
                with pytest.raises(ValueError, match="must be"):
                    await s.store.schedule(0, [EncodedJob("j", values)], False)
            assert await snapshot(s) == before

    run(main())


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("timing", ["at", "delay"])
@pytest.mark.parametrize("state", ["absent", "due", "leased", "dead", "done", "done-and-due"])
def test_one_job_is_decided_alike_by_schedule_one_and_by_a_batch_of_one(
    redis_url: str, state: str, timing: str, replace: bool
) -> None:
    """schedule_one.lua (a single schedule) against schedule.lua with a batch of one, on
    two namespaces brought to the same state: the same status, when and end state
    (with a delay, the due is each namespace's own now plus it: not compared)."""
    at = 1_700_000_000_000  # far in the past: claimable at once

    async def prepare(s: Scheduler) -> None:
        await s.take(0)
        if state == "absent":
            return
        await s.schedule("j", "t", b"old", at=at, max_attempts=1)
        if state == "due":
            return
        (job,) = (await s.claim(0)).jobs
        if state == "dead":
            await s.retry(job, "boom")
        elif state.startswith("done"):
            await s.ack(job)
            if state == "done-and-due":  # the id again, at another due
                await s.schedule("j", "t", b"old", at=at + 5)

    async def decide(s: Scheduler, batch: bool) -> tuple[object, ...]:
        from tickwheel.durable.store._codec import encode_job

        spec = JobSpec("j", "t", b"new", at=at) if timing == "at" else JobSpec("j", "t", b"new")
        job = encode_job(spec, s.max_payload_bytes)
        store = s.store
        if batch:
            keys, args = store._schedule_call(0, [job], replace)
            reply = await store.transport.run(store._scripts.schedule, keys, args, 0)
            status, when = reply[1], reply[2]
        else:
            (result,) = await store.schedule(0, [job], replace)
            status, when = list(ScheduleStatus).index(result.status) + 1, result.when_ms
        info = await s.get("j")
        own_now = timing == "delay" and status in (1, 3)  # the new job's due
        end = None if info is None else (info.state, info.payload, own_now or info.nominal_ms)
        # A lease deadline or a time of death: from each namespace's own now.
        timed = own_now or (state in ("leased", "dead") and status in (2, 4))
        return status, None if timed else when, end, await check_shard(s, 0)

    async def main() -> None:
        async with (
            open_scheduler(redis_url, shards=1) as one,
            open_scheduler(redis_url, shards=1) as many,
        ):
            await prepare(one)
            await prepare(many)
            assert await decide(one, batch=False) == await decide(many, batch=True)

    run(main())
