"""The synchronous store: the producer's script calls over redis-py's sync client.

Ground rules:

- Only the I/O is here. What each call sends (keys, arguments) and how its reply is read
  come from ``_calls.py``, the scripts' text from ``_scripts.py`` and the job's encoding
  from ``_codec.py``: the same code the asyncio :class:`~._store.Store` runs.
- The client is a ``redis.Redis`` or a ``redis.cluster.RedisCluster`` (``SyncClient``),
  with ``decode_responses=False``. Both keep a pool of connections and are safe to share
  between threads; nothing here is mutable after construction except a script's sha
  cache, which every thread would set to the same value.
- Every call is bounded: a plain client's calls go through a pool of this store's own,
  made from the client's settings with the socket timeouts capped at ``call_timeout``
  and no retries (closed by :meth:`SyncStore.close`); a cluster client must have a
  socket timeout of its own (it is then the bound of one attempt). A timeout or a lost
  connection is :class:`RedisUnavailable`; errors are translated by ``_errors.translate``
  as for the asyncio store.
- A script goes as EVALSHA; a NOSCRIPT reply (a SCRIPT FLUSH, a fresh master after a
  failover) means it did not run, so it is loaded and sent again, once. Nothing is
  re-sent after a lost reply: the caller may retry (every producer script is safe to
  send again: a schedule of the same id keeps, a cancel of a gone id finds nothing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from tickwheel.durable.model import JobInfo, JobState, PostgresModeRequired, ScheduleResult

from . import _calls as calls
from ._codec import EncodedJob
from ._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    _no_secrets,
    cluster_target,
)
from ._errors import REDIS_ERRORS, translate
from ._keys import Keys
from ._pauses import RESUME_BATCH, pause_state_call, paused_state, shard_pause_call
from ._scripts import source
from ._transport import DEFAULT_CALL_TIMEOUT

__all__ = ["SyncClient", "SyncScript", "SyncStore", "is_sync_client", "sync_client_from_url"]

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"


def _never() -> Retry:
    return Retry(NoBackoff(), 0)


def is_sync_client(client: object) -> bool:
    """True for a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (not asyncio's)."""
    return isinstance(client, redis.Redis | redis.cluster.RedisCluster)


def sync_client_from_url(url: str, *, cluster: bool = False, **kwargs: Any) -> SyncClient:
    """A sync client for ``url``, without I/O, bounded like :func:`client_from_url`'s:
    socket timeouts (default 5 s) and no retries. The URL names a cluster as there
    (``redis+cluster://``, several hosts, or ``cluster=True``).

    Raises:
        TypeError, ValueError: for a malformed URL or ``decode_responses=True``.
    """
    if kwargs.get("decode_responses"):
        raise ValueError("decode_responses must be False: payloads are bytes")
    kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    kwargs.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    kwargs.setdefault("retry", _never())
    with _no_secrets(url):
        target = cluster_target(url, cluster)
        if target is None:
            return redis.Redis.from_url(url, **kwargs)
        first, nodes = target
        if len(nodes) > 1:
            node: Any = redis.cluster.ClusterNode  # untyped in redis-py
            kwargs["startup_nodes"] = [node(h, p) for h, p in nodes]
        return redis.cluster.RedisCluster.from_url(first, **kwargs)


class SyncScript:
    """One Lua script (``_scripts.source``) sent by EVALSHA, loaded on NOSCRIPT."""

    __slots__ = ("sha", "text")

    def __init__(self, name: str) -> None:
        self.text = source(name)
        self.sha = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA; on NOSCRIPT (it did not run) SCRIPT LOAD and EVALSHA once more."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.text)
            return client.evalsha(self.sha, len(keys), *keys, *args)


_PRODUCER_SCRIPTS = (
    *("init", "now", "schedule", "schedule_one", "flow", "cancel", "reschedule", "get"),
    *("pause", "pause_state"),
)


class SyncStore:
    """The producer's scripts over one namespace, on a sync client (thread-safe).

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster``,
            ``decode_responses=False``.
        keys: the namespace's key names.
        call_timeout: seconds one call may wait for a reply (a plain client's socket
            timeouts are capped at it).

    Raises:
        TypeError: for an asyncio client or anything else.
        ValueError: for a client that decodes responses, a cluster client without a
            socket timeout, or a ``call_timeout`` that is not > 0.
    """

    __slots__ = ("_own", "call_timeout", "client", "cluster", "keys", "scripts")

    def __init__(
        self, client: SyncClient, keys: Keys, *, call_timeout: float = DEFAULT_CALL_TIMEOUT
    ) -> None:
        if not is_sync_client(client):
            kind = f"{type(client).__module__}.{type(client).__qualname__}"
            raise TypeError(
                "client must be a sync Redis client (redis.Redis or redis.cluster.RedisCluster)"
                f", got {kind}"
            )
        if client.get_encoder().decode_responses:
            raise ValueError("client must be created with decode_responses=False")
        if not call_timeout > 0:
            raise ValueError(f"call_timeout must be > 0, got {call_timeout!r}")
        self.call_timeout = float(call_timeout)
        self.keys = keys
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self._own: redis.Redis | None = None
        if isinstance(client, redis.cluster.RedisCluster):
            timeout = client.nodes_manager.connection_kwargs.get("socket_timeout")
            if timeout is None:
                raise ValueError(
                    "a cluster client must have a socket_timeout (calls must be bounded):"
                    " make it with socket_timeout=..., or use sync_client_from_url"
                )
            self.client: Any = client
        else:
            pool = client.connection_pool
            options = dict(pool.connection_kwargs)
            for name in ("socket_timeout", "socket_connect_timeout"):
                given = options.get(name)
                options[name] = self.call_timeout if given is None else min(given, call_timeout)
            options["retry"] = _never()  # never re-send behind the caller's back
            own = redis.ConnectionPool(connection_class=pool.connection_class, **options)
            self._own = self.client = redis.Redis(connection_pool=own)
        self.scripts = {name: SyncScript(name) for name in _PRODUCER_SCRIPTS}

    def close(self) -> None:
        """Close the pool this store made (never the caller's client)."""
        if self._own is not None:
            self._own.close()
            self._own.connection_pool.disconnect()

    def _run(self, name: str, call: tuple[list[str], list[Any]], shard: int) -> Any:
        keys, args = call
        try:
            return self.scripts[name](self.client, keys, args)
        except REDIS_ERRORS as exc:
            raise translate(exc, shard) from exc

    # -- the calls, one script each (what Store's methods of the same names do) --------

    def init(self, postgres: bool = False) -> tuple[int, int]:
        """Store the layout on first use (init.lua, and the Postgres mode when
        ``postgres``); return the stored one.

        Raises:
            PostgresModeRequired: the namespace is in the Postgres mode and this producer
                (``postgres`` False) is not (nothing was written).
        """
        reply = self._run("init", calls.init_call(self.keys, postgres), -1)
        try:
            return calls.init_result(self.keys, reply, postgres)
        except PostgresModeRequired:
            detail = "pass SyncScheduler(..., postgres_url=...)"
            raise PostgresModeRequired(self.keys.namespace, detail) from None

    def now(self, shard: int) -> int:
        """Redis's now for ``shard`` in ms (now.lua)."""
        return int(self._run("now", calls.now_call(self.keys, shard), shard))

    def schedule_one(self, shard: int, job: EncodedJob, replace: bool) -> ScheduleResult:
        """Create, keep or replace one job (schedule_one.lua)."""
        call = calls.schedule_one_call(self.keys, shard, job, replace)
        return calls.schedule_one_result(job, self._run("schedule_one", call, shard))

    def schedule_flow(
        self, shard: int, job: EncodedJob, flow: tuple[str, int, int]
    ) -> ScheduleResult:
        """Schedule one job under debounce or throttle (flow.lua)."""
        call = calls.flow_call(self.keys, shard, job, flow)
        return calls.schedule_one_result(job, self._run("flow", call, shard))

    def schedule_many(
        self, groups: Mapping[int, Sequence[Sequence[EncodedJob]]], replace: bool
    ) -> list[ScheduleResult]:
        """schedule.lua once per chunk, in the bounded rounds of the asyncio store
        (``calls.schedule_rounds``, :meth:`Store.schedule_many`), one after the other.

        On one Redis each round is one MULTI/EXEC (all or nothing per round); on a
        cluster each chunk is one call, atomic on its own. A failure leaves the rounds
        before it written, the failed one written whole, in part or not at all, and
        the rest unsent: retrying the whole batch is safe. Each round trip is bounded
        by ``call_timeout`` (the socket timeouts), not the batch.
        """
        results: list[ScheduleResult] = []
        for round_calls in calls.schedule_rounds(self.keys, groups, replace):
            if self.cluster:
                replies = [self._run("schedule", (c.keys, c.args), c.shard) for c in round_calls]
            else:
                replies = self._transaction([(c.keys, c.args) for c in round_calls])
            for call, reply in zip(round_calls, replies, strict=True):
                results += calls.schedule_results(call.jobs, reply)
        return results

    def _transaction(self, todo: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        script = self.scripts["schedule"]
        try:
            for attempt in range(2):
                with self.client.pipeline(transaction=True) as pipe:
                    for keys, args in todo:
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    replies = pipe.execute(raise_on_error=False)
                # EXEC runs every call or none, so NOSCRIPT is on all of them or on none:
                # none ran; load the script and send the transaction once more.
                if attempt or not isinstance(replies[0], redis.exceptions.NoScriptError):
                    break
                self.client.script_load(script.text)
        except REDIS_ERRORS as exc:
            raise translate(exc) from exc
        for reply in replies:
            if isinstance(reply, REDIS_ERRORS):
                raise translate(reply) from reply
        return list(replies)

    def cancel(self, shard: int, job_id: str) -> JobState | None:
        """Remove a job in any state (cancel.lua); the state it had."""
        reply = self._run("cancel", calls.cancel_call(self.keys, shard, job_id), shard)
        return calls.cancel_result(reply)

    def reschedule(
        self, shard: int, job_id: str, mode: int, time_ms: int, version: int = 0
    ) -> tuple[int, int]:
        """Move a due job (reschedule.lua); ``(status, when_ms)``; ``version`` as
        :meth:`Store.reschedule`'s."""
        call = calls.reschedule_call(self.keys, shard, job_id, mode, time_ms, version=version)
        return calls.reschedule_result(self._run("reschedule", call, shard))

    def paused(self) -> dict[str, int]:
        """The pause state of record (:meth:`PauseCalls.state`)."""
        return paused_state(self._run("pause_state", pause_state_call(self.keys, 2), -1))

    def pause(self, task: str, since_ms: int) -> None:
        """:meth:`PauseCalls.pause`, one shard after the other."""
        call = pause_state_call(self.keys, 1, task, since_ms)
        since = paused_state(self._run("pause_state", call, -1)).get(task, since_ms)
        for shard in range(self.keys.shards):
            self._run("pause", shard_pause_call(self.keys, shard, 1, task, since_ms=since), shard)

    def resume(self, task: str) -> int:
        """:meth:`PauseCalls.resume`, one shard after the other; the jobs moved."""
        moved = 0
        for shard in range(self.keys.shards):
            while True:
                call = shard_pause_call(self.keys, shard, 0, task, limit=RESUME_BATCH)
                n = int(self._run("pause", call, shard))
                moved += n
                if n < RESUME_BATCH:
                    break
        self._run("pause_state", pause_state_call(self.keys, 0, task), -1)
        return moved

    def get(self, shard: int, job_id: str) -> JobInfo | None:
        """One job's state and record (get.lua), or None."""
        reply = self._run("get", calls.get_call(self.keys, shard, job_id), shard)
        return calls.get_result(shard, job_id, reply)
