"""Jitter of a recurring series: the offset (a hash of id and occurrence, within the
jitter), the record, bad input, and on real Redis: never before the occurrence, at most
jitter after it, the occurrence identity and the missed-run decision unchanged."""

from __future__ import annotations

import json
import math

import pytest
from durable_support import check_all, client_of, open_scheduler, run, unique_ns
from spill_support import running_worker, until

from tests.test_cli import cli_json, opts
from tickwheel.durable import JobState, Recurrence, Scheduler, TaskContext, TaskRegistry
from tickwheel.durable.model import JobSpec
from tickwheel.durable.store._codec import encode_job, recurrence_of

MIN = 60_000


def test_the_offset_is_a_fixed_hash_within_the_jitter() -> None:
    rec = Recurrence.interval(60, jitter=30)
    assert rec.jitter_ms == 30_000
    offs = [rec.offset_ms("a", n * MIN) for n in range(200)]
    assert all(0 <= o <= 30_000 for o in offs)
    assert len(set(offs)) > 150  # spread, not one value
    assert offs == [rec.offset_ms("a", n * MIN) for n in range(200)]  # deterministic
    assert rec.offset_ms("a", 0) != rec.offset_ms("b", 0) or rec.offset_ms("c", 0) != offs[0]
    assert Recurrence.interval(60).offset_ms("a", 0) == 0


def test_jitter_round_trips_through_the_record_and_old_records_read_none() -> None:
    for rec in (
        Recurrence.interval(60, jitter=1.5),
        Recurrence.cron_expr("0 9 * * *", tz="Europe/Paris", jitter=120),
        Recurrence.cron_expr("*/5 * * * *", jitter=0.25),
    ):
        assert rec.spec.startswith(f"J={rec.jitter_ms} ")
        kind = 1 if rec.every_ms else 2
        back = recurrence_of(kind, rec.spec.encode(), 0, rec.max_catch_up, rec.misfire_grace_ms)
        assert back == rec
        spec = JobSpec("a", "t", b"", None, None, 5, rec)
        assert rec.spec.encode() in encode_job(spec, 1024).values[3]
    assert Recurrence.cron_expr("0 9 * * *", tz="Europe/Paris").spec == "TZ=Europe/Paris 0 9 * * *"
    old = recurrence_of(1, b"60000", 0, 100, 60_000)
    assert old is not None and old.jitter_ms == 0 and old.every_ms == 60_000


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, math.inf, 8 * 86_400])
def test_a_bad_jitter_is_a_value_error_naming_jitter(bad: float) -> None:
    with pytest.raises(ValueError, match=r"^jitter "):
        Recurrence.interval(60, jitter=bad)
    with pytest.raises(ValueError, match=r"^jitter "):
        Scheduler.recurrence(cron="0 9 * * *", jitter=bad)


@pytest.mark.parametrize("bad", ["5", None, True, [1]])
def test_a_jitter_that_is_not_a_number_is_refused_naming_jitter(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^jitter "):
        Recurrence.cron_expr("0 9 * * *", jitter=bad)  # type: ignore[arg-type]


def test_jitter_without_a_recurrence_is_refused_and_writes_nothing(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"^jitter needs every or cron"):
        Scheduler.recurrence(jitter=5)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            for kwargs in (
                {"jitter": 5},
                {"every": 60, "jitter": -1},
                {"cron": "* * * * *", "jitter": "x"},
            ):
                with pytest.raises((TypeError, ValueError), match="jitter"):
                    await s.schedule("bad", "t", delay=1, **kwargs)  # type: ignore[arg-type]
                assert await s.get("bad") is None

    run(main())


def _id_with_offsets(rec: Recurrence, nominals: list[int]) -> str:
    """An id whose offsets at ``nominals`` are all well inside (0, jitter)."""
    for i in range(10_000):
        job_id = f"j{i}"
        if all(0.1 < rec.offset_ms(job_id, n) / rec.jitter_ms < 0.9 for n in nominals):
            return job_id
    raise AssertionError("no id found")


def test_a_claim_before_the_jittered_time_hands_the_occurrence_back(redis_url: str) -> None:
    """Under ``skip`` with a 1 s grace and 30 s of jitter: each occurrence runs once, at
    its nominal + offset, as itself (not judged missed for being up to 30 s late)."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            clock = s.keys.shard(0).clock
            t0 = (await s.now(0)) // MIN * MIN + 10 * MIN
            rec = Recurrence.interval(60, jitter=30)
            job_id = _id_with_offsets(rec, [t0, t0 + MIN])
            await client_of(s).set(clock, t0)
            await s.schedule(
                job_id, "t", at=t0, every=60, jitter=30, missed="skip", misfire_grace=1
            )
            for n in (t0, t0 + MIN):
                off = rec.offset_ms(job_id, n)
                await client_of(s).set(clock, n)
                batch = await s.claim(0, limit=10, lookahead=1)
                assert batch.jobs == [] and batch.moved == 0  # too early: handed back
                info = await s.get(job_id)
                assert info is not None and info.state is JobState.DUE
                assert (info.nominal_ms, info.when_ms, info.attempt) == (n, n + off, 1)
                await client_of(s).set(clock, n + off - 1)  # not yet (lookahead 0)
                assert (await s.claim(0, limit=10)).jobs == []
                await client_of(s).set(clock, n + off + 500)
                (job,) = (await s.claim(0, limit=10)).jobs
                assert (job.nominal_ms, job.due_ms, job.next_due_ms) == (n, n + off, n + MIN)
                await s.ack(job)
            assert await check_all(s) == {job_id: JobState.DUE}

    run(main())


def test_a_worker_runs_each_occurrence_once_never_early_within_the_jitter(
    redis_url: str,
) -> None:
    reg = TaskRegistry()
    runs: list[tuple[int, int, int]] = []  # (nominal, due, Redis now at the run)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:

            @reg.task(name="j")
            async def j(ctx: TaskContext) -> None:
                assert ctx.job is not None
                runs.append((ctx.nominal_ms, ctx.job.due_ms, await s.now(0)))

            start = (await s.now(0)) + 300
            await s.schedule("js", "j", at=start, every=0.5, jitter=0.4, missed="all")
            async with running_worker(s, reg, poll_interval=0.02, lookahead=0.1) as w:
                assert await until(lambda: len(runs) >= 6, 15), runs
                w.stop()
            await s.cancel("js")

    run(main())
    rec = Recurrence.interval(0.5, jitter=0.4)
    nominals = [n for n, _, _ in runs]
    assert nominals == sorted(set(nominals))  # each once, in order
    assert nominals[:6] == [nominals[0] + 500 * k for k in range(6)]  # none skipped
    for n, due, now in runs:
        assert due == n + rec.offset_ms("js", n)  # the hash's instant
        assert now >= due >= n  # never early
        assert now - n <= 400 + 5_000  # within the jitter, and a generous late bound


def test_cli_jitter(redis_url: str) -> None:
    o = opts(redis_url, unique_ns(), shards=1)
    made = cli_json("schedule", "c", "t", "--every", "60", "--jitter", "5", *o)
    assert made["status"] == "created"
    view = cli_json("inspect", "--job", "c", *o)
    assert view["jitter_ms"] == 5000
    err = cli_json("schedule", "d", "t", "--jitter", "5", *o, code=2)
    assert "jitter needs every or cron" in json.dumps(err)
