"""Clients: one Redis or a Redis Cluster, from a URL or startup nodes.

Ground rules:

- Everything in tickwheel.durable takes a :data:`Client`: a ``redis.asyncio.Redis`` or a
  ``redis.asyncio.RedisCluster``. The scripts touch one shard's slot each, so nothing
  else changes between the two (see ``_keys.py`` for the hash tags).
- :func:`connect` is the one place that turns a URL into a client. A URL names a
  cluster when its scheme is ``redis+cluster``/``rediss+cluster``, when it lists several
  ``host:port`` pairs, or when the server it names reports ``cluster_enabled:1``
  (auto-detected with one ``INFO cluster``), so a plain ``redis://`` URL of any node of
  a cluster just works.
- Clients never decode responses: payloads are bytes.
- Every call is bounded, and nothing is re-sent behind the caller's back. The clients
  made here wait at most ``socket_timeout`` (default :data:`DEFAULT_SOCKET_TIMEOUT`)
  for a reply and ``socket_connect_timeout`` for a connection, and their retry policy
  is "never": redis-py would otherwise re-send a command (EVALSHA included) after a
  lost reply. A Redis that stops answering gives :class:`RedisUnavailable` within the
  bound; the library's own loops decide what to send again (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeAlias

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tickwheel.durable.model import RedisConfigError, RedisUnavailable

from ._errors import config_error
from ._secrets import hidden, hide_secrets, shown_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "Client",
    "client_from_url",
    "cluster_target",
    "connect",
    "is_cluster",
    "no_retry",
    "parse_nodes",
    "split_url",
]

# Where the command line (and the demo's worker processes) read the URL when no
# --redis-url is given.
URL_ENV = "TICKWHEEL_REDIS_URL"

Client: TypeAlias = "redis.asyncio.Redis | RedisCluster"

# Seconds a client made here waits for one reply. A script touches one shard and its
# batch is capped, so a healthy server answers in milliseconds; 5 s rides out a fork for
# a snapshot or a loaded machine, and still lets a worker notice a black hole (a server
# SIGSTOP'd, a network path dropped while the socket stays open) well inside a lease.
DEFAULT_SOCKET_TIMEOUT = 5.0
# Seconds to wait for a TCP connection (and its handshake).
DEFAULT_CONNECT_TIMEOUT = 5.0


def no_retry() -> Retry:
    """A redis-py retry policy that never re-sends: the library retries itself."""
    return Retry(NoBackoff(), 0)


def _bounded(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the library's defaults for timeouts and retries filled in."""
    options = dict(kwargs)
    options.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    options.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    options.setdefault("retry", no_retry())
    return options


_PLAIN_SCHEMES = ("redis", "rediss", "unix")
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# The default port of redis-server, for a host given without one.
_DEFAULT_PORT = 6379


def parse_nodes(text: str) -> list[tuple[str, int]]:
    """Parse ``host[:port][,host[:port]...]`` into (host, port) pairs.

    Raises:
        ValueError: if a host is empty or a port is not an integer in 1..65535.
    """
    nodes: list[tuple[str, int]] = []
    for part in text.split(","):
        host, sep, port_text = part.strip().rpartition(":")
        if not sep:
            host, port_text = port_text, str(_DEFAULT_PORT)
        host = host.strip("[]")  # an IPv6 literal
        if not host:
            raise ValueError(f"url has an empty host in {text!r}")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"url has a port that is not a number: {part!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"url port must be in 1..65535, got {port}")
        nodes.append((host, port))
    return nodes


