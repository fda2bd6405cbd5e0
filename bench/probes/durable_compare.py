"""tickwheel's durable hot paths beside arq and BullMQ's Python port, in one run.

    python -m bench.probes.durable_compare [--rounds 5] [--durable-dir DIR]

On one private redis-server, rounds interleave every row (so a load spike of the shared
machine hits them all alike); each row's figure is its median over the rounds, and the
ratios are of medians measured in this run. ``--durable-dir`` loads ``tickwheel.durable``
from another checkout's ``durable/`` (e.g. main's, extracted with ``git archive``), to
compare before and after with the same peers (bench/probes/_checkout.py). The peers are
bench/peers/queues.py's adapters.

Rows: single awaited schedule (tickwheel ``schedule(delay=60)``, arq ``enqueue_job``,
BullMQ ``Queue.add`` with a delay), 1000 per round; the same calls from ``IN_FLIGHT``
tasks at once (a producer serving many requests: bound by the client's CPU, not by the
round trip), 6,400 per round; batch schedule of 10,000 (tickwheel
``schedule_many`` over 16 shards, BullMQ ``addBulk``); claim + ack of 10,000 due jobs on
one shard (tickwheel, claims of 1000 then ``ack_many``).

Each timed section starts after a full garbage collection (``_start``): a collection
owed by the allocations of the section before (the claim+ack of a round frees 10,000
jobs) otherwise lands in whichever section comes next, which moved the batch row by
20% between two versions whose scripts cost the same (slowlog).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.peers import queues as peers
from bench.probes._checkout import load_durable, redis_server_type

SINGLES = 1000
IN_FLIGHT = 64  # tasks scheduling at once, in the in-flight row
IN_FLIGHT_EACH = 100  # schedules per task and round
BATCH = 10_000
PAYLOAD = b"x" * 32


def _start() -> float:
    """A timed section's start: after a full collection (see the module's docstring)."""
    gc.collect()
    return time.perf_counter()


async def _tickwheel_one(s: Any, key: str) -> None:
    await s.schedule(key, "send_email", PAYLOAD, delay=60)  # as the single row's


async def _at(peer: Any, due_ms: int, key: str) -> None:
    await peer.schedule_one(key, due_ms)


async def _in_flight(call: Callable[[str], Awaitable[object]], prefix: str) -> None:
    """``IN_FLIGHT`` tasks at once, each awaiting ``IN_FLIGHT_EACH`` calls in turn."""

    async def task(w: int) -> None:
        for i in range(IN_FLIGHT_EACH):
            await call(f"{prefix}{w}:{i}")

    await asyncio.gather(*(task(w) for w in range(IN_FLIGHT)))


async def _rows(url: str, rounds: int) -> dict[str, list[float]]:
    import redis.asyncio

    from tickwheel.durable import JobSpec, Scheduler  # after --durable-dir's loading

    client = redis.asyncio.Redis.from_url(url)
    arq, bull = peers.ArqPeer(url), peers.BullMQPeer(url)
    await arq.open()
    await bull.open()
    out: dict[str, list[float]] = {}
    seq = iter(range(10**9))

    def rec(name: str, n: int, t: float) -> None:
        out.setdefault(name, []).append(n / (time.perf_counter() - t))

    for _ in range(rounds):
        await client.flushall()
        s = Scheduler(client, f"c{next(seq)}", shards=16, check=False)
        await s.open()
        t = _start()
        for i in range(SINGLES):
            await s.schedule(f"one:{i}", "send_email", PAYLOAD, delay=60)
        rec("single: tickwheel", SINGLES, t)
        far = peers.now_ms() + 3_600_000
        r = next(seq)
        t = _start()
        for i in range(SINGLES):
            await arq.schedule_one(f"a{r}:{i}", far)
        rec("single: arq", SINGLES, t)
        t = _start()
        for i in range(SINGLES):
            await bull.schedule_one(f"b{r}:{i}", far)
        rec("single: bullmq", SINGLES, t)

        calls: dict[str, Callable[[str], Awaitable[object]]] = {
            "tickwheel": functools.partial(_tickwheel_one, s),
            "arq": functools.partial(_at, arq, far),
            "bullmq": functools.partial(_at, bull, far),
        }
        for name, call in calls.items():
            t = _start()
            await _in_flight(call, f"f{r}:")
            rec(f"in flight: {name}", IN_FLIGHT * IN_FLIGHT_EACH, t)

        specs = [JobSpec(f"m{r}:{i}", "send_email", PAYLOAD, delay=3600) for i in range(BATCH)]
        t = _start()
        await s.schedule_many(specs)
        rec("batch: tickwheel", BATCH, t)
        t = _start()
        await bull.schedule_many([(f"bm{r}:{i}", far) for i in range(BATCH)])
        rec("batch: bullmq", BATCH, t)

        c = Scheduler(client, f"d{next(seq)}", shards=1, check=False)
        await c.take(0)
        await c.schedule_many(JobSpec(f"job:{i}", "send_email", PAYLOAD) for i in range(BATCH))
        t = _start()
        n = 0
        while True:
            batch = await c.claim(0, limit=1000)
            if not batch.jobs:
                break
            await c.ack_many(batch.jobs)
            n += len(batch.jobs)
        assert n == BATCH
        rec("claim+ack: tickwheel", BATCH, t)
        await c.close()
        await s.close()
    await arq.close()
    await bull.close()
    await client.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--durable-dir", default="")
    args = ap.parse_args()
    if args.durable_dir:
        load_durable(args.durable_dir)
    peers.quiet()
    server = redis_server_type()().start()
    try:
        rows = asyncio.run(_rows(server.url, args.rounds))
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    for name, rate in med.items():
        print(f"{name:<22} {rate:>10,.0f} jobs/s (median of {len(rows[name])})")
    tw, arq, bull = med["single: tickwheel"], med["single: arq"], med["single: bullmq"]
    print(f"single: tickwheel / arq {tw / arq:.2f}x, tickwheel / bullmq {tw / bull:.2f}x")
    tw, arq, bull = (med[f"in flight: {lib}"] for lib in ("tickwheel", "arq", "bullmq"))
    print(f"in flight: tickwheel / arq {tw / arq:.2f}x, tickwheel / bullmq {tw / bull:.2f}x")
    print(f"batch: tickwheel / bullmq {med['batch: tickwheel'] / med['batch: bullmq']:.2f}x")


if __name__ == "__main__":
    main()
