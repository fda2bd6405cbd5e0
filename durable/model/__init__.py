"""The vocabulary every layer of tickwheel.durable shares: jobs, recurrences, errors, counters.

Owns: the typed values (``JobSpec``, ``Job``, ``JobInfo``, results), the argument checks
that build them, recurrence arithmetic, the error classes and the counters.

Invariants: values are validated when they are built, so a bad argument is refused
before anything is sent; times are integer ms from Redis's (or PostgreSQL's) clock.

May import: the standard library and ``cronsim``; nothing else from tickwheel.
"""

from __future__ import annotations

from ._args import async_client, finite_seconds_ms, int_between
from ._cancel import CancelResult
from ._errors import (
    BrokerMisconfigured,
    BrokerUnavailable,
    DurableError,
    Fenced,
    LeaseLost,
    ListingTooLong,
    NotOwner,
    PostgresModeRequired,
    PostgresUnavailable,
    RedisConfigError,
    RedisUnavailable,
    ReplicationTimeout,
    SchemaNotReady,
    ServerCheckFailed,
    ShardCountMismatch,
)
from ._flow import MAX_DEFER_S, Defer, flow_ms
from ._jobs import (
    DEFAULT_MAX_ATTEMPTS,
    ERROR_TRACEBACK_MARK,
    MAX_JOB_ID_BYTES,
    MAX_PRIORITY,
    MAX_TASK_BYTES,
    MAX_TRACE_BYTES,
    MIN_AT_MS,
    PRIORITY_AGING,
    ClaimBatch,
    DeadPage,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    ReapResult,
    ScheduleResult,
    ScheduleStatus,
    ShardInfo,
    aging_ms,
    check_job_id,
    check_priority,
    check_task_name,
    check_trace,
    split_error,
    when_args,
)
from ._payload import MAX_PAYLOAD_DEPTH, UndecodablePayload, payload_problem
from ._recurrence import (
    DEFAULT_MAX_CATCH_UP,
    DEFAULT_MISFIRE_GRACE_MS,
    KIND_CRON,
    KIND_INTERVAL,
    POLICY_BY_CODE,
    POLICY_CODES,
    MissedRun,
    Recurrence,
)
from ._stats import LATENESS_BOUNDS, Counters, LatenessHistogram, SchedulerStats, count_reap

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_CATCH_UP",
    "DEFAULT_MISFIRE_GRACE_MS",
    "ERROR_TRACEBACK_MARK",
    "KIND_CRON",
    "KIND_INTERVAL",
    "LATENESS_BOUNDS",
    "MAX_DEFER_S",
    "MAX_JOB_ID_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PRIORITY",
    "MAX_TASK_BYTES",
    "MAX_TRACE_BYTES",
    "MIN_AT_MS",
    "POLICY_BY_CODE",
    "POLICY_CODES",
    "PRIORITY_AGING",
    "BrokerMisconfigured",
    "BrokerUnavailable",
    "CancelResult",
    "ClaimBatch",
    "Counters",
    "DeadPage",
    "Defer",
    "DurableError",
    "Fenced",
    "Job",
    "JobInfo",
    "JobSpec",
    "JobState",
    "LatenessHistogram",
    "LeaseLost",
    "ListingTooLong",
    "MissedRun",
    "NotOwner",
    "PostgresModeRequired",
    "PostgresUnavailable",
    "ReapResult",
    "Recurrence",
    "RedisConfigError",
    "RedisUnavailable",
    "ReplicationTimeout",
    "ScheduleResult",
    "ScheduleStatus",
    "SchedulerStats",
    "SchemaNotReady",
    "ServerCheckFailed",
    "ShardCountMismatch",
    "ShardInfo",
    "UndecodablePayload",
    "aging_ms",
    "async_client",
    "check_job_id",
    "check_priority",
    "check_task_name",
    "check_trace",
    "count_reap",
    "finite_seconds_ms",
    "flow_ms",
    "int_between",
    "payload_problem",
    "split_error",
    "when_args",
]