def split_url(url: str) -> tuple[str, str, str, str]:
    """(scheme, userinfo, netloc hosts, rest) of a URL, checked."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    scheme, sep, remainder = url.partition("://")
    if not sep:
        raise ValueError(f"url must look like redis://host:port/db, got {url!r}")
    scheme = scheme.lower()
    if scheme not in _PLAIN_SCHEMES and scheme not in _CLUSTER_SCHEMES:
        schemes = ", ".join([*_PLAIN_SCHEMES, *_CLUSTER_SCHEMES])
        raise ValueError(f"url scheme must be one of {schemes}, got {scheme!r} in {url!r}")
    netloc, slash, rest = remainder.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    return scheme, userinfo, hosts, slash + rest


def cluster_target(url: str, cluster: bool = False) -> tuple[str, list[tuple[str, int]]] | None:
    """What a client needs of ``url`` when it names a cluster (by its scheme, several
    hosts, or ``cluster``): the URL of its first node (credentials, TLS and query
    options, parsed by redis-py from it) and every node; None for one server. Shared by
    the async and the sync clients; no I/O.

    Raises:
        TypeError, ValueError: for a malformed URL, a unix socket or a database other
            than 0 for a cluster.
    """
    scheme, userinfo, hosts, rest = split_url(url)
    if scheme in _CLUSTER_SCHEMES:
        scheme, cluster = _CLUSTER_SCHEMES[scheme], True
    elif "," in hosts:
        cluster = True
    if not cluster:
        return None
    if scheme == "unix":
        raise ValueError("url: a Redis Cluster cannot be reached over a unix socket")
    path, _, query = rest.partition("?")
    db = path.strip("/")
    if db not in ("", "0"):
        raise ValueError(f"url: a Redis Cluster has database 0 only, got /{db}")
    nodes = parse_nodes(hosts)
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{nodes[0][0]}:{nodes[0][1]}"
    if query:
        first += f"/0?{query}"
    return first, nodes


def client_from_url(url: str, *, cluster: bool = False, **kwargs: Any) -> Client:
    """Make a client for ``url`` without any I/O (so without auto-detection).

    The URL names a cluster by its scheme (``redis+cluster://``) or by listing several
    hosts; ``cluster=True`` makes a plain ``redis://`` URL a cluster's too. Prefer
    :func:`connect`, which also detects a cluster and checks that the server answers.

    Raises:
        TypeError, ValueError: for a malformed URL.
    """
    if kwargs.get("decode_responses"):
        raise ValueError("decode_responses must be False: payloads are bytes")
    kwargs = _bounded(kwargs)
    with _no_secrets(url):
        target = cluster_target(url, cluster)
        if target is None:
            return redis.asyncio.Redis.from_url(url, **kwargs)
        first, nodes = target
        if len(nodes) > 1:
            kwargs["startup_nodes"] = [ClusterNode(h, p) for h, p in nodes]
        return RedisCluster.from_url(first, **kwargs)


@contextlib.contextmanager
def _no_secrets(url: str) -> Iterator[None]:
    """Raise a TypeError or ValueError about ``url`` (redis-py's, or the checks here:
    they may quote a piece of a malformed password) without its credentials."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        clean = hidden(exc, url)
        if clean is exc:
            raise
        raise clean from None


async def connect(
    url: str,
    *,
    cluster: bool | None = None,
    **kwargs: Any,
) -> Client:
    """Make a client for ``url`` and check that the server answers.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS,
            ``unix:///path.sock``; for a cluster ``redis+cluster://host:port,host:port``
            (any one node is enough), or a plain URL of any cluster node.
        cluster: True or False to skip the auto-detection; None to ask the server.
        **kwargs: passed to the redis-py client; ``decode_responses`` is refused.
            ``socket_timeout`` and ``socket_connect_timeout`` default to
            :data:`DEFAULT_SOCKET_TIMEOUT` and :data:`DEFAULT_CONNECT_TIMEOUT`
            (None waits for ever), ``retry`` to :func:`no_retry`.

    Returns:
        A ``redis.asyncio.Redis``, or a ``RedisCluster`` whose slot map is loaded.

    Raises:
        TypeError, ValueError: for a malformed URL (naming what is wrong), a port out
            of range among them.
        RedisConfigError: if the server refuses the URL's credentials or database
            index (permanent: fix the URL).
        RedisUnavailable: if no node answers (the message names the address and why:
            a refused connection stays transient, a server may be starting).
    """
    with _no_secrets(url):
        scheme, _, hosts, _ = split_url(url)
        if cluster is None:
            if scheme in _CLUSTER_SCHEMES or "," in hosts:
                cluster = True
            elif scheme != "unix":
                cluster = await _reports_cluster(url, kwargs)
    client = client_from_url(url, cluster=bool(cluster), **kwargs)
    try:
        if isinstance(client, RedisCluster):
            await client.initialize()
        else:
            await client.ping()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        await client.aclose()
        raise _unavailable(url, exc) from exc
    return client


def is_cluster(client: Client) -> bool:
    """Is ``client`` a Redis Cluster's (a ``RedisCluster``, not one Redis)."""
    return isinstance(client, RedisCluster)


async def _reports_cluster(url: str, kwargs: dict[str, Any]) -> bool:
    scheme, userinfo, hosts, rest = split_url(url)
    query = rest.partition("?")[2]
    # Database 0: a cluster node refuses SELECT, and the answer is the same in every db.
    plain = f"{scheme}://{userinfo + '@' if userinfo else ''}{hosts}/0"
    probe = redis.asyncio.Redis.from_url(plain + (f"?{query}" if query else ""), **_bounded(kwargs))
    try:
        info: dict[str, Any] = await probe.info("cluster")
    except redis.exceptions.RedisError as exc:
        raise _unavailable(url, exc) from exc
    finally:
        await probe.aclose()
    return str(info.get("cluster_enabled", "0")) == "1"


def _unavailable(url: str, exc: BaseException) -> RedisUnavailable | RedisConfigError:
    """What a failed first contact is: a refusal of the URL's configuration
    (permanent), else the server unreachable (transient), naming the URL's address."""
    config = config_error(exc, shown_url(url))
    if config is not None:
        return RedisConfigError(hide_secrets(str(config), url))
    return RedisUnavailable(hide_secrets(f"cannot reach Redis at {shown_url(url)}: {exc}", url))
