"""tickwheel.durable: a Redis lease scheduler for delayed jobs that must survive crashes.

Jobs live in Redis sorted sets, sharded by job id, and move between states only inside
Lua scripts that read Redis's clock (see DESIGN.md, "durable/"). It runs unchanged on
one Redis or a Redis Cluster (:func:`connect` takes either URL). Start with
:class:`Scheduler`; :class:`Timers` spills long or durable timers from the in-memory
wheel to Redis, and a :class:`Worker` (``tickwheel worker``) loads them back and runs
the tasks of a :class:`TaskRegistry`.
"""

from __future__ import annotations

import logging

from ._check import ServerConfigWarning, ServerReport, check_server
from ._connect import Client, connect
from ._errors import (
    DurableError,
    Fenced,
    LeaseLost,
    NotOwner,
    PostgresUnavailable,
    RedisUnavailable,
    ReplicationTimeout,
    SchemaNotReady,
    ServerCheckFailed,
    ShardCountMismatch,
)
from ._keys import MAX_JOB_ID_BYTES, Keys
from ._loader import Loader, LoaderStats
from ._model import (
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
)
from ._ownership import Ownership
from ._reaper import Reaper
from ._recurrence import MissedRun, Recurrence
from ._scheduler import Scheduler
from ._spill import Timers
from ._stats import SchedulerStats
from ._store import Store
from ._stream import Publisher, StreamConsumer, StreamEntry, StreamPublisher
from ._tasks import TaskContext, TaskRegistry
from ._worker import Worker

__all__ = [
    "MAX_JOB_ID_BYTES",
    "ClaimBatch",
    "Client",
    "DeadPage",
    "DurableError",
    "Fenced",
    "Job",
    "JobInfo",
    "JobSpec",
    "JobState",
    "Keys",
    "LeaseLost",
    "Loader",
    "LoaderStats",
    "MissedRun",
    "NotOwner",
    "Ownership",
    "PostgresUnavailable",
    "Publisher",
    "ReapResult",
    "Reaper",
    "Recurrence",
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
    "TaskContext",
    "TaskRegistry",
    "Timers",
    "Worker",
    "check_server",
    "connect",
]

# Quiet unless the application configures logging (the library convention): without a
# handler anywhere, Python's last-resort handler would print our warnings to stderr.
logging.getLogger("tickwheel.durable").addHandler(logging.NullHandler())
