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

from . import _page_dead, _page_jobs, _page_login, _page_overview, _page_recurring
from ._config import DashboardConfig
from ._sessions import SESSION_COOKIE
from ._web import Web

__all__ = ["SESSION_COOKIE", "DashboardConfig", "create_app"]

logger = logging.getLogger("tickwheel.dashboard")

# Seconds a shutdown waits for the sampler to stop, then for the client to close.
SHUTDOWN_BOUND_S = 5.0
# The pages, in the order their routes are matched.
PAGES = (_page_overview, _page_jobs, _page_dead, _page_recurring, _page_login)


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
