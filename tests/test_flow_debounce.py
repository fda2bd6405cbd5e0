"""Debounce and throttle by job id (issue 35): flow.lua under concurrent producers, and
a hypothesis state machine against a model on a clock the test moves (the shard's clock
mark: Redis's now is max(TIME, mark), so a mark far ahead of TIME is an exact now).
On a real redis-server and a real Redis Cluster."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.durable_support import client_of, open_scheduler, push_clock, run, snapshot, unique_ns
from tickwheel.durable import JobSpec, JobState, ScheduleStatus, SyncScheduler
from tickwheel.durable.servers import RedisServer

pytestmark = pytest.mark.redis

C, K, R = ScheduleStatus.CREATED, ScheduleStatus.COALESCED, ScheduleStatus.REPLACED


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"debounce": -1}, "debounce"), ({"debounce": 0}, "debounce"),
     ({"debounce": math.nan}, "debounce"), ({"throttle": 0}, "throttle"),
     ({"throttle": -0.5}, "throttle"), ({"throttle": math.inf}, "throttle"),
     ({"debounce": 1, "max_wait": math.nan}, "max_wait"), ({"max_wait": 5}, "max_wait"),
     ({"debounce": 5, "max_wait": 1}, "max_wait"), ({"debounce": 1, "throttle": 1}, "not both"),
     ({"debounce": 1, "delay": 2}, "delay"), ({"throttle": 1, "at": 10**12}, "delay or at"),
     ({"debounce": 1, "every": 60}, "recurrence"), ({"throttle": 10**9}, "throttle")],
)  # fmt: skip
def test_bad_flow_arguments_are_refused_and_nothing_is_written(
    redis_server: RedisServer, kwargs: dict[str, Any], name: str
) -> None:
    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.open()
            before = await snapshot(s)
            with pytest.raises(ValueError, match=name):
                await s.schedule("a", "t", **kwargs)
            assert await snapshot(s) == before

    run(main())
    sync = SyncScheduler.from_url(redis_server.url, unique_ns(), shards=1)
    try:
        with pytest.raises(ValueError, match=name):
            sync.schedule("b", "t", **kwargs)
    finally:
        sync.close()


def test_a_batch_refuses_a_flow_spec(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            with pytest.raises(ValueError, match="not in a batch"):
                await s.schedule_many([JobSpec("x", "t"), JobSpec("y", "t", throttle=1)])
            assert await s.get("x") is None

    run(main())


def test_eight_producers_debounce_one_id(redis_url: str) -> None:
    """All schedules of a burst fold into one waiting job: one CREATED, its due the
    latest any call set and never past first + max_wait, its payload the last one."""

    async def main() -> None:
        async with open_scheduler(redis_url, shards=4) as s:
            results: list[tuple[int, int, Any]] = []  # (task, n, result)

            async def producer(p: int) -> None:
                for n in range(25):
                    r = await s.schedule("d", "t", {"p": p, "n": n}, debounce=30, max_wait=60)
                    results.append((p, n, r))

            await asyncio.gather(*(producer(p) for p in range(8)))
            statuses = [r.status for _, _, r in results]
            assert statuses.count(C) == 1 and set(statuses) <= {C, R}
            first = next(r.when_ms for _, _, r in results if r.status is C)
            info = await s.get("d")
            assert info is not None
            assert info.when_ms == max(r.when_ms for _, _, r in results)
            assert first <= info.when_ms <= first - 30_000 + 60_000
            # The payload is the last call's: the one whose due is the final one, and
            # the last of those Redis ran (results are appended in reply order per task).
            last = [(p, n) for p, n, r in results if r.when_ms == info.when_ms]
            assert (info.payload["p"], info.payload["n"]) in last

    run(main())


def test_eight_threads_throttle_one_id_against_a_consumer(redis_url: str) -> None:
    """8 SyncScheduler threads hammer one id with throttle=0.3 while a consumer claims and
    acks it: the runs' due times are at least 0.3 s apart, and after the burst the last
    call's trailing run happens. A call while the job runs folds into its trailing run
    (COALESCED), which the ack creates: never BUSY."""
    ns = unique_ns()
    stop = threading.Event()
    calls: list[Any] = []

    def producer(p: int) -> None:
        sync = SyncScheduler.from_url(redis_url, ns, shards=2)
        try:
            n = 0
            while not stop.is_set():
                calls.append(sync.schedule("th", "t", {"p": p, "n": n}, throttle=0.3))
                n += 1
        finally:
            sync.close()

    async def main() -> list[int]:
        async with open_scheduler(redis_url, ns, shards=2) as s:
            shard = s.keys.shard_of("th")
            await s.take(shard)
            threads = [threading.Thread(target=producer, args=(p,)) for p in range(8)]
            for t in threads:
                t.start()
            dues: list[int] = []
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.5
            try:
                while loop.time() < end or stop.is_set() is False:
                    if loop.time() >= end:
                        stop.set()
                        await asyncio.to_thread(lambda: [t.join() for t in threads])
                    batch = await s.claim(shard, limit=10)
                    for job in batch.jobs:
                        dues.append(job.nominal_ms)
                    await s.ack_many(batch.jobs)
                    await asyncio.sleep(0.01)
                # Drain the trailing run (due at most 0.3 s after the last one).
                for _ in range(200):
                    batch = await s.claim(shard, limit=10)
                    dues += [j.nominal_ms for j in batch.jobs]
                    await s.ack_many(batch.jobs)
                    if await s.get("th") is None:
                        break
                    await asyncio.sleep(0.01)
            finally:
                stop.set()
            assert await s.get("th") is None
            return dues

    dues = run(main())
    assert dues  # at least the first run (more unless the machine starves the consumer)
    assert all(b - a >= 300 for a, b in itertools.pairwise(dues)), dues
    created = [c for c in calls if c.status in {C, R}]
    # Each run is one created (or replaced) job, or a trailing run an ack created.
    assert len(created) <= len(dues)
    assert {c.status for c in calls} <= {C, K, R}


@dataclass
class Model:
    """One id under debounce (window, max_wait) or throttle (window)."""

    kind: str
    window: int
    max_wait: int
    due: int | None = None  # its waiting job's due, None when absent
    deadline: int = 0  # debounce: first schedule + max_wait
    last: int | None = None  # throttle: the due of its last throttled job
    payload: int = -1
    pending: tuple[int, int] | None = None  # trailing run: (payload, first call's now)

    def trail(self, now: int, payload: int) -> None:
        """A schedule while the job runs: its trailing run's payload (the latest)."""
        self.pending = (payload, now if self.pending is None else self.pending[1])

    def finish(self, now: int) -> None:
        """The running job acked: its trailing run, if any, is created."""
        if self.pending is None:
            return
        payload, first = self.pending
        self.pending, self.payload = None, payload
        if self.kind == "t":
            self.due = now if self.last is None else max(now, self.last + self.window)
            self.last = self.due
            return
        self.deadline = max(first + self.max_wait, now)
        self.due = min(now + self.window, self.deadline)

    def schedule(self, now: int, payload: int) -> tuple[ScheduleStatus, int]:
        if self.kind == "t":
            if self.due is not None:
                self.payload = payload
                return K, self.due
            due = now if self.last is None else max(now, self.last + self.window)
            self.due, self.last, self.payload = due, due, payload
            return C, due
        self.payload = payload
        if self.due is not None and self.due <= now:
            return K, self.due
        status = C if self.due is None else R
        if self.due is None:
            self.deadline = now + self.max_wait
        self.due = min(now + self.window, self.deadline)
        return status, self.due


