"""What 100,000 parked jobs of a paused task cost the claims of the other tasks.

    python -m bench.probes.pause_claim_cost [--parked 100000] [--rounds 30] [--batch 500]

On one private redis-server, two namespaces of one shard each: ``plain`` (nothing
paused, and ``--parked`` jobs due in a day: as many records, so the record hashes are
alike) and ``paused`` (task ``p`` paused, and ``--parked`` due jobs of it, all parked by
the claims that met them before the measurement). Then, round after round and
alternating, each namespace gets ``--batch`` due jobs of task ``o`` and one claim that
leases them all. The figure is claim.lua's own execution time, as Redis measures it
(SLOWLOG with a threshold of 0: the script only, no network, no client), median over
the rounds; the ratio is paused over plain (1.0: no cost).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url


async def _measure(url: str, parked: int, rounds: int, batch: int) -> dict[str, list[int]]:
    client = client_from_url(url)
    plain = Scheduler(client, "plain", shards=1, check=False)
    paused = Scheduler(client, "paused", shards=1, check=False)
    try:
        await paused.pause("p")
        for i in range(0, parked, 5000):
            n = min(5000, parked - i)
            await paused.schedule_many(JobSpec(f"p{i + j}", "p") for j in range(n))
            await plain.schedule_many(JobSpec(f"p{i + j}", "p", delay=86400) for j in range(n))
        for s in (plain, paused):
            await s.take(0)
        done = 0
        while done < parked:
            got = await paused.claim(0, limit=1000)
            assert not got.jobs and got.parked, got
            done += got.parked
        sha = paused.store._scripts.claim.sha  # the same script in both namespaces
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 100_000)
        out: dict[str, list[int]] = {"plain": [], "paused": []}
        for r in range(rounds):
            pair = [("plain", plain), ("paused", paused)]
            for name, s in pair if r % 2 else pair[::-1]:
                await s.schedule_many(JobSpec(f"o{r}-{j}", "o") for j in range(batch))
                await client.slowlog_reset()
                got = await s.claim(0, limit=batch)
                assert len(got.jobs) == batch and got.parked == 0, (name, got)
                log = await client.slowlog_get(100)
                times = [e["duration"] for e in log if sha.encode() in e["command"]]
                assert len(times) == 1, log
                out[name].append(times[0])
        (info,) = await paused.inspect()
        assert info.parked == parked, info
        return out
    finally:
        await client.config_set("slowlog-log-slower-than", 10_000)
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        out = asyncio.run(_measure(server.url, args.parked, args.rounds, args.batch))
    finally:
        server.stop()
    plain, paused = statistics.median(out["plain"]), statistics.median(out["paused"])
    print(
        f"claim.lua of {args.batch} jobs, median over {args.rounds} rounds: "
        f"{plain:.0f} us with nothing paused, {paused:.0f} us beside {args.parked:,} parked "
        f"jobs of a paused task; ratio paused/plain {paused / plain:.3f}"
    )


if __name__ == "__main__":
    main()
