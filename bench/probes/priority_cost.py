"""What priorities cost a claim (issue 35): ``python -m bench.probes.priority_cost``.

    python -m bench.probes.priority_cost [--rounds 30] [--batch 500] [--backlog 20000]

On one private redis-server, three namespaces of one shard each, alike but for the
priorities of their jobs: ``none`` (all 0: no priority index at all), ``half`` (job
``i`` at ``i % 2``) and ``ten`` (``i % 10``: nine levels in use). Each starts with
``--backlog`` jobs due in a day (as many records in each). Then, round after round and
in a rotating order, each gets ``--batch`` due jobs and one claim that leases them all,
and an ack of them. The figures are claim.lua's and ack.lua's own execution time as
Redis measures it (SLOWLOG with a threshold of 0: the script only), medians over the
rounds, and the ratios to ``none``. Callgrind's counts (``python -m
bench.probes.callgrind durable-redis --priorities K``) are the stable per-job figures;
this one is the wall clock of the same scripts, and its noise.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

LEVELS = {"none": 1, "half": 2, "ten": 10}


async def _script_us(client: object, sha: str) -> int:
    log = await client.slowlog_get(100)  # type: ignore[attr-defined]
    times = [e["duration"] for e in log if sha.encode() in e["command"]]
    assert len(times) == 1, log
    return int(times[0])


async def _measure(url: str, rounds: int, batch: int, backlog: int) -> dict[str, list[int]]:
    client = client_from_url(url)
    scheds = {name: Scheduler(client, name, shards=1, check=False) for name in LEVELS}
    out: dict[str, list[int]] = {f"{n} {op}": [] for n in LEVELS for op in ("claim", "ack")}
    try:
        for name, s in scheds.items():
            k = LEVELS[name]
            for i in range(0, backlog, 5000):
                await s.schedule_many(
                    JobSpec(f"b{j}", "t", delay=86400, priority=j % k)
                    for j in range(i, min(i + 5000, backlog))
                )
            await s.take(0)
        any_s = scheds["none"]
        claim_sha, ack_sha = any_s.store._scripts.claim.sha, any_s.store._scripts.ack.sha
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 100_000)
        names = list(LEVELS)
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                s, k = scheds[name], LEVELS[name]
                await s.schedule_many(
                    JobSpec(f"o{r}-{j}", "t", priority=j % k) for j in range(batch)
                )
                await client.slowlog_reset()
                got = await s.claim(0, limit=batch)
                assert len(got.jobs) == batch, (name, got)
                out[f"{name} claim"].append(await _script_us(client, claim_sha))
                await client.slowlog_reset()
                assert all(await s.ack_many(got.jobs))
                out[f"{name} ack"].append(await _script_us(client, ack_sha))
        return out
    finally:
        await client.config_set("slowlog-log-slower-than", 10_000)
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--backlog", type=int, default=20_000)
    args = parser.parse_args()
    with RedisServer() as server:
        out = asyncio.run(_measure(server.url, args.rounds, args.batch, args.backlog))
    print(
        f"claim.lua and ack.lua of {args.batch} jobs beside {args.backlog:,} pending, "
        f"median us over {args.rounds} rounds (ratio to no priorities):"
    )
    for op in ("claim", "ack"):
        base = statistics.median(out[f"none {op}"])
        for name in LEVELS:
            med = statistics.median(out[f"{name} {op}"])
            print(f"  {op:<5} {name:<5} {med:>8.0f} us  {med / base:.2f}")


if __name__ == "__main__":
    main()
