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

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from tickwheel.durable.model import ServerCheckFailed

from ._connect import Client
from ._errors import REDIS_ERRORS, translate

__all__ = [
    "MIN_REDIS_VERSION",
    "ServerConfigWarning",
    "ServerReport",
    "check_server",
    "crash_loss",
]

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
    appendfsync: str | None = None  # CONFIG GET appendfsync; None if unknown (or mixed)

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong (unknown settings aside)."""
        return not self.problems

    @property
    def crash_loss(self) -> str:
        """What a crash of the server (or of its host) can lose, in one sentence."""
        return crash_loss(self.aof_enabled, self.appendfsync)


def crash_loss(aof_enabled: bool | None, appendfsync: str | None) -> str:
    """What a crash loses with these persistence settings (docs/reliability.md has the
    measurements behind the everysec figures)."""
    if aof_enabled is None:
        return "unknown: appendonly could not be read, or differs between masters"
    if not aof_enabled:
        return "every write since the last RDB snapshot (AOF is off)"
    if appendfsync == "always":
        return "nothing acknowledged: each write is fsynced before its reply"
    if appendfsync == "everysec":
        return (
            "a Redis crash (kill -9, OOM kill): nothing acknowledged, unless a slow disk "
            "made Redis postpone its AOF writes (up to ~2 s); a host crash or power loss: "
            "up to the last ~1 s of acknowledged writes (~2 s on a slow disk)"
        )
    if appendfsync == "no":
        return (
            "a Redis crash: nothing acknowledged; a host crash or power loss: whatever "
            "the OS had not flushed (on Linux up to ~30 s of acknowledged writes)"
        )
    return "unknown: appendfsync could not be read (CONFIG disabled?) or differs between masters"


async def _config_get(client: Any, name: str, **target: Any) -> str | None:
    try:
        reply: Any = await client.config_get(name, **target)
    except redis.exceptions.ResponseError:  # CONFIG disabled, renamed or denied by ACL
        return None
    value = reply.get(name.encode(), reply.get(name)) if isinstance(reply, dict) else None
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def check_server(client: Client, *, strict: bool = False) -> ServerReport:
    """Check that the server keeps jobs: Redis >= 6.2, noeviction, AOF on; on a
    cluster, every master, and ``cluster_state:ok``.

    Args:
        client: the client the scheduler uses (one Redis or a cluster).
        strict: raise on a problem instead of warning.

    Returns:
        The report (also when problems were only warned about). On a cluster the
        version is the oldest master's, and a setting is reported by the first master
        that has it wrong.

    Raises:
        ServerCheckFailed: in strict mode, if a setting may lose jobs.
        RedisUnavailable: if the server cannot be reached.
    """
    try:
        if isinstance(client, RedisCluster):
            report = await _check_cluster(client)
        else:
            report = await _check_node(client, {}, "")
    except REDIS_ERRORS as exc:
        raise translate(exc) from exc
    return _conclude(report, strict)


async def _check_cluster(client: RedisCluster) -> ServerReport:
    await client.initialize()  # the slot map and node list (no-op once loaded)
    reports = [
        await _check_node(client, {"target_nodes": node}, f"{node.name}: ")
        for node in client.get_primaries()
    ]
    info: Any = await client.cluster_info(target_nodes=client.get_primaries()[0])
    state = _text(info.get("cluster_state", "")) if isinstance(info, dict) else None
    problems = [p for r in reports for p in r.problems]
    if state != "ok":
        problems.append(f"cluster_state is {state!r}: some slots have no master")
    unknown = sorted({u for r in reports for u in r.unknown})
    oldest = min(reports, key=lambda r: _version_tuple(r.version))
    policies = {r.maxmemory_policy for r in reports}
    aofs = {r.aof_enabled for r in reports}
    fsyncs = {r.appendfsync for r in reports}
    return ServerReport(
        version=oldest.version,
        maxmemory_policy=policies.pop() if len(policies) == 1 else None,
        aof_enabled=aofs.pop() if len(aofs) == 1 else None,
        problems=problems,
        unknown=unknown,
        cluster_enabled=True,
        cluster_state=state,
        # A mix of settings is reported as unknown: the crash_loss would name one.
        appendfsync=fsyncs.pop() if len(fsyncs) == 1 else None,
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


async def _check_node(client: Any, target: dict[str, Any], label: str) -> ServerReport:
    """The report of one server (``target`` names a cluster node; ``label`` prefixes
    its problems)."""
    info: dict[str, Any] = await client.info(**target)
    version = _text(info.get("redis_version", ""))
    policy_raw = info.get("maxmemory_policy")
    policy = _text(policy_raw) if policy_raw is not None else None
    if policy is None:
        policy = await _config_get(client, "maxmemory-policy", **target)
    aof_raw = info.get("aof_enabled")
    aof: bool | None = bool(int(aof_raw)) if aof_raw is not None else None
    if aof is None:
        appendonly = await _config_get(client, "appendonly", **target)
        aof = None if appendonly is None else appendonly == "yes"
    # INFO does not tell the fsync policy; without CONFIG it stays unknown (the report
    # then says so in crash_loss, without a warning: it decides how much, not whether,
    # a crash loses).
    appendfsync = await _config_get(client, "appendfsync", **target)

    problems: list[str] = []
    unknown: list[str] = []
    if not version:
        unknown.append("redis_version")
    elif _version_tuple(version) < MIN_REDIS_VERSION:
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
    cluster_raw = info.get("cluster_enabled")
    cluster = None if cluster_raw is None else bool(int(cluster_raw))
    if cluster and not label:
        # A plain client on one node of a cluster: its state still tells if slots are
        # served (the cluster client checks every master instead).
        reply: Any = await client.execute_command("CLUSTER", "INFO")
        text = _text(reply) if not isinstance(reply, dict) else ""
        state = (
            dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
            .get("cluster_state", "")
            .strip()
            or None
        )
        if state != "ok":
            problems.append(f"cluster_state is {state!r}: some slots are not served")
    else:
        state = None
    return ServerReport(
        version, policy, aof, [label + p for p in problems], unknown, cluster, state, appendfsync
    )


def _conclude(report: ServerReport, strict: bool) -> ServerReport:
    """Raise (strict) or warn about what the report found."""
    problems, unknown = report.problems, report.unknown
    if problems and strict:
        raise ServerCheckFailed("; ".join(problems))
    for text in problems:
        logger.warning("server check: %s", text)
        warnings.warn(text, ServerConfigWarning, stacklevel=3)
    if unknown:
        text = f"could not read {', '.join(unknown)} (CONFIG disabled?): not checked"
        logger.warning("server check: %s", text)
        warnings.warn(text, ServerConfigWarning, stacklevel=3)
    return report
