"""Who may write: the token, login sessions with their CSRF tokens, and the origin check.

Ground rules:

- A write needs the token, either as ``Authorization: Bearer <token>`` (scripts: a
  browser never sends that header on its own) or through a session cookie made by
  logging in with it; a session's writes also need its CSRF token and a request from
  this dashboard's own origin (Origin, else Referer).
- Sessions live in this process's memory, ``session_ttl`` after their login, at most
  :data:`MAX_SESSIONS` at once (the oldest is dropped past it): an operator's browsers,
  not users.
- Secrets are compared in constant time.
- Logins are rate-limited per client address (:class:`LoginLimiter`): after
  :data:`LOGIN_FAILURES` wrong tokens within :data:`LOGIN_WINDOW_S` seconds, every
  attempt from that address (the right token included) is refused with 429 until the
  oldest of those failures is :data:`LOGIN_WINDOW_S` old; a login that works forgets the
  address's failures. At most :data:`MAX_TRACKED_ADDRESSES` addresses are remembered
  (the least recent is dropped past it).
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections import OrderedDict, deque
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = [
    "LOGIN_FAILURES",
    "LOGIN_WINDOW_S",
    "MAX_SESSIONS",
    "MAX_TRACKED_ADDRESSES",
    "SESSION_COOKIE",
    "LoginLimiter",
    "Sessions",
    "origin_ok",
    "same",
]

SESSION_COOKIE = "tw_session"
# Sessions kept at once (the oldest is dropped past it): an operator's browsers, not users.
MAX_SESSIONS = 256
# Wrong tokens an address may give within LOGIN_WINDOW_S seconds; then it waits (429).
LOGIN_FAILURES = 5
LOGIN_WINDOW_S = 60.0
# Client addresses whose failures are remembered at once.
MAX_TRACKED_ADDRESSES = 4096


def same(given: str, expected: str) -> bool:
    """``given == expected``, in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())


def origin_ok(request: Request) -> bool:
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


class Sessions:
    """The login sessions of one dashboard and the token they were made with.

    Args:
        token: the dashboard's token.
        ttl: seconds a session lives after its login.
    """

    def __init__(self, token: str, ttl: float) -> None:
        self._token = token
        self._ttl = ttl
        # session id -> (its CSRF token, time.monotonic() it expires at), oldest first
        self._live: dict[str, tuple[str, float]] = {}

    def new(self) -> tuple[str, str]:
        """Start a session; return its id (the cookie) and its CSRF token."""
        now = time.monotonic()
        for old in [k for k, (_, expires) in self._live.items() if expires <= now]:
            del self._live[old]
        if len(self._live) >= MAX_SESSIONS:
            self._live.pop(next(iter(self._live)))
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._live[sid] = (csrf, now + self._ttl)
        return sid, csrf

    def end(self, sid: str) -> None:
        """Forget the session ``sid`` (a logout)."""
        self._live.pop(sid, None)

    def csrf_of(self, request: Request) -> str | None:
        """The CSRF token of the request's session; None if it has none, or it expired."""
        return self.csrf(request.cookies.get(SESSION_COOKIE, ""))

    def csrf(self, sid: str) -> str | None:
        """The CSRF token of session ``sid``; None if there is none, or it expired."""
        got = self._live.get(sid) if sid else None
        if got is None:
            return None
        csrf, expires = got
        if expires <= time.monotonic():
            del self._live[sid]
            return None
        return csrf

    def token_ok(self, given: str) -> bool:
        """Is ``given`` the dashboard's token."""
        return same(given, self._token)

    def bearer_ok(self, request: Request) -> bool:
        """Does the request carry the token as ``Authorization: Bearer``."""
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(given.strip())


class LoginLimiter:
    """The failed logins of each client address, and how long an address must wait.

    Args:
        failures: wrong tokens allowed within ``window`` seconds.
        window: seconds a failure counts.
    """

    def __init__(self, failures: int = LOGIN_FAILURES, window: float = LOGIN_WINDOW_S) -> None:
        self._failures = failures
        self._window = window
        # address -> time.monotonic() of its recent failures, least recent address first
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, address: str) -> int:
        """Whole seconds ``address`` must wait before it may try again; 0 if it may now."""
        times = self._failed.get(address)
        if times is None:
            return 0
        now = time.monotonic()
        while times and times[0] <= now - self._window:
            times.popleft()
        if not times:
            del self._failed[address]
            return 0
        if len(times) < self._failures:
            return 0
        return max(1, math.ceil(times[0] + self._window - now))

    def failed(self, address: str) -> None:
        """Count a wrong token from ``address``."""
        times = self._failed.pop(address, None) or deque(maxlen=self._failures)
        times.append(time.monotonic())
        self._failed[address] = times  # now the most recent
        while len(self._failed) > MAX_TRACKED_ADDRESSES:
            self._failed.popitem(last=False)

    def succeeded(self, address: str) -> None:
        """Forget ``address``'s failures (it gave the token)."""
        self._failed.pop(address, None)
