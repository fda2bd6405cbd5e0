"""A startup check of the Redis server: version, eviction policy, persistence, cluster.

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
    cluster_enabled: bool | None = None  # INFO cluster's cluster_enabled; None if unknown
    cluster_state: str | None = None  # CLUSTER INFO's cluster_state; None if not a cluster

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


async def _cluster_state(client: redis.asyncio.Redis) -> str | None:
    try:
        reply: Any = await client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
    except redis.exceptions.ResponseError:  # denied by ACL, or renamed
        return None
    text = _text(reply) if isinstance(reply, bytes | str) else ""
    if isinstance(reply, dict):  # parsed by the client
        value = reply.get("cluster_state", reply.get(b"cluster_state"))
        return None if value is None else _text(value)
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "cluster_state":
            return value.strip()
    return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def check_server(client: redis.asyncio.Redis, *, strict: bool = False) -> ServerReport:
    """Check that the server keeps jobs: Redis >= 6.2, noeviction, AOF on, and (on a
    Redis Cluster) that the cluster state is ok.

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

    cluster_raw = info.get("cluster_enabled")
    cluster = None if cluster_raw is None else bool(int(cluster_raw))
    state = await _cluster_state(client) if cluster else None

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

    if cluster and state != "ok":
        problems.append(f"cluster_state is {state or 'unknown'!r}: some slots are not served")

    report = ServerReport(version, policy, aof, problems, unknown, cluster, state)
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
