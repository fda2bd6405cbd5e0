"""What one dashboard serves and how it guards it (:class:`DashboardConfig`)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

__all__ = ["DEFAULT_SESSION_TTL", "DashboardConfig"]

# Seconds a session lives after its login (an operator's working day); then log in again.
DEFAULT_SESSION_TTL = 12 * 3600.0


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
