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
"""

from __future__ import annotations

import hmac
import secrets
import time
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["MAX_SESSIONS", "SESSION_COOKIE", "Sessions", "origin_ok", "same"]

SESSION_COOKIE = "tw_session"
# Sessions kept at once (the oldest is dropped past it): an operator's browsers, not users.
MAX_SESSIONS = 256


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
