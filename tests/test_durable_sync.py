"""The synchronous producer (SyncScheduler): the producer cases run on it and on the
asyncio Scheduler alike, then what only a sync client meets: threads, a black hole."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from durable_support import unique_ns

from tickwheel.durable import (
    JobSpec,
    JobState,
    RedisUnavailable,
    Scheduler,
    ScheduleStatus,
    ShardCountMismatch,
    SyncScheduler,
)
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import client_from_url, sync_client_from_url


class AsyncSide:
    """The asyncio Scheduler behind the same blocking calls as a SyncScheduler."""

    def __init__(self, url: str, namespace: str, **kwargs: Any) -> None:
        self._runner = asyncio.Runner()
        self._client = client_from_url(url)
        self.sched = Scheduler(self._client, namespace, check=False, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.sched, name)
        if not callable(method) or not asyncio.iscoroutinefunction(method):
            return method  # keys, recurrence(): plain values and functions
        return lambda *args, **kwargs: self._runner.run(method(*args, **kwargs))

    def close(self) -> None:
        self._runner.run(self._client.aclose())
        self._runner.close()


def make(side: str, url: str, namespace: str, **kwargs: Any) -> Any:
    if side == "sync":
        return SyncScheduler.from_url(url, namespace, **kwargs)
    return AsyncSide(url, namespace, **kwargs)


@pytest.fixture(params=["async", "sync"])
def side(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def producer(side: str, redis_url: str) -> Iterator[Any]:
    p = make(side, redis_url, unique_ns(), shards=4)
    yield p
    p.close()


# -- the producer cases, on both ------------------------------------------------------


def test_schedule_keeps_by_default_and_replaces_when_asked(producer: Any) -> None:
    first = producer.schedule("j", "t", b"one", delay=60)
    assert first.status is ScheduleStatus.CREATED and first.id == "j"
    again = producer.schedule("j", "t", b"two", delay=600)
    assert again.status is ScheduleStatus.KEPT and again.when_ms == first.when_ms
    info = producer.get("j")
    assert info is not None and info.payload == b"one" and info.state is JobState.DUE
    rep = producer.schedule("j", "t", {"x": 2}, delay=600, replace=True)
    assert rep.status is ScheduleStatus.REPLACED
    info = producer.get("j")
    assert info is not None and info.payload == {"x": 2} and info.when_ms == rep.when_ms


def test_delay_is_added_on_the_server_and_at_is_absolute(producer: Any) -> None:
    now = producer.now()
    res = producer.schedule("d", "t", delay=30)
    assert now + 30_000 <= res.when_ms <= now + 32_000
    at = now + 45_000
    assert producer.schedule("a", "t", at=at).when_ms == at
    when = datetime.fromtimestamp((now + 50_000) / 1000, tz=UTC)
    assert producer.schedule("b", "t", at=when).when_ms == now + 50_000


def test_cancel_and_reschedule(producer: Any) -> None:
    producer.schedule("c", "t", delay=60, max_attempts=3)
    assert producer.reschedule("c", delay=90) is True
    info = producer.get("c")
    assert info is not None and info.max_attempts == 3
    assert producer.now() + 85_000 <= info.when_ms
    assert producer.reschedule("nope", delay=1) is False
    assert producer.cancel("c") is True
    assert producer.cancel("c") is False
    assert producer.get("c") is None


def test_recurring_jobs_start_at_their_first_occurrence(producer: Any) -> None:
    now = producer.now()
    every = producer.schedule("e", "t", every=60)
    assert now + 60_000 <= every.when_ms <= now + 62_000
    cron = producer.schedule("c", "t", cron="*/5 * * * *", missed="skip")
    assert cron.when_ms > now and cron.when_ms % 300_000 == 0
    info = producer.get("c")
    assert info is not None and info.recurrence is not None
    assert info.recurrence.cron == "*/5 * * * *"
    zoned = producer.schedule("z", "t", cron="0 9 * * *", tz="Europe/Paris")
    assert zoned.when_ms > now
    info = producer.get("z")
    assert info is not None and info.recurrence is not None
    assert info.recurrence.tz == "Europe/Paris"
    many = producer.schedule_many([JobSpec("m", "t", recurrence=producer.recurrence(every=30))])
    assert now + 30_000 <= many[0].when_ms <= now + 32_000


def test_schedule_many_spans_shards_and_keeps_on_repeat(producer: Any) -> None:
    specs = [JobSpec(f"b{i}", "t", {"i": i}, delay=i) for i in range(600)]
    results = producer.schedule_many(specs)
    assert sorted(r.id for r in results) == sorted(s.id for s in specs)
    assert {r.status for r in results} == {ScheduleStatus.CREATED}
    assert {r.status for r in producer.schedule_many(specs)} == {ScheduleStatus.KEPT}
    assert producer.schedule_many([]) == []
    info = producer.get("b599")
    assert info is not None and info.payload == {"i": 599}


BAD: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("id not a str", {"job_id": 1}, TypeError),
    ("empty id", {"job_id": ""}, ValueError),
    ("id too long", {"job_id": "x" * 300}, ValueError),
    ("delay and at", {"delay": 1, "at": 1_700_000_000_000}, ValueError),
    ("at in seconds", {"at": 1_700_000_000}, ValueError),
    ("naive at", {"at": datetime(2030, 1, 1)}, ValueError),
    ("nan delay", {"delay": math.nan}, ValueError),
    ("payload not json", {"payload": object()}, TypeError),
    ("payload too big", {"payload": b"x" * 70_000}, ValueError),
    ("every and cron", {"every": 1, "cron": "* * * * *"}, ValueError),
    ("bad missed", {"every": 1, "missed": "twice"}, ValueError),
    ("unknown zone", {"cron": "0 9 * * *", "tz": "Mars/Olympus"}, ValueError),
    ("zone without cron", {"every": 60, "tz": "Europe/Paris"}, ValueError),
    ("bad max_attempts", {"max_attempts": 0}, ValueError),
    ("conn without postgres", {"conn": object()}, ValueError),
]


@pytest.mark.parametrize(("case", "kwargs", "error"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_alike_and_writes_nothing(
    producer: Any, case: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    args = {"job_id": "bad", "task": "t", **kwargs}
    with pytest.raises(error):
        producer.schedule(**args)
    with pytest.raises(ValueError, match="payload"):  # one bad job: none is written
        producer.schedule_many([JobSpec("ok", "t"), JobSpec("bad", "t", b"x" * 70_000)])
    with pytest.raises((TypeError, ValueError)):
        producer.reschedule("bad", delay=-1)
    assert producer.get("ok") is None
    if isinstance(args["job_id"], str) and args["job_id"] and len(args["job_id"]) < 256:
        assert producer.get(args["job_id"]) is None


def test_shard_count_mismatch_is_refused(side: str, redis_url: str) -> None:
    namespace = unique_ns()
    first = make(side, redis_url, namespace, shards=4)
    other = make(side, redis_url, namespace, shards=8)
    try:
        first.schedule("x", "t")
        with pytest.raises(ShardCountMismatch):
            other.schedule("y", "t")
        assert first.get("y") is None
    finally:
        first.close()
        other.close()


def test_a_resent_script_applies_once(side: str, redis_url: str) -> None:
    """SCRIPT FLUSH between calls: EVALSHA gets NOSCRIPT (it did not run), the script is
    loaded and sent again, and the job is written once."""
    p = make(side, redis_url, unique_ns(), shards=4)
    raw = sync_client_from_url(redis_url)
    try:
        p.schedule("warm", "t")
        raw.script_flush()
        assert p.schedule("s", "t", {"n": 1}, delay=60).status is ScheduleStatus.CREATED
        raw.script_flush()
        assert p.schedule("s", "t", {"n": 2}, delay=60).status is ScheduleStatus.KEPT
        raw.script_flush()
        results = p.schedule_many([JobSpec(f"m{i}", "t", delay=60) for i in range(50)])
        assert {r.status for r in results} == {ScheduleStatus.CREATED}
        raw.script_flush()
        assert p.cancel("m0") is True
        info = p.get("s")
        assert info is not None and info.payload == {"n": 1} and info.attempt == 1
        due = sum(raw.zcard(p.keys.shard(i).due) for i in range(4))
        assert due == 1 + 1 + 49  # warm, s, m1..m49: nothing twice
    finally:
        raw.close()
        p.close()


# -- the sync side only ---------------------------------------------------------------


def test_16_threads_schedule_10000_jobs_none_lost_none_doubled(redis_server: RedisServer) -> None:
    sched = SyncScheduler.from_url(redis_server.url, unique_ns(), shards=8)
    results: list[list[Any]] = [[] for _ in range(16)]
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def work(n: int) -> None:
        try:
            start.wait()
            for i in range(625):
                job_id = f"w{n}-{i}"
                if i % 125 == 0:  # some batches too, beside the single schedules
                    batch = [JobSpec(f"{job_id}-b{k}", "t", delay=30) for k in range(5)]
                    results[n] += sched.schedule_many(batch)
                results[n].append(sched.schedule(job_id, "t", {"n": n}, delay=30))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    flat = [r for rs in results for r in rs]
    wanted = {f"w{n}-{i}" for n in range(16) for i in range(625)}
    wanted |= {f"w{n}-{i}-b{k}" for n in range(16) for i in range(0, 625, 125) for k in range(5)}
    assert len(flat) == len(wanted) == 10_400
    assert {r.id for r in flat} == wanted
    assert {r.status for r in flat} == {ScheduleStatus.CREATED}
    raw = redis.Redis.from_url(redis_server.url)
    try:
        stored: list[bytes] = []
        for shard in range(8):
            stored += raw.zrange(sched.keys.shard(shard).due, 0, -1)
    finally:
        raw.close()
    assert len(stored) == len(wanted)  # none doubled
    assert {s.decode() for s in stored} == wanted  # none lost
    sched.close()


def _black_hole() -> socket.socket:
    """A listening socket that never accepts: connections queue, no reply ever comes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_a_black_hole_gives_redis_unavailable_within_the_bound() -> None:
    hole = _black_hole()
    port = hole.getsockname()[1]
    try:
        # A client of the caller's without any timeout: capped at call_timeout.
        client = redis.Redis(port=port, socket_timeout=None, socket_connect_timeout=None)
        sched = SyncScheduler(client, "hole", call_timeout=0.5)
        for call in (
            lambda: sched.schedule("x", "t"),
            lambda: sched.schedule_many([JobSpec("x", "t")]),
            lambda: sched.get("x"),
        ):
            began = time.monotonic()
            with pytest.raises(RedisUnavailable) as info:
                call()
            assert time.monotonic() - began < 1.5
            assert info.value.transient
        sched.close()
    finally:
        hole.close()


