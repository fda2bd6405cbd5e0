"""The loops that run jobs: loader, task runner, worker, reaper, spill and stream handoff.

Owns: the :class:`Loader` (``_loader.py``), composed of the claim rounds that place due
jobs in a wheel (``_claims.py``), the runner of their handlers with its slots
(``_runner.py``; the jobs waiting for a slot and their shedding in ``_waiting.py``, lease
extension in ``_extending.py``, stopping running handlers in ``_stopping.py``, failed
attempts in ``_failures.py``) and the ack batcher (``_acks.py``); the :class:`Worker`
that holds shards and runs the rest, the reaper round, :class:`Timers` (the spill), the
task registry and the Redis Streams handoff; the handoff's message format and broker
consumers' dedup (``_handoff.py``), and its brokers in modules of their own, imported
only when used: ``jetstream`` (NATS, ``tickwheel[nats]``) and ``amqp`` (RabbitMQ,
``tickwheel[rabbitmq]``).

Invariants: a loop only sets the pace; every decision about time is taken by a script
on Redis's clock; a round that fails is logged and retried after a pause, never fatal.

May import: ``tickwheel.durable.scheduler``, ``.postgres``, ``.store``, ``.model`` and
``tickwheel.wheel``.
"""

from __future__ import annotations

from ._handles import TaskHandle
from ._handoff import (
    FORMAT_VERSION,
    BrokerMessage,
    HandoffConsumer,
    decode_message,
    encode_message,
    message_id,
)
from ._loader import (
    DEFAULT_LIMIT,
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_LOADED,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_START_MARGIN,
    Loader,
    LoaderStats,
)
from ._reaper import DEFAULT_REAP_INTERVAL, DEFAULT_REAP_LIMIT, Reaper
from ._spill import DEFAULT_THRESHOLD, Timers
from ._stopping import TaskTimeout
from ._stream import Publisher, StreamConsumer, StreamEntry, StreamPublisher
from ._task_stats import MAX_TASKS, TASK_FIELDS
from ._tasks import TaskContext, TaskOptions, TaskRegistry
from ._worker import DEFAULT_DRAIN_TIMEOUT, DEFAULT_RECONCILE_INTERVAL, STATS_COUNTERS, Worker

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_LIMIT",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_LOADED",
    "DEFAULT_MAX_RUNNING",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_REAP_INTERVAL",
    "DEFAULT_REAP_LIMIT",
    "DEFAULT_RECONCILE_INTERVAL",
    "DEFAULT_START_MARGIN",
    "DEFAULT_THRESHOLD",
    "FORMAT_VERSION",
    "MAX_TASKS",
    "STATS_COUNTERS",
    "TASK_FIELDS",
    "BrokerMessage",
    "HandoffConsumer",
    "Loader",
    "LoaderStats",
    "Publisher",
    "Reaper",
    "StreamConsumer",
    "StreamEntry",
    "StreamPublisher",
    "TaskContext",
    "TaskHandle",
    "TaskOptions",
    "TaskRegistry",
    "TaskTimeout",
    "Timers",
    "Worker",
    "decode_message",
    "encode_message",
    "message_id",
]
