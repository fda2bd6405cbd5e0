"""Chaos: real worker processes and a real Redis, killed and stopped at random.

One redis-server with ``appendonly yes`` and ``appendfsync always`` holds the jobs; a
second one, the *sink*, which no fault touches, holds what the task did (see
chaos_support.py). While a producer schedules one-shot jobs and five recurring jobs run
every second, a seeded random sequence of faults hits the system:

- ``kill -9`` of a worker, and a replacement started;
- ``kill -9`` of Redis, restarted on the same data directory and the same port;
- ``SIGSTOP`` of a worker for longer than the owner TTL and the lease (its shards and
  its running job go to others), then ``SIGCONT``: it must find itself fenced.

Then the faults stop, everything settles, and the checks run:

- lost: every one-shot job has exactly one effect, and every occurrence of every
  recurring job from its first one up to the settle time has exactly one effect;
- double effects: no job has effects for two different occurrences it does not own
  (a one-shot job one nominal, a recurring job nominals on its grid only);
- early: no call started, and no effect was written, before the nominal due;
- nothing is left due, leased or dead (``Scheduler.inspect``);
- duplicate handler calls (a second call of an occurrence) are counted, and each is
  explained by a fault: of an occurrence's n calls, n - 1 were made by a worker later
  killed or stopped, or were running when Redis was killed (their ack was lost), or
  started just after a restart on a worker that was then fenced. Their number is
  bounded by the faults times the task slots they could have caught.

The Postgres form (``test_chaos[postgres]``) runs the same with PostgreSQL as the source
of truth: Redis runs with no persistence at all (``--save ''``, ``--appendonly no``), so
its kill restarts it empty; the workers run ``tickwheel worker --postgres-url`` and
reconcile every 2 s (nothing else rebuilds the index); a further fault is ``kill -9`` of
PostgreSQL, restarted on the same data directory. It checks the same, and also that
PostgreSQL ends with nothing pending, dead or in the outbox, has a done row for every
one-shot effect, and no done row without an effect. One job in FAIL_EVERY always
fails: each ends dead in PostgreSQL at exactly FAIL_ATTEMPTS, no call ran at a higher
attempt, and the attempts of its calls never go down (``_check_failing``).

The seed is printed (and in every failure message); ``TICKWHEEL_CHAOS_SEED`` replays one.
The CI form runs ~30 s of faults (about 40 s in all, 50-60 s for the Postgres form);
``TICKWHEEL_SOAK=1`` runs 12 min of faults each (about 13 min per form).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from tests.chaos_support import ChaosWorker, failing_calls, occurrence, sink_state
from tickwheel.durable import PostgresUnavailable, RedisUnavailable, Scheduler
from tickwheel.durable.servers._postgres import PostgresServer
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SOAK = os.environ.get("TICKWHEEL_SOAK") == "1"
CHAOS_SECONDS = 720.0 if SOAK else 30.0
# Past the suite's 300 s default: the faults, then up to 3 bounded waits of 90 s.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(CHAOS_SECONDS + 420)]
WORKERS = 3
SHARDS = 8
OWNER_TTL = 2.0
LEASE = 3.0
LOOKAHEAD = 0.5
MAX_RUNNING = 8
EVERY = 1.0  # the recurring jobs' interval (s)
RECURRING = 5
MAX_ATTEMPTS = 50  # each fault may cost an attempt; none may end in the dead letters
# Postgres form: every FAIL_EVERY-th job the producer schedules always fails, with this
# many attempts: it must run at most that many (attempts never reset, whatever is killed
# meanwhile) and end dead in PostgreSQL at exactly that attempt.
FAIL_EVERY = 12
FAIL_ATTEMPTS = 3
WORKER_OPTS = (
    "--owner-ttl", str(OWNER_TTL), "--lease", str(LEASE), "--lookahead", str(LOOKAHEAD),
    "--poll-interval", "0.05", "--reap-interval", "0.25", "--max-running", str(MAX_RUNNING),
    "--limit", "50", "--drain-timeout", "5", "--shards", str(SHARDS),
)  # fmt: skip
# Past the owner TTL (the shards go to others) and the lease (its running job is reaped
# and run elsewhere) with a margin for a loaded machine.
STOP_SECONDS = OWNER_TTL + LEASE + 1.5
# A call counts as caught by a Redis kill if it started this long before the kill (its
# handler runs at most 0.4 s, then acks) or while Redis was down...
REDIS_KILL_REACH_MS = 5_000
# ...or this soon after Redis was back, by a worker that was fenced: an outage longer
# than what was left of an owner token's TTL lets the token expire (Redis restores keys
# with their absolute expiry), so another worker may take the shard (a new epoch) before
# its owner renews it, and the owner's acks of what it claimed meanwhile are refused.
REDIS_RESTART_REACH_MS = int(OWNER_TTL * 1000) + 2_000
# Postgres form: a call cut short by a PostgreSQL kill started this long before it, or
# while it was down, or this soon after (a pooled connection broken by the restart fails
# its first use; the ack retries only while the lease lasts).
PG_KILL_REACH_MS = 5_000
PG_RESTART_REACH_MS = int(LEASE * 1000) + 2_000
# Postgres form: the workers reconcile this often (s); nobody else does, so a Redis
# restarted empty is rebuilt by the workers' own periodic reconcile.
RECONCILE_INTERVAL = 2.0


@dataclass
class Faults:
    """What was done, when (sink ms), to whom."""

    killed: set[int] = field(default_factory=set)  # worker pids killed -9
    stopped: set[int] = field(default_factory=set)  # worker pids SIGSTOP'd then resumed
    redis_down: list[tuple[int, int]] = field(default_factory=list)  # (kill ms, up ms)
    pg_down: list[tuple[int, int]] = field(default_factory=list)  # (kill ms, up ms)
    log: list[str] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(line.split()[1] for line in self.log)


async def sink_ms(sink: redis.asyncio.Redis) -> int:
    sec, usec = await sink.time()
    return int(sec) * 1000 + int(usec) // 1000


async def until(what: str, predicate: Any, within: float, step: float = 0.2) -> Any:
    """Await ``predicate()`` until truthy; fail naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(step)


