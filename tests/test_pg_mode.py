"""The Postgres mode: migrations, transactional enqueue, outbox relay, ack with fencing,
reconcile after Redis lost its data, errors. Real redis-server and PostgreSQL processes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from durable_support import client_of, push_clock, run, snapshot, unique_ns
from pg_support import migrated, pg_scheduler, rows, table_counts, table_locked
from spill_support import running_worker, until

from tickwheel.durable import (
    Fenced,
    JobSpec,
    JobState,
    LeaseLost,
    PostgresUnavailable,
    RedisUnavailable,
    ScheduleStatus,
    SchemaNotReady,
    TaskContext,
    TaskRegistry,
)
from tickwheel.durable.postgres import SCHEMA_VERSION, migrate, migrations, schema_version
from tickwheel.durable.postgres._pg_store import MAX_LOCKED, PgStore
from tickwheel.durable.postgres._rows import encode_pg_job
from tickwheel.durable.servers._redis import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


async def _claim_all(sched, shard: int = 0):  # type: ignore[no-untyped-def]
    await sched.take(shard)
    return await sched.claim(shard, limit=1000)


# -- migrations ---------------------------------------------------------------------


def test_migrate_is_versioned_and_idempotent(pg_url: str) -> None:
    async def main() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            assert await schema_version(conn) == 0
            assert await migrate(conn) == [m.version for m in migrations()]
            assert await migrate(conn) == []
            assert await schema_version(conn) == SCHEMA_VERSION
            # Two concurrent runs serialise on the advisory lock: one applies nothing.
            other = await asyncpg.connect(pg_url)
            try:
                assert await asyncio.gather(migrate(conn), migrate(other)) == [[], []]
            finally:
                await other.close()
            idx = await conn.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'tickwheel_jobs_pending_due'"
            )
            assert "WHERE (state = 0)" in idx
        finally:
            await conn.close()

    run(main())


def test_concurrent_first_migrations_apply_once(pg_url: str) -> None:
    async def main() -> None:
        conns = [await asyncpg.connect(pg_url) for _ in range(3)]
        try:
            results = await asyncio.gather(*(migrate(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        assert sorted(results) == [[], [], [m.version for m in migrations()]]

    run(main())


def test_missing_schema_is_a_typed_error_and_no_ddl(redis_server: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        async with pg_scheduler(redis_server.url, pg_url) as s:
            with pytest.raises(SchemaNotReady, match="tickwheel pg migrate") as info:
                await s.schedule("a", "t", b"x", delay=0)
            assert info.value.found == 0 and info.value.wanted == SCHEMA_VERSION
            assert not info.value.transient
            assert await snapshot(s) == {}
        tables = await rows(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert tables == []

    run(main())


# -- transactional enqueue ----------------------------------------------------------


def test_rollback_means_no_job(redis_server: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            app = await asyncpg.connect(pg_url)
            try:
                await app.execute("CREATE TABLE orders (id text PRIMARY KEY)")
                with pytest.raises(RuntimeError, match="card declined"):
                    async with app.transaction():
                        await app.execute("INSERT INTO orders VALUES ('o1')")
                        result = await s.schedule(
                            "charge-o1", "charge", {"o": 1}, delay=0, conn=app
                        )
                        assert result.status is ScheduleStatus.CREATED
                        raise RuntimeError("card declined")
            finally:
                await app.close()
            assert await s.relay() == 0
            assert await table_counts(pg_url) == {
                "tickwheel_jobs": 0,
                "tickwheel_done": 0,
                "tickwheel_outbox": 0,
            }
            batch = await _claim_all(s)
            assert batch.jobs == []
            assert await s.get("charge-o1") is None

    run(main())


def test_commit_means_the_job_runs_once(redis_server: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            app = await asyncpg.connect(pg_url)
            try:
                async with app.transaction():
                    await s.schedule("charge-o2", "charge", {"o": 2}, delay=0, conn=app)
                    # Not committed yet: nothing in Redis, nothing to relay.
                    assert await s.get("charge-o2") is None
            finally:
                await app.close()
            assert await s.get("charge-o2") is None  # the relay has not run
            assert await s.relay() == 1
            assert await s.relay() == 0
            info = await s.get("charge-o2")
            assert info is not None and info.state is JobState.DUE
            batch = await _claim_all(s)
            assert [j.id for j in batch.jobs] == ["charge-o2"]
            assert batch.jobs[0].payload == {"o": 2}
            await s.ack(batch.jobs[0])
            # Relayed again (a stale outbox copy) or reconciled: it does not come back.
            await rows(
                pg_url,
                "INSERT INTO tickwheel_outbox (ns, id, due_ms) SELECT ns, id, due_ms"
                " FROM tickwheel_jobs",
            )
            assert await s.relay() == 1
            result = await s.reconcile()
            assert result.pending == 0 and result.restored == 0
            await push_clock(s, 0, 10_000)
            assert (await s.claim(0)).jobs == []
            (done,) = await rows(pg_url, "SELECT id, attempt, epoch FROM tickwheel_done")
            assert tuple(done) == ("charge-o2", 1, batch.jobs[0].epoch)
            (job,) = await rows(pg_url, "SELECT state FROM tickwheel_jobs")
            assert job[0] == 1

    run(main())


async def _outbox_empties(pg_url: str, within: float) -> bool:
    deadline = asyncio.get_running_loop().time() + within
    while (await table_counts(pg_url))["tickwheel_outbox"]:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_close_deletes_the_outbox_rows_it_still_holds(
    redis_server: RedisServer, pg_url: str
) -> None:
    """A producer deletes its outbox rows after the call returns (not waiting for it),
    one delete in flight and the rest queued behind it; closing the store finishes
    them all before it returns, so none is left to the relay."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            assert s.pg is not None
            store = s.pg.store
            seqs = [
                seq
                for k in range(3)
                for _, _, seq in await store.schedule(
                    [encode_pg_job(JobSpec(f"c{k}", "t", b"x", delay=60), 0, 1 << 16)]
                )
            ]
            blocker = await asyncpg.connect(pg_url)
            try:
                async with blocker.transaction():
                    await blocker.execute("SELECT 1 FROM tickwheel_outbox FOR UPDATE")
                    store.relayed_later(seqs[:1])
                    await asyncio.sleep(0.2)  # that delete is in flight, waiting on the rows
                    store.relayed_later(seqs[1:2])  # these two queue up behind it
                    store.relayed_later(seqs[2:])
                    closing = asyncio.create_task(store.aclose())
                    await asyncio.sleep(0.3)
                    assert not closing.done()  # close waits for the deletes
            finally:
                await blocker.close()
            await asyncio.wait_for(closing, 20)
            # Nothing runs on after close: no delete left, no pool opened again for one.
            assert store._forgetting is None and store._pool is None
            assert (await table_counts(pg_url))["tickwheel_outbox"] == 0

    run(main())


def test_own_transaction_indexes_at_once_and_is_idempotent(
    redis_server: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=2) as s:
            first = await s.schedule("j", "t", b"x", delay=60)
            assert first.status is ScheduleStatus.CREATED
            again = await s.schedule("j", "t", b"y", delay=120)
            assert again.status is ScheduleStatus.KEPT and again.when_ms == first.when_ms
            info = await s.get("j")
            assert info is not None and info.when_ms == first.when_ms and info.payload == b"x"
            # The producer deletes its outbox row after the call (no relay runs here).
            assert await _outbox_empties(pg_url, within=10.0)
            many = await s.schedule_many([JobSpec(f"m{i}", "t", i, delay=30) for i in range(5)])
            assert [r.status for r in many] == [ScheduleStatus.CREATED] * 5
            assert (await table_counts(pg_url))["tickwheel_jobs"] == 6
            for i in range(5):
                assert await s.get(f"m{i}") is not None

    run(main())


