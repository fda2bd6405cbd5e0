"""Guard rails of issue 40 against misconfiguration: a namespace records the Postgres
mode and refuses whatever comes without ``postgres_url``; configuration errors of a
Redis URL (credentials, database index) are permanent ``RedisConfigError``s; a
producer given ``tasks=`` refuses unknown task names. Each refusal is clear, typed,
and writes nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import redis
import redis.asyncio
from dashboard_support import api_client
from durable_support import client_of, open_scheduler, run, unique_ns
from pg_support import migrated, pg_scheduler, table_counts

from tickwheel.durable import (
    JobSpec,
    PostgresModeRequired,
    RedisConfigError,
    RedisUnavailable,
    Scheduler,
    SyncScheduler,
    TaskRegistry,
    Worker,
    connect,
)
from tickwheel.durable.servers import free_port
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import read_layout

pytestmark = [pytest.mark.redis]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickwheel.durable.ops.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _keys(url: str, ns: str) -> list[bytes]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        return sorted(await client.keys(f"*{ns}*"))
    finally:
        await client.aclose()


# -- the namespace's mode ----------------------------------------------------------


@pytest.mark.postgres
def test_a_postgres_namespace_refuses_producers_cli_dashboard_and_workers_without_it(
    redis_server: RedisServer, pg_url: str
) -> None:
    ns = unique_ns()
    before_keys: list[bytes] = []

    async def main() -> None:
        await migrated(pg_url)
        async with pg_scheduler(redis_server.url, pg_url, ns, shards=2) as pg:
            await pg.schedule("a", "t", delay=3600)  # the first open records the mode
        nonlocal before_keys
        before_keys = await _keys(redis_server.url, ns)
        before_rows = await table_counts(pg_url)
        assert f"{{{ns}}}:mode".encode() in before_keys
        async with open_scheduler(redis_server.url, ns, shards=2) as plain:
            with pytest.raises(PostgresModeRequired, match="postgres_url") as info:
                await plain.schedule("b", "t", delay=60)
            assert repr(ns) in str(info.value)
            with pytest.raises(PostgresModeRequired):
                await plain.schedule_many([JobSpec("c", "t", delay=60)])
            with pytest.raises(PostgresModeRequired):
                await plain.open()
            # A plain worker refuses at start: it would drop the jobs unrun.
            worker = Worker(plain, TaskRegistry())
            with pytest.raises(PostgresModeRequired):
                await asyncio.wait_for(worker.run(), 30)
            # The dashboard's (and the CLI's) read of the layout refuses it too.
            with pytest.raises(PostgresModeRequired):
                await read_layout(client_of(plain), ns, postgres=False)
            assert await read_layout(client_of(plain), ns, postgres=True) == (2, 64)
        assert await _keys(redis_server.url, ns) == before_keys  # nothing written
        assert await table_counts(pg_url) == before_rows

    run(main())
    sync = SyncScheduler.from_url(redis_server.url, ns, shards=2)
    with pytest.raises(PostgresModeRequired, match=r"SyncScheduler.*postgres_url"):
        sync.schedule("d", "t", delay=60)
    sync.close()
    o = ["--redis-url", redis_server.url, "--namespace", ns, "--shards", "2"]
    out = _cli("schedule", "e", "t", "--delay", "60", *o)
    assert out.returncode == 2, out.stderr
    assert "Postgres mode" in out.stderr and "--postgres-url" in out.stderr
    assert "Traceback" not in out.stderr
    out = _cli("cancel", "a", *o)
    assert out.returncode == 2 and "--postgres-url" in out.stderr
    with api_client(redis_server.url, ns) as web:  # a dashboard without it: refused
        r = web.get("/api/overview")
        assert r.status_code == 409 and "postgres_url" in r.text, r.text
        assert "Postgres mode" in web.get("/").text
    assert run(_keys(redis_server.url, ns)) == before_keys
    out = _cli("schedule", "e", "t", "--delay", "60", "--postgres-url", pg_url, *o)
    assert out.returncode == 0, out.stderr  # with the URL it is written
    assert run(_keys(redis_server.url, ns)) != []


def test_a_plain_namespace_records_no_mode(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=2) as s:
            await s.schedule("a", "t", delay=60)
            ns = s.keys.namespace
            assert await client_of(s).exists(f"{{{ns}}}:mode") == 0
            assert await read_layout(client_of(s), ns, postgres=False) == (2, 64)

    run(main())


# -- configuration errors of the Redis URL -------------------------------------------


def test_wrong_credentials_and_missing_database_are_permanent_config_errors() -> None:
    with RedisServer(password="s3cret-pw") as server:
        port = server.port
        base = f"127.0.0.1:{port}"

        async def main() -> None:
            cases = {
                f"redis://{base}/0": "needs a password",  # no password: NOAUTH
                f"redis://:wrong@{base}/0": "check the user and password",
                f"redis://bob:wrong@{base}/0": "check the user and password",
                f"redis://:s3cret-pw@{base}/99": "database the server does not have",
            }
            for url, said in cases.items():
                with pytest.raises(RedisConfigError) as info:
                    await connect(url)
                assert not isinstance(info.value, RedisUnavailable)
                assert not RedisConfigError.transient
                text = str(info.value)
                assert said in text and f":{port}/" in text, text
                assert "s3cret-pw" not in text and ":wrong@" not in text
            # A client made without connect(): its first call is translated the same.
            client = redis.asyncio.Redis.from_url(f"redis://:wrong@{base}/0")
            sched = Scheduler(client, unique_ns(), check=False)
            with pytest.raises(RedisConfigError, match="check the user and password"):
                await sched.schedule("a", "t", delay=60)
            await client.aclose()
            client = redis.asyncio.Redis.from_url(f"redis://:s3cret-pw@{base}/99")
            sched = Scheduler(client, unique_ns(), check=False)
            with pytest.raises(RedisConfigError, match="DB index is out of range"):
                await sched.open()
            await client.aclose()
            good = await connect(server.url)  # the right password works
            await good.aclose()

        run(main())
        sync = SyncScheduler.from_url(f"redis://:wrong@{base}/0", unique_ns())
        with pytest.raises(RedisConfigError):
            sync.schedule("a", "t", delay=60)
        sync.close()
        # The worker's command exits at once with the reason, no retry loop.
        out = _cli(
            "worker",
            "tickwheel.durable.ops._demo:registry",
            "--redis-url",
            f"redis://:wrong@{base}/0",
        )
        assert out.returncode == 2, out.stderr
        assert "check the user and password" in out.stderr and "Traceback" not in out.stderr
        assert "wrong" not in out.stderr.replace("check the user", "")


def test_a_port_where_nothing_listens_stays_transient_and_names_it() -> None:
    port = free_port()

    async def main() -> None:
        with pytest.raises(RedisUnavailable) as info:
            await connect(f"redis://127.0.0.1:{port}/0")
        assert f"127.0.0.1:{port}" in str(info.value)
        with pytest.raises(ValueError, match=r"[Pp]ort"):
            await connect("redis://127.0.0.1:99999/0")
        with pytest.raises(ValueError, match=r"[Pp]ort"):
            await connect("redis://127.0.0.1:abc/0")

    run(main())


# -- unknown task names, opt-in --------------------------------------------------------


def test_unknown_task_names_are_refused_when_the_producer_knows_the_tasks(
    redis_server: RedisServer,
) -> None:
    registry = TaskRegistry()

    @registry.task(name="known")
    async def known(ctx: object, payload: object) -> None:  # pragma: no cover - never run
        pass

    async def main() -> None:
        ns = unique_ns()
        async with open_scheduler(redis_server.url, ns, shards=2, tasks=registry) as s:
            with pytest.raises(ValueError, match=r"task 'nope' is not registered") as info:
                await s.schedule("a", "nope", delay=60)
            assert "'known'" in str(info.value)
            with pytest.raises(ValueError, match="'nope'"):
                await s.schedule_many([JobSpec("b", "known"), JobSpec("c", "nope")])
            assert await _keys(redis_server.url, ns) == []  # nothing, not even the layout
            assert (await s.schedule("d", "known", delay=60)).status.name == "CREATED"

            @registry.task(name="later")  # kept by reference: a task registered later is known
            async def later(ctx: object, payload: object) -> None:  # pragma: no cover
                pass

            await s.schedule("e", "later", delay=60)
        async with open_scheduler(redis_server.url, ns, shards=2) as s:
            await s.schedule("f", "anything", delay=60)  # opt-in: no tasks, no check
        with pytest.raises(TypeError, match="tasks must be a collection"):
            Scheduler(redis.asyncio.Redis(), ns, tasks="known")  # type: ignore[arg-type]

    run(main())
    ns = unique_ns()
    sync = SyncScheduler.from_url(redis_server.url, ns, shards=2, tasks={"known"})
    with pytest.raises(ValueError, match=r"task 'nope' is not registered"):
        sync.schedule("a", "nope", delay=60)
    with pytest.raises(ValueError, match="'nope'"):
        sync.schedule_many([JobSpec("b", "nope")])
    assert run(_keys(redis_server.url, ns)) == []
    sync.schedule("c", "known", delay=60)
    sync.close()


def test_a_config_error_while_a_worker_runs_is_logged_when_it_starts_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's user loses its permissions (NOPERM) for a while and gets them back:
    one ERROR when Redis starts refusing, one INFO with the refused calls counted when
    it accepts the worker again; no line per round, no traceback; the worker goes on."""
    with RedisServer(password="s3cret-pw") as server:
        ns = unique_ns()
        url = f"redis://w:w-pw@127.0.0.1:{server.port}/0"

        async def main() -> None:
            admin = redis.asyncio.Redis.from_url(server.url)
            await admin.execute_command("ACL", "SETUSER", "w", "on", ">w-pw", "~*", "&*", "+@all")
            reg = TaskRegistry()
            ran: list[str] = []

            @reg.task(name="t")
            async def t(ctx: object) -> None:
                ran.append("x")

            async with open_scheduler(url, ns, shards=2) as sched:
                worker = Worker(sched, reg, poll_interval=0.05, lookahead=0.0, reap_interval=0.1)
                running = asyncio.ensure_future(worker.run())
                await asyncio.sleep(1.0)
                caplog.set_level("INFO", logger="tickwheel.durable")
                await admin.execute_command("ACL", "SETUSER", "w", "-@all")
                await asyncio.sleep(2.0)  # many rounds of the loader, reaper and balancer
                await admin.execute_command("ACL", "SETUSER", "w", "+@all")
                await sched.schedule("after", "t", delay=0)
                for _ in range(100):
                    if ran:
                        break
                    await asyncio.sleep(0.1)
                worker.stop()
                await asyncio.wait_for(running, 30)
            await admin.aclose()
            assert ran == ["x"]  # it went on once Redis accepted it again

        run(main())
    lines = [r for r in caplog.records if r.name == "tickwheel.durable"]
    started = [r for r in lines if "Redis refuses this worker" in r.getMessage()]
    ended = [r for r in lines if "Redis accepts this worker again" in r.getMessage()]
    assert len(started) == 1 and started[0].levelname == "ERROR", [r.getMessage() for r in lines]
    assert "no permissions" in started[0].getMessage() and "s3cret" not in started[0].getMessage()
    assert len(ended) == 1 and ended[0].levelname == "INFO"
    assert ended[0].failed_calls > 3  # type: ignore[attr-defined]
    assert not [r for r in lines if r.levelno >= 30 and r not in started], [
        r.getMessage() for r in lines if r.levelno >= 30
    ]
    assert not [r for r in lines if r.exc_info]
