"""Redis instructions per job of the flow limits' batched calls (issue 35,
docs/limits.md "Costs"), counted with redis-server under callgrind:

    python -m bench.probes.callgrind.flow_limits [--jobs 1000] [--keys 100]
        [--durable-dir OLD/durable]

``--jobs`` due jobs over ``--keys`` flow keys of a task with ``concurrency=4``, in 4
shards, claimed; then each step's calls, the counters zeroed before and dumped after
(each figure includes its calls' own cost shared over their jobs; the scripts are
loaded before):

- **claim** and **ack**: the unlimited job's whole Redis cost (every job's claim, in
  claims of 1,000; the acks of the jobs granted a permit, one call per shard): the
  budget a limited job's extra is compared with;
- **permit taken**: limits.lua 'A' of every job (the first ``4 x keys`` are granted,
  the rest queued as waiters);
- **wait written**: waits.lua 'w' of the waiters (one call per shard);
- **permit released**: limits.lua 'R' of the granted ones (each hands its permit to
  the next waiter);
- **the waiter's start**: woken.lua (woken and leased to the releasing worker in one
  call a shard) where the version has it; and, for every version, the older path: its
  wake (waits.lua 'k'), a claim of each shard, and the permit taken again ('A');
- where the version has it (``ClaimLimits``), the claim that takes the permits itself
  (one Redis): every job's claim with its permit taken or its wait written, then the
  permits released, woken.lua and the acks as above.

``--durable-dir`` loads ``tickwheel.durable`` from another checkout's ``durable/``
(bench/probes/_checkout.py), for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from typing import Any

from bench.probes._checkout import load_durable
from bench.probes.callgrind._tools import TracedServer, missing

SHARDS = 4
CONCURRENCY = 4


async def _count(server: TracedServer, jobs: int, keys: int) -> dict[str, float]:
    from tickwheel.durable import JobSpec, Limits, Scheduler, store
    from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, member_of
    from tickwheel.durable.store._connect import client_from_url
    from tickwheel.durable.store._scripts import SCRIPT_NAMES

    lim = Limits(concurrency=CONCURRENCY)
    client = client_from_url(f"redis://127.0.0.1:{server.port}")
    out: dict[str, float] = {}
    try:
        for path in ("woken", "wake+claim+acquire", "in the claim"):
            s = Scheduler(client, f"cg-{path[:5]}", shards=SHARDS, check=False)
            await s.open()
            calls: Any = s.store.limits
            if path == "woken" and not hasattr(calls, "claim_woken"):
                continue
            if path == "in the claim":
                if not hasattr(store, "ClaimLimits"):
                    continue
                limits = store.ClaimLimits(30_000, 60_000, {"t": lim})
                out.update(await _in_the_claim(server, s, limits, jobs, keys))
                continue
            for name in SCRIPT_NAMES:  # loaded before: no figure counts a first load
                await client.script_load(getattr(s.store._scripts, name).script)
            await calls.declare({"t": lim})
            await s.schedule_many([JobSpec(f"j{i}", "t", key=f"k{i % keys}") for i in range(jobs)])
            claimed = []
            for shard in range(SHARDS):
                await s.take(shard)
            server.zero()
            for shard in range(SHARDS):
                claimed += await _claim_all(s, shard)
            out["claim (any job: the unlimited cost)"] = server.dump() / jobs
            claimed.sort(key=lambda j: int(j.id[1:]))
            server.zero()
            codes = await calls.acquire_many([(j, lim) for j in claimed], 30_000)
            out["permit taken"] = server.dump() / jobs
            granted = [j for j, c in zip(claimed, codes, strict=True) if c[0] == ACQUIRED]
            waiting = [j for j, c in zip(claimed, codes, strict=True) if c[0] == PERMIT_WAIT]
            by_shard: dict[int, list[Any]] = {}
            for job in waiting:
                by_shard.setdefault(job.shard, []).append((job, 60_000, True))
            server.zero()
            for shard, waits in by_shard.items():
                await calls.wait_many(shard, waits)
            out["wait written"] = server.dump() / len(waiting)
            releases = [("t", j.key, member_of(j), f"{j.epoch}:{j.attempt}", lim) for j in granted]
            server.zero()
            handed = [m for ms in await calls.release_many(releases, 30_000) for m in ms]
            out["permit released"] = server.dump() / len(granted)
            if path == "woken":
                woken: dict[int, list[tuple[str, str]]] = {}
                for member in handed:
                    text, _, job_id = member.partition("|")
                    woken.setdefault(int(text), []).append(("t", job_id))
                server.zero()
                for shard, items in woken.items():
                    epoch = s.ownership.owned[shard]
                    await calls.claim_woken(shard, epoch, items, 6000, token="cg", prestart=True)
                out["woken and leased (woken.lua)"] = server.dump() / len(handed)
                await _ack(server, s, granted, out)
                continue
            server.zero()
            await calls.wake_many([("t", m) for m in handed])
            out["woken (waits.lua k)"] = server.dump() / len(handed)
            server.zero()
            again = []
            for shard in range(SHARDS):
                again += await _claim_all(s, shard)
            out["claimed again"] = server.dump() / len(handed)
            server.zero()
            await calls.acquire_many([(j, lim) for j in again], 30_000)
            out["permit taken again"] = server.dump() / len(handed)
    finally:
        await client.aclose()
    return out


async def _in_the_claim(
    server: TracedServer, s: Any, limits: Any, jobs: int, keys: int
) -> dict[str, float]:
    """The claim that takes the permits (this version, one Redis): each job's claim with
    its permit taken or its wait written, then the releases, woken.lua and the acks."""
    from tickwheel.durable import JobSpec
    from tickwheel.durable.store import member_of
    from tickwheel.durable.store._scripts import SCRIPT_NAMES

    out: dict[str, float] = {}
    calls: Any = s.store.limits
    for name in SCRIPT_NAMES:
        await s.store.client.script_load(getattr(s.store._scripts, name).script)
    await calls.declare({"t": limits.tasks["t"]})
    await s.schedule_many([JobSpec(f"j{i}", "t", key=f"k{i % keys}") for i in range(jobs)])
    for shard in range(SHARDS):
        await s.take(shard)
    granted: list[Any] = []
    waited = 0
    server.zero()
    for shard in range(SHARDS):
        while True:
            batch = await s.leases.claim(shard, limit=1000, lease=30.0, limits=limits)
            if not batch.jobs and not batch.waited:
                break
            granted += batch.jobs
            waited += batch.waited
    out["claim taking its permit or writing its wait (any limited job)"] = server.dump() / jobs
    lim = limits.tasks["t"]
    releases = [("t", j.key, member_of(j), f"{j.epoch}:{j.attempt}", lim) for j in granted]
    server.zero()
    handed = [m for ms in await calls.release_many(releases, 30_000) for m in ms]
    out["permit released (in the claim's path)"] = server.dump() / len(granted)
    woken: dict[int, list[tuple[str, str]]] = {}
    for member in handed:
        text, _, job_id = member.partition("|")
        woken.setdefault(int(text), []).append(("t", job_id))
    server.zero()
    for shard, items in woken.items():
        epoch = s.ownership.owned[shard]
        await calls.claim_woken(shard, epoch, items, 6000, token="cg2", prestart=True)
    out["woken and leased (in the claim's path)"] = server.dump() / len(handed)
    out["waited in the claim (share of the jobs)"] = waited / jobs
    return out


async def _ack(server: TracedServer, s: Any, granted: list[Any], out: dict[str, float]) -> None:
    """The acks of the runs ``granted`` (one call per shard, as a worker's ack batches)."""
    by_shard: dict[int, list[Any]] = {}
    for job in granted:
        by_shard.setdefault(job.shard, []).append(job)
    server.zero()
    for run in by_shard.values():
        for c in range(0, len(run), 1000):
            await s.ack_many(run[c : c + 1000])
    out["ack (any job: the unlimited cost)"] = server.dump() / len(granted)


async def _claim_all(s: Any, shard: int) -> list[Any]:
    """Every due job of ``shard``, in claims of at most 1,000."""
    jobs: list[Any] = []
    while batch := (await s.claim(shard, limit=1000, lease=30.0)).jobs:
        jobs += batch
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")
    args = parser.parse_args()
    if args.jobs < 2 * CONCURRENCY * args.keys or args.keys < 1:
        raise SystemExit("--jobs must be at least 8 x --keys (some jobs must wait)")
    tool = missing()
    if tool is not None:
        raise SystemExit(f"{tool} not found on PATH")
    if args.durable_dir:
        load_durable(args.durable_dir)
    with tempfile.TemporaryDirectory() as tmp:
        server = TracedServer(tmp, traced=True)
        try:
            figures = asyncio.run(_count(server, args.jobs, args.keys))
        finally:
            server.stop()
    print(
        f"Redis instructions per job ({args.jobs:,} jobs over {args.keys} keys,"
        f" concurrency={CONCURRENCY}, {SHARDS} shards):"
    )
    for name, value in figures.items():
        print(f"  {name:32s} {value:10,.0f}")


if __name__ == "__main__":
    main()
