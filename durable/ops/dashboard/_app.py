"""The dashboard's ASGI app (Starlette): the pages' routes assembled, the chart sampler
run for the app's lifetime, and the headers every response carries.

Each page is a module of its own (``_page_*.py``: its reads and acts over the namespace
and its routes); what they share is ``_web.py``; who may write, ``_sessions.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import (
    _page_dead,
    _page_history,
    _page_internals,
    _page_jobs,
    _page_keys,
    _page_login,
    _page_overview,
    _page_pause,
    _page_recurring,
)
from ._config import DashboardConfig
from ._sessions import SESSION_COOKIE
from ._web import Web

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_LOGIN_BODY_BYTES",
    "SESSION_COOKIE",
    "DashboardConfig",
    "create_app",
]

logger = logging.getLogger("tickwheel.dashboard")

# Seconds a shutdown waits for the sampler to stop, then for the client to close.
SHUTDOWN_BOUND_S = 5.0
# The largest request body read (bytes): a write's JSON or form (1,000 ids of 256 bytes,
# escaped) fits. A bigger one is refused with 413 before any of it is parsed.
MAX_BODY_BYTES = 2 * 1024 * 1024
# The largest body of a login or a logout (a token and a path).
MAX_LOGIN_BODY_BYTES = 8 * 1024
# The pages, in the order their routes are matched.
PAGES = (
    _page_overview,
    _page_internals,
    _page_jobs,
    _page_keys,
    _page_dead,
    _page_history,
    _page_recurring,
    _page_pause,
    _page_login,
)


def create_app(config: DashboardConfig) -> Starlette:
    """The dashboard as an ASGI app (serve it with uvicorn; test it with httpx)."""
    web = Web(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.ensure_future(_page_overview.sample_charts(web))
        try:
            yield
        finally:
            sampler.cancel()
            # Bounded: a shutdown must end even if a Redis call ignores its cancel.
            await asyncio.wait({sampler}, timeout=SHUTDOWN_BOUND_S)
            if not sampler.done():
                logger.warning(
                    "tickwheel dashboard: the chart sampler did not stop within %.0f s: %r",
                    SHUTDOWN_BOUND_S,
                    sampler.get_stack(),
                )
            try:
                await asyncio.wait_for(web.ns.aclose(), SHUTDOWN_BOUND_S)
            except TimeoutError:
                logger.warning("tickwheel dashboard: closing the Redis client timed out")

    app = Starlette(
        routes=[route for page in PAGES for route in page.routes(web)],
        lifespan=lifespan,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(_BodyLimit),
            Middleware(TrustedHostMiddleware, allowed_hosts=config.allowed_hosts),
        ],
    )
    app.state.dashboard = web
    return app


class _SecurityHeaders:
    """ASGI middleware: headers every response carries (no sniffing, no framing, no
    caching, the Referer kept to this origin)."""

    HEADERS = (
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (b"cache-control", b"no-store"),
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, sending)


class _TooLarge(Exception):
    """The request body passed its limit while it was being read."""


class _BodyLimit:
    """ASGI middleware: a request body larger than :data:`MAX_BODY_BYTES`
    (:data:`MAX_LOGIN_BODY_BYTES` for ``/login`` and ``/logout``) is refused with 413,
    from its Content-Length before a byte of it is read, else (a chunked body) as soon
    as what was read passes the limit; so no form or JSON is parsed from it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def limit(path: str) -> int:
        """The largest body a request to ``path`` may carry."""
        return MAX_LOGIN_BODY_BYTES if path in ("/login", "/logout") else MAX_BODY_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope.get("path", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not (value.isdigit() and len(value) < 20):
                    await _refuse(send, 400, b"malformed Content-Length")
                    return
                if int(value) > limit:
                    await _refuse(send, 413, b"request body too large")
                    return
        read = 0
        started = False

        async def receiving() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        except _TooLarge:
            if not started:
                await _refuse(send, 413, b"request body too large")


async def _refuse(send: Send, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(text)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": text})