def test_a_paused_redis_gives_redis_unavailable_within_the_bound(
    private_redis: RedisServer,
) -> None:
    sched = SyncScheduler.from_url(private_redis.url, "pause", shards=4, call_timeout=0.5)
    sched.open()
    private_redis.pause()
    try:
        for call in (
            lambda: sched.schedule("x", "t"),
            lambda: sched.schedule_many([JobSpec(f"p{i}", "t") for i in range(100)]),
        ):
            began = time.monotonic()
            with pytest.raises(RedisUnavailable):
                call()
            assert time.monotonic() - began < 1.5
    finally:
        private_redis.resume()
    # The retry is safe (a lost reply may have applied): keep semantics.
    assert sched.schedule("x", "t").status in (ScheduleStatus.CREATED, ScheduleStatus.KEPT)
    assert len(sched.schedule_many([JobSpec(f"p{i}", "t") for i in range(100)])) == 100
    sched.close()


def test_clients_are_checked() -> None:
    with pytest.raises(TypeError, match="sync Redis client"):
        SyncScheduler(client_from_url("redis://127.0.0.1:1"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decode_responses"):
        SyncScheduler(redis.Redis(decode_responses=True))
    with pytest.raises(ValueError, match="call_timeout"):
        SyncScheduler(redis.Redis(), call_timeout=0)
