"""Issue 42, finding 3: a task cannot kill its worker. ``SystemExit``,
``KeyboardInterrupt``, ``GeneratorExit`` and other ``BaseException``s raised by a task
fail that attempt (retried, then dead, and logged) and the worker goes on; a real SIGINT
or SIGTERM still stops it gracefully."""

from __future__ import annotations

import asyncio
import json
import logging
import signal

import pytest

from tests.durable_support import open_scheduler, run, unique_ns
from tests.spill_support import SINK_ENV, WorkerProcess, until, wait_effects
from tickwheel.durable import JobState, TaskContext, TaskRegistry, Timers, Worker
from tickwheel.durable.store import client_from_url

pytestmark = pytest.mark.redis

FAST = {"lookahead": 0.1, "poll_interval": 0.02, "reap_interval": 0.05}


class Odd(BaseException):
    """A BaseException of a library's own."""


RAISED: dict[str, type[BaseException]] = {
    "exit": SystemExit,
    "interrupt": KeyboardInterrupt,
    "generator_exit": GeneratorExit,
    "odd": Odd,
}


def _registry(ran: list[str]) -> TaskRegistry:
    reg = TaskRegistry()
    for name, exc in RAISED.items():
        # each class from an async task and from a plain one
        def plain(ctx: TaskContext, exc: type[BaseException] = exc) -> None:
            raise exc()

        async def coro(ctx: TaskContext, exc: type[BaseException] = exc) -> None:
            raise exc()

        reg.register(plain, name=f"plain.{name}")
        reg.register(coro, name=f"async.{name}")

    @reg.task(name="ok")
    async def ok(ctx: TaskContext) -> None:
        ran.append(ctx.job_id)

    return reg


def test_base_exceptions_of_a_task_fail_its_attempt_and_the_worker_goes_on(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []
    reg = _registry(ran)
    hostile = [name for name in reg if name != "ok"]

    async def main() -> None:
        async with open_scheduler(redis_url, shards=2, retry_base=0) as s:
            for name in hostile:
                await s.schedule(name, name, max_attempts=2)
            worker = Worker(s, reg, **FAST)
            task = asyncio.ensure_future(worker.run())
            try:
                for i in range(5):
                    await s.schedule(f"ok:{i}", "ok", delay=0.2)

                async def all_dead() -> bool:
                    infos = [await s.get(name) for name in hostile]
                    return all(i is not None and i.state is JobState.DEAD for i in infos)

                deadline = asyncio.get_running_loop().time() + 20
                while not await all_dead():
                    assert asyncio.get_running_loop().time() < deadline, "not all dead"
                    await asyncio.sleep(0.05)
                assert await until(lambda: len(ran) == 5, 10), ran
                assert not task.done()
                # still running: it runs a job scheduled after all that
                await s.schedule("ok:last", "ok")
                assert await until(lambda: "ok:last" in ran, 10), ran
            finally:
                worker.stop()
                stats = await task
            assert (stats.dead, stats.retried) == (len(hostile), len(hostile))
            for name in hostile:
                info = await s.get(name)
                assert info is not None and info.state is JobState.DEAD
                assert RAISED[name.split(".")[1]].__name__ in info.last_error, info
        dead = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
        assert {r.job_id for r in dead} == set(hostile)  # type: ignore[attr-defined]
        assert all(r.levelno == logging.ERROR for r in dead)

    run(main())


def test_an_in_memory_timer_task_cannot_end_the_loop(redis_url: str) -> None:
    ran: list[str] = []
    reg = _registry(ran)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            timers = Timers(s, reg)
            for name in reg:
                if name != "ok":
                    await timers.schedule(0.01, name)
            await timers.schedule(0.05, "ok", job_id="after")
            await asyncio.sleep(0.3)
            assert ran == ["after"]
            assert await timers.close() == []

    run(main())


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_worker_process_outlives_hostile_tasks_and_still_stops_on_a_signal(
    redis_url: str, sig: signal.Signals, code: int
) -> None:
    ns = unique_ns()
    prefix = f"sink:{ns}"

    async def main() -> None:
        async with open_scheduler(redis_url, namespace=ns, shards=2, retry_base=0) as s:
            for name in ("hostile.exit", "hostile.interrupt", "hostile.generator_exit"):
                await s.schedule(name, name, max_attempts=2)
            worker = WorkerProcess(
                redis_url, ns, "--shards", "2", "--poll-interval", "0.05",
                registry="hostile_support:registry",
            )  # fmt: skip
            try:
                worker.wait_started()
                for i in range(3):
                    await s.schedule(f"ok:{i}", "sink", {"sink": prefix}, delay=0.3)
                sink = client_from_url(redis_url)
                try:
                    assert await wait_effects(sink, prefix, 3, 20) == 3
                finally:
                    await sink.aclose()
                deadline = asyncio.get_running_loop().time() + 20
                for name in ("hostile.exit", "hostile.interrupt", "hostile.generator_exit"):
                    while True:
                        info = await s.get(name)
                        assert info is not None
                        if info.state is JobState.DEAD:
                            break
                        assert asyncio.get_running_loop().time() < deadline, info
                        await asyncio.sleep(0.05)
                assert worker.proc.poll() is None  # alive after six hostile attempts
                worker.signal(sig)
                out, err = worker.proc.communicate(timeout=30)
            finally:
                if worker.proc.poll() is None:
                    worker.kill()
            assert worker.proc.returncode == code, err
            last = json.loads(out.splitlines()[-1])
            assert last["event"] == "stopped", out
            assert last["stats"]["dead"] == 3, last

    assert SINK_ENV
    run(main())