def test_crash_between_commit_and_relay_loses_nothing(
    redis_server: RedisServer, pg_url: str
) -> None:
    """The producer commits and dies before any relay; a new process relays; it runs."""

    async def producer(ns: str) -> None:
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=1) as s:
            app = await asyncpg.connect(pg_url)
            async with app.transaction():
                await s.schedule("pay", "charge", b"p", delay=0, conn=app)
            # The process dies here: the connection drops, no relay ever ran.
            app.terminate()

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as probe:
            ns = probe.keys.namespace
        await producer(ns)
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=1) as s:
            assert await s.get("pay") is None
            ran: list[str] = []

            async def handler(job) -> None:  # type: ignore[no-untyped-def]
                ran.append(job.id)

            await s.take(0)
            assert await s.relay() == 1
            assert await s.process(handler) == 1
            assert await s.process(handler) == 0
            assert ran == ["pay"]

    run(main())


# -- ack, fencing, reconcile --------------------------------------------------------


def test_acked_occurrence_never_runs_again_after_flushall(
    private_redis: RedisServer, pg_url: str
) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=2) as s:
            ns = s.keys.namespace
            for i in range(10):
                await s.schedule(f"j{i}", "t", i, delay=0)
            await s.schedule("r", "t", b"", every=0.05)
            acked: set[str] = set()
            for shard in range(2):
                batch = await _claim_all(s, shard)
                for job in batch.jobs[:2]:
                    await s.ack(job)
                    acked.add(job.id)
            assert len(acked) == 4
            await client_of(s).flushall()
        # A fresh process (and so fresh scripts, namespace meta, epochs) after the loss.
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=2) as s:
            result = await s.reconcile()
            assert result.pending == 7  # 6 one-shot jobs and the recurring one
            assert result.restored == 7
            assert result.epochs_raised == 2
            assert (await s.reconcile()).restored == 0  # idempotent
            ran: list[str] = []

            async def handler(job) -> None:  # type: ignore[no-untyped-def]
                ran.append(job.id)

            for shard in range(2):
                epoch = await s.take(shard)
                assert epoch is not None and epoch >= 3  # above what PostgreSQL recorded
            await push_clock(s, 0, 1000)
            await push_clock(s, 1, 1000)
            await s.process(handler)
            one_shots = sorted(x for x in ran if x != "r")
            assert one_shots == sorted({f"j{i}" for i in range(10)} - acked)
            assert not acked & set(ran)

    run(main())


