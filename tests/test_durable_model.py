"""A hypothesis state machine: the durable store against a plain model (dict of states).

Time is fully controlled: the shard's clock high-water mark is set ten days ahead of the
real clock at the start, so Redis's now (max(TIME, clock)) is exactly the model's now,
and the test moves it forward by pushing the mark. Two schedulers (actors) share one
shard; a takeover makes one of them stale, and its writes must all be fenced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import hypothesis.strategies as st
import pytest
import redis.asyncio
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.durable_support import check_shard, client_of, unique_ns
from tickwheel.durable import (
    Fenced,
    Job,
    JobState,
    LeaseLost,
    Scheduler,
    ScheduleStatus,
)
from tickwheel.durable.store._connect import client_from_url

T = TypeVar("T")
pytestmark = pytest.mark.redis

IDS = ("a", "b", "c")  # few ids: collisions (re-claims, re-schedules) are the interesting cases
LEASE_MS = 10_000
MAX_ATTEMPTS = 2
TEN_DAYS_MS = 10 * 86_400_000


@dataclasses.dataclass
class Entry:
    """The model of one job."""

    state: JobState
    when: int  # due time, lease deadline or time of death
    nominal: int
    attempt: int = 1
    epoch: int = 0


class DurableMachine(RuleBasedStateMachine):
    url: ClassVar[str] = ""

    held = Bundle("held")  # (actor, Job) claimed and not yet acked/retried/forgotten

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clients: list[redis.asyncio.Redis] = []
        self.actors: list[Scheduler] = []
        self.jobs: dict[str, Entry] = {}
        self.done: set[tuple[str, int]] = set()
        self.claimed: list[tuple[int, Job]] = []  # every claim ever made, for zombies
        self.epoch = 0  # the shard's current epoch
        self.actor_epoch = [0, 0]  # what each actor believes it holds
        self.now = 0
        self.t0 = 0

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @initialize()
    def setup(self) -> None:
        ns = unique_ns()
        for _ in range(2):
            client = client_from_url(self.url)
            self.clients.append(client)
            self.actors.append(
                # 3 buckets: the five ids share buckets, and some have one to themselves.
                Scheduler(client, ns, shards=1, buckets=3, check=False, dedup_window=TEN_DAYS_MS)
            )
        a = self.actors[0]
        self.t0 = self._run(a.store.now(0)) + TEN_DAYS_MS
        # Every nominal due the rules pick (t0 .. t0 + 5 s) is due at the start: claims
        # find work, so acks, retries and stale leases happen often.
        self.now = self.t0 + 5000
        self._run(client_of(a).set(a.keys.shard(0).clock, self.now))
        assert self._run(a.take(0)) == 1
        self.epoch = 1
        self.actor_epoch = [1, 0]
        for k, job_id in enumerate(IDS):  # start with work to do
            self.schedule(job_id, k, replace=False)

    def teardown(self) -> None:
        for client in self.clients:
            self._run(client.aclose())
        self.loop.close()

    def _as(self, actor: int) -> Scheduler:
        """The actor, believing it owns the shard under the epoch it last took."""
        sched = self.actors[actor]
        if self.actor_epoch[actor]:
            sched.ownership.owned[0] = self.actor_epoch[actor]
        return sched

    # -- producers -----------------------------------------------------------------

    @rule(job_id=st.sampled_from(IDS), k=st.integers(0, 5), replace=st.booleans())
    def schedule(self, job_id: str, k: int, replace: bool) -> None:
        nominal = self.t0 + k * 1000
        res = self._run(
            self.actors[0].schedule(
                job_id, "t", b"p", at=nominal, replace=replace, max_attempts=MAX_ATTEMPTS
            )
        )
        entry = self.jobs.get(job_id)
        if entry is not None and not replace:
            expected = ScheduleStatus.KEPT
        elif entry is not None and entry.state is JobState.LEASED:
            expected = ScheduleStatus.BUSY
        elif (job_id, nominal) in self.done:
            expected = ScheduleStatus.DONE
        else:
            expected = ScheduleStatus.CREATED if entry is None else ScheduleStatus.REPLACED
            self.jobs[job_id] = Entry(JobState.DUE, nominal, nominal)
        assert res.status is expected, (res, entry)

    @rule(job_id=st.sampled_from(IDS))
    def cancel(self, job_id: str) -> None:
        assert self._run(self.actors[0].cancel(job_id)) == (job_id in self.jobs)
        self.jobs.pop(job_id, None)

    @rule(job_id=st.sampled_from(IDS))
    def requeue_dead(self, job_id: str) -> None:
        got = self._run(self.actors[0].requeue_dead([job_id]))
        entry = self.jobs.get(job_id)
        if entry is not None and entry.state is JobState.DEAD:
            assert got == [job_id]
            self.jobs[job_id] = Entry(JobState.DUE, self.now, entry.nominal)
        else:
            assert got == []

    @rule(ms=st.sampled_from([0, 1, 999, 1000, 5000, LEASE_MS, LEASE_MS + 1, 30_000]))
    def advance(self, ms: int) -> None:
        self.now += ms
        a = self.actors[0]
        self._run(client_of(a).set(a.keys.shard(0).clock, self.now))

    # -- owners --------------------------------------------------------------------

    def _fenced(self, epoch: int) -> bool:
        return epoch != self.epoch

    def _owner(self) -> int:
        return self.actor_epoch.index(self.epoch)

    def _stale(self) -> int | None:
        other = 1 - self._owner()
        return other if self.actor_epoch[other] else None

    @rule(target=held, limit=st.integers(1, 3))
    def claim(self, limit: int) -> Any:
        """The current owner claims."""
        actor = self._owner()
        batch = self._run(self._as(actor).claim(0, limit=limit, lease=LEASE_MS / 1000))
        due = sorted(
            (e.when, i)
            for i, e in self.jobs.items()
            if e.state is JobState.DUE and e.when <= self.now
        )[:limit]
        # An occurrence already done (acked after its lease was lost) is dropped unrun.
        dropped = [i for _, i in due if (i, self.jobs[i].nominal) in self.done]
        for i in dropped:
            del self.jobs[i]
        assert batch.dropped == len(dropped)
        assert [j.id for j in batch.jobs] == [i for _, i in due if i not in dropped]
        # The script's now is the model's; claim() then adds the whole ms it spent after
        # the reply (_leases.py: "now_ms as of our return"), which a loaded machine makes
        # more than zero even with no round trip in between.
        assert self.now <= batch.now_ms < self.now + 60_000
        for job in batch.jobs:
            e = self.jobs[job.id]
            assert (job.id, job.nominal_ms) not in self.done  # acked: never claimed again
            assert (job.nominal_ms, job.attempt, job.epoch) == (e.nominal, e.attempt, self.epoch)
            e.state, e.epoch = JobState.LEASED, self.epoch
            e.when = max(self.now, e.when) + LEASE_MS
            assert job.deadline_ms == e.when
        self.claimed += [(actor, job) for job in batch.jobs]
        return multiple(*[(actor, job) for job in batch.jobs])

    @precondition(lambda self: bool(self.claimed))
    @rule(data=st.data())
    def zombie_ack(self, data: st.DataObject) -> None:
        """A claimer wakes up long after its claim (maybe re-leased since) and acks."""
        i = data.draw(st.integers(0, len(self.claimed) - 1), label="claim index")
        self.ack(self.claimed[i])

    @precondition(lambda self: bool(self.claimed))
    @rule(data=st.data())
    def zombie_retry(self, data: st.DataObject) -> None:
        """A claimer wakes up long after its claim and reports a failure."""
        i = data.draw(st.integers(0, len(self.claimed) - 1), label="claim index")
        self.retry(self.claimed[i], 0)

    @precondition(lambda self: self._stale() is not None)
    @rule()
    def stale_owner_writes(self) -> None:
        """The fenced-out owner tries to claim and reap: refused, nothing written."""
        sched = self._as(self._stale())  # type: ignore[arg-type]
        with pytest.raises(Fenced):
            self._run(sched.claim(0, lease=LEASE_MS / 1000))
        sched = self._as(self._stale())  # type: ignore[arg-type]
        with pytest.raises(Fenced):
            self._run(sched.reap(0))

    def _holds(self, job: Job) -> bool:
        e = self.jobs.get(job.id)
        return (
            e is not None
            and e.state is JobState.LEASED
            and (e.epoch, e.attempt, e.nominal) == (job.epoch, job.attempt, job.nominal_ms)
        )

    @rule(item=consumes(held))
    def ack(self, item: tuple[int, Job]) -> None:
        actor, job = item
        sched = self._as(actor)
        if self._fenced(job.epoch):
            with pytest.raises(Fenced):
                self._run(sched.ack(job))
        elif not self._holds(job) and (job.id, job.nominal_ms) in self.done:
            # Done already (acked before, e.g. a re-sent ack): acked, nothing changes.
            self._run(sched.ack(job))
        elif not self._holds(job):
            with pytest.raises(LeaseLost):
                self._run(sched.ack(job))
            # The handler ran all the same: the occurrence is remembered as done.
            self.done.add((job.id, job.nominal_ms))
        else:
            self._run(sched.ack(job))
            self.done.add((job.id, job.nominal_ms))
            del self.jobs[job.id]

    @rule(item=consumes(held), delay_ms=st.sampled_from([0, 1000]))
    def retry(self, item: tuple[int, Job], delay_ms: int) -> None:
        actor, job = item
        sched = self._as(actor)
        call = sched.retry(job, "err", delay=delay_ms / 1000)
        if self._fenced(job.epoch):
            with pytest.raises(Fenced):
                self._run(call)
        elif not self._holds(job):
            with pytest.raises(LeaseLost):
                self._run(call)
        else:
            state = self._run(call)
            e = self.jobs[job.id]
            e.epoch = 0
            if e.attempt >= MAX_ATTEMPTS:
                e.state, e.when = JobState.DEAD, self.now
            else:
                e.state, e.when, e.attempt = JobState.DUE, self.now + delay_ms, e.attempt + 1
            assert state is e.state

    @rule(item=consumes(held))
    def crash(self, item: tuple[int, Job]) -> None:
        """The claimer dies holding the job: it never acks; only the reaper can help."""

    @rule()
    def reap(self) -> None:
        """The current owner reaps expired leases."""
        sched = self._as(self._owner())
        result = self._run(sched.reap(0))
        expired = sorted(
            (e.when, i)
            for i, e in self.jobs.items()
            if e.state is JobState.LEASED and e.when <= self.now
        )
        requeued, dead = [], []
        for _, i in expired:
            e = self.jobs[i]
            e.epoch = 0
            if e.attempt >= MAX_ATTEMPTS:
                e.state, e.when = JobState.DEAD, self.now
                dead.append(i)
            else:
                e.state, e.when, e.attempt = JobState.DUE, self.now, e.attempt + 1
                requeued.append(i)
        assert (result.requeued, result.dead) == (requeued, dead)

    @rule(target=held)
    def lease_expires(self) -> Any:
        """Claimers stall: time passes beyond every lease, the owner reaps and claims
        again, so the stalled claimers now hold stale leases of re-leased jobs."""
        self.advance(LEASE_MS + 1)
        self.reap()
        return self.claim(3)

    @rule(actor=st.sampled_from([0, 1]))
    def takeover(self, actor: int) -> None:
        """The other owner stalls past its TTL; ``actor`` takes the shard over."""
        sched = self.actors[actor]
        self._run(client_of(sched).delete(sched.keys.shard(0).owner))
        sched.ownership.owned.pop(0, None)
        assert self._run(sched.take(0)) == self.epoch + 1
        self.epoch += 1
        self.actor_epoch[actor] = self.epoch

    @precondition(lambda self: self.epoch > 0)
    @invariant()
    def matches_model(self) -> None:
        states = self._run(check_shard(self.actors[0], 0))
        assert states == {i: e.state for i, e in self.jobs.items()}
        for job_id, e in self.jobs.items():
            info = self._run(self.actors[0].get(job_id))
            assert info is not None
            got = (info.when_ms, info.nominal_ms, info.attempt, info.epoch)
            assert got == (e.when, e.nominal, e.attempt, e.epoch), (job_id, info, e)


def multiple(*values: Any) -> Any:
    from hypothesis.stateful import multiple as _multiple

    return _multiple(*values)


def _run_machine(url: str, examples: int, steps: int) -> None:
    DurableMachine.url = url
    run_state_machine_as_test(
        DurableMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_store_matches_model(redis_url: str) -> None:
    """The short form (a few seconds), run by default."""
    _run_machine(redis_url, examples=60, steps=40)


@pytest.mark.slow
def test_store_matches_model_soak(redis_url: str) -> None:
    """The long form: longer runs than the short form's (~10 s by default), ~2 min with
    TICKWHEEL_SOAK=1."""
    soak = bool(os.environ.get("TICKWHEEL_SOAK"))
    _run_machine(redis_url, examples=1000 if soak else 40, steps=80)
