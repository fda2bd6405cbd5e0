"""The facade: the job operations of :class:`Scheduler`, its owner-side calls, shard ownership.

Owns: the public job operations (schedule, cancel, reschedule, get, dead letters), the
calls an owner of a shard makes with its epoch (claim, ack, retry, extend, release,
reap), and :class:`Ownership` (shard tokens and fencing epochs). :class:`Scheduler`
builds and holds one object per room, and its public methods delegate to them:
``Producer`` (``_producer.py``, jobs by id; :class:`SyncScheduler` in ``_sync.py`` is the
same producer, blocking, over a sync client), ``Leases`` (``_leases.py``, the owner's
calls; the runtime's hot path calls ``scheduler.leases`` directly), ``Operator``
(``_operator.py``, inspect and dead letters) and ``Console`` (``_console.py``, the
dashboard's reads); ``Ownership`` lives in ``_shard_owner.py``.

Invariants: every state change is one store call; nothing is kept only in memory except
the epochs of the shards this process owns; arguments are checked before anything is
sent; a ``Fenced`` reply drops the shard in one place (``Ownership.fenced``).

May import: ``tickwheel.durable.postgres``, ``.store``, ``.model``. It has no loops: the
rounds that call it live in ``tickwheel.durable.runtime``.
"""

from __future__ import annotations

from ._scheduler import DEFAULT_LEASE, DEFAULT_SHARDS, MAX_BATCH, MAX_ERROR_CHARS, Scheduler
from ._shard_owner import DEFAULT_OWNER_TTL, RENEW_FRACTION, Ownership
from ._sync import SyncScheduler
from ._tracing import (
    ACKED,
    CANCELLED,
    DEAD,
    DEFERRED,
    LEASE_LOST,
    OUTCOMES,
    RELEASED,
    RETRIED,
    TIMED_OUT,
    UNSETTLED,
    Tracing,
    make_tracing,
)

__all__ = [
    "ACKED",
    "CANCELLED",
    "DEAD",
    "DEFAULT_LEASE",
    "DEFAULT_OWNER_TTL",
    "DEFAULT_SHARDS",
    "DEFERRED",
    "LEASE_LOST",
    "MAX_BATCH",
    "MAX_ERROR_CHARS",
    "OUTCOMES",
    "RELEASED",
    "RENEW_FRACTION",
    "RETRIED",
    "TIMED_OUT",
    "UNSETTLED",
    "Ownership",
    "Scheduler",
    "SyncScheduler",
    "Tracing",
    "make_tracing",
]
