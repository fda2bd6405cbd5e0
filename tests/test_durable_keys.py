"""Key names: one hash slot per script call, stable shard mapping, Lua headers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import pytest
from redis.crc import key_slot

from tests.durable_support import open_scheduler, push_clock, run
from tickwheel.durable import JobSpec, Keys
from tickwheel.durable.model import Limits
from tickwheel.durable.store import Transport, member_of
from tickwheel.durable.store import _calls as store_calls
from tickwheel.durable.store import _pauses as store_pauses
from tickwheel.durable.store._connect import client_from_url
from tickwheel.durable.store._scripts import SCRIPT_NAMES, STANDALONE_SCRIPTS, source

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    ("job_id", "shards", "shard"),
    [
        # Pinned: a change here strands every job already stored under the old mapping.
        # Values are CRC-32 (zlib) of the UTF-8 bytes, mod the shard count.
        ("a", 16, 3),
        ("job-42", 16, 15),
        ("order:1234:charge", 16, 0),
        ("ü", 7, 4),
        ("a", 1, 0),
    ],
)
def test_shard_mapping_is_stable(job_id: str, shards: int, shard: int) -> None:
    assert Keys("ns", shards).shard_of(job_id) == shard


def test_every_key_of_a_shard_carries_its_hash_tag() -> None:
    keys = Keys("orders", 4, buckets=8)
    for s in range(4):
        sk = keys.shard(s)
        names = [*(k for k in sk if isinstance(k, str)), *sk.jobs]
        assert len(names) == 17 + 8  # 12, the flow limits' counts, rechecks and wakes, prio, trail
        assert all(k.startswith(f"{{orders:{s}}}:") for k in names)
        assert len({key_slot(k.encode()) for k in names}) == 1
        assert sk.jobs == tuple(f"{{orders:{s}}}:jobs:{b}" for b in range(8))
    assert keys.meta == "{orders}:meta"
    assert keys.paused == "{orders}:paused"


@pytest.mark.parametrize(
    ("job_id", "buckets", "bucket"),
    [
        # First 32 bits of SHA-1 of the UTF-8 bytes, mod the bucket count; the scripts
        # compute the same with redis.sha1hex (checked against Redis below).
        ("a", 64, 0x86F7E437 % 64),
        ("job-42", 64, 0xC150F4BB % 64),
        ("a", 1, 0),
    ],
)
def test_bucket_mapping_is_stable(job_id: str, buckets: int, bucket: int) -> None:
    assert Keys("ns", 1, buckets).bucket_of(job_id) == bucket


def test_python_and_lua_agree_on_buckets(redis_url: str) -> None:
    async def main() -> None:
        client: Any = client_from_url(redis_url)
        keys = Keys("ns", 1, 64)
        lua = "return tonumber(string.sub(redis.sha1hex(ARGV[1]), 1, 8), 16) % 64"
        for job_id in ["a", "job-42", "ü", "x" * 256, "order:1234:charge"]:
            assert await client.eval(lua, 0, job_id) == keys.bucket_of(job_id), job_id
        await client.aclose()

    run(main())


@pytest.mark.parametrize(
    ("namespace", "shards", "error"),
    [
        ("", 16, ValueError),
        ("a{b", 16, ValueError),
        ("a}b", 16, ValueError),
        ("x" * 65, 16, ValueError),
        (b"ns", 16, TypeError),
        ("ns", 0, ValueError),
        ("ns", 16385, ValueError),
        ("ns", True, TypeError),
        ("ns", 2.0, TypeError),
    ],
)
def test_bad_namespace_or_shards(namespace: Any, shards: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"namespace|shards"):
        Keys(namespace, shards)


def test_all_keys_of_each_script_land_in_one_slot(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, list[str]]] = []
    names = {}
    real_run = Transport.run
    real_schedule_call = store_calls.schedule_call

    async def spy(
        self: Transport, script: Any, keys: Sequence[str], args: Sequence[Any], shard: int
    ) -> Any:
        calls.append((names[script.sha], list(keys)))
        return await real_run(self, script, keys, args, shard)

    real_pipelined = Transport.pipelined

    async def spy_pipelined(self: Transport, sent: Sequence[Any], *, wait: bool) -> Any:
        # The flow limits' batches (waits.lua, limits.lua 'A'/'R') go out pipelined.
        for call in sent:
            calls.append((names[call.script.sha], list(call.keys)))
        return await real_pipelined(self, sent, wait=wait)

    def spy_schedule(keys_of: Any, shard: int, jobs: Any, replace: bool) -> Any:
        # schedule.lua goes out in rounds (Transport.batch), not through run: its keys
        # are seen where every call of it builds them.
        keys, args = real_schedule_call(keys_of, shard, jobs, replace)
        calls.append(("schedule", list(keys)))
        return keys, args

    real_pause_call = store_pauses.shard_pause_call

    def spy_pause(*args: Any, **kwargs: Any) -> Any:
        # pause.lua goes out in a pipeline over the shards: seen where it is built.
        keys, rest = real_pause_call(*args, **kwargs)
        calls.append(("pause", list(keys)))
        return keys, rest

    monkeypatch.setattr(Transport, "run", spy)
    monkeypatch.setattr(Transport, "pipelined", spy_pipelined)
    monkeypatch.setattr(store_calls, "schedule_call", spy_schedule)
    monkeypatch.setattr(store_pauses, "shard_pause_call", spy_pause)

    async def main() -> None:
        async with open_scheduler(redis_url, shards=4) as s:
            for name in SCRIPT_NAMES:
                names[getattr(s.store._scripts, name).sha] = name
            for shard in range(4):
                await s.take(shard)
                await s.ownership.renew(shard)
            await s.now(1)
            await s.schedule_many([JobSpec(f"k{i}", "t", max_attempts=1) for i in range(20)])
            await s.schedule("r", "t", every=5)
            await s.schedule("deb", "t", debounce=5)  # flow.lua
            await s.reschedule("r", delay=0)
            await s.get("k1")
            await s.pause("other")  # claims read the copy; t still runs
            await s.paused()
            for shard in range(4):
                batch = await s.claim(shard)
                if batch.jobs:
                    await s.extend(batch.jobs[0])
                    await s.retry(batch.jobs[0], "x")
                    await s.ack_many(batch.jobs[1:2])
                    await s.release(batch.jobs[2:3])
                await push_clock(s, shard, 60_000)
                await s.reap(shard)
                page = await s.dead_letters(shard)
                await s.requeue_dead([j.id for j in page.jobs[:1]])
                await s.purge_dead([j.id for j in page.jobs[1:2]])
                await s.purge_all_dead(shard)
            await s.resume("other")
            await s.cancel("k2")
            assert not await s.store.raise_epoch(3, 0)
            assert await s.workers.heartbeat("w1", 10_000, True) == 1
            assert len(await s.inspect()) == 4
            await s.store.due_list(0, 0, 10)
            await s.store.due_rank(0, 0)
            # The flow limits: limits.lua in the key's own slot, wake.lua in the shard's.
            await s.schedule("lk", "t", key="merchant:1")
            (job,) = [j for j in (await s.claim(s.keys.shard_of("lk"))).jobs if j.id == "lk"]
            lim, limits = Limits(1, 5, 1000), s.store.limits
            await limits.acquire(job, lim, 1000)
            await limits.extend(job, lim, 1000)
            await limits.look("t", "merchant:1", lim)
            await limits.release("t", job.key, member_of(job), "x", lim=lim, hold_ms=1000)
            await limits.wake("t", member_of(job))
            await limits.wait(job, 100, permit=True)
            # Batches: waits.lua in the shard; limits.lua 'A' of one key (on one Redis a
            # batch spans keys of many slots by design: one call per key on a cluster).
            (job,) = [j for j in (await s.claim(s.keys.shard_of("lk"))).jobs if j.id == "lk"]
            assert await limits.acquire_many([(job, lim)], 1000) == [(1, 0)]
            await limits.wait_many(job.shard, [(job, 100, True)])
            await limits.wake_many([("t", member_of(job))])
            await limits.claim_woken(job.shard, job.epoch, [("t", "lk")], 1000, token="w1")
            await s.close()

    run(main())
    assert {name for name, _ in calls} == set(SCRIPT_NAMES)
    for name, keys in calls:
        assert len({key_slot(k.encode()) for k in keys}) == 1, (name, keys)


@pytest.mark.parametrize("name", SCRIPT_NAMES + STANDALONE_SCRIPTS)
def test_lua_header_lists_keys_argv_returns_errors(name: str) -> None:
    text = resources.files("tickwheel.durable.store").joinpath("lua", f"{name}.lua").read_text()
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    head = "\n".join(header)
    assert header[0].startswith(f"-- {name}.lua: ")
    assert "KEYS[1]" in head
    assert "Returns:" in head
    assert "Errors:" in head
    # Every KEYS[n] the body uses is documented in the header.
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", text)}
    documented = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", head)}
    assert used <= documented
    assert source(name).endswith(text)


def test_the_record_layout_is_the_same_on_both_sides() -> None:
    """_codec.py's FIELDS and DEFAULTS are _lib.lua's F_* constants and DEFAULTS."""
    from tickwheel.durable.store._codec import DEFAULTS, FIELDS

    lib = resources.files("tickwheel.durable.store").joinpath("lua", "_lib.lua").read_text()
    lua_fields: dict[int, str] = {}
    for names, values in re.findall(r"^local (F_[A-Z_, ]+) = ([\d, ]+)$", lib, flags=re.M):
        for name, value in zip(names.split(","), values.split(","), strict=True):
            lua_fields[int(value)] = name.strip().removeprefix("F_").lower()
    assert [lua_fields[i] for i in sorted(lua_fields)] == list(FIELDS)
    assert sorted(lua_fields) == list(range(1, len(FIELDS) + 1))
    assert re.search(rf"^local NFIELDS = {len(FIELDS)}$", lib, flags=re.M)
    (table,) = re.findall(r"^local DEFAULTS = \{(.*)\}$", lib, flags=re.M)
    lua_defaults = [b"" if v.strip() == "''" else int(v) for v in table.split(",")]
    assert lua_defaults == list(DEFAULTS)
