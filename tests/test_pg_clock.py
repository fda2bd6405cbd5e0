"""One clock: the skew between PostgreSQL's clock (where the Postgres mode decides a
delay) and Redis's (where the job fires) is measured and bounded, and ``tickwheel
check --postgres-url`` reports it. Both servers here run on one host, so their true
skew is zero; an offset is injected into the PostgreSQL read the measurement makes."""

from __future__ import annotations

import json

import asyncpg
import pytest

from tests.durable_support import run
from tickwheel.durable.ops.cli import main as cli_main
from tickwheel.durable.postgres import measure, pg_redis_skew
from tickwheel.durable.postgres._clock import warn_of_skew
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

_PG_NOW = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def test_the_measured_skew_bounds_the_true_one(redis_server: RedisServer, pg_url: str) -> None:
    """The interval the measurement gives holds the true skew: 0 between the real
    servers, and an injected +5 s or -2.5 s offset of PostgreSQL's clock read."""

    async def main() -> None:
        client = client_from_url(redis_server.url)
        conn = await asyncpg.connect(pg_url)
        try:
            real = await pg_redis_skew(pg_url, client)
            assert real.samples == 5 and 0.5 <= real.bound_ms < 1000
            assert abs(real.offset_ms) <= real.bound_ms  # one host: one clock

            async def redis_now() -> float:
                seconds, micros = await client.time()
                return int(seconds) * 1000 + int(micros) / 1000

            for injected in (5_000, -2_500):

                async def pg_now(off: int = injected) -> float:
                    return float(await conn.fetchval(_PG_NOW)) + off

                skew = await measure(pg_now, redis_now, samples=3)
                assert abs(skew.offset_ms - injected) <= skew.bound_ms
                assert skew.worst_ms >= abs(injected)
            with pytest.raises(ValueError, match="samples"):
                await measure(pg_now, redis_now, samples=0)
        finally:
            await conn.close()
            await client.aclose()

    run(main())


def test_a_reconcile_warns_of_a_skew_past_the_bound(
    redis_server: RedisServer, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What every reconcile runs: no warning at the true (zero) skew; a warning naming
    the offset when one past 50 ms is injected; a failed reading is no error."""

    async def main() -> None:
        client = client_from_url(redis_server.url)
        conn = await asyncpg.connect(pg_url)
        try:

            async def redis_now() -> float:
                seconds, micros = await client.time()
                return int(seconds) * 1000 + int(micros) / 1000

            async def pg_now(off: float = 0.0) -> float:
                return float(await conn.fetchval(_PG_NOW)) + off

            async def down() -> float:
                raise ConnectionRefusedError("down")

            with caplog.at_level("WARNING", logger="tickwheel.durable"):
                assert await warn_of_skew(pg_now, redis_now) is not None
                assert not caplog.records
                skew = await warn_of_skew(lambda: pg_now(-120.0), redis_now)
                assert skew is not None and abs(skew.offset_ms + 120) <= skew.bound_ms
                assert await warn_of_skew(down, redis_now) is None
            (record,) = caplog.records
            assert "PostgreSQL's clock is -1" in record.getMessage()
        finally:
            await conn.close()
            await client.aclose()

    run(main())


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``tickwheel check ARGV`` in this process: exit code, stdout, stderr."""
    code = cli_main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_reports_the_skew_and_calls_it_a_problem_past_the_bound(
    redis_server: RedisServer, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--redis-url", redis_server.url]
    code, out, _ = _check(capsys, *base, "--json")  # this Redis's own problems may fail it
    assert "clock_skew" not in json.loads(out)  # nothing measured without PostgreSQL
    within, out, err = _check(capsys, *base, "--postgres-url", pg_url, "--json")
    assert within == code, err
    doc = json.loads(out)
    skew = doc["clock_skew"]
    assert skew["max_ms"] == 50.0 and abs(skew["offset_ms"]) <= skew["bound_ms"]
    assert not any("clock" in p for p in doc["problems"])
    strict, out, _ = _check(capsys, *base, "--postgres-url", pg_url, "--max-clock-skew", "0")
    assert strict == 1 and "clock skew        PostgreSQL" in out
    assert "PROBLEM: PostgreSQL's clock" in out and "--max-clock-skew 0 ms" in out
    bad, _, err = _check(capsys, *base, "--postgres-url", pg_url, "--max-clock-skew", "-1")
    assert bad == 2 and "--max-clock-skew" in err