async def persist(call: Any, within: float = 60.0) -> Any:
    """Run a scheduler call until Redis answers (its scripts are safe to run again)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except (RedisUnavailable, PostgresUnavailable):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_chaos(tmp_path: Path, mode: str) -> None:
    """``redis``: Redis with AOF (fsync always) holds the jobs. ``postgres``: PostgreSQL
    holds them and Redis runs with no persistence at all (a kill restarts it empty);
    PostgreSQL is killed -9 too, and restarted on its data directory."""
    seed = int(os.environ.get("TICKWHEEL_CHAOS_SEED", random.randrange(2**32)))
    print(f"chaos seed {seed} ({CHAOS_SECONDS:.0f} s of faults, {mode})")
    logdir = tmp_path / "logs"
    logdir.mkdir()
    if mode == "redis":
        server = RedisServer(appendonly=True, appendfsync="always", data_dir=tmp_path / "data")
        pg = None
    else:  # --save '' and --appendonly no: a restart comes back empty
        server = RedisServer(appendonly=False, data_dir=tmp_path / "data")
        # Not under tmp_path: its parents are private to this user, and the server may
        # run as another (PostgresServer runs it unprivileged when this is root).
        pg_dir = Path(tempfile.mkdtemp(prefix="tickwheel-chaos-pg-"))
        pg = PostgresServer(data_dir=pg_dir)
    with RedisServer() as sink_server:
        server.start()
        try:
            if pg is not None:
                pg.start()
                asyncio.run(_migrate(pg.url))
            asyncio.run(_chaos(random.Random(seed), seed, server, sink_server, logdir, pg=pg))
        finally:
            server.stop()
            if pg is not None:
                pg.stop()
                shutil.rmtree(pg.base_dir, ignore_errors=True)


async def _migrate(url: str) -> None:
    import asyncpg

    from tickwheel.durable.postgres import migrate

    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _pg_rows(url: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _chaos(
    rng: random.Random,
    seed: int,
    server: RedisServer,
    sink_server: RedisServer,
    logdir: Path,
    *,
    pg: PostgresServer | None,
) -> None:
    ns = f"chaos{uuid.uuid4().hex[:8]}"
    prefix = f"sink:{ns}"
    sink: redis.asyncio.Redis = client_from_url(sink_server.url)  # type: ignore[assignment]
    client = client_from_url(server.url)
    pg_url = pg.url if pg is not None else None
    sched = Scheduler(client, ns, shards=SHARDS, check=False, postgres_url=pg_url)
    opts = WORKER_OPTS
    if pg_url is not None:
        opts += ("--postgres-url", pg_url, "--reconcile-interval", str(RECONCILE_INTERVAL))
    workers: list[ChaosWorker] = []
    faults = Faults()
    one_shots: dict[str, int] = {}  # id -> scheduled at (sink ms, before the call)
    failing: dict[str, int] = {}  # Postgres form: jobs that always fail, the same
    tag = f"(seed {seed})"

    def spawn() -> ChaosWorker:
        w = ChaosWorker(server.url, sink_server.url, ns, logdir, *opts)
        workers.append(w)
        return w

    def payload(d: float) -> dict[str, Any]:
        return {"sink": prefix, "d": round(d, 3)}

    async def produce(stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            job_id = f"o{i}"
            body, delay = payload(rng.uniform(0.02, 0.4)), rng.uniform(0, 3)
            at = await sink_ms(sink)
            if pg_url is not None and i % FAIL_EVERY == FAIL_EVERY // 2:
                job_id = f"f{i}"
                await persist(
                    lambda job_id=job_id, body=body, delay=delay: sched.schedule(
                        job_id, "chaos_fail", body, delay=delay, max_attempts=FAIL_ATTEMPTS
                    )
                )
                failing[job_id] = at
                i += 1
                continue
            await persist(
                lambda job_id=job_id, body=body, delay=delay: sched.schedule(
                    job_id, "chaos", body, delay=delay, max_attempts=MAX_ATTEMPTS
                )
            )
            one_shots[job_id] = at
            i += 1
            await asyncio.sleep(rng.uniform(0.01, 0.1))

    async def live() -> list[ChaosWorker]:
        return [w for w in workers if w.alive() and w.pid not in faults.killed]

    async def fault(kind: str) -> None:
        now = await sink_ms(sink)
        if kind == "worker-kill":
            victim = rng.choice([w for w in await live() if not w.stopped])
            victim.kill()
            faults.killed.add(victim.pid)
            faults.log.append(f"{now} worker-kill {victim.pid}")
            await spawn().wait_started()
        elif kind == "redis-kill":
            server.kill()
            await asyncio.sleep(rng.uniform(0.1, 1.5))
            server.start()  # same port, same data dir (Postgres form: no data, empty)
            up = await sink_ms(sink)
            faults.redis_down.append((now, up))
            faults.log.append(f"{now} redis-kill down {up - now} ms")
        elif kind == "pg-kill":
            assert pg is not None
            pg.kill()
            await asyncio.sleep(rng.uniform(0.1, 1.5))
            await asyncio.to_thread(pg.start)  # same port, same data dir: WAL recovery
            up = await sink_ms(sink)
            faults.pg_down.append((now, up))
            faults.log.append(f"{now} pg-kill down {up - now} ms")
        else:  # worker-stop
            victim = rng.choice([w for w in await live() if not w.stopped])
            victim.pause()
            faults.stopped.add(victim.pid)
            faults.log.append(f"{now} worker-stop {victim.pid}")
            await asyncio.sleep(STOP_SECONDS)
            victim.resume()

    try:
        await sched.open()
        for _ in range(WORKERS):
            spawn()
        for w in workers:
            await w.wait_started()
        first_at = await sink_ms(sink)
        for r in range(RECURRING):
            await sched.schedule(
                f"r{r}",
                "chaos",
                payload(0.05 + 0.05 * r),
                every=EVERY,
                missed="all",
                max_attempts=MAX_ATTEMPTS,
            )
        stop = asyncio.Event()
        producer = asyncio.ensure_future(produce(stop))
        # Each kind at least once, then at random; a pause of 2-5 s between faults.
        kinds = ["worker-kill", "redis-kill", "worker-stop"]
        if pg is not None:
            kinds.append("pg-kill")
        rng.shuffle(kinds)
        kinds_after = [k for k in sorted(kinds) if k != "worker-kill"]
        end = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < end:
            await asyncio.sleep(rng.uniform(2, 5))
            if producer.done():
                producer.result()  # raise what stopped it
            if not kinds:  # then kills of workers 3 times as often as the others
                kinds = [rng.choice(["worker-kill"] * 3 + kinds_after)]
            kind = kinds.pop()
            await fault(kind)
        stop.set()
        await producer
        print(
            "faults:",
            dict(faults.counts()),
            f"one-shot jobs: {len(one_shots)}, always failing: {len(failing)}",
        )

        # -- settle: no more faults; every job that came due runs ----------------------
        settled_at = await sink_ms(sink)

        async def one_shots_done() -> bool:
            effects = (await sink_state(sink, prefix))["effect"]
            ran = {occurrence(o)[0] for o in effects} & one_shots.keys()
            return len(ran) == len(one_shots)

        async def recurring_caught_up() -> bool:
            state = await sink_state(sink, prefix)
            seen = Counter(occurrence(o)[0] for o in state["effect"])
            newest: dict[str, int] = {}
            for o in state["effect"]:
                job_id, nominal = occurrence(o)
                newest[job_id] = max(newest.get(job_id, 0), nominal)
            done = [newest.get(f"r{r}", 0) >= settled_at for r in range(RECURRING)]
            return all(done) and all(seen[f"r{r}"] > 0 for r in range(RECURRING))

        effects_n = await sink.hlen(f"{prefix}:effect")
        with_msg = f"{tag}: {effects_n} effects of {len(one_shots)} one-shots so far"
        await until(f"the recurring jobs to catch up {with_msg}", recurring_caught_up, 90)
        for r in range(RECURRING):
            assert await persist(lambda r=r: sched.cancel(f"r{r}")), f"r{r} vanished {tag}"

        async def dead_ids() -> set[str]:
            pages = [
                await persist(lambda k=k: sched.store.dead_list(k, 0, 1000)) for k in range(SHARDS)
            ]
            return {j.id for page in pages for j in page.jobs}

        async def quiet() -> bool:
            if not await one_shots_done():
                return False
            shards = await persist(sched.inspect)
            if not all(s.due == s.leased == 0 for s in shards):
                return False
            if not await dead_ids() <= failing.keys():  # a Redis kill may lose some
                return False
            return pg_url is None or not await _pg_left(pg_url, ns, failing)

        await until(f"every one-shot to run and nothing to be due or leased {tag}", quiet, 90)
        alive = [w for w in workers if w.pid not in faults.killed]
        for w in alive:
            assert w.alive(), f"worker {w.pid} exited {tag}: {w.stderr_tail()}"
        stats = {w.pid: await w.stop() for w in alive}
        for pid, got in stats.items():
            print(f"worker {pid}:", got)
        for pid in faults.stopped - faults.killed:
            got = stats[pid]
            assert got is not None, f"stopped worker {pid} gave no stats {tag}"
            # Its shards' owner keys expired while it was stopped: it must have dropped
            # them (fenced), not gone on with a stale epoch.
            assert got["fenced"] >= 1, (pid, got, tag)

        shards = await persist(sched.inspect)
        assert [(s.due, s.leased, s.expired) for s in shards] == [(0, 0, 0)] * SHARDS
        assert await dead_ids() <= failing.keys(), tag
        state = await sink_state(sink, prefix)
        if pg_url is not None:
            assert not await _pg_left(pg_url, ns, failing), tag
            calls = await failing_calls(sink, prefix)
            await _check_failing(pg_url, ns, failing=failing, calls=calls, faults=faults, tag=tag)
            # PostgreSQL recorded done exactly the one-shot occurrences that had their
            # effect (and recurring ones that had theirs: none without).
            done = {
                f"{r[0]}|{r[1]}"
                for r in await _pg_rows(
                    pg_url, "SELECT id, nominal_ms FROM tickwheel_done WHERE ns = $1", ns
                )
            }
            phantom = done - set(state["effect"])
            assert not phantom, f"done in PostgreSQL with no effect {tag}: {sorted(phantom)[:10]}"
            one_shot_effects = {o for o in state["effect"] if occurrence(o)[0] in one_shots}
            unrecorded = one_shot_effects - done
            assert not unrecorded, f"effects PostgreSQL never recorded {tag}: {unrecorded}"
        _check(
            state,
            one_shots=one_shots,
            first_at=first_at,
            settled_at=settled_at,
            faults=faults,
            tag=tag,
            workers=workers,
            stats=stats,
        )
    finally:
        for w in workers:
            w.resume()
        for w in workers:
            if w.alive():
                w.kill()
        await client.aclose()
        await sink.aclose()


async def _pg_left(pg_url: str, ns: str, failing: dict[str, int]) -> list[str]:
    """What PostgreSQL still holds for ``ns`` that is not an end state: pending job
    rows, dead ones but the always-failing jobs', outbox rows."""
    left = await _pg_rows(
        pg_url,
        "SELECT id || ':' || state FROM tickwheel_jobs WHERE ns = $1 AND state <> 1"
        " AND NOT (state = 2 AND id = ANY($2::text[]))"
        " UNION ALL SELECT 'outbox:' || id FROM tickwheel_outbox WHERE ns = $1",
        ns,
        list(failing),
    )
    return [r[0] for r in left]


