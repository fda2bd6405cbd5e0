"""Serve the dashboard with uvicorn on a socket bound here (so port 0 works and the
printed address is the real one)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from collections.abc import Callable

import uvicorn

from tickwheel.durable.store import shown_url

from ._app import create_app
from ._config import DashboardConfig

__all__ = ["TOKEN_ENV", "is_loopback", "serve"]

# Where the dashboard reads its token; without it one is generated and printed.
TOKEN_ENV = "TICKWHEEL_DASHBOARD_TOKEN"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]


def is_loopback(host: str) -> bool:
    """Is ``host`` a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    config: DashboardConfig,
    host: str,
    port: int,
    *,
    token_given: bool,
    say: Callable[[str], None] = lambda text: print(text, flush=True),
) -> int:
    """Bind ``host:port``, print where (and the token when it was generated), serve
    until interrupted; return 0.

    Raises:
        OSError: if the address cannot be bound.
    """
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host

    def ready() -> None:
        say(
            f"tickwheel dashboard: http://{shown}:{bound}/ (namespace {config.namespace!r}, "
            f"Redis at {shown_url(config.redis_url)}"
            f"{', read-only' if config.read_only else ''})"
        )
        if not config.read_only:
            if token_given:
                say(f"tickwheel dashboard: writes need the token in ${TOKEN_ENV}")
            else:
                say(f"tickwheel dashboard: token for writes (log in with it): {config.token}")

    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    server = _Server(
        uvicorn.Config(
            create_app(config),
            log_level="warning",
            access_log=False,
            lifespan="on",
            server_header=False,
        ),
        ready,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    print("tickwheel dashboard: stopped", file=sys.stderr, flush=True)
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, saying where it listens once it serves: by then its signal
    handlers are in place, so a Ctrl-C right after the address is printed is a graceful
    stop (one that came before them could land anywhere in the start-up)."""

    def __init__(self, config: uvicorn.Config, ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self._ready()
