"""The one place that translates Redis errors into the library's (model/_errors.py).

Lua scripts report refusals with ``redis.error_reply('TW_<CODE> message')`` or, from
inside a helper, ``error('TW_<CODE> message', 0)``; :func:`translate` maps each code to
its class. Nothing else parses error text.

An error raised inside a script reaches the client wrapped, differently by version:

- Redis 7 appends `` script: <sha>, on @user_script:<line>.`` to the error;
- Redis 6.2 prefixes ``Error running script (call to f_<sha>): @user_script:<line>: ``
  and, for a refusal of a ``redis.call`` (OOM, WRONGTYPE), a second
  ``@user_script: <line>: -``.

:func:`script_error_text` takes the wrapper off, so a refusal inside a script is
translated as the same refusal outside one (an OOM is transient on both).
"""

from __future__ import annotations

import re

import redis.exceptions

from tickwheel.durable.model import (
    DurableError,
    Fenced,
    ListingTooLong,
    RedisConfigError,
    RedisUnavailable,
)

__all__ = [
    "CLUSTER_ERRORS",
    "NO_REPLY_ERRORS",
    "REDIS_ERRORS",
    "config_error",
    "error_reply",
    "script_error_text",
    "translate",
    "unwrap",
]


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
_V6_WRAPPER = re.compile(
    r"^Error running script \(call to f_[0-9a-f]{40}\): @user_script:\d+: "
    r"(?:@user_script: \d+: )?-?"
)
_V7_SUFFIX = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.$")
# What redis-py raises: RedisError, and for the cluster client RedisClusterException
# (which is not a RedisError).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
# The layers above never import redis-py; the classes they tell apart are named here.
# Errors of a reply that never came: the server was not reached, or did not answer.
NO_REPLY_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# The cluster client's own errors (no node reachable, no slot map): not RedisErrors.
CLUSTER_ERRORS = (redis.exceptions.RedisClusterException,)


# Refusals of the connection's configuration (model/_errors.py, RedisConfigError): by
# redis-py's class or the first word of the reply (NOAUTH, WRONGPASS, NOPERM), or its
# text for "ERR DB index is out of range" (SELECT). AuthenticationError is a
# ConnectionError in redis-py: it is told apart before the transient ones.
_CONFIG_TEXTS = ("DB index is out of range", "invalid DB index")
_CONFIG_HINT = {
    "NOAUTH": "the server needs a password: put it in the URL, as user:password before the host",
    "WRONGPASS": "check the user and password in the URL",
    "NOPERM": "the URL's user lacks a permission (check the server's ACL)",
    "DB": "the URL names a database the server does not have (check /db, and 'databases')",
}


def config_error(exc: BaseException, where: str = "") -> RedisConfigError | None:
    """A :class:`RedisConfigError` for a refusal of the connection's configuration
    (wrong or missing credentials, a permission the user lacks, a database index out of
    range); None for anything else. ``where`` (a URL without secrets, or host:port)
    is named in the message."""
    if not isinstance(exc, redis.exceptions.RedisError):
        return None
    text = script_error_text(str(exc))
    code = text.partition(" ")[0]
    if isinstance(exc, redis.exceptions.AuthenticationError) or code in ("NOAUTH", "WRONGPASS"):
        low = text.lower()  # no password sent: NOAUTH, "Authentication required", HELLO's
        missing = code == "NOAUTH" or "required" in low or "already authenticated" in low
        code = "NOAUTH" if missing else "WRONGPASS"
    elif isinstance(exc, redis.exceptions.NoPermissionError) or code == "NOPERM":
        code = "NOPERM"
    elif isinstance(exc, redis.exceptions.ResponseError) and any(t in text for t in _CONFIG_TEXTS):
        code = "DB"
    else:
        return None
    at = f" at {where}" if where else ""
    return RedisConfigError(
        f"Redis{at} refused the connection's configuration: {text} ({_CONFIG_HINT[code]})"
    )


def script_error_text(text: str) -> str:
    """The error a script raised or was refused with, without the server's wrapper
    (see the module's docstring); ``text`` itself when it has none.

    >>> script_error_text("TW_TOOMANY too many script: " + "a" * 40 + ", on @user_script:9.")
    'TW_TOOMANY too many'
    """
    text = _V7_SUFFIX.sub("", _V6_WRAPPER.sub("", text.rstrip("\n"), count=1), count=1)
    return text.removeprefix("ERR ")


def unwrap(
    exc: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
) -> redis.exceptions.RedisError | redis.exceptions.RedisClusterException:
    """``exc`` as redis-py raises the same refusal outside a script: an error reply
    from inside one loses its wrapper, and an OOM is an ``OutOfMemoryError`` (Redis 6.2
    sends it as a script error); anything else is returned as it is."""
    if not isinstance(exc, redis.exceptions.ResponseError):
        return exc
    text = script_error_text(str(exc))
    if text == str(exc):
        return exc
    code, _, message = text.partition(" ")
    if code == "OOM":
        return redis.exceptions.OutOfMemoryError(message)
    return type(exc)(text)


def translate(
    exc: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
    shard: int | None = None,
) -> Exception:
    """Map a redis-py exception to the exception the caller should see.

    Args:
        exc: the exception redis-py raised (or returned in a pipeline).
        shard: the shard the call was for, attached to :class:`Fenced`.

    Returns:
        A :class:`RedisConfigError` for wrong credentials, a missing permission or a
        database index out of range (permanent); a :class:`RedisUnavailable` for
        connection errors, timeouts and the refusals a
        server recovers from (OOM, LOADING, BUSY, NOREPLICAS), the class of a
        script's ``TW_*`` code, or ``exc`` itself when it adds nothing to know.
    """
    exc = unwrap(exc)
    config = config_error(exc)
    if config is not None:
        return config
    if isinstance(exc, _UNAVAILABLE):
        return RedisUnavailable(f"redis unavailable: {exc}")
    if isinstance(exc, redis.exceptions.ResponseError):
        code, _, message = str(exc).partition(" ")
        if code in _UNAVAILABLE_CODES:
            return RedisUnavailable(f"redis unavailable: {exc}")
        cls = _CODES.get(code)
        if cls is Fenced:
            return Fenced(message, shard)
        if cls is not None:
            return cls(message)
    return exc


def error_reply(exc: BaseException) -> Exception | None:
    """The refusal Redis replied with behind ``exc``, as :func:`unwrap` gives it:
    ``exc`` itself, or the cause of a :class:`RedisUnavailable` that :func:`translate`
    made of a refusal a server recovers from (OOM, LOADING, CLUSTERDOWN, ...). None
    when no reply came (a connection error, a timeout, a cluster client's own error)
    or ``exc`` is none of redis-py's."""
    if isinstance(exc, RedisUnavailable):
        exc = exc.__cause__  # type: ignore[assignment]
    if not isinstance(exc, redis.exceptions.RedisError) or isinstance(exc, NO_REPLY_ERRORS):
        return None
    return unwrap(exc)