async def _check_failing(
    pg_url: str,
    ns: str,
    *,
    failing: dict[str, int],
    calls: dict[str, list[tuple[int, int, int]]],
    faults: Faults,
    tag: str,
) -> None:
    """Attempts never reset, and ``max_attempts`` holds exactly, through every kill of a
    worker, of Redis (restarted empty) and of PostgreSQL: each always-failing job ends
    dead in PostgreSQL at attempt FAIL_ATTEMPTS; no call ran at a higher attempt; in the
    order the calls started (a stopped worker's call may be logged late, so its calls
    are left out of the order) the attempt never went down; and an attempt ran twice
    only when a fault cut the first call short (its worker killed or stopped, or a
    server killed around it)."""
    got = {
        r[0]: (int(r[1]), int(r[2]))
        for r in await _pg_rows(
            pg_url,
            "SELECT id, state, attempt FROM tickwheel_jobs WHERE ns = $1 AND id = ANY($2::text[])",
            ns,
            list(failing),
        )
    }
    wrong = {i: got.get(i) for i in failing if got.get(i) != (2, FAIL_ATTEMPTS)}
    assert not wrong, f"always-failing jobs not dead at attempt {FAIL_ATTEMPTS} {tag}: {wrong}"
    assert set(calls) <= failing.keys(), tag
    for job_id, runs in calls.items():
        attempts = [a for a, _, _ in runs]
        assert max(attempts) <= FAIL_ATTEMPTS, f"{job_id} ran {attempts} {tag}"
        ordered = [a for a, pid, _ in runs if pid not in faults.stopped]
        assert ordered == sorted(ordered), f"{job_id}'s attempt went down: {runs} {tag}"
        for attempt in set(attempts):
            again = [(pid, ms) for a, pid, ms in runs if a == attempt]
            unexplained = [
                (pid, ms)
                for pid, ms in again[:-1]
                if pid not in faults.killed | faults.stopped
                and not any(
                    down - PG_KILL_REACH_MS <= ms <= up + PG_RESTART_REACH_MS
                    for down, up in faults.redis_down + faults.pg_down
                )
            ]
            assert not unexplained, f"{job_id} ran attempt {attempt} again: {runs} {tag}"
    print(
        f"{len(failing)} always-failing jobs, {sum(map(len, calls.values()))} calls, all dead"
        f" at attempt {FAIL_ATTEMPTS}"
    )


