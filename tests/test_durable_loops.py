"""The loops (ownership, reaper) on real time, and the record codec against Lua's."""

from __future__ import annotations

import asyncio
import gc

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.durable_support import client_of, open_scheduler, push_clock, run
from tests.spill_support import until
from tickwheel.durable import JobState, Loader, Ownership, Reaper, TaskRegistry
from tickwheel.durable.scheduler._scheduler import DEFAULT_MAX_ATTEMPTS
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._codec import DEFAULTS, pack_oneshot, pack_record
from tickwheel.durable.store._msgpack import (
    pack_ack_batch,
    pack_array,
    pack_schedule_batch,
    pack_value,
)
from tickwheel.wheel import TimingWheel

pytestmark = pytest.mark.redis


def test_ownership_loop_takes_renews_and_shares(redis_url: str) -> None:
    async def main() -> None:
        async with (
            open_scheduler(redis_url, shards=4) as a,
            open_scheduler(redis_url, a.keys.namespace, shards=4) as b,
        ):
            # TTL 2 s, renewed every 0.67 s: a loaded CI machine may stall the loop for
            # a second without losing a's shards. The waits poll with generous bounds.
            oa = Ownership(a.store, ttl=2.0)
            ob = Ownership(b.store, ttl=2.0)
            ta = asyncio.create_task(oa.run(max_shards=2))
            assert await until(lambda: sorted(oa.owned) == [0, 1], 10)
            tb = asyncio.create_task(ob.run())
            assert await until(lambda: sorted(ob.owned) == [2, 3], 10)
            await asyncio.sleep(2.5)  # more than a TTL: renewals kept a's shards
            assert sorted(oa.owned) == [0, 1]
            assert sorted(ob.owned) == [2, 3]
            oa.stop()
            await asyncio.wait_for(ta, 5)
            # a stopped renewing: once its tokens expire b takes over with new epochs
            assert await until(lambda: sorted(ob.owned) == [0, 1, 2, 3], 15)
            assert ob.owned[0] == oa.owned[0] + 1
            ob.stop()
            await asyncio.wait_for(tb, 5)
            await ob.give_back_all()
            assert ob.owned == {}
            owner = client_of(a)
            assert await owner.exists(*[a.keys.shard(s).owner for s in range(4)]) == 0

    run(main())


