"""What every page's routes share: the dashboard's state, rendering, the guards, errors as
pages or JSON, and reading a request's fields.

Ground rules:

- Pages are rendered on the server by Jinja2 with autoescape on, so every value a job
  carries (id, task, payload, error) is text; the one inline script gets a per-response
  nonce and the Content-Security-Policy allows no other script.
- Every write (a POST) needs, in this order: a dashboard that is not ``--read-only``;
  the token or a session (``_sessions.py``); for a session, the CSRF check. When the
  dashboard is bound beyond loopback, reads need the token too.
- Errors are answered, never raised to the server: a refusal with its status
  (``_refusals.py``), Redis unreachable a 503 (a page that retries by itself), an error
  reply from Redis a 502 quoting it, a library error a 409. The Redis URL is shown
  without its password.
- A path under ``/api/`` answers JSON; any other, HTML.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tickwheel.durable.model import DurableError, RedisUnavailable
from tickwheel.durable.store import CLUSTER_ERRORS, NO_REPLY_ERRORS, REDIS_ERRORS, hide_secrets

from ._charts import Charts
from ._config import DashboardConfig
from ._human import duration, time_tag, utc
from ._namespace import Namespace
from ._refusals import ActionError
from ._rows import iso
from ._sessions import LoginLimiter, Sessions, origin_ok, same
from ._tasks import DEAD_SAMPLE, DUE_SAMPLE

__all__ = ["PAGE_ROWS", "REDIS_DOWN", "Handler", "Refused", "Web", "form", "next_path"]

# Rows per page of the lists.
PAGE_ROWS = 50
# Seconds between the overview's refreshes (its inline script).
REFRESH_S = 2.0
# What says Redis is out of reach: then a 503, and the page retries by itself.
REDIS_DOWN = (RedisUnavailable, *NO_REPLY_ERRORS, *CLUSTER_ERRORS)


class Refused(ActionError):
    """A request refused by a guard (401/403)."""


def _secs(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s"


async def form(request: Request) -> FormData:
    """The request's form (cached by Starlette); a malformed one reads as empty."""
    try:
        return await request.form()
    except (MultiPartException, ValueError):  # a body that is not a form
        return FormData()


def next_path(request: Request, given: str | None = None) -> str:
    """Where to go after logging in: a path of this dashboard only."""
    nxt = given if given is not None else request.query_params.get("next", "/")
    if not nxt.startswith("/") or nxt.startswith("//") or "\\" in nxt:
        return "/"
    return nxt


