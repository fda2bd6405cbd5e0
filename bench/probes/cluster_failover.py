"""What a master's death loses in Redis's asynchronous-replication window.

Usage::

    .venv/bin/python -m bench.probes.cluster_failover [--trials 5] [--writers 8]

Each trial starts a fresh cluster (3 masters, 3 replicas), runs ``--writers`` tasks that
schedule jobs on shards of one master as fast as they can, kills that master (SIGKILL,
by pid) while they run, waits for its replica to take over, and counts the jobs whose
``schedule()`` had *returned* but which the promoted replica does not hold. It does so
with ``replicas=0`` (plain async replication) and with ``replicas=1`` (WAIT), in the same
trial order. Lost must be 0 with ``replicas=1``; with 0 it is whatever the window held.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from redis.crc import key_slot

from tickwheel.durable import RedisUnavailable, ReplicationTimeout, Scheduler
from tickwheel.durable.servers._redis import RedisClusterServer
from tickwheel.durable.store._connect import client_from_url


async def _trial(replicas: int, writers: int) -> tuple[int, int]:
    with RedisClusterServer(masters=3, replicas=1) as cluster:
        s = Scheduler(client_from_url(cluster.url), "fo", replicas=replicas, check=False)
        await s.open()
        slot = key_slot(s.keys.shard(0).due.encode())
        master = cluster.master_of_slot(slot)
        acked: list[str] = []
        stop = False

        async def writer(w: int) -> None:
            i = 0
            while not stop:
                job_id = f"w{w}:{i}"
                i += 1
                if s.keys.shard_of(job_id) != 0:
                    continue
                try:
                    await s.schedule(job_id, "t", delay=3600)
                except (RedisUnavailable, ReplicationTimeout):
                    await asyncio.sleep(0.05)
                    continue
                acked.append(job_id)

        tasks = [asyncio.ensure_future(writer(w)) for w in range(writers)]
        await asyncio.sleep(1.0)
        master.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if cluster.master_of_slot(slot).port != master.port:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.1)
        stop = True
        await asyncio.gather(*tasks)
        cluster.wait_healthy()
        lost = 0
        for job_id in acked:
            for _ in range(50):
                try:
                    lost += await s.get(job_id) is None
                    break
                except RedisUnavailable:
                    await asyncio.sleep(0.1)
        await s.store.aclose()
        await s.store.client.aclose()
        return lost, len(acked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--writers", type=int, default=8)
    args = parser.parse_args()
    for replicas in (0, 1):
        results = [asyncio.run(_trial(replicas, args.writers)) for _ in range(args.trials)]
        lost = [r[0] for r in results]
        print(
            f"replicas={replicas}: lost per trial {lost} (median {statistics.median(lost)}) "
            f"of {[r[1] for r in results]} acknowledged schedules"
        )


if __name__ == "__main__":
    main()