def test_pg_refuses_a_stale_owners_ack_that_redis_alone_would_take(
    redis_server: RedisServer, pg_url: str
) -> None:
    """docs/postgres.md: "ack calls tickwheel_ack() first: under the shard's epoch
    (refused whole with Fenced unless it is the stored one)". PostgreSQL refuses a
    stale owner's ack even when Redis alone would take it (its epoch put back to the
    stale one): Fenced, and nothing written to either store."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as a:
            ns = a.keys.namespace
            await a.schedule("x", "t", b"", delay=0)
            await a.schedule("y", "t", b"", delay=0)
            batch = await _claim_all(a)
            assert {j.id for j in batch.jobs} == {"x", "y"}
            stale = batch.jobs
            async with pg_scheduler(redis_server.url, pg_url, ns, shards=1) as b:
                # b takes over (a's token is deleted as if it had expired).
                await client_of(b).delete(b.keys.shard(0).owner)
                epoch_b = await b.take(0)
                assert epoch_b is not None and epoch_b == stale[0].epoch + 1
                await push_clock(b, 0, 60_000)
                await b.reap(0)
                batch_b = await b.claim(0)
                assert {j.id for j in batch_b.jobs} == {"x", "y"}
                (stored,) = await rows(
                    pg_url,
                    "SELECT epoch FROM tickwheel_shard_epochs WHERE ns = $1 AND shard = 0",
                    ns,
                )
                assert stored[0] == epoch_b
                # Redis's epoch back at a's: Redis alone would take a's ack (its fence
                # passes; it would record both occurrences done and report the leases
                # lost). PostgreSQL refuses it first: nothing written to either store.
                epoch_key = b.keys.shard(0).epoch
                await client_of(b).set(epoch_key, stale[0].epoch)
                before = await snapshot(a)
                with pytest.raises(Fenced):
                    await a.ack_many(stale)
                assert await snapshot(a) == before
                assert (await table_counts(pg_url))["tickwheel_done"] == 0
                await client_of(b).set(epoch_key, epoch_b)
                await b.ack(batch_b.jobs[0])
                (done,) = await rows(pg_url, "SELECT id, epoch FROM tickwheel_done")
                assert tuple(done) == (batch_b.jobs[0].id, epoch_b)

    run(main())


def test_an_ack_without_postgres_leaves_the_job_leased_in_redis(
    redis_server: RedisServer,
) -> None:
    """docs/postgres.md: "ack calls tickwheel_ack() first" (PostgreSQL first, then
    Redis). With PostgreSQL down the ack raises PostgresUnavailable and Redis is not
    written: the job is still leased under its claim, not done, and the same ack
    succeeds once PostgreSQL is back."""
    from tickwheel.durable.servers._postgres import PostgresServer

    async def main(pg: PostgresServer) -> None:
        await migrated(pg.url)
        async with pg_scheduler(redis_server.url, pg.url, shards=1) as s:
            await s.schedule("a", "t", b"", delay=0)
            (job,) = (await _claim_all(s)).jobs
            before = await snapshot(s)
            pg.kill()
            with pytest.raises(PostgresUnavailable) as info:
                await s.ack(job)
            assert info.value.transient
            assert await snapshot(s) == before
            got = await s.get("a")
            assert got is not None and got.state is JobState.LEASED
            assert (got.epoch, got.attempt) == (job.epoch, job.attempt)
            pg.start()
            for _ in range(100):  # the pool reconnects once PostgreSQL is back
                try:
                    await s.ack(job)
                    break
                except PostgresUnavailable:
                    await asyncio.sleep(0.1)
            assert await s.get("a") is None
            assert [tuple(r) for r in await rows(pg.url, "SELECT id FROM tickwheel_done")] == [
                ("a",)
            ]

    with PostgresServer() as pg:
        run(main(pg))


# -- errors -------------------------------------------------------------------------


def _deep(depth: int) -> list[object]:
    """A list ``depth`` lists deep."""
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_bad_input_writes_nothing_in_either_store(redis_server: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=1) as s:
            await s.open()
            before = await snapshot(s)
            with pytest.raises(ValueError, match="job_id"):
                await s.schedule("", "t")
            with pytest.raises(TypeError, match="task"):
                await s.schedule("a", 5)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="payload"):
                await s.schedule("a", "t", b"x" * (s.max_payload_bytes + 1))
            conn = await asyncpg.connect(pg_url)
            try:
                with pytest.raises(ValueError, match="no transaction open"):
                    await s.schedule("a", "t", replace=True, conn=conn)
            finally:
                await conn.close()
            with pytest.raises(ValueError, match="delay"):
                await s.schedule("a", "t", delay=-1)
            # A NUL cannot go in PostgreSQL's text: refused here as in the Redis mode,
            # not a raw asyncpg error.
            with pytest.raises(ValueError, match=r"job_id must not contain NUL"):
                await s.schedule("a\x00b", "t")
            with pytest.raises(ValueError, match=r"job_id must not contain NUL"):
                await s.schedule_many([JobSpec("ok", "t"), JobSpec("a\x00b", "t")])
            with pytest.raises(ValueError, match=r"task must not contain NUL"):
                await s.schedule("a", "t\x00")
            with pytest.raises(ValueError, match=r"job_id must not contain NUL"):
                await s.cancel("a\x00b")
            with pytest.raises(ValueError, match=r"nested at most 100"):
                await s.schedule("a", "t", [[[[]]]] * 2 + [_deep(101)])
            with pytest.raises(TypeError, match=r"payload\['k'\] is a tuple"):
                await s.schedule("a", "t", {"k": (1, 2)})
            with pytest.raises(TypeError, match="specs"):
                await s.schedule_many([JobSpec("ok", "t"), "bad"])  # type: ignore[list-item]
            assert await snapshot(s) == before
            assert await table_counts(pg_url) == {
                "tickwheel_jobs": 0,
                "tickwheel_done": 0,
                "tickwheel_outbox": 0,
            }

    run(main())


def test_conn_without_postgres_mode_is_refused(redis_server: RedisServer) -> None:
    from durable_support import open_scheduler

    async def main() -> None:
        async with open_scheduler(redis_server.url) as s:
            with pytest.raises(ValueError, match="postgres_url"):
                await s.schedule("a", "t", conn=object())
            with pytest.raises(ValueError, match="postgres_url"):
                await s.reconcile()

    run(main())


def test_a_connection_broken_mid_operation_is_transient() -> None:
    """asyncpg's InternalClientError ("cannot switch to state ...; another operation is in
    progress") is what a pooled connection raises on its reset when its server died
    mid-call: the chaos test (seed 2308646441) saw it escape ``schedule()`` after the
    commit. It is PostgresUnavailable, as any other lost connection."""
    from tickwheel.durable.postgres import translate

    exc = asyncpg.InternalClientError(
        "cannot switch to state 15; another operation (2) is in progress"
    )
    assert isinstance(translate(exc), PostgresUnavailable)


def test_postgres_down_is_transient_and_writes_nothing(redis_server: RedisServer) -> None:
    from tickwheel.durable.servers._postgres import PostgresServer

    async def main(server: PostgresServer) -> None:
        await migrated(server.url)
        async with pg_scheduler(redis_server.url, server.url, shards=1) as s:
            await s.schedule("before", "t", delay=0)
            server.kill()
            with pytest.raises(PostgresUnavailable) as info:
                await s.schedule("during", "t", delay=0)
            assert info.value.transient
            assert await s.get("during") is None
            server.start()
            # The pool reconnects: the same call succeeds once PostgreSQL is back.
            for _ in range(50):
                try:
                    await s.schedule("after", "t", delay=0)
                    break
                except PostgresUnavailable:
                    await asyncio.sleep(0.1)
            assert await s.get("after") is not None
            ids = [
                r[0] for r in await rows(server.url, "SELECT id FROM tickwheel_jobs ORDER BY id")
            ]
            assert ids == ["after", "before"]

    with PostgresServer() as server:
        run(main(server))


def test_redis_down_after_commit_is_repaired_by_the_relay(pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        server = RedisServer().start()
        try:
            async with pg_scheduler(server.url, pg_url, shards=1) as s:
                await s.open()
                server.kill()
                # Committed in PostgreSQL: not an error, the relay writes it later.
                result = await s.schedule("k", "t", b"v", delay=0)
                assert result.status is ScheduleStatus.CREATED
                assert (await table_counts(pg_url))["tickwheel_outbox"] == 1
                server.start()
                for _ in range(50):
                    try:
                        assert await s.relay() == 1
                        break
                    except Exception:
                        await asyncio.sleep(0.1)
                info = await s.get("k")
                assert info is not None and info.payload == b"v"
                assert (await table_counts(pg_url))["tickwheel_outbox"] == 0
        finally:
            server.stop()

    run(main())


# -- workers through a Redis loss -----------------------------------------------------


@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_workers_ride_out_a_redis_loss(pg_url: str, loss: str) -> None:
    """Two workers run 200 jobs; mid-run Redis loses everything (FLUSHALL, or a restart
    of a server without persistence). After reconcile every job runs, each occurrence
    has one effect, and nothing acked before the loss runs again."""
    from spill_support import running_worker, until

    from tickwheel.durable import TaskRegistry

    n = 200
    calls: dict[tuple[str, int], int] = {}
    reg = TaskRegistry()

    @reg.task(name="pay")
    async def pay(ctx: TaskContext) -> None:
        calls[ctx.key] = calls.get(ctx.key, 0) + 1
        await asyncio.sleep(0.005)

    async def main(server: RedisServer) -> None:
        await migrated(pg_url)
        opts = {"shards": 4, "owner_ttl": 2.0}
        async with (
            pg_scheduler(server.url, pg_url, **opts) as s1,
            pg_scheduler(server.url, pg_url, s1.keys.namespace, **opts) as s2,
        ):
            now = await s1.pg.store.now() if s1.pg else 0  # type: ignore[union-attr]
            specs = [JobSpec(f"j{i:03d}", "pay", i, at=now + 300 + 15 * i) for i in range(n)]
            await s1.schedule_many(specs)
            # The workers reconcile at start only here: the test's reconcile is the one
            # that finds the loss (test_worker_reconciles_at_start covers the workers').
            wargs = {"lookahead": 0.2, "poll_interval": 0.05, "reconcile_interval": 600}
            async with (
                running_worker(s1, reg, **wargs),
                running_worker(s2, reg, **wargs),
            ):
                assert await until(lambda: len(calls) >= n // 3, 30)
                if loss == "flushall":
                    await client_of(s1).flushall()
                else:
                    server.kill()
                    server.start()
                acked = {
                    (r[0], r[1])
                    for r in await rows(pg_url, "SELECT id, nominal_ms FROM tickwheel_done")
                }
                for _ in range(50):  # the first call after a restart meets a dead socket
                    try:
                        result = await s1.reconcile()
                        break
                    except RedisUnavailable:
                        await asyncio.sleep(0.1)
                # Jobs loaded before the loss go on being acked while reconcile waits for
                # the restarted Redis: pending is bounded by the done rows before and after.
                (done_after,) = await rows(pg_url, "SELECT count(*) FROM tickwheel_done")
                assert n - done_after[0] <= result.pending <= n - len(acked)
                assert result.restored > 0  # Redis had lost them
                assert await until(lambda: len(calls) == n, 60), (len(calls), result)
                await asyncio.sleep(1.0)  # let a late duplicate show up, if any
            assert sorted(k[0] for k in calls) == [s.id for s in specs]
            for key in acked:
                assert calls[key] == 1, key
            (done,) = await rows(pg_url, "SELECT count(*) FROM tickwheel_done")
            assert done[0] == n
            pending = await rows(pg_url, "SELECT id FROM tickwheel_jobs WHERE state = 0")
            assert pending == []

    with RedisServer() as server:
        run(main(server))


def test_workers_ride_out_postgres_killed_and_restarted(redis_server: RedisServer) -> None:
    """PostgreSQL is SIGKILLed mid-run and restarted: claims hand their batches back
    (no attempt spent), and every job runs and is recorded done once PostgreSQL is back."""
    from spill_support import running_worker, until

    from tickwheel.durable import TaskRegistry
    from tickwheel.durable.servers._postgres import PostgresServer

    n = 120
    calls: dict[tuple[str, int], int] = {}
    reg = TaskRegistry()

    @reg.task(name="pay")
    async def pay(ctx: TaskContext) -> None:
        calls[ctx.key] = calls.get(ctx.key, 0) + 1

    async def main(pg: PostgresServer) -> None:
        await migrated(pg.url)
        async with pg_scheduler(redis_server.url, pg.url, shards=2) as s:
            assert s.pg is not None
            now = await s.pg.store.now()
            specs = [
                JobSpec(f"j{i:03d}", "pay", i, at=now + 200 + 25 * i, max_attempts=2)
                for i in range(n)
            ]
            await s.schedule_many(specs)
            wargs = {"lookahead": 0.1, "poll_interval": 0.05, "lease": 2.0, "reap_interval": 0.2}
            async with running_worker(s, reg, **wargs) as worker:
                assert await until(lambda: len(calls) >= n // 4, 30)
                pg.kill()
                await asyncio.sleep(1.0)
                pg.start()
                assert await until(lambda: len(calls) == n, 60), len(calls)

                async def all_done() -> bool:
                    return (await rows(pg.url, "SELECT count(*) FROM tickwheel_done"))[0][0] == n

                for _ in range(300):  # acks lost in the outage are redelivered, then acked
                    if await all_done():
                        break
                    await asyncio.sleep(0.1)
                assert await all_done()
                assert worker.loader is not None and worker.loader.stats.unavailable > 0
            assert sorted(k[0] for k in calls) == [s.id for s in specs]
            assert await rows(pg.url, "SELECT id FROM tickwheel_jobs WHERE state = 0") == []
            # Nothing went dead for want of PostgreSQL.
            for shard in range(2):
                assert (await s.dead_letters(shard)).jobs == []

    with PostgresServer() as pg:
        run(main(pg))


def test_concurrent_producers_create_each_job_once(redis_server: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=2) as a:
            b_ctx = pg_scheduler(redis_server.url, pg_url, a.keys.namespace, shards=2)
            async with b_ctx as b:
                specs = [JobSpec(f"c{i}", "t", i, delay=30) for i in range(50)]
                results = await asyncio.gather(*(p.schedule_many(specs) for p in (a, b, a, b)))
                created = [r.id for rs in results for r in rs if r.status is ScheduleStatus.CREATED]
                assert sorted(created) == sorted(s.id for s in specs)
                whens = {(r.id, r.when_ms) for rs in results for r in rs}
                assert len(whens) == len(specs)  # every producer saw the one due time
                counts = await table_counts(pg_url)
                assert counts["tickwheel_jobs"] == 50
                for spec in specs:
                    info = await a.get(spec.id)
                    assert info is not None and (spec.id, info.when_ms) in whens

    run(main())


def test_worker_reconciles_at_start(private_redis: RedisServer, pg_url: str) -> None:
    """Jobs committed while Redis was lost (here: never relayed, Redis flushed) are
    back in Redis once a worker starts, without any reconcile command."""
    from spill_support import running_worker, until

    from tickwheel.durable import TaskRegistry

    ran: list[str] = []
    reg = TaskRegistry()

    @reg.task(name="t")
    def t(ctx: TaskContext) -> None:
        ran.append(ctx.job_id)

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=2) as s:
            await s.schedule_many([JobSpec(f"w{i}", "t", delay=0) for i in range(20)])
            await client_of(s).flushall()
            await rows(pg_url, "DELETE FROM tickwheel_outbox")  # no relay can help either
            async with running_worker(s, reg, poll_interval=0.05):
                assert await until(lambda: len(ran) == 20, 30), ran
            assert sorted(ran) == sorted(f"w{i}" for i in range(20))

    run(main())


def test_shard_count_mismatch_writes_nothing(redis_server: RedisServer, pg_url: str) -> None:
    from tickwheel.durable import ShardCountMismatch

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, shards=2) as s:
            await s.schedule("a", "t", delay=60)
            ns = s.keys.namespace
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=3) as wrong:
            with pytest.raises(ShardCountMismatch):
                await wrong.schedule("b", "t", delay=60)
        assert [r[0] for r in await rows(pg_url, "SELECT id FROM tickwheel_jobs")] == ["a"]

    run(main())


def test_bad_postgres_url_is_named(redis_server: RedisServer) -> None:
    from tickwheel.durable import Scheduler
    from tickwheel.durable.store._connect import client_from_url

    async def main() -> None:
        client = client_from_url(redis_server.url)
        try:
            with pytest.raises(TypeError, match="postgres_url"):
                Scheduler(client, postgres_url=5)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="postgres_url"):
                Scheduler(client, postgres_url="mysql://x")
        finally:
            await client.aclose()

    run(main())


def test_dead_letters_are_an_end_state_in_postgres(private_redis: RedisServer, pg_url: str) -> None:
    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            for job_id in ("d1", "d2", "d3"):
                await s.schedule(job_id, "t", b"", delay=0, max_attempts=1)
            batch = await _claim_all(s)
            for job in batch.jobs:
                assert await s.retry(job, "boom") is JobState.DEAD

            async def states() -> dict[str, int]:
                got = await rows(pg_url, "SELECT id, state FROM tickwheel_jobs")
                return {r[0]: r[1] for r in got}

            assert await states() == {"d1": 2, "d2": 2, "d3": 2}
            assert await s.requeue_dead(["d1"]) == ["d1"]
            assert await s.purge_dead(["d2"]) == ["d2"]
            assert await states() == {"d1": 0, "d3": 2}
            # After Redis loses everything, the dead job does not come back as due.
            await client_of(s).flushall()
            ns = s.keys.namespace
        async with pg_scheduler(private_redis.url, pg_url, ns, shards=1) as s:
            result = await s.reconcile()
            assert (result.pending, result.restored) == (1, 1)
            await push_clock(s, 0, 1000)
            batch = await _claim_all(s)
            assert [j.id for j in batch.jobs] == ["d1"]

    run(main())


def test_redis_only_mode_never_imports_the_driver() -> None:
    import subprocess
    import sys

    code = (
        "import sys, redis.asyncio\n"
        "from tickwheel.durable import Scheduler, Worker, TaskRegistry\n"
        "import tickwheel.durable.ops.cli\n"
        "s = Scheduler(redis.asyncio.Redis(), 'n', check=False)\n"
        "Worker(s, TaskRegistry())\n"
        "assert s.pg is None\n"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported'\n"
        "assert 'tickwheel.durable.postgres' not in sys.modules, 'postgres imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_dashboard_cancel_reaches_postgres(redis_server: RedisServer, pg_url: str) -> None:
    """In the Postgres mode the dashboard's cancel deletes the source-of-truth row too,
    so a reconcile does not bring the job back."""
    from dashboard_support import api_client, bearer

    ns = unique_ns()

    async def setup() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=2) as s:
            await s.schedule("keep", "t", b"", delay=600)
            await s.schedule("gone", "t", b"", delay=600)

    run(setup())
    with api_client(redis_server.url, ns, postgres_url=pg_url) as client:
        seen = client.get("/api/job", params={"id": "gone"}).json()["job"]["seen"]
        r = client.post("/api/job/cancel", json={"id": "gone", "seen": seen}, headers=bearer())
        assert r.status_code == 200, r.text

    async def check() -> None:
        ids = {r["id"] for r in await rows(pg_url, "SELECT id FROM tickwheel_jobs")}
        assert ids == {"keep"}
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=2) as s:
            await s.reconcile()
            assert await s.get("gone") is None and await s.get("keep") is not None

    run(check())


def test_workers_reconcile_one_at_a_time(private_redis: RedisServer, pg_url: str) -> None:
    """``reconcile(if_free=True)`` (what workers run) skips while another reconcile of
    the namespace holds its advisory lock, and does the work once it is free; a
    plain reconcile (the command's) runs regardless, and another namespace's lock is
    not this one's."""

    async def main() -> None:
        await migrated(pg_url)
        async with (
            pg_scheduler(private_redis.url, pg_url, shards=2) as s,
            pg_scheduler(private_redis.url, pg_url, shards=2) as other,
        ):
            await s.schedule_many([JobSpec(f"r{i}", "t", delay=60) for i in range(10)])
            await client_of(s).flushall()
            assert s.pg is not None and other.pg is not None
            async with s.pg.store.exclusive("reconcile") as got:
                assert got
                async with s.pg.store.exclusive("reconcile") as again:
                    assert not again  # one holder: even the same store's second ask fails
                skipped = await s.reconcile(if_free=True)
                assert skipped.skipped and skipped.pending == 0 and skipped.restored == 0
                assert await client_of(s).dbsize() == 0  # it wrote nothing
                free = await other.reconcile(if_free=True)  # its own namespace's lock
                assert not free.skipped
            result = await s.reconcile(if_free=True)
            assert not result.skipped and result.pending == 10 and result.restored == 10
            async with s.pg.store.exclusive("reconcile"):
                forced = await s.reconcile()
            assert not forced.skipped and forced.pending == 10 and forced.restored == 0
            info = await s.get("r3")
            assert info is not None and info.state is JobState.DUE

    run(main())


# -- replace and reschedule ---------------------------------------------------------


async def _row(pg_url: str, ns: str, job_id: str) -> tuple[int, int, bytes] | None:
    """A job row's (state, due_ms, payload), or None."""
    found = await rows(
        pg_url,
        "SELECT state, due_ms, payload FROM tickwheel_jobs WHERE ns = $1 AND id = $2",
        ns,
        job_id,
    )
    return (int(found[0][0]), int(found[0][1]), bytes(found[0][2])) if found else None


def test_replace_follows_redis_into_postgres(pg_url: str) -> None:
    """``replace=True`` in the Postgres mode: Redis decides (it alone knows a lease) and
    the row follows in the same PostgreSQL transaction. A due job is overwritten in both,
    a leased one in neither (BUSY), a new id is created in both, an occurrence done in
    PostgreSQL is refused (DONE) even when Redis forgot it, and a reconcile after a Redis
    loss brings back the replaced job, not the old one. Redis down: a typed error and
    the row untouched."""

    async def main(server: RedisServer) -> None:
        await migrated(pg_url)
        async with pg_scheduler(server.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = await s.store.now(0)
            await s.schedule("a", "t", b"old", at=now + 60_000)
            got = await s.schedule("a", "t", b"new", at=now + 90_000, replace=True)
            assert got.status is ScheduleStatus.REPLACED and got.when_ms == now + 90_000
            assert await _row(pg_url, ns, "a") == (0, now + 90_000, b"new")

            await s.schedule("b", "t", b"run", delay=0)
            batch = await _claim_all(s)
            assert [j.id for j in batch.jobs] == ["b"]
            busy = await s.schedule("b", "t", b"other", at=now + 5_000, replace=True)
            assert busy.status is ScheduleStatus.BUSY
            b_row = await _row(pg_url, ns, "b")
            assert b_row is not None and b_row[2] == b"run"  # untouched
            await s.ack(batch.jobs[0])
            b_due = b_row[1]

            many = await s.schedule_many(
                [JobSpec("c", "t", b"c1", delay=30), JobSpec("a", "t", b"newer", delay=30)],
                replace=True,
            )
            assert [r.status for r in many] == [ScheduleStatus.CREATED, ScheduleStatus.REPLACED]
            c_row, a_row = await _row(pg_url, ns, "c"), await _row(pg_url, ns, "a")
            assert c_row is not None and a_row is not None
            assert c_row[2] == b"c1" and a_row[2] == b"newer"
            info = await s.get("a")
            assert info is not None and info.when_ms == a_row[1]  # one due, both stores

            await client_of(s).flushall()  # Redis forgets b's done marker too
            done = await s.schedule("b", "t", b"again", at=b_due, replace=True)
            assert done.status is ScheduleStatus.DONE
            assert await _row(pg_url, ns, "b") == (1, b_due, b"run")
            assert await s.get("b") is None  # nothing written to Redis either
            result = await s.reconcile()
            assert result.pending == 2 and result.restored == 2
            back = await s.get("a")
            assert back is not None and back.payload == b"newer" and back.when_ms == a_row[1]

            server.kill()
            with pytest.raises(RedisUnavailable):
                await s.schedule("a", "t", b"lost", delay=5, replace=True)
            assert await _row(pg_url, ns, "a") == a_row

    with RedisServer() as server:
        run(main(server))


def test_reschedule_moves_the_row_with_redis(private_redis: RedisServer, pg_url: str) -> None:
    """``reschedule`` in the Postgres mode moves the job in Redis and its row in the same
    PostgreSQL transaction; a leased or unknown job moves in neither. A worker whose
    expired lease was on the old occurrence and acks late records that occurrence done
    but does not complete the moved job (migration 0002), so a Redis loss after it
    still brings the moved job back."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = await s.store.now(0)
            await s.schedule("a", "t", b"x", at=now + 60_000)
            assert await s.reschedule("a", at=now + 120_000)
            assert await _row(pg_url, ns, "a") == (0, now + 120_000, b"x")
            info = await s.get("a")
            assert info is not None and info.when_ms == now + 120_000
            assert not await s.reschedule("nobody", delay=1)

            await s.schedule("b", "t", b"y", delay=0)
            await s.take(0)
            (job,) = (await s.claim(0, lease=0.05)).jobs
            assert not await s.reschedule("b", delay=30)  # leased: Redis refuses
            b_row = await _row(pg_url, ns, "b")
            assert b_row is not None and b_row[1] == job.nominal_ms  # unmoved

            await push_clock(s, 0, 1_000)  # the lease expires; the reaper makes b due
            await s.reap(0)
            assert await s.reschedule("b", delay=300)
            moved = await _row(pg_url, ns, "b")
            assert moved is not None and moved[0] == 0 and moved[1] > job.nominal_ms
            with pytest.raises(LeaseLost):
                await s.ack(job)  # the stale holder, late: Redis refuses after PostgreSQL
            assert await _row(pg_url, ns, "b") == moved  # still pending at its new due
            await client_of(s).flushall()
            result = await s.reconcile()
            assert result.pending == 2 and result.restored == 2
            back = await s.get("b")
            assert back is not None and back.when_ms == moved[1]

    run(main())


def test_a_retry_survives_a_redis_loss(private_redis: RedisServer, pg_url: str) -> None:
    """A retry is recorded in PostgreSQL (migration 0002): after Redis loses everything,
    reconcile brings the occurrence back at its retry time and attempt, with its own
    nominal due, so the job keeps its backoff and does not get its attempts back; its
    ack then completes the row."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("f", "t", b"x", delay=0, max_attempts=4)
            (job,) = (await _claim_all(s)).jobs
            assert await s.retry(job, "boom", delay=60) is JobState.DUE
            info = await s.get("f")
            assert info is not None and info.attempt == 2
            (row,) = await rows(
                pg_url,
                "SELECT attempt, run_ms, due_ms FROM tickwheel_jobs WHERE ns = $1 AND id = 'f'",
                ns,
            )
            assert tuple(row) == (2, info.when_ms, job.nominal_ms)

            await client_of(s).flushall()
            result = await s.reconcile()
            assert result.pending == 1 and result.restored == 1
            back = await s.get("f")
            assert back is not None and back.state is JobState.DUE
            assert back.when_ms == info.when_ms  # the backoff is kept: not due at once
            assert back.attempt == 2 and back.nominal_ms == job.nominal_ms
            assert not (await _claim_all(s)).jobs  # not due before its retry time

            await push_clock(s, 0, 61_000)
            (again,) = (await s.claim(0)).jobs
            assert again.attempt == 2 and again.nominal_ms == job.nominal_ms
            await s.ack(again)
            assert await _row(pg_url, ns, "f") == (1, job.nominal_ms, b"x")
            await client_of(s).flushall()
            assert (await s.reconcile()).pending == 0  # done: nothing comes back

    run(main())


# -- the row's current occurrence (migration 0003) -----------------------------------


def test_a_recurring_row_follows_a_missed_run_skip(private_redis: RedisServer, pg_url: str) -> None:
    """A recurring job that missed runs skips them (policy ``skip``): the claim runs it
    now as its current occurrence, its lease moved there in place, and records the move
    in PostgreSQL (migration 0003), so the ack of that occurrence moves the row on, and
    a Redis loss after it brings back the next occurrence, not the long-past one the
    row had."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("r", "t", b"", every=1, missed="skip")
            first = await _row(pg_url, ns, "r")
            assert first is not None
            await s.take(0)
            await push_clock(s, 0, 10_500)  # ten runs missed
            (job,) = (await s.claim(0)).jobs  # the current occurrence, run now
            assert job.nominal_ms >= first[1] + 9_000
            moved = await _row(pg_url, ns, "r")
            assert moved is not None and moved[1] == job.nominal_ms  # followed Redis
            await s.ack(job)
            row = await _row(pg_url, ns, "r")
            assert row is not None and row[0] == 0
            assert row[1] == job.next_due_ms and row[1] > job.nominal_ms
            await client_of(s).flushall()
            assert (await s.reconcile()).restored == 1
            back = await s.get("r")
            assert back is not None and back.when_ms == row[1]

    run(main())


def _pause_before_the_row(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Pause every replace between its Redis write and its row write (still holding the
    ids): the first event is set when one is there, the second lets it go on."""
    in_redis, go_on = asyncio.Event(), asyncio.Event()
    overwrite = PgStore.overwrite

    async def paused(self: PgStore, conn: Any, jobs: Any) -> None:
        in_redis.set()
        await go_on.wait()
        await overwrite(self, conn, jobs)

    monkeypatch.setattr(PgStore, "overwrite", paused)
    return in_redis, go_on


def test_an_ack_waits_for_a_replace_still_committing(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replace`` moves a job in Redis before its PostgreSQL transaction commits the
    row. A worker that claims and acks the new occurrence in between waits for that
    commit (the id's advisory lock) and then completes the row: the row does not stay
    pending at an occurrence already done."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = await s.store.now(0)
            await s.schedule("a", "t", b"old", at=now + 60_000)
            in_redis, go_on = _pause_before_the_row(monkeypatch)
            replace = asyncio.create_task(
                s.schedule("a", "t", b"new", at=now - 1_000, replace=True)
            )
            await asyncio.wait_for(in_redis.wait(), 10)
            (job,) = (await _claim_all(s)).jobs
            assert job.payload == b"new"
            ack = asyncio.create_task(s.ack(job))
            await asyncio.sleep(0.3)
            assert not ack.done()  # waiting for the replace's commit
            go_on.set()
            got = await asyncio.wait_for(replace, 10)
            assert got.status is ScheduleStatus.REPLACED
            await asyncio.wait_for(ack, 10)
            assert await _row(pg_url, ns, "a") == (1, now - 1_000, b"new")
            await client_of(s).flushall()
            assert (await s.reconcile()).pending == 0  # done: nothing comes back

    run(main())


async def _advisory_waiters(pg_url: str) -> int:
    """Backends waiting for an advisory lock (an id another transaction holds)."""
    found = await rows(
        pg_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return int(found[0][0])


def test_a_cancel_waits_for_a_replace_of_a_new_id_still_committing(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replace of an id with no row yet writes Redis, then the row, then commits. A
    cancel in between waits for that commit (the id's advisory lock), then removes the
    job from both stores: no row is left pending for a reconcile to bring back (it used
    to find no row, empty Redis, and leave the replace's row behind)."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            in_redis, go_on = _pause_before_the_row(monkeypatch)
            replace = asyncio.create_task(s.schedule("n", "t", b"new", delay=600, replace=True))
            await asyncio.wait_for(in_redis.wait(), 10)
            cancel = asyncio.create_task(s.cancel("n"))
            assert await until_async(lambda: _advisory_waiters(pg_url), 10)
            assert not cancel.done()
            go_on.set()
            assert (await asyncio.wait_for(replace, 10)).status is ScheduleStatus.CREATED
            assert await asyncio.wait_for(cancel, 10) is True
            assert await _row(pg_url, ns, "n") is None
            assert await s.get("n") is None
            assert (await s.reconcile()).pending == 0
            assert await s.get("n") is None

    run(main())


def test_a_cancel_that_redis_fails_removes_nothing(pg_url: str) -> None:
    """The cancel's row delete and its Redis removal share one transaction: when Redis
    does not answer, the error is raised and the row is still pending (before, the row
    was gone while Redis still had the job, and the job ran)."""

    async def main() -> None:
        await migrated(pg_url)
        server = RedisServer().start()
        try:
            async with pg_scheduler(server.url, pg_url, shards=1) as s:
                ns = s.keys.namespace
                await s.schedule("c", "t", b"v", delay=600)
                server.kill()
                with pytest.raises(RedisUnavailable):
                    await s.cancel("c")
                row = await _row(pg_url, ns, "c")
                assert row is not None and row[0] == 0
                assert (await table_counts(pg_url))["tickwheel_jobs"] == 1
                server.start()
                await s.reconcile()
                assert await s.get("c") is not None
                assert await s.cancel("c") is True
                assert await _row(pg_url, ns, "c") is None
                assert await s.get("c") is None
        finally:
            server.stop()

    run(main())


def test_a_job_cancelled_before_the_producer_indexed_it_never_runs(
    private_redis: RedisServer,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The producer writes Redis after its commit. A cancel in between deletes the row
    and finds nothing in Redis yet; the producer then indexes the job. The claim asks
    PostgreSQL, finds no row, and takes the job out of Redis unrun (it used to run)."""
    from tickwheel.durable.postgres._mode import PostgresMode

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            committed, go_on = asyncio.Event(), asyncio.Event()
            index = PostgresMode._index

            async def paused(self, sched, created):  # type: ignore[no-untyped-def]
                committed.set()  # the row is committed; Redis has nothing yet
                await go_on.wait()
                await index(self, sched, created)

            monkeypatch.setattr(PostgresMode, "_index", paused)
            producer = asyncio.create_task(s.schedule("x", "t", b"v", delay=0))
            await asyncio.wait_for(committed.wait(), 10)
            assert await s.cancel("x") is True
            assert await _row(pg_url, ns, "x") is None
            go_on.set()
            assert (await asyncio.wait_for(producer, 10)).status is ScheduleStatus.CREATED
            info = await s.get("x")
            assert info is not None and info.state is JobState.DUE  # the stale write
            batch = await _claim_all(s)
            assert batch.jobs == [] and batch.dropped == 1
            assert "1 claimed job(s) without a PostgreSQL row" in caplog.text
            assert await s.get("x") is None
            assert (await s.reconcile()).pending == 0

    run(main())


def test_a_claim_waits_for_a_replace_of_a_new_id_and_runs_it(
    private_redis: RedisServer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replace of an id with no row writes Redis before its row commits. A claim in
    between finds no row, so it waits for the id's advisory lock, sees the committed
    row, and keeps the job: a job without a row is dropped only once nothing that could
    still write its row holds the id."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            in_redis, go_on = _pause_before_the_row(monkeypatch)
            replace = asyncio.create_task(s.schedule("r", "t", b"new", delay=0, replace=True))
            await asyncio.wait_for(in_redis.wait(), 10)
            claim = asyncio.create_task(_claim_all(s))
            assert await until_async(lambda: _advisory_waiters(pg_url), 10)
            assert not claim.done()
            go_on.set()
            assert (await asyncio.wait_for(replace, 10)).status is ScheduleStatus.CREATED
            batch = await asyncio.wait_for(claim, 10)
            assert [j.id for j in batch.jobs] == ["r"] and batch.dropped == 0
            await s.ack(batch.jobs[0])
            done = (1, batch.jobs[0].nominal_ms, b"new")
            assert await _row(pg_url, s.keys.namespace, "r") == done

    run(main())


def test_replace_checks_done_per_occurrence_and_batches_its_locks(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A replace batch that names an id twice is refused only for the occurrence
    PostgreSQL has done (the last spec of the id wins), and a batch larger than one
    locked transaction (``MAX_LOCKED``) is written whole, in order."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = await s.store.now(0)
            await s.schedule("d", "t", b"1", at=now - 10)
            (job,) = (await _claim_all(s)).jobs
            await s.ack(job)
            done, again = await s.schedule_many(
                [
                    JobSpec("d", "t", b"2", at=job.nominal_ms),
                    JobSpec("d", "t", b"3", at=now + 50_000),
                ],
                replace=True,
            )
            assert done.status is ScheduleStatus.DONE
            assert again.status is ScheduleStatus.CREATED
            assert await _row(pg_url, ns, "d") == (0, now + 50_000, b"3")

            n = MAX_LOCKED + 20
            specs = [JobSpec(f"m{k}", "t", b"a", at=now + 60_000) for k in range(n)]
            specs.append(JobSpec("m0", "t", b"last", at=now + 70_000))  # in a later batch
            results = await s.schedule_many(specs, replace=True)
            assert [r.status for r in results] == [ScheduleStatus.CREATED] * n + [
                ScheduleStatus.REPLACED
            ]
            (count,) = await rows(
                pg_url,
                "SELECT count(*) FROM tickwheel_jobs WHERE ns = $1 AND id LIKE 'm%'",
                ns,
            )
            assert count[0] == n
            assert await _row(pg_url, ns, "m0") == (0, now + 70_000, b"last")
            info = await s.get("m0")
            assert info is not None and info.when_ms == now + 70_000

    run(main())


# -- the worker's timing when PostgreSQL is slow -------------------------------------


def test_a_claims_now_covers_its_postgres_round_trip(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A claim's ``now_ms`` includes the time the Postgres check took after Redis's
    reply (here held for a second), so the loader, which converts due times from the
    moment claim() returned, does not fire every job that much late; and it is never
    ahead of Redis's clock, so nothing fires early."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            await s.schedule("a", "t", b"", delay=0)
            await s.take(0)
            async with table_locked(pg_url, "tickwheel_done"):
                before = await s.store.now(0)
                claim = asyncio.create_task(s.claim(0))
                await asyncio.sleep(1.0)
                assert not claim.done()  # Redis answered; the Postgres check waits
            batch = await asyncio.wait_for(claim, 10)
            after = await s.store.now(0)
            assert [j.id for j in batch.jobs] == ["a"]
            assert before + 900 <= batch.now_ms <= after

    run(main())


@pytest.mark.parametrize("outcome", ["ack", "retry"])
def test_a_job_waiting_for_its_ack_or_retry_leaves_its_slot(
    private_redis: RedisServer, pg_url: str, outcome: str
) -> None:
    """``max_running`` bounds handlers, not what is written after them: with one slot,
    while the first job's ack (or, when its handler raised, its retry) waits for
    PostgreSQL (the table it writes held), the second job still runs on time; both end
    once PostgreSQL answers. Before, the slot was held through the ack, which capped a
    worker at ``max_running`` commits' worth of jobs per second, and then through a
    retry."""
    table, stat = (
        ("tickwheel_done", "succeeded") if outcome == "ack" else ("tickwheel_jobs", "retried")
    )

    async def main() -> None:
        await migrated(pg_url)
        started: list[str] = []
        reg = TaskRegistry()

        @reg.task(name="t")
        def record(ctx: TaskContext) -> None:
            started.append(ctx.job_id)
            if outcome == "retry" and ctx.job_id == "a" and ctx.attempt == 1:
                raise RuntimeError("boom")  # once: a second run after the backoff succeeds

        def ended() -> int:
            return 0 if w.loader is None else int(getattr(w.loader.stats, stat))

        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            # Due in 3 s, claimed within 0.5 s: seconds to take the lock in between.
            await s.schedule("a", "t", b"", delay=3.0, max_attempts=3)
            await s.schedule("b", "t", b"", delay=3.02)
            fast = {"lookahead": 2.5, "poll_interval": 0.02, "reap_interval": 0.05}
            async with running_worker(s, reg, max_running=1, **fast) as w:
                assert await until(lambda: w.loader is not None and w.loader.loaded == 2, 10)
                async with table_locked(pg_url, table):
                    assert await until(lambda: started == ["a", "b"], 10)
                    assert ended() == 0  # the first job's ack or retry waits
                assert await until(lambda: ended() == (2 if outcome == "ack" else 1), 10)
            if outcome == "ack":
                (count,) = await rows(
                    pg_url,
                    "SELECT count(*) FROM tickwheel_jobs WHERE ns = $1 AND state = 1",
                    s.keys.namespace,
                )
                assert count[0] == 2
            else:
                (row,) = await rows(
                    pg_url,
                    "SELECT attempt FROM tickwheel_jobs WHERE ns = $1 AND id = 'a'",
                    s.keys.namespace,
                )
                assert row[0] >= 2  # the retry's record (or, after its rerun, the ack's)

    run(main())


# -- schedule_many as one statement (migration 0004) ---------------------------------


def test_a_batch_is_decided_per_job_like_one_by_one(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A batch of distinct ids (one set-based statement) gives each job what a
    schedule() of its own would: a pending id is kept at its due, a completed one-shot
    row is overwritten by the new job, an occurrence done already is refused and
    nothing is written for it, a new id is created; in the batch's order, with one
    outbox row per job written. A batch that names an id twice sees its first copy."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            now = await s.store.now(0)
            await s.schedule("kept", "t", b"k", at=now + 40_000)
            await s.schedule("ran", "t", b"r", at=now - 10)
            (job,) = (await _claim_all(s)).jobs
            await s.ack(job)
            results = await s.schedule_many(
                [
                    JobSpec("new", "t", b"n", at=now + 10_000),
                    JobSpec("kept", "t", b"k2", at=now + 20_000),
                    JobSpec("done", "t", b"d", at=job.nominal_ms),  # a fresh id: created
                    JobSpec("ran", "t", b"r2", at=job.nominal_ms),  # that occurrence ran
                    JobSpec("again", "t", b"a", at=now + 30_000),
                ]
            )
            assert [(r.id, r.status, r.when_ms) for r in results] == [
                ("new", ScheduleStatus.CREATED, now + 10_000),
                ("kept", ScheduleStatus.KEPT, now + 40_000),
                ("done", ScheduleStatus.CREATED, job.nominal_ms),
                ("ran", ScheduleStatus.DONE, job.nominal_ms),
                ("again", ScheduleStatus.CREATED, now + 30_000),
            ]
            assert await _row(pg_url, ns, "kept") == (0, now + 40_000, b"k")
            assert await _row(pg_url, ns, "ran") == (1, job.nominal_ms, b"r")
            rerun = await s.schedule_many(
                [JobSpec("ran", "t", b"r3", at=now + 50_000), JobSpec("more", "t", b"m")]
            )
            assert rerun[0].status is ScheduleStatus.CREATED  # a new occurrence: overwrites
            assert await _row(pg_url, ns, "ran") == (0, now + 50_000, b"r3")
            for job_id in ("new", "done", "again", "ran"):
                info = await s.get(job_id)
                assert info is not None and info.state is JobState.DUE
            assert await _outbox_empties(pg_url, within=10.0)

            twice = await s.schedule_many(
                [
                    JobSpec("dup", "t", b"1", at=now + 1_000),
                    JobSpec("dup", "t", b"2", at=now + 2_000),
                ]
            )
            assert [(r.status, r.when_ms) for r in twice] == [
                (ScheduleStatus.CREATED, now + 1_000),
                (ScheduleStatus.KEPT, now + 1_000),
            ]

    run(main())


def test_a_batch_keeps_a_job_a_concurrent_producer_created_first(
    private_redis: RedisServer, pg_url: str
) -> None:
    """An application transaction has created job "x" and not committed; a batch
    naming "x" waits for it, then keeps that job (with its due, read after the
    statement) and creates the others. After a rollback instead, the batch creates it."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            now = await s.store.now(0)
            for outcome in ("commit", "rollback"):
                app = await asyncpg.connect(pg_url)
                try:
                    tx = app.transaction()
                    await tx.start()
                    await s.schedule(f"x-{outcome}", "t", b"app", at=now + 5_000, conn=app)
                    batch = asyncio.create_task(
                        s.schedule_many(
                            [
                                JobSpec(f"x-{outcome}", "t", b"batch", at=now + 9_000),
                                JobSpec(f"y-{outcome}", "t", b"batch", at=now + 9_000),
                            ]
                        )
                    )
                    await asyncio.sleep(0.3)
                    assert not batch.done()  # waits for the application's transaction
                    await (tx.commit() if outcome == "commit" else tx.rollback())
                    x, y = await asyncio.wait_for(batch, 10)
                finally:
                    await app.close()
                assert y.status is ScheduleStatus.CREATED
                if outcome == "commit":
                    assert (x.status, x.when_ms) == (ScheduleStatus.KEPT, now + 5_000)
                else:
                    assert (x.status, x.when_ms) == (ScheduleStatus.CREATED, now + 9_000)

    run(main())


def test_a_batch_waiting_on_a_committing_ack_sees_the_occurrence_done(
    private_redis: RedisServer, pg_url: str
) -> None:
    """A batch naming an occurrence whose ack is committing waits for the ack's row lock
    and then refuses it (DONE), as a schedule of its own does: the completed job is not
    put back to pending, and nothing is written to Redis for it."""

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(private_redis.url, pg_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule("x", "t", b"x", delay=0)
            (job,) = (await _claim_all(s)).jobs
            acking = await asyncpg.connect(pg_url)
            try:
                tx = acking.transaction()
                await tx.start()
                await acking.execute(
                    "SELECT tickwheel_ack($1, 0, $2, $3, $4, $5, $6)",
                    ns,
                    job.epoch,
                    ["x"],
                    [job.attempt],
                    [job.nominal_ms],
                    [0],
                )
                batch = asyncio.create_task(
                    s.schedule_many(
                        [JobSpec("x", "t", b"2", at=job.nominal_ms), JobSpec("y", "t", b"y")]
                    )
                )
                await asyncio.sleep(0.3)
                assert not batch.done()  # waits for the ack's row lock
                await tx.commit()
                x, y = await asyncio.wait_for(batch, 10)
            finally:
                await acking.close()
            assert (x.status, x.when_ms) == (ScheduleStatus.DONE, job.nominal_ms)
            assert y.status is ScheduleStatus.CREATED
            assert await _row(pg_url, ns, "x") == (1, job.nominal_ms, b"x")
            (count,) = await rows(
                pg_url, "SELECT count(*) FROM tickwheel_outbox WHERE ns = $1 AND id = 'x'", ns
            )
            assert count[0] == 0

    run(main())


async def _waiting_on_a_lock(probe: Any, holder: Any) -> bool:
    """True once a backend is blocked by ``holder``'s transaction."""
    pid = holder.get_server_pid()
    found = await probe.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", pid
    )
    return bool(found)


async def until_async(check: Any, within: float) -> bool:
    """Poll an async ``check`` until it is true or ``within`` seconds pass."""
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.parametrize("replace", [False, True])
def test_rows_are_locked_in_code_point_order_under_a_database_collation(
    private_redis: RedisServer, pg_icu_url: str, replace: bool
) -> None:
    """Under an ICU collation "a" sorts before "B"; Python's sort, which orders the ack's
    locks, puts "B" first. A batch (and a replace, through PgStore.locked) must lock its
    rows in Python's order too, or an ack and a batch deadlock. Seen here: with "a" held
    by another transaction, the waiting batch already holds "B"."""

    async def main() -> None:
        await migrated(pg_icu_url)
        (ordered,) = await rows(
            pg_icu_url, "SELECT array_agg(x ORDER BY x) FROM unnest(ARRAY['B', 'a']) x"
        )
        assert list(ordered[0]) == ["a", "B"]  # the collation differs from code points
        async with pg_scheduler(private_redis.url, pg_icu_url, shards=1) as s:
            ns = s.keys.namespace
            await s.schedule_many([JobSpec("B", "t", b"1", delay=60), JobSpec("a", "t", b"1")])
            holder = await asyncpg.connect(pg_icu_url)
            probe = await asyncpg.connect(pg_icu_url)
            try:
                tx = holder.transaction()
                await tx.start()
                await holder.execute(
                    "SELECT 1 FROM tickwheel_jobs WHERE ns = $1 AND id = 'a' FOR UPDATE", ns
                )
                specs = [JobSpec(i, "t", b"2", delay=60) for i in ("a", "B")]
                batch = asyncio.create_task(s.schedule_many(specs, replace=replace))
                assert await until_async(lambda: _waiting_on_a_lock(probe, holder), 10)
                assert not batch.done()  # waits for "a"
                with pytest.raises(asyncpg.LockNotAvailableError):
                    await probe.execute(
                        "SELECT 1 FROM tickwheel_jobs WHERE ns = $1 AND id = 'B' FOR UPDATE NOWAIT",
                        ns,
                    )
                await tx.commit()
                results = await asyncio.wait_for(batch, 10)
            finally:
                await holder.close()
                await probe.close()
            expected = ScheduleStatus.REPLACED if replace else ScheduleStatus.KEPT
            assert [r.status for r in results] == [expected, expected]

    run(main())


def test_only_jobs_left_to_the_relays_wake_them(private_redis: RedisServer, pg_url: str) -> None:
    """A schedule that indexes its own jobs does not notify the relays (they raced it and
    re-sent most jobs, measured 1,266 of 2,000); a job written in the application's
    transaction does, at its commit; and the names of the previous release
    (tickwheel_schedule, tickwheel_schedule_many) still notify, for its workers."""

    async def main() -> None:
        await migrated(pg_url)
        heard: list[str] = []
        listener = await asyncpg.connect(pg_url)
        await listener.add_listener("tickwheel_outbox", lambda *a: heard.append(str(a[3])))
        marker = await asyncpg.connect(pg_url)

        async def notified() -> bool:
            """Whether a notification came since the last call. A marker notified now is
            delivered after any of an earlier commit (commit order): wait for it."""
            await marker.execute("NOTIFY tickwheel_outbox, 'marker'")
            assert await until(lambda: "marker" in heard, 10)
            got = any(p != "marker" for p in heard)
            heard.clear()
            return got

        try:
            async with pg_scheduler(private_redis.url, pg_url, shards=2) as s:
                ns = s.keys.namespace
                await s.schedule("own", "t", b"x", delay=60)
                await s.schedule_many([JobSpec(f"own{i}", "t", b"x", delay=60) for i in range(3)])
                await s.schedule_many([JobSpec("dup", "t"), JobSpec("dup", "t")])  # per row
                assert not await notified()
                assert (await s.get("own")) is not None  # indexed by the producer itself
                app = await asyncpg.connect(pg_url)
                try:
                    async with app.transaction():
                        await s.schedule("app", "t", b"x", delay=60, conn=app)
                        assert not await notified()  # not before the commit
                    assert await notified()
                    job = encode_pg_job(JobSpec("old", "t", b"x", delay=60), 0, 1 << 16)
                    await app.fetch(
                        "SELECT * FROM tickwheel_schedule"
                        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                        ns,
                        job.id,
                        job.shard,
                        *job.args,
                    )
                    assert await notified()
                    await app.fetch(
                        "SELECT * FROM tickwheel_schedule_many"
                        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                        ns,
                        ["old2"],
                        [job.shard],
                        *([a] for a in job.args),
                    )
                    assert await notified()
                finally:
                    await app.close()
                assert await s.relay() >= 2  # the relay indexes what the old names wrote
                assert (await s.get("old2")) is not None
        finally:
            await listener.close()
            await marker.close()

    run(main())