class Web:
    """One dashboard's state (its namespace, sessions and charts) and what its routes
    share.

    Args:
        config: what it serves and how it guards it.
    """

    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.ns = Namespace(config.redis_url, config.namespace, config.postgres_url)
        self.sessions = Sessions(config.token, config.session_ttl)
        self.logins = LoginLimiter()
        self.charts = Charts(config.sample_interval)
        self.redis_error = ""  # the last sampler error, shown until a sample works
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("tickwheel.durable.ops.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["iso"] = iso
        self.env.filters["secs"] = _secs
        self.env.filters["q"] = lambda v: quote(str(v), safe="")
        self.env.filters["dur"] = duration
        self.env.filters["utc"] = utc
        self.env.globals["when"] = time_tag
        self.env.globals["due_sample"] = DUE_SAMPLE
        self.env.globals["dead_sample"] = DEAD_SAMPLE

    # -- routes ------------------------------------------------------------------------

    def read(self, path: str, handler: Handler) -> Route:
        """A GET route behind the read guard (the token, when reads are protected)."""
        return Route(path, self._guarded(handler, write=False))

    def write(self, path: str, handler: Handler) -> Route:
        """A POST route behind the write guards."""
        return Route(path, self._guarded(handler, write=True), methods=["POST"])

    def unguarded(self, path: str, handler: Handler, method: str) -> Route:
        """A route without a guard (logging in and out check what they need)."""

        async def endpoint(request: Request) -> Response:
            return await handler(self, request)

        return Route(path, endpoint, methods=[method])

    def _guarded(
        self, handler: Handler, *, write: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        config = self.config

        async def endpoint(request: Request) -> Response:
            try:
                if write:
                    await self._check_write(request)
                elif config.protect_reads and not (
                    self.sessions.csrf_of(request) or self.sessions.bearer_ok(request)
                ):
                    if self.wants_json(request):
                        raise Refused("this dashboard needs the token: log in first", 401)
                    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/login?next={quote(here, safe='')}", 303)
                return await handler(self, request)
            except (ActionError, DurableError, *REDIS_DOWN) as exc:
                return self.failure(request, exc)
            except REDIS_ERRORS as exc:
                return self.failure(request, exc)

        return endpoint

    async def _check_write(self, request: Request) -> None:
        if self.config.read_only:
            raise Refused("this dashboard is read-only (--read-only): writes are refused", 403)
        if self.sessions.bearer_ok(request):
            if "origin" in request.headers and not origin_ok(request):
                raise Refused("cross-origin write refused", 403)
            return
        csrf = self.sessions.csrf_of(request)
        if csrf is None:
            raise Refused("this action needs the dashboard token: log in first", 401)
        if not origin_ok(request):
            raise Refused("cross-origin write refused (Origin is not this dashboard)", 403)
        given = request.headers.get("x-csrf-token")
        if given is None:
            given = str((await form(request)).get("csrf", ""))
        if not same(given, csrf):
            raise Refused("CSRF check failed: reload the page and try again", 403)

    # -- answers -----------------------------------------------------------------------

    @staticmethod
    def wants_json(request: Request) -> bool:
        """Does the request want JSON (a path under ``/api/``)."""
        return request.url.path.startswith("/api/")

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        """The template ``name`` as a page, with its nonce and security policy."""
        nonce = secrets.token_urlsafe(16)
        csrf = self.sessions.csrf_of(request)
        html = self.env.get_template(name).render(
            nonce=nonce,
            csrf=csrf or "",
            logged_in=csrf is not None,
            read_only=self.config.read_only,
            namespace=self.config.namespace,
            where=self.ns.where,
            path=request.url.path,
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            refresh_ms=int(REFRESH_S * 1000),
            **ctx,
        )
        response = HTMLResponse(html, status_code=status)
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        return response

    def failure(self, request: Request, exc: BaseException) -> Response:
        """An error as a page or a JSON document, with its status."""
        if isinstance(exc, ActionError):
            status, message = exc.status, str(exc)
        elif isinstance(exc, REDIS_DOWN):
            status, message = 503, self.unreachable(exc)
        elif isinstance(exc, DurableError):
            status, message = 409, f"{type(exc).__name__}: {exc}"
        else:  # an error reply: Redis answered and refused
            reply = self.hide(str(exc))[:300]
            status, message = 502, f"Redis refused the command: {type(exc).__name__}: {reply}"
        message = self.hide(message)
        if self.wants_json(request):
            return JSONResponse({"error": message, "status": status}, status_code=status)
        return self.render(
            request, "message.html", status, title=f"Error {status}", message=message
        )

    def done(self, request: Request, message: str, back: str, data: dict[str, Any]) -> Response:
        """What a write answers when it worked: JSON, or a page linking ``back``."""
        if self.wants_json(request):
            return JSONResponse({"message": message, **data})
        return self.render(
            request, "message.html", title="Done", message=message, back=back, ok=True
        )

    def hide(self, text: str) -> str:
        """``text`` without a credential of the dashboard's URLs (or of any URL in it)."""
        return hide_secrets(text, self.config.redis_url, self.config.postgres_url)

    def unreachable(self, exc: BaseException) -> str:
        """The sentence for Redis out of reach, without the URL's password."""
        reason = self.hide(str(exc).replace(self.config.redis_url, "<url>"))
        # Any URL in the message (redis-py's or the library's) goes: `where` says it.
        reason = re.sub(r"(cannot reach Redis at )?[\w+.-]+://\S*\s*", "", reason)
        reason = reason.replace("<url>", "").strip(" :") or type(exc).__name__
        return f"Redis is unreachable at {self.ns.where} ({reason}); retrying"

    # -- requests ----------------------------------------------------------------------

    @staticmethod
    async def values(request: Request) -> dict[str, Any]:
        """The request's fields: a JSON object (the API) or the form (the pages)."""
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                body = await request.json()
            except ValueError:
                raise ActionError("the body must be a JSON object") from None
            if not isinstance(body, dict):
                raise ActionError("the body must be a JSON object")
            return body
        got = await form(request)
        out: dict[str, Any] = {k: got.get(k) for k in got}
        out["ids"] = got.getlist("ids")
        return out


# A route's handler: the dashboard's state and the request.
Handler = Callable[[Web, Request], Awaitable[Response]]
