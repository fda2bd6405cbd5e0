"""Bad input: a clear error naming the parameter, and nothing written to Redis."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run, snapshot
from tickwheel.durable import JobSpec, Scheduler, ShardCountMismatch

pytestmark = pytest.mark.redis

Call = Callable[[Scheduler], Awaitable[Any]]

CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("empty id", lambda s: s.schedule("", "t"), ValueError, "job_id must not be empty"),
    ("id not str", lambda s: s.schedule(42, "t"), TypeError, "job_id must be a str"),  # type: ignore[arg-type]
    ("id too long", lambda s: s.schedule("x" * 257, "t"), ValueError, "job_id must be at most 256"),
    (
        "negative delay",
        lambda s: s.schedule("j", "t", delay=-1),
        ValueError,
        "delay must be a finite number >= 0",
    ),
    (
        "nan delay",
        lambda s: s.schedule("j", "t", delay=math.nan),
        ValueError,
        "delay must be a finite",
    ),
    (
        "inf delay",
        lambda s: s.schedule("j", "t", delay=math.inf),
        ValueError,
        "delay must be a finite",
    ),
    ("str delay", lambda s: s.schedule("j", "t", delay="5"), TypeError, "delay must be a number"),  # type: ignore[arg-type]
    ("delay and at", lambda s: s.schedule("j", "t", delay=1, at=5), ValueError, "delay or at"),
    (
        "naive at",
        lambda s: s.schedule("j", "t", at=datetime(2030, 1, 1)),
        ValueError,
        "at must be timezone-aware",
    ),
    ("negative at", lambda s: s.schedule("j", "t", at=-5), ValueError, "at must be epoch ms"),
    # Past 2**53 ms a script's doubles round the due, and past 2**63 it wrapped negative
    # (due at once) on the single path.
    ("huge at", lambda s: s.schedule("j", "t", at=2**64), ValueError, "at must be epoch ms"),
    ("at past 2**53", lambda s: s.schedule("j", "t", at=2**53), ValueError, "at must be epoch"),
    ("huge delay", lambda s: s.schedule("j", "t", delay=1e20), ValueError, "delay must be at"),
    (
        "huge delay, batch",
        lambda s: s.schedule_many([JobSpec("j", "t", delay=1e16)]),
        ValueError,
        "delay must be at most",
    ),
    (
        "huge reschedule",
        lambda s: s.reschedule("j", at=2**63),
        ValueError,
        "at must be epoch ms",
    ),
    (
        "payload too big",
        lambda s: s.schedule("j", "t", b"x" * 101),
        ValueError,
        "payload must be at most 100 bytes",
    ),
    (
        "json too big",
        lambda s: s.schedule("j", "t", {"k": "x" * 100}),
        ValueError,
        "payload must be at most 100",
    ),
    (
        "payload not json",
        lambda s: s.schedule("j", "t", object()),
        TypeError,
        "payload must be bytes or JSON",
    ),
    (
        "payload nan",
        lambda s: s.schedule("j", "t", math.nan),
        TypeError,
        "payload must be bytes or JSON",
    ),
    (
        "unknown policy",
        lambda s: s.schedule("j", "t", every=5, missed="sometimes"),
        ValueError,
        "missed must be one of",
    ),
    (
        "unknown policy, one-shot",
        lambda s: s.schedule("j", "t", missed="nope"),
        ValueError,
        "missed must be one of",
    ),
    (
        "malformed cron",
        lambda s: s.schedule("j", "t", cron="61 * * * *"),
        ValueError,
        "cron is not a valid",
    ),
    (
        "cron wrong fields",
        lambda s: s.schedule("j", "t", cron="* *"),
        ValueError,
        "cron is not a valid",
    ),
    (
        "every and cron",
        lambda s: s.schedule("j", "t", every=1, cron="* * * * *"),
        ValueError,
        "every or cron",
    ),
    (
        "zero interval",
        lambda s: s.schedule("j", "t", every=0),
        ValueError,
        "every must be at least 1 ms",
    ),
    (
        "interval below 1 ms",
        lambda s: s.schedule("j", "t", every=1e-9),
        ValueError,
        "every must be at least 1 ms",
    ),
    (
        "at past year 9999 in UTC",
        lambda s: s.schedule(
            "j", "t", at=datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14)))
        ),
        ValueError,
        "at must be before year 10000",
    ),
    (
        "cap zero",
        lambda s: s.schedule("j", "t", every=1, missed="all", max_catch_up=0),
        ValueError,
        "max_catch_up",
    ),
    ("empty task", lambda s: s.schedule("j", ""), ValueError, "task must be 1 to 128"),
    ("max attempts 0", lambda s: s.schedule("j", "t", max_attempts=0), ValueError, "max_attempts"),
    (
        "batch with one bad payload",
        lambda s: s.schedule_many([JobSpec("ok", "t"), JobSpec("bad", "t", b"x" * 101)]),
        ValueError,
        "payload must be at most 100",
    ),
    ("batch of non-specs", lambda s: s.schedule_many(["j"]), TypeError, "JobSpec"),  # type: ignore[list-item]
    ("cancel empty id", lambda s: s.cancel(""), ValueError, "job_id"),
    ("reschedule nan", lambda s: s.reschedule("j", delay=math.nan), ValueError, "delay"),
    ("get bad id", lambda s: s.get(None), TypeError, "job_id"),  # type: ignore[arg-type]
    ("requeue a str", lambda s: s.requeue_dead("abc"), TypeError, "job_ids"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("call", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_and_writes_nothing(
    redis_url: str, call: Call, error: type[Exception], message: str
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, max_payload_bytes=100) as s:
            with pytest.raises(error, match=message):
                await call(s)
            assert await snapshot(s) == {}

    run(main())


def test_default_payload_limit_is_64_kib(redis_url: str) -> None:
    """A Scheduler with default settings takes an encoded payload of up to 64 KiB
    (DEFAULT_MAX_PAYLOAD_BYTES: payloads live in Redis memory with every pending job)
    and refuses a larger one, bytes or JSON, with a ValueError naming ``payload``,
    before anything is written."""
    limit = 64 * 1024

    async def main() -> None:
        async with open_scheduler(redis_url) as s:
            with pytest.raises(ValueError, match=f"payload must be at most {limit} bytes"):
                await s.schedule("over", "t", b"x" * (limit + 1))
            # JSON: the two quotes of a string count, so limit - 1 characters are over.
            with pytest.raises(ValueError, match=f"payload must be at most {limit} bytes"):
                await s.schedule_many([JobSpec("over-json", "t", "x" * (limit - 1))])
            assert await snapshot(s) == {}
            await s.schedule("under", "t", b"x" * (limit - 1))
            await s.schedule("exact", "t", b"y" * limit)
            await s.schedule("json", "t", "z" * (limit - 2))
            for job_id, size in (("under", limit - 1), ("exact", limit)):
                info = await s.get(job_id)
                assert info is not None and len(info.payload) == size, job_id
            info = await s.get("json")
            assert info is not None and info.payload == "z" * (limit - 2)
            assert await s.get("over") is None and await s.get("over-json") is None

    run(main())


def test_claim_arguments_are_checked(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)
            before = await snapshot(s)
            with pytest.raises(ValueError, match="limit"):
                await s.claim(0, limit=0)
            with pytest.raises(ValueError, match="limit"):
                await s.claim(0, limit=100_000)
            with pytest.raises(ValueError, match="lease"):
                await s.claim(0, lease=0)
            with pytest.raises(ValueError, match="lookahead"):
                await s.claim(0, lookahead=-1)
            assert await snapshot(s) == before

    run(main())


def test_shard_count_mismatch_is_refused_and_writes_nothing(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=16) as s:
            await s.schedule("j", "t")
            before = await snapshot(s)
            async with open_scheduler(redis_url, s.keys.namespace, shards=8) as other:
                with pytest.raises(
                    ShardCountMismatch, match="shards=16, buckets=64; got shards=8"
                ) as info:
                    await other.schedule("k", "t")
                assert (info.value.stored, info.value.given) == ((16, 64), (8, 64))
                with pytest.raises(ShardCountMismatch):
                    await other.schedule_many([JobSpec("k", "t")])
                # Dead-letter calls too: a wrong count would look in the wrong shard.
                with pytest.raises(ShardCountMismatch):
                    await other.requeue_dead(["j"])
                with pytest.raises(ShardCountMismatch):
                    await other.purge_dead(["j"])
            async with open_scheduler(redis_url, s.keys.namespace, shards=16, buckets=8) as other:
                with pytest.raises(
                    ShardCountMismatch, match="buckets=64; got shards=16, buckets=8"
                ):
                    await other.get("j")
            assert await snapshot(s) == before

    run(main())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"dedup_window": -1}, "dedup_window"),
        ({"owner_ttl": math.nan}, "ttl"),
        ({"retry_base": math.inf}, "retry_base"),
        ({"buckets": 0}, "buckets"),
    ],
)
def test_bad_scheduler_settings(kwargs: dict[str, Any], message: str) -> None:
    import redis.asyncio

    with pytest.raises(ValueError, match=message):
        Scheduler(redis.asyncio.Redis(), "ns", **kwargs)


def test_decoding_client_is_refused() -> None:
    import redis.asyncio

    with pytest.raises(ValueError, match="decode_responses"):
        Scheduler(redis.asyncio.Redis(decode_responses=True), "ns")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"id": "\U0001f600" * 64}, None, ""),  # 256 UTF-8 bytes: the limit
        ({"id": "\U0001f600" * 65}, ValueError, "job_id must be at most 256 UTF-8 bytes"),
        ({"id": "é" * 129}, ValueError, "job_id must be at most 256 UTF-8 bytes, got 258"),
        ({"id": "x" * 256}, None, ""),
        ({"task": "\U0001f600" * 32}, None, ""),  # 128 bytes
        ({"task": "\U0001f600" * 33}, ValueError, "task must be 1 to 128 UTF-8 bytes"),
        ({"id": 7}, TypeError, "job_id must be a str, got int"),
        ({"max_attempts": True}, TypeError, "max_attempts must be an int, got bool"),
        ({"max_attempts": 5.0}, TypeError, "max_attempts must be an int, got float"),
        ({"delay": True}, TypeError, "delay must be a number of seconds"),
        ({"delay": -1}, ValueError, "delay must be a finite number >= 0"),
        ({"delay": 2**53}, ValueError, "delay must be at most"),
    ],
)
def test_a_spec_is_checked_the_same_on_its_fast_path(
    kwargs: dict[str, Any], error: type[Exception] | None, message: str
) -> None:
    """JobSpec skips the full checks for a short str id and task, the default
    attempts and a whole-second delay; at and past each edge of that path the full
    checks still decide, with their messages."""
    fields: dict[str, Any] = {"id": "j", "task": "t", "delay": 5, **kwargs}
    if error is None:
        spec = JobSpec(**fields)
        assert (spec.mode, spec.time_ms) == (1, fields["delay"] * 1000)
    else:
        with pytest.raises(error, match=message):
            JobSpec(**fields)
