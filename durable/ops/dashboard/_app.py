"""The dashboard's ASGI app (Starlette): HTML pages, a JSON API, and its guards.

Ground rules:

- Pages are rendered on the server by Jinja2 with autoescape on, so every value a job
  carries (id, task, payload, error) is text; the one inline script gets a per-response
  nonce and the Content-Security-Policy allows no other script.
- Every write (a POST) needs, in this order: a dashboard that is not ``--read-only``;
  the token, either as ``Authorization: Bearer <token>`` (scripts: a browser never
  sends that header on its own) or through a session cookie made by logging in with
  it; and for a session, a CSRF check: the request's Origin (or Referer) is this
  dashboard's own, and it carries the session's CSRF token (form field ``csrf`` or
  header ``X-CSRF-Token``). The session cookie is HttpOnly and SameSite=Strict,
  Secure when the dashboard is served over https, and the session expires
  ``session_ttl`` after its login (12 h by default).
- When the dashboard is bound beyond loopback, reads need the token too.
- A bad id, filter or form value is a 400, a missing job a 404, an action on a job that
  moved on a 409, Redis unreachable a 503 with a page that retries by itself: never a
  500 for what an operator typed. The Redis URL is shown without its password.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
import redis.exceptions
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tickwheel.durable.model import DurableError, RedisUnavailable

from ._charts import Charts
from ._data import ActionError, DeadFilter, Namespace, checked_id, iso, parse_when

__all__ = ["SESSION_COOKIE", "DashboardConfig", "create_app"]

logger = logging.getLogger("tickwheel.dashboard")

SESSION_COOKIE = "tw_session"
# Sessions kept at once (the oldest is dropped past it): an operator's browsers, not users.
MAX_SESSIONS = 256
# Seconds a session lives after its login (an operator's working day); then log in again.
DEFAULT_SESSION_TTL = 12 * 3600.0
# Rows per page of the lists.
PAGE_ROWS = 50
# Seconds a shutdown waits for the sampler to stop, then for the client to close.
SHUTDOWN_BOUND_S = 5.0
# Seconds between the overview's refreshes (its inline script).
REFRESH_S = 2.0
_REDIS_DOWN = (
    RedisUnavailable,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.RedisClusterException,  # a cluster that cannot be reached or mapped
)


@dataclass
class DashboardConfig:
    """What one dashboard serves and how it guards it.

    Args:
        redis_url: the Redis (or Redis Cluster) URL.
        namespace: the tickwheel namespace.
        token: the secret every write needs (and every read, with ``protect_reads``).
        read_only: refuse every write.
        protect_reads: reads need the token too (set when bound beyond loopback).
        allowed_hosts: Host header values served (DNS rebinding); ``["*"]`` for any.
        sample_interval: seconds between chart samples.
        postgres_url: the namespace's PostgreSQL in the Postgres mode (docs/postgres.md):
            actions then change the source of truth too; None for Redis only.
        session_ttl: seconds a login session lives; an expired one is refused (401).
    """

    redis_url: str
    namespace: str = "tickwheel"
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    read_only: bool = False
    protect_reads: bool = False
    allowed_hosts: list[str] = field(default_factory=lambda: ["127.0.0.1", "localhost", "[::1]"])
    sample_interval: float = 5.0
    postgres_url: str | None = None
    session_ttl: float = DEFAULT_SESSION_TTL

    def __post_init__(self) -> None:
        if not isinstance(self.token, str) or len(self.token) < 16:
            raise ValueError("token must be a str of at least 16 characters")
        if not (isinstance(self.sample_interval, int | float) and self.sample_interval > 0):
            raise ValueError(f"sample_interval must be > 0 s, got {self.sample_interval!r}")
        ttl = self.session_ttl
        if isinstance(ttl, bool) or not (isinstance(ttl, int | float) and 0 < ttl < math.inf):
            raise ValueError(f"session_ttl must be a finite number of seconds > 0, got {ttl!r}")


class _Refused(ActionError):
    """A write refused by a guard (401/403)."""


class _State:
    """The app's state: the namespace, sessions, the chart sampler."""

    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.ns = Namespace(config.redis_url, config.namespace, config.postgres_url)
        # session id -> (its CSRF token, time.monotonic() it expires at), oldest first
        self.sessions: dict[str, tuple[str, float]] = {}
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

    def new_session(self) -> tuple[str, str]:
        now = time.monotonic()
        for old in [k for k, (_, expires) in self.sessions.items() if expires <= now]:
            del self.sessions[old]
        if len(self.sessions) >= MAX_SESSIONS:
            self.sessions.pop(next(iter(self.sessions)))
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.sessions[sid] = (csrf, now + self.config.session_ttl)
        return sid, csrf

    def csrf_of(self, request: Request) -> str | None:
        """The CSRF token of the request's session; None if it has none, or it expired."""
        return self.session_csrf(request.cookies.get(SESSION_COOKIE, ""))

    def session_csrf(self, sid: str) -> str | None:
        got = self.sessions.get(sid) if sid else None
        if got is None:
            return None
        csrf, expires = got
        if expires <= time.monotonic():
            del self.sessions[sid]
            return None
        return csrf

    def bearer_ok(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        return scheme.lower() == "bearer" and _same(given.strip(), self.config.token)

    def unreachable(self, exc: BaseException) -> str:
        reason = str(exc).replace(self.config.redis_url, "<url>")
        # Any URL in the message (redis-py's or the library's) goes: `where` says it.
        reason = re.sub(r"(cannot reach Redis at )?[\w+.-]+://\S*\s*", "", reason)
        reason = reason.replace("<url>", "").strip(" :") or type(exc).__name__
        return f"Redis is unreachable at {self.ns.where} ({reason}); retrying"


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _secs(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s"


def _origin_ok(request: Request) -> bool:
    """The request comes from a page of this dashboard (Origin, else Referer)."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == own
    referer = request.headers.get("referer")
    if referer is None:
        return False
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}" == own


def create_app(config: DashboardConfig) -> Starlette:
    """The dashboard as an ASGI app (serve it with uvicorn; test it with httpx)."""
    state = _State(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.ensure_future(_sample(state))
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
                await asyncio.wait_for(state.ns.aclose(), SHUTDOWN_BOUND_S)
            except TimeoutError:
                logger.warning("tickwheel dashboard: closing the Redis client timed out")

    def render(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        csrf = state.csrf_of(request)
        html = state.env.get_template(name).render(
            nonce=nonce,
            csrf=csrf or "",
            logged_in=csrf is not None,
            read_only=config.read_only,
            namespace=config.namespace,
            where=state.ns.where,
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

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def failure(request: Request, exc: BaseException) -> Response:
        """An error as a page or a JSON document, with its status."""
        if isinstance(exc, ActionError):
            status, message = exc.status, str(exc)
        elif isinstance(exc, _REDIS_DOWN):
            status, message = 503, state.unreachable(exc)
        elif isinstance(exc, DurableError):
            status, message = 409, f"{type(exc).__name__}: {exc}"
        else:  # an error reply: Redis answered and refused
            reply = str(exc).replace(config.redis_url, "<url>")[:300]
            status, message = 502, f"Redis refused the command: {type(exc).__name__}: {reply}"
        if wants_json(request):
            return JSONResponse({"error": message, "status": status}, status_code=status)
        return render(request, "message.html", status, title=f"Error {status}", message=message)

    def guarded(
        fn: Callable[[Request], Awaitable[Response]], *, write: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if write:
                    await check_write(request)
                elif config.protect_reads and not (
                    state.csrf_of(request) or state.bearer_ok(request)
                ):
                    if wants_json(request):
                        raise _Refused("this dashboard needs the token: log in first", 401)
                    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/login?next={quote(here, safe='')}", 303)
                return await fn(request)
            except (ActionError, DurableError, *_REDIS_DOWN) as exc:
                return failure(request, exc)
            except redis.exceptions.RedisError as exc:
                return failure(request, exc)

        return endpoint

    async def check_write(request: Request) -> None:
        if config.read_only:
            raise _Refused("this dashboard is read-only (--read-only): writes are refused", 403)
        if state.bearer_ok(request):
            if "origin" in request.headers and not _origin_ok(request):
                raise _Refused("cross-origin write refused", 403)
            return
        csrf = state.csrf_of(request)
        if csrf is None:
            raise _Refused("this action needs the dashboard token: log in first", 401)
        if not _origin_ok(request):
            raise _Refused("cross-origin write refused (Origin is not this dashboard)", 403)
        given = request.headers.get("x-csrf-token")
        if given is None:
            form = await _form(request)
            given = str(form.get("csrf", ""))
        if not _same(given, csrf):
            raise _Refused("CSRF check failed: reload the page and try again", 403)

    # -- pages -----------------------------------------------------------------------

    async def overview_data() -> tuple[dict[str, Any], int, str]:
        try:
            data = await state.ns.overview()
        except _REDIS_DOWN as exc:
            return {"created": False, "shards": [], "workers": []}, 503, state.unreachable(exc)
        return data, 200, ""

    async def overview(request: Request) -> Response:
        data, status, error = await overview_data()
        name = "overview_live.html" if request.query_params.get("fragment") else "overview.html"
        return render(request, name, status, o=data, error=error, title="Overview")

    async def api_overview(request: Request) -> Response:
        data = await state.ns.overview()
        return JSONResponse(data)

    async def api_charts(request: Request) -> Response:
        return JSONResponse({**state.charts.series(), "error": state.redis_error})

    async def job_page(request: Request) -> Response:
        job_id = request.query_params.get("id", "")
        if not job_id:
            return render(request, "job.html", job=None, job_id="", title="Job lookup")
        try:
            data = await state.ns.job(job_id)
        except ActionError as exc:
            return render(
                request,
                "job.html",
                exc.status,
                job=None,
                job_id=job_id,
                error=str(exc),
                title="Job lookup",
            )
        return render(request, "job.html", job=data["job"], job_id=job_id, title=f"Job {job_id}")

    async def api_job(request: Request) -> Response:
        return JSONResponse(await state.ns.job(request.query_params.get("id", "")))

    async def scheduled_data(request: Request) -> dict[str, Any]:
        q = request.query_params
        from_text = q.get("from", "").strip()
        return await state.ns.scheduled(
            _int(q.get("shard", "0"), "shard"),
            _int(q.get("offset", "0"), "offset"),
            _int(q.get("count", str(PAGE_ROWS)), "count"),
            parse_when(from_text) if from_text else None,
        ) | {"from": from_text}

    async def scheduled(request: Request) -> Response:
        return render(request, "scheduled.html", s=await scheduled_data(request), title="Scheduled")

    async def api_scheduled(request: Request) -> Response:
        return JSONResponse(await scheduled_data(request))

    async def dead_filter(values: Any) -> DeadFilter:
        sched = await state.ns.scheduler()
        shards = sched.keys.shards if sched is not None else 1
        return DeadFilter.parse(
            str(values.get("task", "")),
            str(values.get("reason", "")),
            str(values.get("shard", "")),
            shards,
        )

    async def dead_data(request: Request) -> dict[str, Any]:
        q = request.query_params
        flt = await dead_filter(q)
        return await state.ns.dead(
            flt, _int(q.get("offset", "0"), "offset"), _int(q.get("count", str(PAGE_ROWS)), "count")
        )

    async def dead(request: Request) -> Response:
        return render(request, "dead.html", d=await dead_data(request), title="Dead letters")

    async def api_dead(request: Request) -> Response:
        return JSONResponse(await dead_data(request))

    async def recurring(request: Request) -> Response:
        return render(request, "recurring.html", r=await state.ns.recurring(), title="Recurring")

    async def api_recurring(request: Request) -> Response:
        return JSONResponse(await state.ns.recurring())

    # -- writes ----------------------------------------------------------------------

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
        form = await _form(request)
        out: dict[str, Any] = {k: form.get(k) for k in form}
        out["ids"] = form.getlist("ids")
        return out

    def done(request: Request, message: str, back: str, data: dict[str, Any]) -> Response:
        if wants_json(request):
            return JSONResponse({"message": message, **data})
        return render(request, "message.html", title="Done", message=message, back=back, ok=True)

    async def job_action(request: Request) -> Response:
        action = request.path_params["action"]
        v = await values(request)
        job_id = checked_id(str(v.get("id", "")))
        seen = str(v.get("seen", ""))
        back = f"/job?id={quote(job_id, safe='')}"
        if action == "cancel":
            message = await state.ns.cancel(job_id, seen)
            back = "/"
        elif action == "run-now":
            message = await state.ns.reschedule(job_id, seen, delay=0.0)
        elif action == "reschedule":
            at = str(v.get("at") or "").strip()
            delay_text = str(v.get("delay") if v.get("delay") is not None else "").strip()
            if at and delay_text:
                raise ActionError("give a delay or a time (at), not both")
            if at:
                message = await state.ns.reschedule(job_id, seen, at_ms=parse_when(at))
            elif delay_text:
                message = await state.ns.reschedule(job_id, seen, delay=_seconds(delay_text))
            else:
                raise ActionError("give a delay (seconds) or a time (at) to reschedule to")
        else:
            raise ActionError(f"unknown action {action!r}", 404)
        return done(request, message, back, {"id": job_id, "action": action})

    async def dead_action(request: Request) -> Response:
        action = request.path_params["action"]
        v = await values(request)
        ids = v.get("ids") or []
        if isinstance(ids, str) or not isinstance(ids, list):
            raise ActionError("ids must be a list of job ids")
        result = await state.ns.dead_act(action, [str(i) for i in ids])
        verb = "requeued" if action == "requeue" else "purged"
        message = f"{verb} {len(result[verb])} dead letter(s)"
        if result["missing"]:
            message += "; not dead letters (any more): " + ", ".join(result["missing"])
        if result["missing"] and not result[verb]:
            raise ActionError(message, 409)
        return done(request, message, "/dead", result)

    async def dead_bulk(request: Request) -> Response:
        action = request.path_params["action"]
        v = await values(request)
        flt = await dead_filter(v)
        everything = str(v.get("all", "")).lower() in ("1", "on", "true", "yes")
        result = await state.ns.dead_bulk(action, flt, everything)
        verb = "requeued" if action == "requeue" else "purged"
        return done(request, f"{verb} {result['count']} dead letter(s)", "/dead", result)

    # -- login -----------------------------------------------------------------------

    async def login_page(request: Request) -> Response:
        return render(request, "login.html", title="Log in", next=_next(request), error="")

    async def login(request: Request) -> Response:
        form = await _form(request)
        nxt = _next(request, str(form.get("next", "/")))
        if not _origin_ok(request):
            return render(
                request,
                "login.html",
                403,
                title="Log in",
                next=nxt,
                error="cross-origin login refused",
            )
        if not _same(str(form.get("token", "")), config.token):
            return render(request, "login.html", 401, title="Log in", next=nxt, error="wrong token")
        sid, _ = state.new_session()
        response = RedirectResponse(nxt, 303)
        # Secure when served over TLS (the browser then never sends it in the clear);
        # on plain http (loopback) a Secure cookie would never come back.
        secure = request.url.scheme == "https"
        max_age = math.ceil(config.session_ttl)
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

    async def logout(request: Request) -> Response:
        sid = request.cookies.get(SESSION_COOKIE, "")
        csrf = state.session_csrf(sid)
        form = await _form(request)
        if csrf is not None and _origin_ok(request) and _same(str(form.get("csrf", "")), csrf):
            state.sessions.pop(sid, None)
        response = RedirectResponse("/", 303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    routes = [
        Route("/", guarded(overview)),
        Route("/job", guarded(job_page)),
        Route("/scheduled", guarded(scheduled)),
        Route("/dead", guarded(dead)),
        Route("/recurring", guarded(recurring)),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/job/{action}", guarded(job_action, write=True), methods=["POST"]),
        Route("/dead/bulk/{action}", guarded(dead_bulk, write=True), methods=["POST"]),
        Route("/dead/{action}", guarded(dead_action, write=True), methods=["POST"]),
        Route("/api/overview", guarded(api_overview)),
        Route("/api/charts", guarded(api_charts)),
        Route("/api/job", guarded(api_job)),
        Route("/api/scheduled", guarded(api_scheduled)),
        Route("/api/dead", guarded(api_dead)),
        Route("/api/recurring", guarded(api_recurring)),
        Route("/api/job/{action}", guarded(job_action, write=True), methods=["POST"]),
        Route("/api/dead/bulk/{action}", guarded(dead_bulk, write=True), methods=["POST"]),
        Route("/api/dead/{action}", guarded(dead_action, write=True), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=config.allowed_hosts),
        ],
    )
    app.state.dashboard = state

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


async def _form(request: Request) -> FormData:
    """The request's form (cached by Starlette); a malformed one reads as empty."""
    try:
        return await request.form()
    except (MultiPartException, ValueError):  # a body that is not a form
        return FormData()


def _next(request: Request, given: str | None = None) -> str:
    """Where to go after logging in: a path of this dashboard only."""
    nxt = given if given is not None else request.query_params.get("next", "/")
    if not nxt.startswith("/") or nxt.startswith("//") or "\\" in nxt:
        return "/"
    return nxt


def _int(text: str, name: str) -> int:
    text = text.strip()
    if not text.lstrip("-").isdigit() or len(text) > 18:
        raise ActionError(f"{name} must be a whole number, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ActionError(f"delay must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or value > 10**10:
        raise ActionError(f"delay must be 0 to 1e10 seconds, got {text!r}")
    return value


async def _sample(state: _State) -> None:
    """The chart sampler: every interval, the workers' stats (two commands)."""
    while True:
        try:
            sched = await state.ns.scheduler()
            if sched is not None:
                now = await sched.store.now(0)
                state.charts.add(await state.ns.workers(sched, now), now)
            state.redis_error = ""
        except _REDIS_DOWN as exc:
            state.redis_error = state.unreachable(exc)
        except ActionError as exc:
            state.redis_error = str(exc)
        except Exception:  # the sampler must outlive a bad reply
            logger.exception("tickwheel dashboard: chart sample failed")
        await asyncio.sleep(state.config.sample_interval)
