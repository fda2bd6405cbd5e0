"""Section 3 of ``python -m bench``: durable jobs against arq, BullMQ, saq and streaq.

One private redis-server for the section (and a second one, the sink of the SIGKILL
row). Each repeat measures, for each peer in turn, tickwheel (namespace ``bench``, one
shard: arq, saq and streaq also keep one sorted set per queue, BullMQ one ``delayed``
set) and then the peer, flushing before each; every figure is the ratio within that
pair. The peers are the adapters of bench/peers/queues.py, which says what is set for
each and why. Jobs carry a 32-byte payload (a 32-character str for the peers: saq
encodes JSON).

1. bulk schedule: N far jobs (due in a day). tickwheel: ``schedule_many`` by 1000;
   BullMQ ``addBulk`` and streaq ``enqueue_many`` by 1000; arq and saq have no batch
   call, so 100 calls in flight at once (their fastest path).
2. Redis memory per pending job after step 1: ``used_memory`` less the clients' buffers
   (``mem_clients_normal``), over N.
3. single schedule: sequential awaited calls, one job each, with the N jobs pending.
4. drain: D jobs due now (each library's path for a job without a delay), run by a
   worker in this process until all ran, timed from the worker's start (claim + run a
   no-op + ack): a :class:`Loader` (max 32 tasks, LIMIT 1000) against each peer's own
   worker at concurrency 100.
5. firing lateness at 1,000 and 5,000 jobs/s: ``rate * seconds`` jobs due at a steady
   rate, scheduled ahead in batches with the N jobs still pending; lateness = the
   ``time.time()`` at which the job starts minus its due time (both on this host's
   clock). tickwheel: bench/workloads/durable_lateness.py's loader run (Loader,
   lookahead 0.5 s, poll 50 ms); a peer: its worker already running while the jobs go
   in, the first due a second plus twice its bulk-schedule time for as many jobs ahead.
   A peer that runs fewer jobs per second than the rate shows its backlog here.
6. SIGKILL row, once per run after the repeats (``--quick``: tickwheel only): K jobs due
   at once, a worker subprocess (``python -m bench.peers kill-worker``, 4 jobs at once)
   whose task adds 1 to the job's field in the sink's hash and sleeps 20 ms, SIGKILLed
   when a third of the jobs wrote their effect; a fresh worker then runs until every
   effect is in and stable for a second, and at least the library's redelivery time
   (its lease or visibility timeout, cut to a few seconds for every library) plus 2 s
   passed. Lost = jobs with no effect, duplicated = more than one. Reported, and checked
   for tickwheel only (it must lose none).

Celery is not a peer: see bench/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio

from bench.peers.queues import EFFECTS, PEERS, now_ms, quiet
from bench.runner.harness import Checks, Figure, Plan, Progress, percentiles
from bench.workloads.durable_lateness import loader_lateness, peer_lateness
from tickwheel.durable import JobSpec, Loader, Scheduler, TaskContext, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.wheel import TimingWheel

SECTION = "durable"
FAR = 86_400  # s: the pending jobs are never due during a run
CHUNK = 1000  # schedule_many batch
PAYLOAD = b"x" * 32
DRAIN_TIMEOUT = 120.0  # s before a drain that has not finished counts as jobs lost


def _kill_libs(plan: Plan) -> tuple[str, ...]:
    """The SIGKILL row's libraries: ``--quick`` runs tickwheel's alone (its check)."""
    return ("tickwheel",) if plan.quick else ("tickwheel", *LIBS)


def steps(plan: Plan) -> int:
    return plan.repeats * 2 * len(LIBS) + len(_kill_libs(plan))


async def _used_memory(client: Any) -> int:
    """Redis's ``used_memory`` less its clients' buffers: a peer that schedules over 100
    connections at once would otherwise be charged for their query buffers."""
    info = await client.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"])


async def _tickwheel(url: str, plan: Plan, checks: Checks) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    out: dict[str, Any] = {}
    s = Scheduler(client, "bench", shards=1, check=False)
    await s.take(0)
    mem0 = await _used_memory(client)
    t = time.perf_counter()
    for start in range(0, plan.durable_pending, CHUNK):
        await s.schedule_many(
            JobSpec(f"far:{i}", "noop", PAYLOAD, delay=FAR)
            for i in range(start, min(plan.durable_pending, start + CHUNK))
        )
    out["bulk_per_s"] = plan.durable_pending / (time.perf_counter() - t)
    out["bytes_per_job"] = (await _used_memory(client) - mem0) / plan.durable_pending
    t = time.perf_counter()
    for i in range(plan.durable_singles):
        await s.schedule(f"one:{i}", "noop", PAYLOAD, delay=FAR)
    out["single_per_s"] = plan.durable_singles / (time.perf_counter() - t)

    ran: list[int] = []
    all_ran = asyncio.Event()
    reg = TaskRegistry()

    @reg.task(name="noop")  # async, like the peers' handlers (a plain one runs inline)
    async def noop(ctx: TaskContext) -> None:
        ran.append(1)
        if len(ran) == plan.durable_drain:
            all_ran.set()

    await s.schedule_many(JobSpec(f"due:{i}", "noop", PAYLOAD) for i in range(plan.durable_drain))
    loader = Loader(s, reg, TimingWheel(), lookahead=0.0, limit=1000, poll_interval=0.05)
    t = time.perf_counter()
    task = asyncio.ensure_future(loader.run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_ran.wait(), DRAIN_TIMEOUT)
    out["drain_per_s"] = len(ran) / (time.perf_counter() - t)
    loader.stop_claiming()
    await task
    await loader.drain(1.0)  # the last acks
    checks.expect(
        loader.stats.succeeded == plan.durable_drain == len(ran),
        f"durable: tickwheel ran every due job once ({len(ran)}/{plan.durable_drain})",
    )
    await s.close()  # gives the shard back: spill_vs_arq's run takes it next
    await client.aclose()
    out["lateness_ms"] = {}
    for rate in plan.durable_rates:
        late = await asyncio.wait_for(
            loader_lateness(url, rate, plan.durable_seconds, flush=False, prefix=f"r{rate}:"),
            plan.durable_seconds + DRAIN_TIMEOUT,
        )
        n = int(rate * plan.durable_seconds)
        checks.expect(len(late) == n, f"durable: tickwheel fired every job ({len(late)}/{n})")
        checks.expect(min(late) >= 0, f"durable: no tickwheel job early (min {min(late):.2f} ms)")
        out["lateness_ms"][str(rate)] = percentiles(late)
    return out


async def _peer(lib: str, url: str, plan: Plan) -> dict[str, Any]:
    """One peer's figures, measured as tickwheel's are (see the module's docstring)."""
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    peer = PEERS[lib](url)
    await peer.open()
    out: dict[str, Any] = {}
    try:
        far_ms = now_ms() + FAR * 1000
        mem0 = await _used_memory(client)
        t = time.perf_counter()
        for start in range(0, plan.durable_pending, CHUNK):
            stop = min(plan.durable_pending, start + CHUNK)
            await peer.schedule_many([(f"far:{i}", far_ms) for i in range(start, stop)])
        out["bulk_per_s"] = plan.durable_pending / (time.perf_counter() - t)
        out["bytes_per_job"] = (await _used_memory(client) - mem0) / plan.durable_pending
        t = time.perf_counter()
        for i in range(plan.durable_singles):
            await peer.schedule_one(f"one:{i}", far_ms)
        out["single_per_s"] = plan.durable_singles / (time.perf_counter() - t)

        ran: set[str] = set()
        all_ran = asyncio.Event()

        async def noop(key: str, due_ms: int) -> None:
            ran.add(key)
            if len(ran) == plan.durable_drain:
                all_ran.set()

        for start in range(0, plan.durable_drain, CHUNK):
            stop = min(plan.durable_drain, start + CHUNK)
            await peer.schedule_now([f"due:{i}" for i in range(start, stop)])
        t = time.perf_counter()
        async with peer.worker(noop):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_ran.wait(), DRAIN_TIMEOUT)
            out["drain_per_s"] = len(ran) / (time.perf_counter() - t)
        out["drain_ran"] = len(ran)

        out["lateness_ms"] = {}
        out["lateness_fired"] = {}
        out["lateness_enqueue_late_ms"] = {}
        for rate in plan.durable_rates:
            # The first job due a second plus twice this peer's bulk-schedule time ahead.
            lead_s = 1 + 2 * int(rate * plan.durable_seconds) / out["bulk_per_s"]
            late, fired, overran = await peer_lateness(
                peer, rate, plan.durable_seconds, lead_s, DRAIN_TIMEOUT
            )
            out["lateness_ms"][str(rate)] = percentiles(late) if late else None
            out["lateness_fired"][str(rate)] = fired
            out["lateness_enqueue_late_ms"][str(rate)] = overran
    finally:
        await peer.close()
        await client.aclose()
    return out


