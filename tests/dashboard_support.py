"""Helpers of the dashboard tests: the app in a real uvicorn on a free loopback port,
a worker in a thread of its own, and the test client's way to write."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from durable_support import open_scheduler
from starlette.testclient import TestClient

from tickwheel.durable import TaskRegistry
from tickwheel.durable.ops.dashboard import DashboardConfig, create_app
from tickwheel.durable.runtime._worker import Worker

TOKEN = "test-token-0123456789abcdef"
BASE = "http://127.0.0.1"
# Chromium of the distribution (never a browser Playwright downloads);
# $TICKWHEEL_CHROMIUM names another build.
CHROMIUM = os.environ.get("TICKWHEEL_CHROMIUM") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def config(url: str, namespace: str, **kwargs: Any) -> DashboardConfig:
    """A dashboard config with the test token and fast chart samples."""
    kwargs.setdefault("token", TOKEN)
    kwargs.setdefault("sample_interval", 0.2)
    return DashboardConfig(url, namespace, **kwargs)


@contextmanager
def api_client(url: str, namespace: str, **kwargs: Any) -> Iterator[TestClient]:
    """A Starlette TestClient (httpx) on the app, its lifespan running."""
    app = create_app(config(url, namespace, **kwargs))
    with TestClient(app, base_url=BASE, raise_server_exceptions=True) as client:
        yield client


def bearer() -> dict[str, str]:
    """Headers of a script that writes with the token."""
    return {"Authorization": f"Bearer {TOKEN}"}


def login(client: TestClient) -> str:
    """Log the client in (its cookie jar keeps the session); return the CSRF token
    from a page's form."""
    r = client.post("/login", data={"token": TOKEN, "next": "/job"}, headers={"Origin": BASE})
    assert r.status_code == 200, r.text  # followed the 303 to /job
    page = client.get("/job").text
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


class LiveDashboard:
    """The app served by uvicorn in a thread, on a free loopback port."""

    def __init__(self, cfg: DashboardConfig) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(cfg), log_level="warning", access_log=False, lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LiveDashboard:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


class WorkerThread:
    """A :class:`Worker` of the namespace running on its own loop in a thread."""

    def __init__(self, url: str, namespace: str, registry: TaskRegistry, **kwargs: Any) -> None:
        self.url, self.namespace, self.registry = url, namespace, registry
        self.shards = kwargs.pop("shards", 4)
        self.sample_s = kwargs.pop("sample_s", 0.5)  # chart samples: fast, for the tests
        self.kwargs = {"poll_interval": 0.05, "lookahead": 0.0, **kwargs}
        self.started = threading.Event()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def body() -> None:
            async with open_scheduler(self.url, self.namespace, shards=self.shards) as sched:
                self._loop = asyncio.get_running_loop()
                self._worker = Worker(sched, self.registry, **self.kwargs)
                self._worker.stats_publisher.sample_s = self.sample_s
                self.started.set()
                await self._worker.run()

        try:
            asyncio.run(body())
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self.started.set()

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        assert self.started.wait(20)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._worker is not None:
            self._loop.call_soon_threadsafe(self._worker.stop)
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def artifacts_dir(fallback: Path) -> Path:
    """Where screenshots go: ``$TICKWHEEL_ARTIFACTS`` or the test's tmp_path."""
    where = Path(os.environ.get("TICKWHEEL_ARTIFACTS") or fallback)
    where.mkdir(parents=True, exist_ok=True)
    return where


def wait_for(predicate: Callable[[], bool], within: float, step: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``within`` s passed; return its last value."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def temp_artifacts() -> Path:
    """A fresh directory for a run's screenshots when no test path is at hand."""
    return Path(tempfile.mkdtemp(prefix="tickwheel-dashboard-"))
