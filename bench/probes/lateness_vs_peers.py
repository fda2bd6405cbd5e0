"""Firing lateness of durable jobs: tickwheel's loader beside a peer's worker (arq's by
default), at set rates, in one run.

    .venv/bin/python -m bench.probes.lateness_vs_peers --rates 1000,10000 --seconds 2
        [--peers arq,bullmq,saq,streaq]

Jobs fall due at a steady rate (``--rates``, jobs/s) for ``--seconds``; each records
``time.time()`` when it runs, minus its due time (bench/workloads/durable_lateness.py).
Both sides get the jobs in well before the first is due, use one private redis-server
(flushed before each run), and run in one process on one event loop, one after the
other. tickwheel: one :class:`Loader` (lookahead 0.5 s, poll 50 ms); a peer: its worker
as bench/peers/queues.py sets it (arq: ``poll_delay`` 50 ms, ``max_jobs`` 100), already
running while the jobs go in.
"""

from __future__ import annotations

import argparse
import asyncio

import redis.asyncio

from bench.peers.queues import PEERS, quiet
from bench.workloads.durable_lateness import LEAD_PER_JOB, loader_lateness, peer_lateness
from tickwheel.durable.servers._redis import RedisServer

TIMEOUT = 120.0  # s past the last due time before the jobs not run are given up


def _pcts(late: list[float]) -> str:
    if not late:
        return "no job ran"
    late = sorted(late)
    p = {q: late[min(len(late) - 1, int(len(late) * q))] for q in (0.5, 0.99)}
    return (
        f"p50 {p[0.5]:7.1f} ms  p99 {p[0.99]:7.1f} ms  max {late[-1]:7.1f} ms  "
        f"min {late[0]:6.1f} ms"
    )


async def _peer(lib: str, url: str, rate: int, seconds: float) -> tuple[list[float], int]:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    await client.aclose()
    peer = PEERS[lib](url)
    await peer.open()
    try:
        n = int(rate * seconds)
        late, ran, _ = await peer_lateness(peer, rate, seconds, 1 + n * LEAD_PER_JOB, TIMEOUT)
    finally:
        await peer.close()
    return late, ran


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rates", default="1000,10000", help="jobs per second, comma list")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--peers", default="arq", help=f"comma list of {', '.join(PEERS)}")
    args = parser.parse_args(argv)
    libs = args.peers.split(",")
    unknown = sorted(set(libs) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {unknown}")
    quiet()
    with RedisServer() as server:
        loop = asyncio.new_event_loop()
        try:
            for rate in (int(r) for r in args.rates.split(",")):
                n = int(rate * args.seconds)
                ours = loop.run_until_complete(loader_lateness(server.url, rate, args.seconds))
                print(f"{rate:>6} jobs/s  {'tickwheel':<10} {_pcts(ours)}", flush=True)
                for lib in libs:
                    late, ran = loop.run_until_complete(_peer(lib, server.url, rate, args.seconds))
                    missing = f"  ({n - ran} of {n} not run)" if ran < n else ""
                    print(f"{rate:>6} jobs/s  {lib:<10} {_pcts(late)}{missing}", flush=True)
        finally:
            loop.close()


if __name__ == "__main__":
    main()
