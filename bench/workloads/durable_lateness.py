"""How late durable jobs run: tickwheel's loader and worker, and a peer's worker, timed alike.

Every run here schedules jobs due at a steady rate well ahead of the first due time and
records, for each job as it starts, ``time.time()`` minus its due time in ms (both on
this host's clock, which Redis's ``TIME`` also reads):

- :func:`loader_lateness`: one shard, one :class:`Loader` (lookahead 0.5 s, poll 50 ms);
- :func:`peer_lateness`: a peer of bench/peers/queues.py, its worker already running
  while the jobs go in;
- :func:`evening_peak`: the source document's peak, one :class:`Worker` owning every
  shard (poll 100 ms, LIMIT 500, lookahead 1 s), with the worker's CPU over the window.

Used by the durable and example sections of ``python -m bench``, and by the probes
``spill_vs_arq`` and ``scale``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from bench.peers.queues import Peer, now_ms
from tickwheel.durable import (
    JobSpec,
    Loader,
    LoaderStats,
    Scheduler,
    TaskContext,
    TaskRegistry,
    Worker,
)
from tickwheel.wheel import TimingWheel

CHUNK = 1000  # jobs per schedule_many
# Seconds of lead per job scheduled, plus a fixed second (the loader run): no job may be
# due before all are in.
LEAD_PER_JOB = 0.0006
POLL = 0.05  # the loader's poll interval
# The evening peak, as the source document has it.
PEAK_LIMIT = 500  # claim LIMIT
PEAK_POLL = 0.1  # s between claims
PEAK_LEAD = 3.0  # s between the last job scheduled and the first due
PEAK_FINISH_TIMEOUT = 60.0  # s after the last due time before missing jobs count as lost


def lateness_probe(
    registry: TaskRegistry, name: str, n: int
) -> tuple[list[float], set[str], asyncio.Event]:
    """Register task ``name``: it records how late it runs (ms, ``time.time()`` minus the
    job's due time) and its job id.

    Returns:
        The lateness list, the set of job ids run, and an event set once ``n`` ran.
    """
    late: list[float] = []
    seen: set[str] = set()
    done = asyncio.Event()

    @registry.task(name=name)  # async, like the peers' handlers (a plain one runs inline)
    async def probe(ctx: TaskContext) -> None:
        assert ctx.job is not None
        late.append(time.time() * 1000 - ctx.job.due_ms)
        seen.add(ctx.job_id)
        if len(seen) == n:
            done.set()

    return late, seen, done


async def loader_lateness(
    url: str, rate: int, seconds: float, flush: bool = True, prefix: str = "j"
) -> list[float]:
    """Lateness (ms) of ``rate * seconds`` jobs in namespace ``bench`` (one shard), ids
    ``prefix`` + a number, run by one :class:`Loader`; with ``flush=False`` whatever is
    pending there stays (the far jobs of ``python -m bench``)."""
    client = redis.asyncio.Redis.from_url(url)
    if flush:
        await client.flushall()
    n = int(rate * seconds)
    reg = TaskRegistry()
    late, _, done = lateness_probe(reg, "probe", n)

    sched = Scheduler(client, "bench", shards=1, check=False)
    await sched.take(0)
    start_ms = int(time.time() * 1000 + (1 + n * LEAD_PER_JOB) * 1000)
    for i in range(0, n, CHUNK):
        await sched.schedule_many(
            JobSpec(f"{prefix}{k}", "probe", at=start_ms + k * 1000 // rate)
            for k in range(i, min(n, i + CHUNK))
        )
    loader = Loader(sched, reg, TimingWheel(), lookahead=0.5, poll_interval=POLL, limit=CHUNK)
    task = asyncio.ensure_future(loader.run())
    await done.wait()
    loader.stop_claiming()
    await task
    await loader.drain(1.0)  # the last acks
    await sched.close()  # gives the shard back for the next run in this Redis
    await client.aclose()
    return late


async def peer_lateness(
    peer: Peer, rate: int, seconds: float, lead_s: float, give_up_s: float
) -> tuple[list[float], int, float]:
    """Lateness (ms) of ``rate * seconds`` jobs due at a steady rate, all scheduled (in
    batches of 1000) before the first is due, ``lead_s`` after the scheduling starts,
    with the peer's worker already running (some take a second to start).

    Returns:
        The lateness of each job that ran within ``seconds + 2 + give_up_s``, how many
        ran, and by how much the scheduling overran the first due time (0 if it did not).
    """
    n = int(rate * seconds)
    late: list[float] = []
    seen: set[str] = set()
    done = asyncio.Event()

    async def probe(key: str, due_ms: int) -> None:
        if key in seen:
            return
        seen.add(key)
        late.append(time.time() * 1000 - due_ms)
        if len(seen) == n:
            done.set()

    async with peer.worker(probe):
        start_ms = now_ms() + int(lead_s * 1000)
        for i in range(0, n, CHUNK):
            stop = min(n, i + CHUNK)
            await peer.schedule_many(
                [(f"r{rate}:{k}", start_ms + k * 1000 // rate) for k in range(i, stop)]
            )
        overran = max(0, now_ms() - start_ms)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), seconds + 2 + give_up_s)
    return late, len(seen), overran


@dataclass
class Peak:
    """One evening peak: what ran, how late, and the CPU it took."""

    jobs: int  # jobs due over the peak
    late: list[float]  # ms, one per run (a job run twice counts twice)
    seen: set[str]  # the job ids that ran
    worker_cpu_s: float  # this process's CPU from the first due time to the last run
    opened: Any  # what ``measure`` returned when the window opened
    closed: Any  # and when it closed
    stats: LoaderStats  # the worker's


async def evening_peak(
    sched: Scheduler,
    rate: int,
    seconds: float,
    measure: Callable[[], Awaitable[Any]],
    *,
    payload: bytes = b"",
    opening: Callable[[], Awaitable[Any]] | None = None,
) -> Peak:
    """``rate`` jobs due per second for ``seconds`` (ids ``peak:K``, task ``remind``),
    scheduled ahead beside whatever ``sched`` holds, run by one :class:`Worker` that owns
    every shard. ``measure`` (say, Redis's CPU so far) is awaited when the first job is
    due and once the last has run, ``opening`` (if given) instead of it at the start."""
    n_peak = int(rate * seconds)
    start_ms = int(time.time() * 1000 + (PEAK_LEAD + n_peak / 50_000) * 1000)
    for lo in range(0, n_peak, CHUNK * 10):
        await sched.schedule_many(
            JobSpec(f"peak:{k}", "remind", payload, at=start_ms + k * 1000 // rate)
            for k in range(lo, min(n_peak, lo + CHUNK * 10))
        )
    reg = TaskRegistry()
    late, seen, all_ran = lateness_probe(reg, "remind", n_peak)
    worker = Worker(sched, reg, lookahead=1.0, limit=PEAK_LIMIT, poll_interval=PEAK_POLL)
    running = asyncio.ensure_future(worker.run())
    # The measured window: from the first due time to the last job run.
    await asyncio.sleep(max(0.0, start_ms / 1000 - time.time()))
    cpu0 = time.process_time()
    opened = await (opening or measure)()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_ran.wait(), seconds + PEAK_FINISH_TIMEOUT)
    cpu = time.process_time() - cpu0
    closed = await measure()
    worker.stop()
    stats = await running
    return Peak(n_peak, late, seen, cpu, opened, closed, stats)
