"""The far index (lua/_lib.lua): jobs due two slots ahead or later are kept as chunks of
ids, not in ``{ns:s}:due``, and every claim promotes them into due a slot ahead.

Every test ends with :func:`check_all`, which holds each shard's invariants: due, leased,
dead and the far index's live jobs partition the records, every open chunk has its
marker, and ``get`` reports a far job due at its nominal.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from tests.durable_support import check_all, client_of, far_jobs, open_scheduler, push_clock, run
from tickwheel.durable import JobSpec, JobState, Recurrence, Scheduler
from tickwheel.durable.store import encode_job
from tickwheel.durable.store._msgpack import FAR_SLOT_MS, unpack_far_chunk, unpack_far_ids

SLOT = FAR_SLOT_MS
FAR = 3 * SLOT / 1000  # s: a delay that always lands in the far index
NEAR = SLOT / 1000  # s: one that never does (the far index starts two slots on)


async def _far(s: Scheduler, shard: int = 0) -> dict[str, int]:
    return await far_jobs(s, shard)


async def _due_ids(s: Scheduler, shard: int = 0) -> list[str]:
    k = s.keys.shard(shard)
    return [m.decode() for m in await client_of(s).zrange(k.due, 0, -1)]


def test_lua_slot_width_is_the_python_one() -> None:
    lib = resources.files("tickwheel.durable.store").joinpath("lua/_lib.lua").read_text()
    assert re.search(r"^local FAR_SLOT = (\d+)$", lib, re.M)[1] == str(FAR_SLOT_MS)  # type: ignore[index]


def test_a_far_chunk_that_is_not_one_is_refused() -> None:
    assert unpack_far_chunk(b"120000:1\xa1a\xa2bc") == (120000, False, ["a", "bc"])
    assert unpack_far_chunk(b"120000:0") == (120000, True, [])
    for bad in (b"x:1\xa1a", b"12:2\xa1a", b"12", b"12:1", b"12:0\xa1a"):
        with pytest.raises(ValueError, match="member"):
            unpack_far_chunk(bad)
    for blob in (b"\xa5ab", b"\xc0"):
        with pytest.raises(ValueError, match="far chunk"):
            unpack_far_ids(blob)


def test_a_far_job_skips_due_and_is_found_counted_and_listed(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            far = await s.schedule("far", "t", b"p", delay=FAR)
            near = await s.schedule("near", "t", b"p", delay=NEAR)
            assert await _due_ids(s) == ["near"]
            assert await _far(s) == {"far": far.when_ms}
            info = await s.get("far")
            assert info is not None and info.state is JobState.DUE
            assert (info.when_ms, info.nominal_ms, info.payload) == (far.when_ms, far.when_ms, b"p")
            # Kept (not replaced): the existing job's due comes back.
            again = await s.schedule("far", "t", delay=FAR * 2)
            assert (again.status.name, again.when_ms) == ("KEPT", far.when_ms)
            [shard] = await s.inspect()
            assert (shard.due, shard.next_due_ms) == (2, near.when_ms)
            page = await s.store.due_list(0, 0, 10)
            assert page.total == 2 and [j.id for j in page.jobs] == ["near", "far"]
            assert [j.when_ms for j in page.jobs] == [near.when_ms, far.when_ms]
            assert [j.id for j in (await s.store.due_list(0, 1, 10)).jobs] == ["far"]
            assert await s.store.due_rank(0, far.when_ms) == 1
            assert await s.store.due_rank(0, far.when_ms + 1) == 2
            assert await s.cancel("near")
            [shard] = await s.inspect()
            assert (shard.due, shard.next_due_ms) == (1, far.when_ms)
            await check_all(s)

    run(main())


def test_a_claim_promotes_far_jobs_in_time_and_in_due_order(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            now = await s.now(0)
            # Three slots ahead and on, in two slots, listed out of order.
            base = now - now % SLOT + 3 * SLOT
            # Long ids: ~10 to a chunk, so a claim of 7 promotes part of a slot at a time.
            dues = {f"j{i:02d}" + "x" * 90: base + (i % 2) * SLOT + 997 * i for i in range(40)}
            # The open chunk (the later jobs) sorts first among a slot's chunks.
            await s.schedule_many(JobSpec(i, "t", at=d) for i, d in dues.items())
            assert len(await _far(s)) == 40 and await _due_ids(s) == []
            await s.take(0)
            assert (await s.claim(0, limit=100)).jobs == []  # not yet: nothing moved
            assert len(await _far(s)) == 40
            await check_all(s)
            # Past the last due: claims of 7 at a time take every job once, in due order.
            await push_clock(s, 0, max(dues.values()) - now + 1)
            got: list[tuple[int, str]] = []
            for _ in range(40):  # a claim that only promoted part of a slot takes none
                batch = await s.claim(0, limit=7)
                got += [(j.due_ms, j.id) for j in batch.jobs]
                await s.ack_many(batch.jobs)
            assert got == sorted((d, i) for i, d in dues.items())
            assert await _far(s) == {} and await client_of(s).zcard(s.keys.shard(0).far) == 0
            assert await client_of(s).hlen(s.keys.shard(0).faro) == 0
            await check_all(s)

    run(main())


@pytest.mark.parametrize("count", [130, 120])
def test_single_schedules_fill_chunks_as_a_batch_does(redis_url: str, count: int) -> None:
    """schedule_one's own far push (far_push_one) against schedule's (far_push): the same
    ids into one slot, past several full chunks, give the same far index (120 ids end on
    a full chunk: no open chunk and no marker are left), and claims take them all back
    in due order."""
    lib = resources.files("tickwheel.durable.store").joinpath("lua/_lib.lua").read_text()
    chunk_bytes = int(re.search(r"^local FAR_CHUNK = (\d+)$", lib, re.M)[1])  # type: ignore[index]
    assert chunk_bytes == 512  # the counts above are sized for it
    ids = [f"job-with-a-longer-id:{i:04}" for i in range(count)]  # 26 B each, packed
    # The rule both pushes follow: a chunk is full once its ids reach chunk_bytes.
    expected: list[list[str]] = [[]]
    for job_id in ids:
        expected[-1].append(job_id)
        if len(expected[-1]) * 26 >= chunk_bytes:
            expected.append([])

    async def layout(s: Scheduler, slot: int) -> list[list[str]]:
        """The slot's full chunks in order, then its open chunk's ids ([] if none)."""
        k = s.keys.shard(0)
        members = [unpack_far_chunk(m) for m in await client_of(s).zrange(k.far, 0, -1)]
        assert {m[0] for m in members} == {slot}
        blob = await client_of(s).hget(k.faro, str(slot))
        # A marker exactly when there is an open chunk (none dangling after a fill).
        assert [m[1] for m in members].count(True) == (blob is not None)
        return [*sorted(m[2] for m in members if not m[1]), unpack_far_ids(blob or b"")]

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as one:
            now = await one.now(0)
            at = now - now % SLOT + 5 * SLOT
            for n, job_id in enumerate(ids):
                made = await one.schedule(job_id, "t", at=at + n)
                assert (made.status.name, made.when_ms) == ("CREATED", at + n)
            assert await layout(one, at) == expected
            await check_all(one)
            async with open_scheduler(redis_url, shards=1) as many:
                for job_id in ids:  # one at a time, through the batch script
                    await many.schedule_many([JobSpec(job_id, "t", at=at)])
                assert await layout(many, at) == expected
                await check_all(many)
            await one.take(0)
            await push_clock(one, 0, at + len(ids) - now)
            claimed: list[str] = []
            for _ in range(10):  # a claim moving part of the slot takes none of it yet
                batch = (await one.claim(0, limit=50)).jobs
                claimed += [j.id for j in batch]
                await one.ack_many(batch)
            assert claimed == ids
            assert await client_of(one).zcard(one.keys.shard(0).far) == 0
            await check_all(one)

    run(main())


def test_a_far_job_is_in_due_by_the_time_a_lookahead_reaches_it(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            made = await s.schedule("j", "t", delay=FAR)
            await s.take(0)
            now = await s.now(0)
            # A claim looking far enough ahead takes it, at its own due time.
            batch = await s.claim(0, lookahead=(made.when_ms - now) / 1000)
            assert [(j.id, j.due_ms, j.nominal_ms) for j in batch.jobs] == [
                ("j", made.when_ms, made.when_ms)
            ]
            await s.ack_many(batch.jobs)
            await check_all(s)

    run(main())


def test_cancelled_and_moved_far_jobs_leave_entries_that_never_run(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            now = await s.now(0)
            base = now - now % SLOT + 3 * SLOT
            await s.schedule("gone", "t", at=base + 10)
            assert await s.cancel("gone")
            # Cancelled, then made again in the same slot at another time: one run, then.
            await s.schedule("again", "t", at=base + 20)
            assert await s.cancel("again")
            await s.schedule("again", "t", at=base + 30)
            # Replaced far -> near, near -> far, far -> far (another slot).
            await s.schedule("f2n", "t", at=base + 40)
            await s.schedule("f2n", "t", delay=NEAR, replace=True)
            await s.schedule("n2f", "t", delay=NEAR)
            await s.schedule("n2f", "t", at=base + 50, replace=True)
            await s.schedule("f2f", "t", at=base + 60)
            await s.schedule("f2f", "t", at=base + SLOT + 60, replace=True)
            # Rescheduled far -> far in the same slot, and far -> near.
            await s.schedule("r", "t", at=base + 70)
            await s.reschedule("r", at=base + 80)
            await s.schedule("r2n", "t", at=base + 90)
            await s.reschedule("r2n", delay=NEAR)
            far = await _far(s)
            assert far == {
                "again": base + 30,
                "n2f": base + 50,
                "f2f": base + SLOT + 60,
                "r": base + 80,
            }
            assert set(await _due_ids(s)) == {"f2n", "r2n"}
            await check_all(s)
            await s.take(0)
            # A claim a slot before `base` promotes that slot only: f2f's old entry there
            # is skipped, and it stays far, in its own slot.
            await push_clock(s, 0, base - SLOT - now)
            batch = await s.claim(0)  # the near ones are due by now
            assert sorted(j.id for j in batch.jobs) == ["f2n", "r2n"]
            await s.ack_many(batch.jobs)
            assert set(await _due_ids(s)) == {"again", "n2f", "r"}
            assert await _far(s) == {"f2f": base + SLOT + 60}
            await check_all(s)
            await push_clock(s, 0, 2 * SLOT + 1000)
            runs: list[tuple[str, int]] = []
            while batch := (await s.claim(0, limit=3)).jobs:
                runs += [(j.id, j.due_ms) for j in batch]
                await s.ack_many(batch)
            assert sorted(i for i, _ in runs) == ["again", "f2f", "n2f", "r"]
            assert {i: d for i, d in runs if i in far} == far
            await check_all(s)

    run(main())


def test_a_replaced_batch_keeps_the_last_write_of_an_id(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            now = await s.now(0)
            far_at = now - now % SLOT + 4 * SLOT
            await s.schedule_many(
                [
                    JobSpec("a", "t", at=far_at),
                    JobSpec("a", "t", delay=NEAR),  # kept: the first write stands
                    JobSpec("b", "t", delay=NEAR),
                ]
            )
            results = await s.schedule_many(
                [
                    JobSpec("a", "t", delay=NEAR),
                    JobSpec("b", "t", at=far_at),
                    JobSpec("b", "t", at=far_at + 5),
                ],
                replace=True,
            )
            assert [r.status.name for r in results] == ["REPLACED", "REPLACED", "REPLACED"]
            assert await _due_ids(s) == ["a"]
            assert await _far(s) == {"b": far_at + 5}
            await check_all(s)

    run(main())


def test_a_recurring_job_with_a_long_period_waits_in_the_far_index(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            made = await s.schedule("hourly", "t", every=3600)
            await s.take(0)
            await push_clock(s, 0, made.when_ms - await s.now(0))
            batch = await s.claim(0)
            assert [j.id for j in batch.jobs] == ["hourly"]
            await s.ack_many(batch.jobs)
            assert await _far(s) == {"hourly": made.when_ms + 3_600_000}
            assert await _due_ids(s) == []
            await check_all(s)
            await push_clock(s, 0, 3_600_000)
            batch = await s.claim(0)
            assert [(j.id, j.nominal_ms) for j in batch.jobs] == [
                ("hourly", made.when_ms + 3_600_000)
            ]
            await s.ack_many(batch.jobs)
            await check_all(s)

    run(main())


def test_far_jobs_left_unpromoted_show_as_overdue(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            made = await s.schedule("late", "t", delay=FAR)
            await push_clock(s, 0, made.when_ms - await s.now(0) + SLOT)
            [shard] = await s.inspect()
            assert shard.overdue == 1 and shard.oldest_overdue_ms <= made.when_ms
            assert shard.lag_ms >= SLOT
            await check_all(s)

    run(main())


# rec_with_nominal's slow path, whose bytes its fast one must give: decode, set, encode.
_REFERENCE = "local r = rec_decode(ARGV[1])\nr[F_NOMINAL] = tonumber(ARGV[2])\nreturn rec_encode(r)"


@pytest.mark.parametrize(
    ("payload", "kw"),
    [
        (b"", {}),  # task only: decoded and encoded
        (b"p", {}),  # task, payload: defaults appended
        (b"x" * 300, {"max_attempts": 9}),  # a str16 payload and a max
        ({"a": [1, 2]}, {}),  # JSON: flags set
        (b"y", {"max_attempts": 200}),  # a max past a fixint
        (b"r", {"every": 600}),  # recurring: decoded and encoded
    ],
    ids=["empty", "short", "str16", "json", "max200", "recurring"],
)
@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_far_record_is_the_record_with_its_nominal(
    redis_url: str, payload: object, kw: dict[str, object], batch: bool
) -> None:
    """schedule_one.lua and schedule.lua (whose pads are made once a call) append the
    nominal to a new one-shot record; the bytes must be those of decode, set, encode."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            if batch:
                every = kw.get("every")
                specs = [
                    JobSpec(
                        i,
                        "task",
                        payload,  # type: ignore[arg-type]
                        delay=FAR,
                        recurrence=None if every is None else Recurrence.interval(every),  # type: ignore[arg-type]
                        **{k: v for k, v in kw.items() if k != "every"},  # type: ignore[arg-type]
                    )
                    for i in ("j", "k")
                ]
                made = (await s.schedule_many(specs))[0]
            else:
                made = await s.schedule("j", "task", payload, delay=FAR, **dict(kw))  # type: ignore[arg-type]
            client = client_of(s)
            raw = await client.hget(s.keys.jobs_key(0, "j"), "j")
            every = kw.pop("every", None)
            rec = None if every is None else Recurrence.interval(every)  # type: ignore[arg-type]
            spec = JobSpec("j", "task", payload, delay=FAR, recurrence=rec, **kw)  # type: ignore[arg-type]
            sent = encode_job(spec, 1 << 20).values[3]
            lib = resources.files("tickwheel.durable.store").joinpath("lua/_lib.lua").read_text()
            want = await client.eval(lib + "\n" + _REFERENCE, 0, sent, made.when_ms)
            assert raw == want
            info = await s.get("j")
            assert info is not None and (info.payload, info.nominal_ms) == (payload, made.when_ms)
            await check_all(s)

    run(main())
