"""The task and the worker processes of the chaos test (tests/test_chaos.py).

The task writes to a *sink*, a redis-server of its own that no fault touches, in two
atomic script calls keyed by the occurrence ``"<job id>|<nominal ms>"``:

- at the start, ``HINCRBY calls`` and a log line ``occurrence|pid|sink ms``: every
  handler call is counted, duplicates included;
- at the end, ``HINCRBY finished`` and the effect itself, ``HSETNX effect`` (so a
  duplicate call has no second effect), with the sink's time and the pid.

Each call is one script, so a worker killed at any instant leaves each record whole or
absent. Times are the sink's ``TIME``: the sink runs on the same host clock as the
scheduler's Redis, which stamps the nominal due times.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import redis.asyncio

from tickwheel.durable import TaskContext, TaskRegistry
from tickwheel.durable.store._connect import client_from_url

SINK_ENV = "TICKWHEEL_CHAOS_SINK_URL"
TESTS_DIR = Path(__file__).resolve().parent

# KEYS[1] prefix; ARGV occurrence, phase ("start" | "end"), pid. Returns the sink's ms.
_SINK_LUA = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local occ, pid = ARGV[1], ARGV[3]
if ARGV[2] == 'start' then
  redis.call('HINCRBY', KEYS[1] .. ':calls', occ, 1)
  redis.call('RPUSH', KEYS[1] .. ':log', occ .. '|' .. pid .. '|' .. ms)
else
  redis.call('HINCRBY', KEYS[1] .. ':finished', occ, 1)
  redis.call('HSETNX', KEYS[1] .. ':effect', occ, ms .. '|' .. pid)
end
return ms
"""

registry = TaskRegistry()
_scripts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _sink_script() -> Any:
    loop = asyncio.get_running_loop()
    script = _scripts.get(loop)
    if script is None:
        client: redis.asyncio.Redis = client_from_url(os.environ[SINK_ENV])  # type: ignore[assignment]
        script = _scripts[loop] = client.register_script(_SINK_LUA)
    return script


@registry.task(name="chaos")
async def chaos(ctx: TaskContext) -> None:
    """Count the call, work for ``payload["d"]`` seconds (so kills land mid-run), then
    write the effect once."""
    prefix = ctx.payload["sink"]
    occ = f"{ctx.job_id}|{ctx.nominal_ms}"
    script = _sink_script()
    pid = str(os.getpid())
    await script([prefix], [occ, "start", pid])
    await asyncio.sleep(float(ctx.payload["d"]))
    await script([prefix], [occ, "end", pid])


@registry.task(name="chaos_fail")
async def chaos_fail(ctx: TaskContext) -> None:
    """Log the call with its attempt (``<id>|<attempt>|pid|sink ms`` in ``:fails``), work
    for ``payload["d"]`` seconds, then fail: every attempt fails, until the last one
    dead-letters the job."""
    prefix = ctx.payload["sink"]
    script = _sink_script()
    await script([prefix + ":f"], [f"{ctx.job_id}|{ctx.attempt}", "start", str(os.getpid())])
    await asyncio.sleep(float(ctx.payload["d"]))
    raise RuntimeError(f"chaos_fail {ctx.job_id} attempt {ctx.attempt}")


async def failing_calls(
    client: redis.asyncio.Redis, prefix: str
) -> dict[str, list[tuple[int, int, int]]]:
    """The calls of :func:`chaos_fail` by job id: (attempt, pid, sink ms) in log order."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for line in await client.lrange(f"{prefix}:f:log", 0, -1):
        job_id, attempt, pid, ms = line.decode().rsplit("|", 3)
        out.setdefault(job_id, []).append((int(attempt), int(pid), int(ms)))
    return out


async def sink_state(client: redis.asyncio.Redis, prefix: str) -> dict[str, Any]:
    """Everything the sink holds under ``prefix``.

    Returns:
        ``calls`` and ``finished`` (occurrence -> count), ``effect`` (occurrence ->
        (sink ms, pid)) and ``log`` (occurrence -> [(pid, sink ms), ...] in call order).
    """
    calls = await client.hgetall(f"{prefix}:calls")
    finished = await client.hgetall(f"{prefix}:finished")
    effect = await client.hgetall(f"{prefix}:effect")
    log: dict[str, list[tuple[int, int]]] = {}
    for line in await client.lrange(f"{prefix}:log", 0, -1):
        job_id, nominal, pid, ms = line.decode().rsplit("|", 3)
        log.setdefault(f"{job_id}|{nominal}", []).append((int(pid), int(ms)))
    return {
        "calls": {k.decode(): int(v) for k, v in calls.items()},
        "finished": {k.decode(): int(v) for k, v in finished.items()},
        "effect": {
            k.decode(): tuple(int(x) for x in v.decode().split("|")) for k, v in effect.items()
        },
        "log": log,
    }


def occurrence(occ: str) -> tuple[str, int]:
    """``"<id>|<nominal>"`` -> (id, nominal ms)."""
    job_id, nominal = occ.rsplit("|", 1)
    return job_id, int(nominal)


class ChaosWorker:
    """A ``tickwheel worker`` process on this module's registry, stopped by its pid.

    Its stdout and stderr go to files (a pipe nobody reads would fill up with the
    warnings of a Redis outage and block the worker).
    """

    def __init__(self, url: str, sink_url: str, namespace: str, logdir: Path, *opts: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), **{SINK_ENV: sink_url})
        self.started_at = time.monotonic()
        stamp = f"{time.time_ns()}"
        self.out_path = logdir / f"worker-{stamp}.out"
        self.err_path = logdir / f"worker-{stamp}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "tickwheel.durable.ops.cli", "worker",
                    "chaos_support:registry", "--redis-url", url, "--namespace", namespace,
                    "--no-check", *opts,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
            )  # fmt: skip
        self.pid = self.proc.pid
        self.stopped = False  # SIGSTOP'd and not yet resumed

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines the worker printed so far."""
        text = self.out_path.read_text(errors="replace")
        return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]

    def stderr_tail(self, chars: int = 2000) -> str:
        return self.err_path.read_text(errors="replace")[-chars:]

    async def wait_started(self, within: float = 60.0) -> None:
        """Wait until it printed its started line; fail with its stderr if it exited."""
        deadline = time.monotonic() + within
        while not any(e.get("event") == "started" for e in self.events()):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.pid} exited with {self.proc.returncode} before it "
                    f"started: {self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.pid} did not start in {within} s")
            await asyncio.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        if self.stopped and self.alive():
            os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        """kill -9, by pid (a stopped process dies too)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self.stopped = False

    async def stop(self, within: float = 60.0) -> dict[str, int] | None:
        """SIGTERM, wait (SIGKILL past ``within``); return its final stats or None."""
        self.resume()
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, within)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        for event in self.events():
            if event.get("event") == "stopped":
                stats: dict[str, int] = event["stats"]
                return stats
        return None
