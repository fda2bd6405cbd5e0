"""tickwheel.durable: a Redis lease scheduler for delayed jobs that must survive crashes.

Jobs live in Redis sorted sets, sharded by job id, and move between states only inside
Lua scripts that read Redis's clock (see docs/design.md). It runs unchanged on
one Redis or a Redis Cluster (:func:`connect` takes either URL). Start with
:class:`Scheduler`; :class:`Timers` spills long or durable timers from the in-memory
wheel to Redis, and a :class:`Worker` (``tickwheel worker``) loads them back and runs
the tasks of a :class:`TaskRegistry`.
"""

from __future__ import annotations

import logging

from .model import (
    MAX_PAYLOAD_DEPTH,
    MAX_PRIORITY,
    PRIORITY_AGING,
    BrokerMisconfigured,
    BrokerUnavailable,
    CancelResult,
    ClaimBatch,
    DeadPage,
    Defer,
    DurableError,
    Fenced,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    LeaseLost,
    ListingTooLong,
    MissedRun,
    NotOwner,
    PostgresModeRequired,
    PostgresUnavailable,
    ReapResult,
    Recurrence,
    RedisConfigError,
    RedisUnavailable,
    ReplicationTimeout,
    ScheduleResult,
    SchedulerStats,
    ScheduleStatus,
    SchemaNotReady,
    ServerCheckFailed,
    ShardCountMismatch,
    ShardInfo,
    UndecodablePayload,
)
from .runtime import (
    Loader,
    LoaderStats,
    Publisher,
    Reaper,
    StreamConsumer,
    StreamEntry,
    StreamPublisher,
    TaskContext,
    TaskHandle,
    TaskRegistry,
    Timers,
    Worker,
)
from .scheduler import Ownership, Scheduler, SyncScheduler
from .store import (
    MAX_JOB_ID_BYTES,
    Client,
    Keys,
    ServerConfigWarning,
    ServerReport,
    Store,
    check_server,
    connect,
)

__all__ = [
    "MAX_JOB_ID_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PRIORITY",
    "PRIORITY_AGING",
    "BrokerMisconfigured",
    "BrokerUnavailable",
    "CancelResult",
    "ClaimBatch",
    "Client",
    "DeadPage",
    "Defer",
    "DurableError",
    "Fenced",
    "Job",
    "JobInfo",
    "JobSpec",
    "JobState",
    "Keys",
    "LeaseLost",
    "ListingTooLong",
    "Loader",
    "LoaderStats",
    "MissedRun",
    "NotOwner",
    "Ownership",
    "PostgresModeRequired",
    "PostgresUnavailable",
    "Publisher",
    "ReapResult",
    "Reaper",
    "Recurrence",
    "RedisConfigError",
    "RedisUnavailable",
    "ReplicationTimeout",
    "ScheduleResult",
    "ScheduleStatus",
    "Scheduler",
    "SchedulerStats",
    "SchemaNotReady",
    "ServerCheckFailed",
    "ServerConfigWarning",
    "ServerReport",
    "ShardCountMismatch",
    "ShardInfo",
    "Store",
    "StreamConsumer",
    "StreamEntry",
    "StreamPublisher",
    "SyncScheduler",
    "TaskContext",
    "TaskHandle",
    "TaskRegistry",
    "Timers",
    "UndecodablePayload",
    "Worker",
    "check_server",
    "connect",
]

# Quiet unless the application configures logging (the library convention): without a
# handler anywhere, Python's last-resort handler would print our warnings to stderr.
logging.getLogger("tickwheel.durable").addHandler(logging.NullHandler())
