"""The PostgreSQL launcher: initdb, start on a free loopback port, kill, restart, stop."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncpg
import pytest

from tickwheel.durable.servers._postgres import (
    PostgresServer,
    PostgresServerError,
    find_postgres_bin,
)

pytestmark = pytest.mark.postgres


async def _query(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_binaries_are_found() -> None:
    found = find_postgres_bin()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert os.access(found / name, os.X_OK)


def test_env_directory_without_binaries_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TICKWHEEL_POSTGRES_BIN", str(tmp_path))
    with pytest.raises(PostgresServerError, match="TICKWHEEL_POSTGRES_BIN"):
        find_postgres_bin()


def _no_other_source(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Hide every source but PATH=``path``: no env, no Debian directory, no pgserver."""
    from tickwheel.durable.servers import _postgres

    monkeypatch.delenv("TICKWHEEL_POSTGRES_BIN", raising=False)
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.setattr(_postgres.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(_postgres.importlib.util, "find_spec", lambda name: None)


def test_pg_config_bindir_is_a_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without pg_ctl on PATH, a pg_config there names the server's binaries (the way
    Python 3.13, which pgserver has no build for, finds a client-only install's server)."""
    bindir = tmp_path / "server-bin"
    bindir.mkdir()
    for name in ("initdb", "pg_ctl", "postgres"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "pg_config").write_text(f"#!/bin/sh\necho {bindir}\n")
    (on_path / "pg_config").chmod(0o755)
    _no_other_source(monkeypatch, on_path)
    assert find_postgres_bin() == bindir


def test_no_postgres_anywhere_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing found fails loudly (the fixtures then error), it never skips."""
    _no_other_source(monkeypatch, tmp_path)
    with pytest.raises(PostgresServerError, match="no PostgreSQL binaries found"):
        find_postgres_bin()


def test_session_server_is_private(pg_server: PostgresServer) -> None:
    assert pg_server.port != 5432
    assert asyncio.run(_query(pg_server.url, "SHOW port")) == str(pg_server.port)
    assert asyncio.run(_query(pg_server.url, "SHOW fsync")) == "on"
    assert asyncio.run(_query(pg_server.url, "SHOW listen_addresses")) == "127.0.0.1"


def test_kill_and_restart_keeps_committed_data() -> None:
    server = PostgresServer().start()
    try:
        asyncio.run(_query(server.url, "CREATE TABLE kept AS SELECT 42 AS v"))
        pid = server.pid
        server.kill()
        assert pid is not None and not PostgresServer._alive(pid)
        with pytest.raises(ConnectionRefusedError):
            asyncio.run(_query(server.url, "SELECT 1"))
        server.start()
        assert asyncio.run(_query(server.url, "SELECT v FROM kept")) == 42
    finally:
        server.stop()
    assert not server.base_dir.exists()
    assert server.pid is None


def test_fresh_database_per_test(pg_url: str) -> None:
    assert (
        asyncio.run(_query(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))
        == 0
    )
