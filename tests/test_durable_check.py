"""The startup check of the server: warn by default, raise in strict mode."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from typing import Any

import pytest
import redis.asyncio

from tests.durable_support import run
from tickwheel.durable import (
    Scheduler,
    ServerCheckFailed,
    ServerConfigWarning,
    check_server,
)
from tickwheel.durable.servers._redis import RedisClusterServer, RedisServer
from tickwheel.durable.store._connect import client_from_url
from tickwheel.durable.store._server_check import crash_loss

pytestmark = pytest.mark.redis


def test_aof_off_warns_by_default_and_raises_when_strict(redis_url: str) -> None:
    # The session server runs without AOF.
    async def main() -> None:
        client = client_from_url(redis_url)
        with pytest.warns(ServerConfigWarning, match="AOF is off"):
            report = await check_server(client)
        assert report.aof_enabled is False and report.maxmemory_policy == "noeviction"
        assert not report.ok and report.version
        with pytest.raises(ServerCheckFailed, match="AOF is off"):
            await check_server(client, strict=True)
        s = Scheduler(client, "chk", strict=True)
        with pytest.raises(ServerCheckFailed):
            await s.schedule("j", "t")
        assert await client.exists("{chk}:meta") == 0
        await client.aclose()

    run(main())


def test_good_server_passes_silently(tmp_path: Any) -> None:
    with RedisServer(appendonly=True, data_dir=tmp_path) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                report = await check_server(client, strict=True)
            assert report.ok and report.aof_enabled and report.unknown == []
            s = Scheduler(client, "good", strict=True)
            await s.open()
            assert s.server_report == report
            await client.aclose()

        run(main())


def test_eviction_policy_is_a_problem(tmp_path: Any) -> None:
    args = ["--maxmemory-policy", "allkeys-lru"]
    with RedisServer(appendonly=True, data_dir=tmp_path, extra_args=args) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            with pytest.raises(ServerCheckFailed, match="allkeys-lru"):
                await check_server(client, strict=True)
            await client.aclose()

        run(main())


class _HidingInfo(redis.asyncio.Redis):
    """A managed Redis that leaves settings out of INFO (as some providers do)."""

    async def info(self, *args: Any, **kwargs: Any) -> Any:
        info = await super().info(*args, **kwargs)
        info.pop("maxmemory_policy", None)
        info.pop("aof_enabled", None)
        return info


def test_config_disabled_is_handled(tmp_path: Any) -> None:
    args = ["--rename-command", "CONFIG", ""]
    with RedisServer(appendonly=True, data_dir=tmp_path, extra_args=args) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            with pytest.raises(redis.exceptions.ResponseError):
                await client.config_get("appendonly")
            # INFO still tells: the check passes without CONFIG.
            assert (await check_server(client, strict=True)).ok
            hiding = _HidingInfo.from_url(server.url)
            # Neither INFO nor CONFIG tells: unknown, a warning even in strict mode.
            with pytest.warns(ServerConfigWarning, match="could not read"):
                report = await check_server(hiding, strict=True)
            assert report.unknown == ["maxmemory-policy", "appendonly"]
            assert report.maxmemory_policy is None and report.aof_enabled is None
            await client.aclose()
            await hiding.aclose()

        run(main())


def test_config_fallback_when_info_lacks_a_field(tmp_path: Any) -> None:
    with RedisServer(appendonly=False, data_dir=tmp_path) as server:

        async def main() -> None:
            hiding = _HidingInfo.from_url(server.url)
            with pytest.raises(ServerCheckFailed, match="AOF is off"):
                await check_server(hiding, strict=True)  # read through CONFIG GET
            await hiding.aclose()

        run(main())


@pytest.mark.parametrize(
    ("appendfsync", "said"),
    [
        ("always", "nothing acknowledged: each write is fsynced"),
        ("everysec", "a host crash or power loss: up to the last ~1 s"),
        ("no", "whatever the OS had not flushed"),
    ],
)
def test_the_report_says_what_a_crash_loses(tmp_path: Any, appendfsync: str, said: str) -> None:
    with RedisServer(appendonly=True, appendfsync=appendfsync, data_dir=tmp_path) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a plain fact, not a warning
                report = await check_server(client, strict=True)
            assert report.ok and report.appendfsync == appendfsync
            assert said in report.crash_loss
            await client.aclose()

        run(main())
        # `tickwheel check` says it in its text and in its JSON.
        cmd = [
            sys.executable,
            "-m",
            "tickwheel.durable.ops.cli",
            "check",
            "--redis-url",
            server.url,
        ]
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert text.returncode == 0, text.stderr
        assert f"appendfsync       {appendfsync}" in text.stdout
        (line,) = [ln for ln in text.stdout.splitlines() if "a crash loses" in ln]
        assert said in line
        out = subprocess.run(
            [*cmd, "--json"], capture_output=True, text=True, timeout=60, check=True
        )
        data = json.loads(out.stdout)
        assert data["appendfsync"] == appendfsync and said in data["crash_loss"]


def test_without_config_the_crash_loss_is_unknown(tmp_path: Any) -> None:
    args = ["--rename-command", "CONFIG", ""]
    with RedisServer(appendonly=True, data_dir=tmp_path, extra_args=args) as server:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(server.url)
            report = await check_server(client, strict=True)  # INFO tells the rest: ok
            assert report.ok and report.aof_enabled is True and report.appendfsync is None
            assert report.crash_loss.startswith("unknown: appendfsync could not be read")
            await client.aclose()

        run(main())
    assert "every write since the last RDB snapshot" in crash_loss(False, "always")
    assert crash_loss(None, None).startswith("unknown: appendonly")


def test_a_cluster_reports_its_masters_appendfsync(redis_cluster: RedisClusterServer) -> None:
    async def main() -> None:
        client = client_from_url(redis_cluster.url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the session cluster runs without AOF
            report = await check_server(client)
        assert report.appendfsync == "everysec"  # RedisClusterServer's default
        assert "AOF is off" in report.crash_loss
        await client.aclose()

    run(main())
