"""Redis Cluster: slots per shard, spread over masters, failover, WAIT durability.

The rest of the durable and spill suites also runs on the session's cluster (the
``[cluster]`` backend of ``redis_url``); these are the tests only a cluster can answer.
Failover tests start a cluster of their own and kill a master by pid.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from redis.crc import key_slot

from tests.durable_support import check_all, open_scheduler, run
from tickwheel.durable import (
    JobSpec,
    JobState,
    Keys,
    RedisUnavailable,
    ReplicationTimeout,
    Scheduler,
    connect,
)
from tickwheel.durable.servers._redis import RedisClusterServer, RedisServer
from tickwheel.durable.store._connect import client_from_url, parse_nodes

pytestmark = pytest.mark.redis


def _masters_by_slot(cluster: RedisClusterServer) -> list[tuple[int, int, int]]:
    """(first slot, last slot, master port) of the live cluster."""
    import redis

    with redis.Redis(port=cluster.nodes[0].port) as c:
        slots: Any = c.execute_command("CLUSTER", "SLOTS")
    return [(int(a), int(b), int(m[1])) for a, b, m, *_ in slots]


def test_every_shard_is_one_slot_and_the_server_agrees(redis_cluster: RedisClusterServer) -> None:
    import redis

    keys = Keys("tickwheel", 16)
    with redis.Redis(port=redis_cluster.nodes[0].port) as c:
        for s in range(16):
            sk = keys.shard(s)
            names = [*(k for k in sk if isinstance(k, str)), *sk.jobs]
            slots = {int(c.execute_command("CLUSTER", "KEYSLOT", k)) for k in names}
            assert slots == {key_slot(sk.due.encode())}, (s, slots)


def test_16_shards_give_every_master_at_least_3(redis_cluster: RedisClusterServer) -> None:
    ranges = _masters_by_slot(redis_cluster)
    assert len({port for *_, port in ranges}) == 3
    for namespace in ["tickwheel", "shop", *(uuid.uuid4().hex[:8] for _ in range(300))]:
        keys = Keys(namespace, 16)
        per_master: dict[int, int] = {}
        for s in range(16):
            slot = key_slot(keys.shard(s).due.encode())
            port = next(p for a, b, p in ranges if a <= slot <= b)
            per_master[port] = per_master.get(port, 0) + 1
        assert len(per_master) == 3 and min(per_master.values()) >= 3, (namespace, per_master)


def test_connect_tells_a_cluster_from_one_redis(
    redis_cluster: RedisClusterServer, redis_server: RedisServer
) -> None:
    from redis.asyncio.cluster import RedisCluster

    async def main() -> None:
        node = f"redis://127.0.0.1:{redis_cluster.nodes[1].port}/0"
        for url, cluster in [(redis_cluster.url, True), (node, True), (redis_server.url, False)]:
            client = await connect(url)
            assert isinstance(client, RedisCluster) is cluster, url
            await client.aclose()
        with pytest.raises(ValueError, match="database 0 only"):
            await connect(f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/3")
        with pytest.raises(ValueError, match="scheme"):
            await connect("http://127.0.0.1:1")
        with pytest.raises(RedisUnavailable, match=r"127\.0\.0\.1:1"):
            await connect("redis://127.0.0.1:1/0")

    run(main())
    assert parse_nodes("a:1,[::1]:2,b") == [("a", 1), ("::1", 2), ("b", 6379)]
    with pytest.raises(ValueError, match="port"):
        parse_nodes("a:x")


def test_server_check_covers_every_master(redis_cluster: RedisClusterServer) -> None:
    async def main() -> None:
        async with open_scheduler(redis_cluster.url, check=True) as s:
            with pytest.warns(UserWarning, match="AOF is off"):
                await s.open()
            report = s.server_report
            assert report is not None and report.cluster_enabled and report.cluster_state == "ok"
            masters = {f"127.0.0.1:{n.port}" for n in redis_cluster.nodes[:3]}
            assert {p.split(": ")[0] for p in report.problems} == masters

    run(main())


def test_replication_timeout_when_fewer_replicas_confirm(redis_url: str) -> None:
    # The session cluster has 1 replica per master and the single server none: asking
    # for one more than there are times out, after writing on the master.
    wanted = 2 if "cluster" in redis_url else 1

    async def main() -> None:
        async with open_scheduler(redis_url, replicas=wanted, replica_timeout=0.05) as s:
            with pytest.raises(ReplicationTimeout) as info:
                await s.schedule("r1", "t", delay=60)
            assert info.value.wanted == wanted and info.value.acked == wanted - 1
            assert info.value.transient
            job = await s.get("r1")
            assert job is not None  # on the master all the same; a retry is safe
            with pytest.raises(ReplicationTimeout):
                await s.schedule_many([JobSpec(f"m{i}", "t", delay=60) for i in range(40)])
            assert all([await s.get(f"m{i}") for i in range(40)])

    run(main())


def test_end_states_wait_for_replicas_too(redis_url: str) -> None:
    """ack, retry and release WAIT like the producer writes: each is applied on the
    master, then refused with ReplicationTimeout when too few replicas confirm."""
    wanted = 2 if "cluster" in redis_url else 1

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1, replicas=wanted, replica_timeout=0.05) as s:
            with pytest.raises(ReplicationTimeout):
                await s.schedule_many([JobSpec(f"e{i}", "t", delay=0) for i in range(3)])
            assert await s.ownership.take(0)
            try:
                jobs = {j.id: j for j in (await s.claim(0, limit=3)).jobs}
                assert sorted(jobs) == ["e0", "e1", "e2"]
                with pytest.raises(ReplicationTimeout):
                    await s.ack(jobs["e0"])
                with pytest.raises(ReplicationTimeout):
                    await s.retry(jobs["e1"], "boom", delay=60)
                with pytest.raises(ReplicationTimeout):
                    await s.release([jobs["e2"]])
                assert await s.get("e0") is None  # acked on the master
                e1, e2 = await s.get("e1"), await s.get("e2")
                assert e1 is not None and e1.state is JobState.DUE and e1.attempt == 2
                assert e2 is not None and e2.state is JobState.DUE and e2.attempt == 1
            finally:
                await s.ownership.give_back_all()

    run(main())


def test_wait_confirms_on_one_redis_with_a_replica() -> None:
    with RedisServer() as master, RedisServer() as replica:
        import redis

        with redis.Redis(port=replica.port) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", master.port)
            deadline = time.monotonic() + 20
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "replica did not sync"
                time.sleep(0.05)

        async def main() -> None:
            async with open_scheduler(master.url, replicas=1, replica_timeout=2.0) as s:
                await s.schedule("w", "t", delay=60)
                await s.schedule_many([JobSpec(f"b{i}", "t", delay=60) for i in range(50)])
                assert await s.cancel("b0")
                assert await s.reschedule("b1", delay=120)
            # WAIT returned, so the replica holds every write already.
            async with open_scheduler(replica.url, namespace=s.keys.namespace) as r2:
                # Store.get: the read-only script (a replica refuses open()'s init write).
                def get(job_id: str) -> Any:
                    return r2.store.get(r2.keys.shard_of(job_id), job_id)

                assert await get("w") is not None
                assert await get("b0") is None
                assert all([await get(f"b{i}") for i in range(1, 50)])

        run(main())


async def _wait_promoted(cluster: RedisClusterServer, slot: int, old_port: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            port = await asyncio.to_thread(lambda: cluster.master_of_slot(slot).port)
        except Exception:
            port = old_port
        if port != old_port:
            await asyncio.to_thread(cluster.wait_healthy)
            return port
        await asyncio.sleep(0.1)
    raise AssertionError(f"no replica took over slot {slot}")


def test_wait_durability_survives_killing_the_master_at_once() -> None:
    with RedisClusterServer(masters=3, replicas=1) as cluster:

        async def main() -> None:
            async with open_scheduler(cluster.url, replicas=1, replica_timeout=2.0) as s:
                shard = 0
                slot = key_slot(s.keys.shard(shard).due.encode())
                ids = [f"job{i}" for i in range(400) if s.keys.shard_of(f"job{i}") == shard]
                master = cluster.master_of_slot(slot)
                for job_id in ids:
                    await s.schedule(job_id, "t", delay=3600)
                master.kill()  # right after the last schedule() returned
                await _wait_promoted(cluster, slot, master.port)
                missing = [j for j in ids if await _get_retrying(s, j) is None]
                assert missing == [], f"{len(missing)} of {len(ids)} lost: {missing[:5]}"

        run(main())


async def _get_retrying(s: Scheduler, job_id: str) -> Any:
    for _ in range(50):
        try:
            return await s.get(job_id)
        except RedisUnavailable:
            await asyncio.sleep(0.1)
    return await s.get(job_id)


def test_shards_keep_working_when_a_master_dies() -> None:
    with RedisClusterServer(masters=3, replicas=1) as cluster:

        async def main() -> None:
            async with open_scheduler(cluster.url, shards=16) as s:
                for shard in range(16):
                    assert await s.take(shard)
                await s.schedule_many([JobSpec(f"a{i}", "t") for i in range(200)])
                victim = cluster.master_of_slot(key_slot(s.keys.shard(0).due.encode()))
                victim.kill()
                await _wait_promoted(cluster, key_slot(s.keys.shard(0).due.encode()), victim.port)
                # The client follows MOVED to the promoted replica; claim and ack on
                # every shard, those of the dead master included.
                seen: set[str] = set()
                deadline = time.monotonic() + 30
                while len(seen) < 200 and time.monotonic() < deadline:
                    for shard in range(16):
                        try:
                            batch = await s.claim(shard, limit=100)
                            await s.ack_many(batch.jobs)
                        except RedisUnavailable:
                            await asyncio.sleep(0.1)
                            continue
                        seen.update(j.id for j in batch.jobs)
                assert seen == {f"a{i}" for i in range(200)}
                assert await check_all(s) == {}
                # New work lands on the new master too.
                await s.schedule("after", "t")
                batch = await s.claim(s.keys.shard_of("after"))
                assert [j.id for j in batch.jobs] == ["after"]

        run(main())


def test_plain_client_from_a_cluster_url_is_refused_for_unix() -> None:
    with pytest.raises(ValueError, match="unix"):
        client_from_url("unix:///tmp/x.sock", cluster=True)