def test_debounce_and_throttle_follow_a_model(redis_server: RedisServer) -> None:
    url = redis_server.url
    # A clock mark a year ahead of TIME: each step's now is exactly the mark.
    base = 1_900_000_000_000

    class Machine(RuleBasedStateMachine):
        examples = 0

        def __init__(self) -> None:
            super().__init__()
            Machine.examples += 1
            self.loop = asyncio.new_event_loop()
            self.cm = open_scheduler(url, shards=1)
            self.s = self.loop.run_until_complete(self.cm.__aenter__())
            self.loop.run_until_complete(self.s.take(0))
            self.now = base + Machine.examples * 10**9
            self.set_clock()
            self.model: Model | None = None
            self.id = "j"
            self.n = 0
            self.held: Any = None  # a claimed job not acked yet (its run in progress)

        def set_clock(self) -> None:
            key = self.s.keys.shard(0).clock
            self.loop.run_until_complete(client_of(self.s).set(key, self.now))

        def teardown(self) -> None:
            self.loop.run_until_complete(self.cm.__aexit__(None, None, None))
            self.loop.close()

        @rule(
            kind=st.sampled_from(["d", "t"]),
            window=st.integers(1, 600),
            max_wait=st.integers(0, 1200),
        )
        def schedule(self, kind: str, window: int, max_wait: int) -> None:
            if self.model is None:  # one kind and window per example
                max_wait = max(max_wait, window) if max_wait else 0
                self.model = Model(kind, window * 1000, max_wait * 1000 if kind == "d" else 0)
            m = self.model
            if m.kind == "d" and not m.max_wait:
                m.max_wait = 10**15  # no max_wait: the model's deadline never binds
            self.n += 1
            flow: dict[str, Any] = (
                {"throttle": m.window / 1000}
                if m.kind == "t"
                else {"debounce": m.window / 1000}
                | ({"max_wait": m.max_wait / 1000} if m.max_wait < 10**15 else {})
            )
            got = self.loop.run_until_complete(self.s.schedule(self.id, "t", self.n, **flow))
            if self.held is not None:  # running: folded into its trailing run
                assert (got.status, got.when_ms) == (K, self.held.deadline_ms)
                m.trail(self.now, self.n)
                return
            want = m.schedule(self.now, self.n)
            assert (got.status, got.when_ms) == want

        @rule(seconds=st.integers(0, 900))
        def advance(self, seconds: int) -> None:
            self.now += seconds * 1000
            self.set_clock()

        @rule(hold=st.booleans())
        def run_due(self, hold: bool) -> None:
            if self.held is not None:
                return
            batch = self.loop.run_until_complete(self.s.claim(0, limit=10))
            m = self.model
            if m is None or m.due is None or m.due > self.now:
                assert batch.jobs == []
                return
            [job] = batch.jobs
            assert job.nominal_ms == m.due and job.payload == m.payload
            if hold:  # left running (leased) until finish()
                self.held = job
            else:
                self.loop.run_until_complete(self.s.ack_many([job]))
            m.due = None

        @rule()
        def finish(self) -> None:
            if self.held is not None:
                self.loop.run_until_complete(self.s.ack_many([self.held]))
                self.held = None
                if self.model is not None:
                    self.model.finish(self.now)

        @invariant()
        def stored_due_matches(self) -> None:
            info = self.loop.run_until_complete(self.s.get(self.id))
            want = None if self.model is None else self.model.due
            if self.held is not None:
                assert info is not None and info.state is JobState.LEASED
                return
            assert (info.when_ms if info is not None else None) == want

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_cli_schedule_takes_debounce_and_throttle(redis_server: RedisServer) -> None:
    from tests.test_cli import cli, cli_json, opts

    o = opts(redis_server.url, unique_ns(), shards=1)
    assert cli("schedule", "j", "t", "--debounce", "-1", *o).returncode == 2
    assert cli("schedule", "j", "t", "--throttle", "nan", *o).returncode == 2
    assert cli("schedule", "j", "t", "--max-wait", "5", *o).returncode == 2
    args = ("schedule", "j", "t", "--debounce", "30", "--max-wait", "60", *o)
    assert cli_json(*args)["status"] == "created"
    assert cli_json(*args)["status"] == "replaced"
    assert cli_json("schedule", "k", "t", "--throttle", "60", *o)["status"] == "created"
    assert cli_json("schedule", "k", "t", "--throttle", "60", *o)["status"] == "coalesced"


