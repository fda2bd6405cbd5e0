"""Logging in and out: a session cookie made with the dashboard's token.

The cookie is HttpOnly and SameSite=Strict, Secure when the dashboard is served over
https, and lives ``session_ttl`` (12 h by default). A login must come from this
dashboard's own origin, and logins are rate-limited per client address
(``_sessions.LoginLimiter``: 5 wrong tokens a minute, then 429). A logout ends the
session on the server (the old cookie no longer works) and drops the cookie. Routes:
``/login`` (GET: the form; POST: log in) and ``/logout`` (POST).
"""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ._sessions import SESSION_COOKIE, origin_ok
from ._web import Web, form, next_path

__all__ = ["routes"]


async def _login_page(web: Web, request: Request) -> Response:
    return web.render(request, "login.html", title="Log in", next=next_path(request), error="")


async def _login(web: Web, request: Request) -> Response:
    address = request.client.host if request.client else ""
    wait = web.logins.wait(address)
    if wait:  # before the form is read: a guesser gets nothing for its bytes
        refused = web.render(
            request,
            "login.html",
            429,
            title="Log in",
            next=next_path(request),
            error=f"too many wrong tokens: try again in {wait} s",
        )
        refused.headers["Retry-After"] = str(wait)
        return refused
    got = await form(request)
    nxt = next_path(request, str(got.get("next", "/")))
    if not origin_ok(request):
        return web.render(
            request,
            "login.html",
            403,
            title="Log in",
            next=nxt,
            error="cross-origin login refused",
        )
    if not web.sessions.token_ok(str(got.get("token", ""))):
        web.logins.failed(address)
        return web.render(request, "login.html", 401, title="Log in", next=nxt, error="wrong token")
    web.logins.succeeded(address)
    sid, _ = web.sessions.new()
    response = RedirectResponse(nxt, 303)
    # Secure when served over TLS (the browser then never sends it in the clear);
    # on plain http (loopback) a Secure cookie would never come back.
    secure = request.url.scheme == "https"
    max_age = math.ceil(web.config.session_ttl)
    response.set_cookie(
        SESSION_COOKIE,
        sid,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        path="/",
        secure=secure,
    )
    return response


async def _logout(web: Web, request: Request) -> Response:
    # The session named by the cookie ends on the server, whatever else the request
    # carries: its cookie is SameSite=Strict (no other site makes the browser send it),
    # and ending it gives nobody anything; a stolen cookie no longer works after it.
    web.sessions.end(request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def routes(web: Web) -> list[Route]:
    """The login form, logging in, and logging out."""
    return [
        web.unguarded("/login", _login_page, "GET"),
        web.unguarded("/login", _login, "POST"),
        web.unguarded("/logout", _logout, "POST"),
    ]