def _check(
    state: dict[str, Any],
    *,
    one_shots: dict[str, int],
    first_at: int,
    settled_at: int,
    faults: Faults,
    tag: str,
    workers: list[ChaosWorker],
    stats: dict[int, dict[str, int] | None],
) -> None:
    effect: dict[str, tuple[int, int]] = state["effect"]
    log: dict[str, list[tuple[int, int]]] = state["log"]
    by_id: dict[str, list[int]] = {}
    for occ in effect:
        job_id, nominal = occurrence(occ)
        by_id.setdefault(job_id, []).append(nominal)

    # Lost / double effects, one-shot: one effect each, of one occurrence.
    lost = [j for j in one_shots if j not in by_id]
    assert not lost, f"{len(lost)} one-shot jobs never had an effect {tag}: {lost[:20]}"
    double = {j: n for j, n in by_id.items() if j in one_shots and len(n) != 1}
    assert not double, f"one-shot jobs with effects of several occurrences {tag}: {double}"
    stray = set(by_id) - set(one_shots) - {f"r{r}" for r in range(RECURRING)}
    assert not stray, f"effects of jobs never scheduled {tag}: {stray}"
    for job_id, nominals in by_id.items():
        if job_id in one_shots:
            assert nominals[0] >= one_shots[job_id] - 5, (job_id, nominals, tag)

    # Recurring: every occurrence on the grid from the first to the settle time.
    every_ms = int(EVERY * 1000)
    for r in range(RECURRING):
        nominals = sorted(by_id.get(f"r{r}", []))
        assert nominals, f"r{r} never ran {tag}"
        first = nominals[0]
        assert first_at <= first <= first_at + every_ms + 10_000, (f"r{r}", first, tag)
        want = list(range(first, nominals[-1] + 1, every_ms))
        missing = sorted(set(want) - set(nominals))
        off_grid = sorted(set(nominals) - set(want))
        assert not missing, f"r{r} lost {len(missing)} occurrences {tag}: {missing[:10]}"
        assert not off_grid, f"r{r} ran off its grid {tag}: {off_grid[:10]}"
        assert nominals[-1] >= settled_at, (f"r{r}", nominals[-1], settled_at, tag)

    # Early: no call started and no effect was written before the nominal due.
    times = [(occ, ms) for occ, calls in log.items() for _, ms in calls]
    times += [(occ, ms) for occ, (ms, _) in effect.items()]
    early = [(occ, ms - occurrence(occ)[1]) for occ, ms in times if ms < occurrence(occ)[1]]
    assert not early, f"{len(early)} early calls or effects (ms) {tag}: {early[:10]}"

    # Every occurrence's calls: each call but the last one was cut short by a fault.
    # The one exception: the end's cancel of each series stops the run it finds (a
    # cancel of a running job stops its handler), at most one per series, newer than
    # every occurrence of that series with an effect.
    unfinished = set(log) - set(effect)
    stopped_by_cancel = {
        occ
        for occ in unfinished
        if occurrence(occ)[0].startswith("r")
        and occurrence(occ)[1] > max(by_id.get(occurrence(occ)[0], [0]))
    }
    per_series = Counter(occurrence(occ)[0] for occ in stopped_by_cancel)
    assert all(n == 1 for n in per_series.values()), f"runs stopped {tag}: {per_series}"
    assert set(effect) <= set(log), f"effects without a call {tag}: {set(effect) - set(log)}"
    lost_calls = unfinished - stopped_by_cancel
    assert not lost_calls, f"calls without an effect {tag}: {lost_calls}"

    def cut_short(pid: int, ms: int) -> str | None:
        """The fault that can have cut this call short (its ack never landed)."""
        if pid in faults.killed:
            return "its worker was killed"
        if pid in faults.stopped:
            return "its worker was stopped"
        if any(down - REDIS_KILL_REACH_MS <= ms <= up for down, up in faults.redis_down):
            return "Redis was killed"
        if (stats.get(pid) or {}).get("fenced", 0) > 0 and any(
            up < ms <= up + REDIS_RESTART_REACH_MS for _, up in faults.redis_down
        ):
            return "Redis was killed, its worker fenced after"
        if any(
            down - PG_KILL_REACH_MS <= ms <= up + PG_RESTART_REACH_MS for down, up in faults.pg_down
        ):
            return "PostgreSQL was killed"
        return None

    # Of an occurrence's n calls, n - 1 must each have a fault that cut it short; the
    # one left is the call that was acked. Not necessarily the last in the log: a worker
    # stopped between starting a task and its first write logs its call on resuming,
    # after the worker that took the job over.
    reasons: Counter[str] = Counter()
    unexplained: list[tuple[str, int, int]] = []
    for occ, calls in log.items():
        assert state["calls"][occ] == len(calls), (occ, tag)
        if len(calls) < 2:
            continue
        why = [(cut_short(pid, ms), pid, ms) for pid, ms in calls]
        plain = [(pid, ms) for reason, pid, ms in why if reason is None]
        unexplained += [(occ, pid, ms) for pid, ms in plain[1:]]
        faulted = [reason for reason, _, _ in why if reason is not None]
        reasons.update(faulted if plain else faulted[:-1])
    duplicates = sum(reasons.values()) + len(unexplained)
    print(f"{len(effect)} occurrences, {duplicates} duplicate calls: {dict(reasons)}")
    print("\n".join(faults.log))
    if unexplained:
        said = [
            f"{w.pid}: {line}"
            for w in workers
            for line in w.stderr_tail(10**6).splitlines()
            if any(occ.split("|")[0] + "'" in line for occ, _, _ in unexplained)
        ]
        raise AssertionError(
            f"duplicate calls no fault explains {tag}: {unexplained[:10]}\nfaults:\n"
            + "\n".join(faults.log)
            + "\nworkers said:\n"
            + "\n".join(said[:40])
        )
    # A killed or stopped worker had at most MAX_RUNNING tasks running; a Redis kill
    # could cut every worker's running tasks short.
    bound = MAX_RUNNING * (
        len(faults.killed)
        + len(faults.stopped)
        + WORKERS * (len(faults.redis_down) + len(faults.pg_down))
    )
    assert duplicates <= bound, (duplicates, bound, tag)