@pytest.mark.parametrize("kind", ["throttle", "debounce"])
def test_calls_while_the_job_runs_make_exactly_one_trailing_run(redis_url: str, kind: str) -> None:
    """8 producers schedule the id 10 times each while its job runs (leased): every call
    folds into one pending trailing run (COALESCED, when = the lease deadline). The ack
    creates it, once, with one of those calls' payloads: due at the last throttled due
    + the period (throttle) or at the ack's now + the quiet time (debounce). Its own
    ack creates nothing more."""
    flow: dict[str, Any] = {kind: 5} | ({"max_wait": 20} if kind == "debounce" else {})

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            shard = s.keys.shard_of("x")
            await s.take(shard)
            first = await s.schedule("x", "t", {"p": -1}, delay=0)
            [job] = (await s.claim(shard, limit=10)).jobs

            async def producer(p: int) -> list[Any]:
                return [await s.schedule("x", "t", {"p": p, "n": n}, **flow) for n in range(10)]

            calls = [r for rs in await asyncio.gather(*map(producer, range(8))) for r in rs]
            assert {(r.status, r.when_ms) for r in calls} == {(K, job.deadline_ms)}
            k = s.keys.shard(shard)
            assert await client_of(s).hlen(k.trail) == 1
            before = await s.now(shard)
            await s.ack_many([job])
            after = await s.now(shard)
            info = await s.get("x")
            assert info is not None and info.state is JobState.DUE
            assert info.payload in [{"p": p, "n": n} for p in range(8) for n in range(10)]
            if kind == "throttle":  # no throttled run before: due at the ack's now
                assert before <= info.when_ms <= after
            else:
                assert before + 5000 <= info.when_ms <= after + 5000
            assert await client_of(s).exists(k.trail) == 0
            assert await client_of(s).zcard(k.due) == 1
            await push_clock(s, shard, 10_000)
            [trailing] = (await s.claim(shard, limit=10)).jobs
            assert trailing.payload == info.payload and trailing.nominal_ms != first.when_ms
            await s.ack_many([trailing])
            assert await s.get("x") is None  # exactly one trailing run
            await s.schedule("x", "t", b"", **flow)
            await push_clock(s, shard, 10_000)
            [again] = (await s.claim(shard, limit=10)).jobs
            await s.schedule("x", "t", b"late", **flow)  # pending again, then cancelled
            assert await s.cancel("x")
            assert await client_of(s).exists(k.trail) == 0
            assert await s.get("x") is None and again.id == "x"

    run(main())
