"""The internals page: every shard's counts, lag, owner, epoch and next due, and the
live workers with their counters (what the first screen used to lead with).

The same bounded reads as the first screen's totals (``_page_overview.internals``: one
pipeline of inspect.lua, two commands for the workers); no sample per task. Routes:
``/internals`` (``?fragment=1``: the part the page refreshes) and ``/api/internals``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ._page_overview import internals
from ._web import REDIS_DOWN, Web

__all__ = ["routes"]


async def _page(web: Web, request: Request) -> Response:
    try:
        data, status, error = await internals(web.ns), 200, ""
    except REDIS_DOWN as exc:
        data = {"created": False, "shards": [], "workers": [], "tasks": []}
        status, error = 503, web.unreachable(exc)
    name = "internals_live.html" if request.query_params.get("fragment") else "internals.html"
    return web.render(request, name, status, o=data, error=error, title="Internals")


async def _api(web: Web, request: Request) -> Response:
    return JSONResponse(await internals(web.ns))


def routes(web: Web) -> list[Route]:
    """The internals page's routes."""
    return [web.read("/internals", _page), web.read("/api/internals", _api)]
