"""A startup check of the Redis server: version, eviction policy, persistence.

A durable scheduler on a Redis that evicts keys, or that keeps no AOF, loses jobs
without an error. The check reads ``INFO`` (available on managed Redis, where ``CONFIG``
is often disabled or renamed) and falls back to ``CONFIG GET`` for a field INFO lacks.
What it cannot determine is reported as unknown: a warning, even in strict mode.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
import redis.exceptions

from ._errors import ServerCheckFailed, translate

__all__ = ["MIN_REDIS_VERSION", "ServerConfigWarning", "ServerReport", "check_server"]

logger = logging.getLogger("tickwheel.durable")

# The scripts use ZMSCORE, added in Redis 6.2.
MIN_REDIS_VERSION = (6, 2)


class ServerConfigWarning(UserWarning):
    """The Redis server's configuration may lose jobs (or could not be checked)."""


@dataclass(frozen=True, slots=True)
class ServerReport:
    """What :func:`check_server` found."""

    version: str  # redis_version, "" if unknown
    maxmemory_policy: str | None  # None if unknown
    aof_enabled: bool | None  # None if unknown
    problems: list[str] = field(default_factory=list)  # settings that may lose jobs
    unknown: list[str] = field(default_factory=list)  # settings that could not be read

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong (unknown settings aside)."""
        return not self.problems


async def _config_get(client: redis.asyncio.Redis, name: str) -> str | None:
    try:
        reply: Any = await client.config_get(name)
    except redis.exceptions.ResponseError:  # CONFIG disabled, renamed or denied by ACL
        return None
    value = reply.get(name.encode(), reply.get(name)) if isinstance(reply, dict) else None
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def check_server(client: redis.asyncio.Redis, *, strict: bool = False) -> ServerReport:
    """Check that the server keeps jobs: Redis >= 6.2, noeviction, AOF on.

    Args:
        client: the client the scheduler uses.
        strict: raise on a problem instead of warning.

    Returns:
        The report (also when problems were only warned about).

    Raises:
        ServerCheckFailed: in strict mode, if a setting may lose jobs.
        RedisUnavailable: if the server cannot be reached.
    """
    try:
        info: dict[str, Any] = await client.info()
    except redis.exceptions.RedisError as exc:
        raise translate(exc) from exc
    version = _text(info.get("redis_version", ""))
    policy_raw = info.get("maxmemory_policy")
    policy = _text(policy_raw) if policy_raw is not None else None
    if policy is None:
        policy = await _config_get(client, "maxmemory-policy")
    aof_raw = info.get("aof_enabled")
    aof: bool | None = bool(int(aof_raw)) if aof_raw is not None else None
    if aof is None:
        appendonly = await _config_get(client, "appendonly")
        aof = None if appendonly is None else appendonly == "yes"

    problems: list[str] = []
    unknown: list[str] = []
    if not version:
        unknown.append("redis_version")
    else:
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parts < MIN_REDIS_VERSION:
            want = ".".join(map(str, MIN_REDIS_VERSION))
            problems.append(f"Redis {version} is older than {want} (the scripts need ZMSCORE)")
    if policy is None:
        unknown.append("maxmemory-policy")
    elif policy != "noeviction":
        problems.append(f"maxmemory-policy is {policy!r}: Redis may evict jobs (use noeviction)")
    if aof is None:
        unknown.append("appendonly")
    elif not aof:
        problems.append("AOF is off: a crash loses every job since the last snapshot")

    report = ServerReport(version, policy, aof, problems, unknown)
    if problems and strict:
        raise ServerCheckFailed("; ".join(problems))
    for text in problems:
        logger.warning("tickwheel.durable server check: %s", text)
        warnings.warn(text, ServerConfigWarning, stacklevel=2)
    if unknown:
        text = f"could not read {', '.join(unknown)} (CONFIG disabled?): not checked"
        logger.warning("tickwheel.durable server check: %s", text)
        warnings.warn(text, ServerConfigWarning, stacklevel=2)
    return report
