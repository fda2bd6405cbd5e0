"""The one place that translates Redis errors into the library's (model/_errors.py).

Lua scripts report refusals with ``redis.error_reply('TW_<CODE> message')``;
:func:`translate` maps each code to its class. Nothing else parses error text.
"""

from __future__ import annotations

import redis.exceptions

from tickwheel.durable.model import DurableError, Fenced, ListingTooLong, RedisUnavailable

__all__ = ["REDIS_ERRORS", "translate"]


# Error codes the scripts emit (first word of the error reply), mapped to classes.
_CODES: dict[str, type[DurableError]] = {
    "TW_FENCED": Fenced,
    "TW_BADARG": DurableError,  # a script received an argument the client should refuse
    "TW_TOOMANY": ListingTooLong,  # a listing would read too much of the far index
}


# Errors a failover or a restart produces: the same call may succeed once the cluster
# has a master for the slot again (redis-py follows MOVED itself).
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.TryAgainError,  # TRYAGAIN during a resharding
    redis.exceptions.ReadOnlyError,  # a write reached a master demoted to replica
    redis.exceptions.SlotNotCoveredError,  # no node serves the slot (yet)
    redis.exceptions.BusyLoadingError,  # LOADING: a restarted server reads its AOF
    redis.exceptions.OutOfMemoryError,  # OOM: writes refused until memory is freed
)
# Error replies without a redis-py class of their own that pass the same way: a script
# running too long (BUSY), too few replicas online (NOREPLICAS, min-replicas-to-write).
_UNAVAILABLE_CODES = frozenset({"BUSY", "NOREPLICAS", "MASTERDOWN"})
# What redis-py raises: RedisError, and for the cluster client RedisClusterException
# (which is not a RedisError).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def translate(
    exc: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
    shard: int | None = None,
) -> Exception:
    """Map a redis-py exception to the exception the caller should see.

    Args:
        exc: the exception redis-py raised (or returned in a pipeline).
        shard: the shard the call was for, attached to :class:`Fenced`.

    Returns:
        A :class:`RedisUnavailable` for connection errors, timeouts and the refusals a
        server recovers from (OOM, LOADING, BUSY, NOREPLICAS), the class of a
        script's ``TW_*`` code, or ``exc`` itself when it adds nothing to know.
    """
    if isinstance(exc, _UNAVAILABLE):
        return RedisUnavailable(f"redis unavailable: {exc}")
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        code, _, message = text.partition(" ")
        if code in _UNAVAILABLE_CODES:
            return RedisUnavailable(f"redis unavailable: {exc}")
        cls = _CODES.get(code)
        if cls is Fenced:
            return Fenced(message, shard)
        if cls is not None:
            return cls(message)
    return exc
