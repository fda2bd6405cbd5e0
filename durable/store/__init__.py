"""The Redis store: one awaitable method per Lua script, and the client that carries them.

Owns: ``lua/`` (one atomic transition per file), the key names (``_keys.py``), the job
codec (``_codec.py``: a JobSpec to its record and a reply back to a Job), the msgpack
bytes by hand (``_msgpack.py``), script loading (``_scripts.py``), the connection to one
Redis or a Redis Cluster (``_connect.py``), the translation of Redis errors
(``_errors.py``), the bounded transport of script calls (``_transport.py``), the store's
job lifecycle calls (``_store.py``), shard ownership (``_fencing.py``), the operator's
calls (``_operator_calls.py``), the startup check of a server (``_server_check.py``), the
namespace's layout key (``_layout.py``), the workers' member set and stats documents
(``_workers.py``), the commands of a Redis Stream (``_streams.py``), the producer
scripts' keys, arguments and replies as pure functions (``_calls.py``) and the same
producer calls over redis-py's sync client (``_sync_store.py``, :class:`SyncStore`).

Invariants: a :class:`Store` method is one script call (or one pipeline of the same
script over shards): no loops over time, no sleeping; every call is bounded by
``call_timeout``; redis-py's untyped replies stop here. No other layer imports redis-py
(``tests/test_layers.py``): what they need of it is named here (``REDIS_ERRORS``,
``NO_REPLY_ERRORS``, ``CLUSTER_ERRORS``, ``error_reply``, ``is_cluster``).

May import: ``tickwheel.durable.model``, ``tickwheel.wheel`` (for its timeout), redis-py.
"""

from __future__ import annotations

from ._calls import ClaimLimits
from ._codec import (
    KEY_FIELD,
    TIMEOUT_FIELD,
    TRACE_FIELD,
    ClaimedRef,
    EncodedJob,
    decode_payload,
    encode_job,
    encode_payload,
    pack_record,
    record_count,
    record_fields,
    record_priority,
    with_key,
    with_priority,
    with_timeout,
    with_trace,
    with_version,
)
from ._connect import (
    URL_ENV,
    Client,
    client_from_url,
    connect,
    is_cluster,
    no_retry,
    parse_nodes,
    split_url,
)
from ._errors import (
    CLUSTER_ERRORS,
    NO_REPLY_ERRORS,
    REDIS_ERRORS,
    error_reply,
    script_error_text,
    translate,
    unwrap,
)
from ._history import BATCH_MAX, HISTORY_CAP, HISTORY_SCAN, HistoryBoard, HistoryEntry
from ._keys import DEFAULT_BUCKETS, MAX_JOB_ID_BYTES, Keys, parse_layout
from ._layout import LayoutUnreadable, read_layout
from ._limits import ACQUIRED, PERMIT_WAIT, RATE_WAIT, KeyState, LimitCalls, member_of
from ._msgpack import pack_array
from ._scripts import register
from ._secrets import hidden, hide_secrets, shown_url, url_error
from ._server_check import (
    MIN_REDIS_VERSION,
    ServerConfigWarning,
    ServerReport,
    check_server,
    crash_loss,
)
from ._store import Store
from ._streams import RawEntry, Stream
from ._sync_store import SyncClient, SyncStore, is_sync_client, sync_client_from_url
from ._transport import DEFAULT_CALL_TIMEOUT, Transport
from ._workers import (
    SAMPLE_S,
    STATS_COUNTERS,
    STATS_VERSION,
    Sample,
    WorkerBoard,
    WorkerEntry,
    parse_sample,
    parse_stats_document,
    task_growth,
)

__all__ = [
    "ACQUIRED",
    "BATCH_MAX",
    "CLUSTER_ERRORS",
    "DEFAULT_BUCKETS",
    "DEFAULT_CALL_TIMEOUT",
    "HISTORY_CAP",
    "HISTORY_SCAN",
    "KEY_FIELD",
    "MAX_JOB_ID_BYTES",
    "MIN_REDIS_VERSION",
    "NO_REPLY_ERRORS",
    "PERMIT_WAIT",
    "RATE_WAIT",
    "REDIS_ERRORS",
    "SAMPLE_S",
    "STATS_COUNTERS",
    "STATS_VERSION",
    "TIMEOUT_FIELD",
    "TRACE_FIELD",
    "URL_ENV",
    "ClaimLimits",
    "ClaimedRef",
    "Client",
    "EncodedJob",
    "HistoryBoard",
    "HistoryEntry",
    "KeyState",
    "Keys",
    "LayoutUnreadable",
    "LimitCalls",
    "RawEntry",
    "Sample",
    "ServerConfigWarning",
    "ServerReport",
    "Store",
    "Stream",
    "SyncClient",
    "SyncStore",
    "Transport",
    "WorkerBoard",
    "WorkerEntry",
    "check_server",
    "client_from_url",
    "connect",
    "crash_loss",
    "decode_payload",
    "encode_job",
    "encode_payload",
    "error_reply",
    "hidden",
    "hide_secrets",
    "is_cluster",
    "is_sync_client",
    "member_of",
    "no_retry",
    "pack_array",
    "pack_record",
    "parse_layout",
    "parse_nodes",
    "parse_sample",
    "parse_stats_document",
    "read_layout",
    "record_count",
    "record_fields",
    "record_priority",
    "register",
    "script_error_text",
    "shown_url",
    "split_url",
    "sync_client_from_url",
    "task_growth",
    "translate",
    "unwrap",
    "url_error",
    "with_key",
    "with_priority",
    "with_timeout",
    "with_trace",
    "with_version",
]
