"""A big schedule_many goes in bounded rounds (issue 42, finding 4): another client's
PING is answered between them, every job is written once, and a retry of a batch that
failed part-way is safe."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from durable_support import run, unique_ns

from tickwheel.durable import JobSpec, RedisUnavailable, Scheduler, ScheduleStatus, SyncScheduler
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import client_from_url
from tickwheel.durable.store._calls import ROUND_JOBS
from tickwheel.durable.store._transport import Transport

BIG = 300_000
PING_BOUND_S = 0.5  # one MULTI/EXEC of 300k jobs blocks Redis for seconds


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


# The pinger runs in a process of its own: in a thread it would wait for the GIL behind
# the producer's encoding, and measure the client, not Redis.
_PINGER = """
import sys, threading, time, redis
client = redis.Redis.from_url(sys.argv[1], socket_timeout=60)
client.ping()
print("ready", flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
worst, count = 0.0, 0
while not stop.is_set():
    t = time.perf_counter()
    client.ping()
    worst, count = max(worst, time.perf_counter() - t), count + 1
    time.sleep(0.002)
print(worst, count, flush=True)
"""


class Pinger:
    """Another client PINGing Redis all along (a process of its own): worst latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.count = 0

    def __enter__(self) -> Pinger:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PINGER, self.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate(timeout=60)  # closes stdin: the pinger stops
        worst, count = out.split()
        self.worst, self.count = float(worst), int(count)


def _stored(url: str, sched: Any) -> list[str]:
    raw = redis.Redis.from_url(url)
    try:
        ids: list[str] = []
        for shard in range(sched.keys.shards):
            ids += [m.decode() for m in raw.zrange(sched.keys.shard(shard).due, 0, -1)]
        return ids
    finally:
        raw.close()


def _big(n: int) -> list[JobSpec]:
    return [JobSpec(f"j{i}", "t", delay=30) for i in range(n)]


def _check_once(url: str, sched: Any, results: list[Any], n: int) -> None:
    assert len(results) == n
    assert {r.status for r in results} == {ScheduleStatus.CREATED}
    stored = _stored(url, sched)
    assert len(stored) == n  # none doubled
    assert set(stored) == {f"j{i}" for i in range(n)}  # none lost


def test_big_schedule_many_lets_other_clients_in(own_redis: RedisServer) -> None:
    specs = _big(BIG)

    async def main() -> list[Any]:
        sched = Scheduler(client_from_url(own_redis.url), unique_ns(), shards=16, check=False)
        await sched.open()
        try:
            with Pinger(own_redis.url) as pinger:
                results = await sched.schedule_many(specs)
            assert pinger.count > 10
            assert pinger.worst < PING_BOUND_S, f"PING waited {pinger.worst:.3f} s"
            _check_once(own_redis.url, sched, results, BIG)
            return results
        finally:
            await sched.close()

    run(main())


def test_big_sync_schedule_many_lets_other_clients_in(own_redis: RedisServer) -> None:
    specs = _big(BIG)
    sched = SyncScheduler.from_url(own_redis.url, unique_ns(), shards=16)
    try:
        with Pinger(own_redis.url) as pinger:
            results = sched.schedule_many(specs)
        assert pinger.count > 10
        assert pinger.worst < PING_BOUND_S, f"PING waited {pinger.worst:.3f} s"
        _check_once(own_redis.url, sched, results, BIG)
    finally:
        sched.close()


def _lose_reply_of_round(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """Make round ``k`` (1-based) of schedule_many run, then raise as a lost reply."""
    real = Transport.batch
    seen = [0]

    async def batch(self: Transport, script: Any, calls: Any) -> list[Any]:
        seen[0] += 1
        replies = await real(self, script, calls)
        if seen[0] == k:
            raise RedisUnavailable("redis unavailable: no reply (the call may have run)")
        return replies

    monkeypatch.setattr(Transport, "batch", batch)


@pytest.mark.parametrize("replace", [False, True])
def test_a_retry_after_a_partial_write_is_safe(
    redis_server: RedisServer, replace: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 4 * ROUND_JOBS + 500  # 5 rounds
    at = int(time.time() * 1000) + 30_000  # in due, not the far index
    specs = [JobSpec(f"j{i}", "t", {"i": i}, at=at + i % 7) for i in range(n)]

    async def main() -> None:
        sched = Scheduler(client_from_url(redis_server.url), unique_ns(), shards=8, check=False)
        await sched.open()
        try:
            with monkeypatch.context() as patch:
                _lose_reply_of_round(patch, 2)
                with pytest.raises(RedisUnavailable):
                    await sched.schedule_many(specs)
            prefix = _stored(redis_server.url, sched)
            assert ROUND_JOBS < len(prefix) <= 2 * ROUND_JOBS  # the first two rounds, whole
            first = {i: await sched.get(i) for i in prefix[:50]}
            results = await sched.schedule_many(specs, replace=replace)
            assert len(results) == n
            again = ScheduleStatus.REPLACED if replace else ScheduleStatus.KEPT
            by_status: dict[ScheduleStatus, set[str]] = {}
            for r in results:
                by_status.setdefault(r.status, set()).add(r.id)
            assert by_status[again] == set(prefix)
            assert by_status[ScheduleStatus.CREATED] == {s.id for s in specs} - set(prefix)
            assert len(by_status) == 2
            stored = _stored(redis_server.url, sched)
            assert len(stored) == n and set(stored) == {s.id for s in specs}
            for job_id, info in first.items():  # the same job (at=: the same due)
                now = await sched.get(job_id)
                assert info is not None and now is not None
                assert (now.when_ms, now.nominal_ms, now.payload, now.attempt) == (
                    info.when_ms,
                    info.nominal_ms,
                    info.payload,
                    info.attempt,
                )
        finally:
            await sched.close()

    run(main())
