"""Shared helpers of the spill tests: a task registry with a sink that records every run
in Redis, worker processes started and stopped by pid, and Redis-clock lateness.

The sink is what a careful user writes: its effect is one idempotent command,
``SADD effects "<id>:<nominal>"``, so a redelivered occurrence has no second effect and a
worker killed at any instant leaves the effect either whole or absent. (An earlier sink
did ``SET NX`` and then, in a second round trip, ``INCR`` a counter: a kill -9 between the
two left an effect that was never counted, which read as a lost job.) It also counts
every call (INCR) and which worker process made it, so tests can tell duplicates apart
from double effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio

from tickwheel.durable import Scheduler, TaskContext, TaskRegistry, Worker
from tickwheel.durable.store._connect import client_from_url

# The sink's Redis (a worker process reads it from the environment).
SINK_ENV = "TICKWHEEL_TEST_SINK_URL"
# A directory: each worker process runs with -v and writes its stderr (per-job DEBUG
# lines) to <dir>/worker-<pid>.log there, to find out what a flaky run did.
LOGS_ENV = "TICKWHEEL_TEST_WORKER_LOGS"
TESTS_DIR = Path(__file__).resolve().parent

registry = TaskRegistry()
# loop -> sink client: a redis.asyncio client must not outlive the loop it ran on.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


def _sink_client() -> redis.asyncio.Redis:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = client_from_url(os.environ[SINK_ENV])
    return client


def redis_ms(reply: Any) -> float:
    """Redis TIME (seconds, microseconds) as ms."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) / 1000


@registry.task(name="sink")
async def sink(ctx: TaskContext) -> None:
    """Record the run under the prefix in the payload: calls, runner pid, effect (NX),
    and lateness against the due time by Redis's clock."""
    prefix = ctx.payload["sink"]
    assert ctx.job is not None
    client = _sink_client()
    now = await client.time()  # apart: redis-py's cluster pipeline refuses TIME
    async with client.pipeline(transaction=False) as pipe:
        pipe.incr(f"{prefix}:calls:{ctx.job_id}")
        pipe.sadd(f"{prefix}:by:{ctx.job_id}", os.getpid())
        pipe.sadd(f"{prefix}:effects", f"{ctx.job_id}:{ctx.nominal_ms}")
        await pipe.execute()
    late = redis_ms(now) - ctx.job.due_ms
    await client.rpush(f"{prefix}:late", f"{late:.3f}")


async def sink_report(client: redis.asyncio.Redis, prefix: str, ids: list[str]) -> dict[str, Any]:
    """What the sink saw: effects and the ids they were for, calls per id, runner pids
    per id, lateness (ms)."""
    async with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.get(f"{prefix}:calls:{job_id}")
        calls = [int(c or 0) for c in await pipe.execute()]
    async with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.smembers(f"{prefix}:by:{job_id}")
        by = [{int(p) for p in s} for s in await pipe.execute()]
    effects = {m.decode() for m in await client.smembers(f"{prefix}:effects")}
    return {
        "effects": len(effects),
        # The ids that had an effect (one member per (id, nominal) occurrence).
        "effect_ids": {m.rsplit(":", 1)[0] for m in effects},
        "calls": dict(zip(ids, calls, strict=True)),
        "by": dict(zip(ids, by, strict=True)),
        "late": [float(x) for x in await client.lrange(f"{prefix}:late", 0, -1)],
    }


async def wait_effects(client: redis.asyncio.Redis, prefix: str, n: int, within: float) -> int:
    """Poll until the sink saw ``n`` effects or ``within`` s passed; return the count."""
    deadline = time.monotonic() + within
    while True:
        got = int(await client.scard(f"{prefix}:effects"))
        if got >= n or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_worker(
    scheduler: Scheduler, reg: TaskRegistry, **kwargs: Any
) -> AsyncIterator[Worker]:
    """A :class:`Worker` running in a task of this loop, stopped gracefully on exit."""
    worker = Worker(scheduler, reg, **kwargs)
    task = asyncio.ensure_future(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await task


async def until(predicate: Any, within: float, step: float = 0.01) -> bool:
    """Poll a sync predicate until true or ``within`` s passed; return its last value."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


class WorkerProcess:
    """A ``tickwheel worker`` subprocess on the sink registry, stopped by its pid."""

    def __init__(
        self, url: str, namespace: str, *options: str, registry: str = "spill_support:registry"
    ) -> None:
        env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), **{SINK_ENV: url})
        logs = os.environ.get(LOGS_ENV)
        # -v writes a line per job: to a file, never a pipe nobody reads until the end.
        log = None
        if logs:
            log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, kept)
                "w", dir=logs, prefix="worker-", suffix=".log", delete=False
            )
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "tickwheel.durable.ops.cli", "worker",
                registry, "--redis-url", url, "--namespace", namespace,
                "--no-check", *options, *(["-v"] if log else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if log is None else log,
            env=env,
            text=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        if log is not None:
            log.close()  # the child has its own descriptor
            os.replace(log.name, Path(logs or ".") / f"worker-{self.pid}.log")

    def wait_started(self) -> None:
        """Block until the worker printed its started line (fails if it exited)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert json.loads(line)["event"] == "started", line

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout: float = 30.0) -> tuple[int, dict[str, int] | None, str]:
        """SIGTERM, wait, and return (exit code, final stats or None, stderr)."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        stats = None
        for line in out.splitlines():
            event = json.loads(line)
            if event.get("event") == "stopped":
                stats = event["stats"]
        return self.proc.returncode, stats, err or ""  # "" when it went to a log file

    def kill(self) -> None:
        """kill -9, by pid."""
        self.proc.kill()
        self.proc.communicate()


@contextlib.asynccontextmanager
async def worker_processes(
    url: str, namespace: str, count: int, *options: str
) -> AsyncIterator[list[WorkerProcess]]:
    """``count`` started worker processes; any still running at exit is killed (by pid)."""
    workers = [WorkerProcess(url, namespace, *options) for _ in range(count)]
    try:
        for w in workers:
            w.wait_started()
        yield workers
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