def test_a_dropped_loader_stops_hearing_of_fenced_shards(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as sched:
            own = sched.ownership
            base = own.fenced_subscribers  # the scheduler's own (its claim tokens)
            wheel = TimingWheel()
            first = Loader(sched, TaskRegistry(), wheel)
            second = Loader(sched, TaskRegistry(), wheel)
            assert own.fenced_subscribers == base + 2
            del first  # a worker run that ended: nothing may keep its loader alive
            gc.collect()
            assert own.fenced_subscribers == base + 1
            heard: list[tuple[int, int]] = []
            unsubscribe = own.on_fenced(lambda shard, epoch: heard.append((shard, epoch)))
            own.drop(1, 7)
            assert heard == [(1, 7)]
            assert second.stats.fenced == 1
            unsubscribe()
            unsubscribe()  # twice is harmless
            own.drop(1, 8)
            assert heard == [(1, 7)]
            assert second.stats.fenced == 2
            assert own.fenced_subscribers == base + 1
            wheel.close()

    run(main())


def test_reaper_loop_returns_expired_leases_and_drops_fenced_shards(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=2) as s:
            for shard in range(2):
                await s.take(shard)
            for i in range(6):
                await s.schedule(f"r{i}", "t")
            for shard in range(2):
                await s.claim(shard, lease=1)
                await push_clock(s, shard, 1_001)
            reaper = Reaper(s.ownership, interval=0.01)
            task = asyncio.create_task(reaper.run())
            await asyncio.sleep(0.1)
            for i in range(6):
                info = await s.get(f"r{i}")
                assert info is not None and info.state is JobState.DUE and info.attempt == 2
            # Another owner takes shard 1: the reaper is fenced there and drops it.
            await client_of(s).delete(s.keys.shard(1).owner)
            await s.store.take(1, "other", 10_000)
            await asyncio.sleep(0.1)
            assert sorted(s.ownership.owned) == [0]
            reaper.stop()
            await asyncio.wait_for(task, 5)

    run(main())


def test_python_and_lua_record_defaults_agree() -> None:
    assert DEFAULTS[2] == DEFAULT_MAX_ATTEMPTS


@settings(max_examples=40, deadline=None)
@given(
    task=st.binary(min_size=1, max_size=40),
    # Sizes at each header boundary of msgpack str (fixstr, str8, str16, str32).
    payload=st.binary(max_size=40)
    | st.sampled_from([31, 32, 255, 256, 65535, 65536]).map(lambda n: b"p" * n),
    ints=st.lists(st.integers(0, 2**53), min_size=3, max_size=3),
)
def test_python_record_matches_cmsgpack(
    redis_server: RedisServer, task: bytes, payload: bytes, ints: list[int]
) -> None:
    """A record packed in Python is byte for byte what the scripts' cmsgpack packs."""
    client = redis.Redis.from_url(redis_server.url)
    lua = (
        "return cmsgpack.pack(ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),"
        " tonumber(ARGV[5]))"
    )
    fields: list[int | bytes] = [task, payload, *ints]
    assert b"".join(pack_value(f) for f in fields) == client.eval(lua, 0, *fields)
    # Trailing defaults are dropped, as rec_encode drops them.
    assert pack_record([task, payload, DEFAULTS[2], 0, 0, 1, 0]) == pack_record([task, payload])
    # A batch array unpacks to the same values.
    assert client.eval("return cmsgpack.unpack(ARGV[1])", 0, pack_array(fields)) == fields
    # A new one-shot record is the generic record of the same fields, for every max and
    # flags (defaults dropped or not), and it decodes in Lua to them.
    for max_attempts, flags in ((DEFAULTS[2], 0), (1, 0), (200, 0), (DEFAULTS[2], 1), (7, 1)):
        generic = pack_record([task, payload, max_attempts, flags, 0, 1, 0])
        assert pack_oneshot(task, payload, max_attempts, flags) == generic
    # The fixed-width batches unpack in Lua to their values (the ints as numbers).
    times = [min(i, 2**53) for i in ints]
    ack = [(task, times[0], times[1], times[2], 1023), (payload, 1, 0, 0, 0)]
    got = client.eval("return cmsgpack.unpack(ARGV[1])", 0, pack_ack_batch(ack))
    assert got == [v for item in ack for v in item]
    sched = [(task, 1, times[0], payload), (payload, 0, times[1], task)]
    got = client.eval("return cmsgpack.unpack(ARGV[1])", 0, pack_schedule_batch(sched))
    assert got == [v for item in sched for v in item]
    client.close()


def test_batches_refuse_values_out_of_range() -> None:
    with pytest.raises(ValueError, match="ack values"):
        pack_ack_batch([(b"a", -1, 0, 0, 0)])
    with pytest.raises(ValueError, match="ack values"):
        pack_ack_batch([(b"a", 1, 0, 0, 65536)])  # the bucket is a uint16
    with pytest.raises(ValueError, match="schedule times"):
        pack_schedule_batch([(b"a", 0, 2**64, b"")])
    with pytest.raises(ValueError, match="mode must be 0 or 1, got 2"):
        pack_schedule_batch([(b"a", 1, 0, b""), (b"b", 2, 0, b"")])
    with pytest.raises(ValueError, match="schedule times"):
        pack_schedule_batch([(b"a", 1, 5, b""), (b"b", 0, -1, b"")])
    with pytest.raises(ValueError, match="4 values each"):
        pack_schedule_batch([(b"a", 1, 5)])  # type: ignore[list-item]