def _spawn(lib: str, url: str, sink_url: str) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    return subprocess.Popen(
        [sys.executable, "-m", "bench.peers", "kill-worker", lib, url, sink_url],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


async def _kill_row(lib: str, url: str, sink_url: str, k: int) -> dict[str, Any]:
    """K jobs due now; a worker subprocess runs them (each adds 1 to its key's field in
    the sink, then sleeps 20 ms) and is SIGKILLed once a third of them wrote their
    effect; a fresh worker then runs until every job's effect is in and stayed for a
    second, and at least the library's redelivery time (plus 2 s) has passed since the
    kill, or that time plus 20 s. Counts jobs with no effect (lost) and with more than
    one (duplicated)."""
    client = redis.asyncio.Redis.from_url(url)
    sink = redis.asyncio.Redis.from_url(sink_url)
    await client.flushall()
    await sink.flushall()
    keys = [f"kill:{i}" for i in range(k)]
    due = now_ms()
    if lib == "tickwheel":
        s = Scheduler(client, "kill", shards=1, check=False)
        for i in range(0, k, CHUNK):
            await s.schedule_many(JobSpec(key, "job", at=due) for key in keys[i : i + CHUNK])
        redeliver = 6.0  # owner TTL 2 s, lease 3 s, reaper every 1 s
    else:
        peer = PEERS[lib](url)
        await peer.open()
        for i in range(0, k, CHUNK):
            await peer.schedule_many([(key, due) for key in keys[i : i + CHUNK]])
        await peer.close()
        redeliver = PEERS[lib].redeliver_s
    out: dict[str, Any] = {"jobs": k, "redeliver_s": redeliver}
    first = _spawn(lib, url, sink_url)
    try:
        deadline = time.monotonic() + 60
        while await sink.hlen(EFFECTS) < k // 3 and time.monotonic() < deadline:
            if first.poll() is not None:
                break
            await asyncio.sleep(0.005)
    finally:
        _kill(first)
    killed = time.monotonic()
    out["effects_at_kill"] = int(await sink.hlen(EFFECTS))
    if first.returncode != -signal.SIGKILL:
        assert first.stderr is not None
        out["error"] = first.stderr.read().decode(errors="replace")[-2000:]
    second = _spawn(lib, url, sink_url)
    try:
        last, stable_since = -1, time.monotonic()
        while True:
            now = time.monotonic()
            effects = await sink.hgetall(EFFECTS)
            total = sum(int(v) for v in effects.values())
            if total != last:
                last, stable_since = total, now
            settled = len(effects) == k and now - stable_since >= 1.0
            if (settled and now - killed >= redeliver + 2) or now - killed >= redeliver + 20:
                break
            await asyncio.sleep(0.1)
    finally:
        _kill(second)
    out["settle_s"] = time.monotonic() - killed
    counts = [int(effects.get(key.encode(), 0)) for key in keys]
    out["lost"] = sum(1 for c in counts if c == 0)
    out["duplicated"] = sum(1 for c in counts if c > 1)
    await client.aclose()
    await sink.aclose()
    return out


LIBS = tuple(PEERS)  # arq, bullmq, saq, streaq


def run(plan: Plan, progress: Progress, checks: Checks) -> dict[str, Any]:
    quiet()
    rows: list[dict[str, Any]] = []
    kills: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    try:
        with RedisServer() as server, RedisServer() as sink:
            for r in range(plan.repeats):
                for lib in LIBS:
                    n = f"{plan.durable_pending:,} pending, {r + 1}"
                    progress.step(f"durable: tickwheel (beside {lib}), {n}")
                    ours = loop.run_until_complete(_tickwheel(server.url, plan, checks))
                    progress.step(f"durable: {lib}, {n}")
                    theirs = loop.run_until_complete(_peer(lib, server.url, plan))
                    rows.append({"peer": lib, "tickwheel": ours, lib: theirs})
            for lib in _kill_libs(plan):
                progress.step(f"durable: SIGKILL row, {lib}")
                kills[lib] = loop.run_until_complete(
                    _kill_row(lib, server.url, sink.url, plan.durable_kill_jobs)
                )
    finally:
        loop.close()
    tw = kills["tickwheel"]
    checks.expect(
        tw["lost"] == 0 and "error" not in tw,
        f"durable: tickwheel lost no job to a SIGKILLed worker ({tw['lost']} lost, "
        f"{tw['duplicated']} run twice)",
    )
    n = f"{plan.durable_pending:,} pending"
    specs = [
        ("bulk_per_s", f"bulk schedule, {n}", "jobs/s", "higher"),
        ("single_per_s", f"single schedule, {n}", "jobs/s", "higher"),
        ("drain_per_s", f"claim+run+ack of due jobs, {n}", "jobs/s", "higher"),
        ("bytes_per_job", "Redis memory per pending job", "B", "lower"),
    ]
    figures = []
    for lib in LIBS:
        mine = [row for row in rows if row["peer"] == lib]
        for key, name, unit, better in specs:
            fig = Figure(SECTION, name, lib, unit, better)
            for row in mine:
                fig.add(row["tickwheel"][key], row[lib][key])
            figures.append(fig)
        for rate in plan.durable_rates:
            for q in ("p50", "p99", "max"):
                fig = Figure(SECTION, f"firing lateness {q} at {rate:,} jobs/s", lib, "ms", "lower")
                for row in mine:
                    theirs = row[lib]["lateness_ms"][str(rate)]
                    if theirs is not None:
                        fig.add(row["tickwheel"]["lateness_ms"][str(rate)][q], theirs[q])
                figures.append(fig)
    return {"figures": figures, "raw": {"runs": rows, "kill": kills}}
