"""The transport of a Store: script calls over one Redis or a Redis Cluster, bounded.

Ground rules:

- Every call is bounded by ``call_timeout`` (WAIT adds ``replica_timeout``) and its
  errors are translated once (``_errors.translate``): callers see
  :class:`RedisUnavailable`, :class:`Fenced`, :class:`ReplicationTimeout` or redis-py's
  own error. A single call's bound is a :class:`~._bound.Bound` (no timer armed per
  call); pipelines and the rest use ``timeout``.
- A pipelined write goes one round trip per node, without MULTI. Calls that did not run
  (NOSCRIPT on a fresh master, MOVED/ASK on a stale slot map) are resent after a
  recovery, up to ``_MAX_ROUNDS``; a call that may have run is never resent here.
- Every call is bounded whatever the client's own socket timeout: a Redis that stops
  answering gives :class:`RedisUnavailable`, never a hang. The call may have run (a lost
  reply); each script is safe to send again (docs/reliability.md), and nothing here
  re-sends one whose reply was lost: the per-node clients made here never retry.
- With ``replicas`` > 0, :meth:`Transport.write` follows a write by ``WAIT replicas
  timeout`` *on the connection that wrote*: WAIT counts the replicas that have that
  connection's writes. One pipeline per node carries the script calls and then WAIT.
- redis-py's cluster pipeline refuses EVALSHA, and could not put WAIT on the write's
  connection anyway; so pipelined writes to a cluster go through a plain client per
  master (``_node_client``), routed by the cluster client's slot map. A reply of MOVED
  or ASK means the call did not run there: the slot map is refreshed and it is resent.
- Nothing here knows a script's meaning: ``_store.py`` has one method per script.
- A :class:`~._store.Store` *has* a transport (``store.transport``) and calls it; the
  transport knows nothing of the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from tickwheel.durable.model import RedisUnavailable, ReplicationTimeout
from tickwheel.wheel import timeout

from ._bound import Bound
from ._connect import Client, no_retry
from ._direct import Direct
from ._errors import REDIS_ERRORS, translate

__all__ = ["DEFAULT_CALL_TIMEOUT", "Call", "Transport"]

# Rounds of a pipelined write whose calls came back NOSCRIPT (a fresh master after a
# failover) or MOVED/ASK (a stale slot map): each round loads or refreshes, then resends
# only those calls, which did not run.
_MAX_ROUNDS = 4
# Replies after which a call is resent: it did not run on the node that answered.
_RESEND = (
    redis.exceptions.NoScriptError,
    redis.exceptions.AskError,  # MovedError too
    redis.exceptions.TryAgainError,
)


# Seconds one call may take before it gives RedisUnavailable. Above the default socket
# timeout of the clients connect() makes (5 s), so those fail first with redis-py's own
# error; this bound is for a client made without one.
DEFAULT_CALL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Call:
    """One script call of a pipeline."""

    script: Any  # the AsyncScript
    keys: Sequence[str]  # KEYS (all in one slot)
    args: Sequence[Any]  # ARGV
    shard: int  # for error translation


class Transport:
    """Bounded, translated script calls on one client (what a :class:`Store` calls).

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` created with
            ``decode_responses=False``.
        replicas: producer writes return only once this many replicas have them
            (``WAIT``); 0 does not wait.
        replica_timeout_ms: how long to wait for them; then :class:`ReplicationTimeout`.
        call_timeout: seconds a call may wait for Redis (besides WAIT); then
            :class:`RedisUnavailable`.

    Raises:
        ValueError: if ``client`` decodes responses, a replica setting is negative or
            ``call_timeout`` is not positive.
    """

    __slots__ = (
        "_bound",
        "_client",
        "_direct",
        "_nodes",
        "_wait_timeout",
        "call_timeout",
        "cluster",
        "replica_timeout_ms",
        "replicas",
    )

    def __init__(
        self,
        client: Client,
        *,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        if client.get_encoder().decode_responses:
            raise ValueError("client must be created with decode_responses=False")
        if replicas < 0 or replica_timeout_ms < 0:
            raise ValueError(
                f"replicas and replica_timeout must be >= 0, got {replicas}, {replica_timeout_ms}"
            )
        if not call_timeout > 0:  # also refuses NaN
            raise ValueError(f"call_timeout must be > 0 seconds, got {call_timeout!r}")
        self._client = client  # the redis-py client (one Redis or a cluster)
        self.call_timeout = float(call_timeout)  # bound of one call (s)
        self._bound = Bound(self.call_timeout)  # of single calls (run)
        self._wait_timeout = self.call_timeout + replica_timeout_ms / 1000  # with WAIT
        self.cluster = isinstance(client, RedisCluster)  # scripts routed by slot
        self.replicas = replicas  # WAIT for this many replicas after producer writes
        self.replica_timeout_ms = replica_timeout_ms  # WAIT's timeout
        self._nodes: dict[str, redis.asyncio.Redis] = {}  # cluster node name -> plain client
        # One Redis: single script calls skip redis-py's command machinery (_direct.py).
        self._direct = Direct(client) if Direct.usable(client) else None  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Close the per-node clients and the held connections this store made (never
        the caller's client)."""
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.aclose()
        if self._direct is not None:
            await self._direct.aclose()

    def _node_client(self, node: Any) -> redis.asyncio.Redis:
        """A plain client of one cluster node, with the cluster client's settings."""
        client = self._nodes.get(node.name)
        if client is None:
            # Never re-send: a lost reply is the caller's to recover (see claim.lua).
            options = {**node.connection_kwargs, "retry": no_retry()}
            pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **options)
            client = self._nodes[node.name] = redis.asyncio.Redis(connection_pool=pool)
        return client

    @property
    def client(self) -> Client:
        """The redis-py client (a ``Redis`` or a ``RedisCluster``)."""
        return self._client

    async def run(self, script: Any, keys: Sequence[str], args: Sequence[Any], shard: int) -> Any:
        """One script call, bounded by ``call_timeout``, its errors translated (Redis's
        errors naming ``shard``)."""
        bound = self._bound
        task = bound.enter()
        try:
            if self._direct is not None:
                return await self._direct.evalsha(script, keys, args)
            return await script(keys, args)
        except REDIS_ERRORS as exc:
            raise translate(exc, shard) from exc
        except asyncio.CancelledError:
            if bound.expired(task):
                raise self._no_reply(bound.seconds) from None
            raise
        except TimeoutError:
            raise self._no_reply(bound.seconds) from None
        finally:
            bound.leave(task)

    @staticmethod
    def _no_reply(seconds: float) -> RedisUnavailable:
        return RedisUnavailable(
            f"redis unavailable: no reply within {seconds:g} s (the call may have run)"
        )

    async def write(self, script: Any, keys: Sequence[str], args: Sequence[Any], shard: int) -> Any:
        """A producer write: one script call, then WAIT when replicas are asked for."""
        if not self.replicas:
            return await self.run(script, keys, args, shard)
        (reply,) = await self.pipelined([Call(script, keys, args, shard)], wait=True)
        return reply

    async def pipelined(self, calls: Sequence[Call], *, wait: bool) -> list[Any]:
        """Script calls in one pipeline (one round trip per node, no MULTI); with
        ``wait``, then ``WAIT`` on each node's connection. Replies in call order.

        Raises:
            ReplicationTimeout: if a node's WAIT saw fewer than ``replicas``.
            RedisUnavailable, Fenced, ...: the first failed call's error, translated.
        """
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        bound = self._wait_timeout if wait else self.call_timeout
        for _ in range(_MAX_ROUNDS):
            try:
                async with timeout(bound):
                    got = await self._send(calls, todo, wait)
            except REDIS_ERRORS as exc:
                raise translate(exc) from exc
            except TimeoutError:
                raise self._no_reply(bound) from None
            resend: list[int] = []
            for i, reply in zip(todo, got, strict=False):
                if isinstance(reply, _RESEND):
                    resend.append(i)
                elif isinstance(reply, REDIS_ERRORS):
                    raise translate(reply, calls[i].shard) from reply
                else:
                    replies[i] = reply
            for acked in got[len(todo) :]:
                if acked is None:
                    continue
                if isinstance(acked, REDIS_ERRORS):
                    raise translate(acked) from acked
                if int(acked) < self.replicas:
                    raise ReplicationTimeout(
                        f"{acked} of {self.replicas} replicas confirmed the write within "
                        f"{self.replica_timeout_ms} ms",
                        int(acked),
                        self.replicas,
                    )
            if not resend:
                return replies
            try:
                async with timeout(self.call_timeout):
                    await self._recover(
                        [calls[i] for i in resend], [got[todo.index(i)] for i in resend]
                    )
            except TimeoutError:
                raise self._no_reply(self.call_timeout) from None
            todo = resend
        raise translate(redis.exceptions.TryAgainError("slot map kept moving; try again"))

    async def _send(self, calls: Sequence[Call], todo: Sequence[int], wait: bool) -> list[Any]:
        """Replies of ``calls[i]`` for i in ``todo``, then one WAIT reply per node."""
        if not self.cluster:
            if self._direct is not None and not wait:  # packed here: see _direct.py
                return await self._direct.pipeline(
                    [(calls[i].script, calls[i].keys, calls[i].args) for i in todo]
                )
            return await self._send_node(self._client, calls, todo, wait)
        cluster: Any = self._client
        await cluster.initialize()  # routing needs the slot map (no-op once loaded)
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i in todo:
            node = cluster.get_node_from_key(calls[i].keys[0])
            by_node.setdefault(node.name, (node, []))[1].append(i)
        parts = await asyncio.gather(
            *(
                self._send_node(self._node_client(node), calls, ids, wait)
                for node, ids in by_node.values()
            ),
            return_exceptions=True,
        )
        replies: dict[int, Any] = {}
        waits: list[Any] = []
        for (_, ids), part in zip(by_node.values(), parts, strict=True):
            if isinstance(part, BaseException):
                if not isinstance(part, Exception):
                    raise part
                got = [part] * (len(ids) + wait)  # the node failed: every call with it
            else:
                got = part
            replies.update(zip(ids, got, strict=False))
            waits += got[len(ids) :]
        return [replies[i] for i in todo] + waits

    async def _send_node(
        self, client: Any, calls: Sequence[Call], todo: Sequence[int], wait: bool
    ) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for i in todo:
            call = calls[i]
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        if wait:
            pipe.execute_command("WAIT", self.replicas, self.replica_timeout_ms)
        got = list(await pipe.execute(raise_on_error=False))
        if wait and all(isinstance(r, _RESEND) for r in got[:-1]):
            got[-1] = None  # nothing ran on this connection: nothing for WAIT to confirm
        return got

    async def _recover(self, calls: Sequence[Call], errors: Sequence[Any]) -> None:
        """Load missing scripts and refresh the slot map before a resend."""
        loaded: set[str] = set()
        for call, error in zip(calls, errors, strict=True):
            try:
                if isinstance(error, redis.exceptions.NoScriptError):
                    if call.script.sha not in loaded:
                        await self._client.script_load(call.script.script)
                        loaded.add(call.script.sha)
                else:
                    # A keyed read through the cluster client follows MOVED/ASK and
                    # updates its slot map.
                    await self._client.exists(call.keys[0])
            except REDIS_ERRORS as exc:
                raise translate(exc, call.shard) from exc

    async def batch(
        self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any], int]]
    ) -> list[Any]:
        """``script`` once per ``(keys, args, shard)``, one round trip per node; the
        replies in call order.

        On one Redis without ``replicas`` the calls go in one MULTI/EXEC: all run or
        none. On a cluster, or with ``replicas`` (WAIT cannot follow EXEC on one
        connection), they are pipelined (:meth:`pipelined`, then WAIT): each is atomic on
        its own, and a failure may leave some run. Bounded by ``call_timeout`` as a
        whole: the caller keeps ``calls`` small enough for one bounded round trip
        (``Store.schedule_many`` sends one round of ``_calls.schedule_rounds`` a time).

        Raises:
            RedisUnavailable, Fenced, ReplicationTimeout, ...: the first error, translated.
        """
        if self.cluster or self.replicas:
            pipelined = [Call(script, keys, args, shard) for keys, args, shard in calls]
            return await self.pipelined(pipelined, wait=bool(self.replicas))
        return await self._transaction(script, [(keys, args) for keys, args, _ in calls])

    async def _transaction(
        self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """``script`` once per ``(keys, args)`` in one MULTI/EXEC on one Redis, within
        ``call_timeout``."""
        try:
            async with timeout(self.call_timeout):
                if self._direct is not None:
                    return await self._direct.transaction(script, calls)
                client: Any = self._client
                async with client.pipeline(transaction=True) as pipe:
                    for keys, args in calls:
                        await script(keys, args, client=pipe)
                    return list(await pipe.execute())
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        except TimeoutError:
            raise self._no_reply(self.call_timeout) from None

    async def bounded(self, call: Callable[[], Awaitable[Any]], shard: int = -1) -> Any:
        """Await ``call()`` (one plain command, or a script the caller holds) within
        ``call_timeout``, its errors translated to the library's."""
        try:
            async with timeout(self.call_timeout):
                return await call()
        except REDIS_ERRORS as exc:
            raise translate(exc, shard) from exc
        except TimeoutError:
            raise self._no_reply(self.call_timeout) from None
