"""The job codec: a :class:`JobSpec` to the record the scripts store, and back to a
:class:`Job` or a :class:`JobInfo`.

Ground rules:

- The record is the job's fields as a msgpack stream in :data:`FIELDS` order, trailing
  defaults dropped. ``lua/_lib.lua`` is the other side of the same layout (its ``F_*``
  constants and ``DEFAULTS``); ``tests/test_durable_keys.py`` holds the two equal.
- A payload is bytes as is (flags 0) or JSON text (:data:`FLAG_JSON`); it is encoded once,
  when the job is scheduled (refused then if it would not come back the same), and
  decoded where a reply is read, here. A payload that cannot be decoded fails its own
  job only: it decodes to an ``UndecodablePayload`` (``model/_payload.py``), never an
  exception in a batch's loop.
- Every reply that carries a record is decoded with what is here: get and listing rows
  into :class:`JobInfo` by :func:`info_rows`; a claim's rows into :class:`Job` by the
  loop in ``Store.claim``, with :data:`CLAIM_SHORT_ROW`, :func:`recurrence_of`,
  :func:`decode_payload` and :func:`init_job` (by position, in :data:`CLAIM_JOB_FIELDS`
  order). That one loop stays in the frame that awaited the reply: the same loop in a
  function here, one call away, measured 870 more client instructions per job
  (callgrind durable-client claim_ack: 18,800 against 17,900; CPython 3.11).

The bytes themselves are packed by ``_msgpack.py``; nothing there knows a job.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgpack  # type: ignore[import-untyped]

from tickwheel.durable.model import (
    KIND_CRON,
    KIND_INTERVAL,
    MAX_KEY_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_PRIORITY,
    MAX_TRACE_BYTES,
    POLICY_BY_CODE,
    POLICY_CODES,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    Recurrence,
    UndecodablePayload,
    payload_problem,
)

from ._msgpack import FIXINT, pack_str, pack_value

__all__ = [
    "CLAIM_FULL_ROW",
    "CLAIM_JOB_FIELDS",
    "CLAIM_SHORT_ROW",
    "CLAIM_TIMED_ROW",
    "CLAIM_VERSIONED_ROW",
    "DEFAULTS",
    "DUPLICATE",
    "FIELDS",
    "FLAG_JSON",
    "KEY_FIELD",
    "PRIORITY_FIELD",
    "TIMEOUT_FIELD",
    "TRACE_FIELD",
    "VERSION_FIELD",
    "ClaimedRef",
    "EncodedJob",
    "claimed_extras",
    "claimed_key",
    "claimed_trace",
    "decode_payload",
    "encode_job",
    "encode_payload",
    "info_rows",
    "init_job",
    "job_info",
    "new_job",
    "pack_oneshot",
    "pack_record",
    "record_count",
    "record_fields",
    "record_priority",
    "recurrence_of",
    "with_key",
    "with_priority",
    "with_timeout",
    "with_trace",
    "with_version",
]

# The job record's fields, in record order: lua/_lib.lua's F_* constants, lowercased
# (F_TASK = 1, ...). tests/test_durable_keys.py holds the two sides equal.
FIELDS = (
    "task",
    "payload",
    "max",
    "flags",
    "nominal",
    "attempt",
    "epoch",
    "rkind",
    "rspec",
    "policy",
    "cap",
    "grace",
    "error",
    "timeout",
    "trace",
    "key",
    "priority",
    "wait",
    "version",
)
# Their defaults, in the same order (lua/_lib.lua: DEFAULTS); trailing ones are dropped.
DEFAULTS: tuple[int | bytes, ...] = (
    *(b"", b"", 5, 0, 0, 1, 0, 0, b"", 0, 0, 0, b"", 0, b""),
    *(b"", 0, 0, 0),  # key, priority, wait, version
)
# Record fields of a claim.lua row that is not short (all of them).
CLAIM_FULL_ROW = len(FIELDS)
TRACE_FIELD = FIELDS.index("trace")  # its index from 0
KEY_FIELD = FIELDS.index("key")
TIMEOUT_FIELD = FIELDS.index("timeout")
PRIORITY_FIELD = FIELDS.index("priority")
VERSION_FIELD = FIELDS.index("version")

FLAG_JSON = 1  # record field 4, bit 0: the payload is JSON text

# Values per job in the replies of get.lua / dead_list.lua / due_list.lua (id, when, then
# the record's fields in FIELDS order). claim.lua's rows have a length of their own.
_ROW_STRIDE = 2 + len(FIELDS)
# A claim.lua row: id, due, deadline, tag (bit 0: the occurrence is done already; the
# rest: the index of the job's record hash), count, then ``count`` record fields: 6 for a
# one-shot job without an error, a timeout of its own or a trace; 7 (those 6, then the
# timeout) for such a job with a timeout of its own; 8 (those 7, then the version) for a
# one-shot job with a version (the Postgres mode); all of them (19) otherwise.
CLAIM_SHORT_ROW = 6
CLAIM_TIMED_ROW = 7
CLAIM_VERSIONED_ROW = 8  # the timed row, then the version (the Postgres mode's records)
DUPLICATE = (False, True)  # a row's tag bit 0 as a bool, indexed (no call of bool())

# A claim builds one Job per row as ``init_job(new_job(Job), *CLAIM_JOB_FIELDS values)``:
# the dataclass's own __init__ on a bare instance, its arguments by position in
# :data:`CLAIM_JOB_FIELDS` order (checked against Job's fields below, at import). Measured
# per claimed job (callgrind durable-client claim_ack, CPython 3.11, GC off):
# ``Job(id=..., ...)`` turns a class call's keywords into a dict and back (7,200 more
# instructions); ``init_job(job, id=..., ...)`` binds 15 keywords by a scan of the
# parameter names each (initialize_locals, ~1,000 instructions a job; 600 more than
# main's positional ``Job(...)``); positional ``init_job`` skips both, and type_call's
# tuple and __init__ look-up: ~650 fewer than ``Job(...)``.
new_job = object.__new__
init_job = Job.__init__
CLAIM_JOB_FIELDS = (
    "id",
    "shard",
    "task",
    "payload",
    "nominal_ms",
    "due_ms",
    "deadline_ms",
    "attempt",
    "max_attempts",
    "epoch",
    "recurrence",
    "next_due_ms",
    "duplicate",
    "last_error",
    "bucket",
    "timeout_ms",
    "trace",
    "key",
    "version",
)
if tuple(f.name for f in dataclasses.fields(Job)) != CLAIM_JOB_FIELDS:  # pragma: no cover
    raise ImportError("Job's fields changed: update CLAIM_JOB_FIELDS and Store.claim's loop")

# Binary payloads: a tuple for isinstance, built once (``bytes | bytearray | ...``
# builds a union object on every call: 106 against 13 ns).
_BINARY = (bytes, bytearray, memoryview)


@dataclass(frozen=True, slots=True)
class EncodedJob:
    """A validated job as schedule.lua takes it: id, mode, time and packed record."""

    id: str  # job id
    values: tuple[bytes, int, int, bytes]  # id (UTF-8), mode, time (ms), record
    priority: int = 0  # its priority (also in the record): schedule.lua indexes it


@dataclass(frozen=True, slots=True)
class ClaimedRef:
    """What ack/release need to name a lease."""

    id: str  # job id
    attempt: int  # the attempt held
    nominal_ms: int  # the occurrence held
    time_ms: int  # ack: next occurrence (0 none); release: the due to go back to
    renominate: bool = False  # release: time_ms is also the new nominal due
    keep_leased: bool = False  # release with renominate: stay leased (to run as time_ms)


# -- JobSpec -> record ----------------------------------------------------------------


def encode_payload(payload: object, limit: int) -> tuple[bytes, int]:
    """Return ``(bytes, flags)`` for a payload: bytes as is, anything else as JSON that
    decodes to an equal value (see ``model/_payload.py`` for what a payload may hold).

    Never a RecursionError, however deep the value.

    Raises:
        TypeError: if ``payload`` is neither bytes nor JSON-serialisable, or holds what
            would not come back the same (a tuple, a dict key that is not a str).
        ValueError: if it is over ``limit`` bytes once encoded, nested deeper than
            :data:`MAX_PAYLOAD_DEPTH`, or holds a str that is not valid Unicode.
    """
    if type(payload) is bytes:  # the common case first; then a tuple, not a union per call
        data, flags = payload, 0
    elif isinstance(payload, _BINARY):
        data, flags = bytes(payload), 0
    else:
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            data = text.encode()
        except (TypeError, ValueError, RecursionError) as exc:  # what it is, by a walk
            problem = payload_problem(payload)
            if problem is None:  # not found by the walk: the encoder's own words
                raise TypeError(f"payload must be bytes or JSON-serialisable: {exc}") from None
            raise problem[0](problem[1]) from None
        flags = FLAG_JSON
        # Refused as it would come back otherwise: decoded, it must be equal (a tuple is
        # a list then, {1: "a"} is {"1": "a"}); deeper than the limit, it is undecodable.
        if len(data) <= limit and (_too_deep(data) or json.loads(data) != payload):
            error, message = payload_problem(payload) or (
                ValueError,
                "payload would not come back the same from JSON",
            )
            raise error(message)
    if len(data) > limit:
        raise ValueError(f"payload must be at most {limit} bytes encoded, got {len(data)}")
    return data, flags


# Depth without decoding: JSON text shorter than this cannot nest deeper than the limit
# (each level is two bytes at least), nor can text with fewer brackets than the limit.
_DEPTH_FREE = 2 * MAX_PAYLOAD_DEPTH + 2
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _too_deep(data: bytes) -> bool:
    """Whether JSON text nests lists and objects deeper than :data:`MAX_PAYLOAD_DEPTH`,
    found without decoding it (no recursion): its strings cut out, the depth is the
    highest running count of its brackets. O(n), in C but for one step per bracket."""
    if len(data) < _DEPTH_FREE or data.count(b"[") + data.count(b"{") <= MAX_PAYLOAD_DEPTH:
        return False
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > (
        MAX_PAYLOAD_DEPTH
    )


def decode_payload(data: bytes, flags: int) -> Any:
    """Inverse of :func:`encode_payload`; never raises: a payload that cannot be decoded
    (not JSON, nested deeper than :data:`MAX_PAYLOAD_DEPTH`) is returned as an
    :class:`UndecodablePayload` with the reason, for its job alone to fail."""
    if not flags & FLAG_JSON:
        return data
    if _too_deep(data):
        return UndecodablePayload(
            data, f"nested too deep (more than {MAX_PAYLOAD_DEPTH} lists and dicts)"
        )
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        return UndecodablePayload(data, f"not JSON ({exc})")


def pack_record(fields: Sequence[int | bytes]) -> bytes:
    """A job record: the fields (in :data:`FIELDS` order) as a msgpack stream, trailing
    defaults dropped."""
    return b"".join([pack_value(f) for f in fields[: record_count(fields)]])


def pack_oneshot(task: bytes, payload: bytes, max_attempts: int, flags: int) -> bytes:
    """The record of a new one-shot job (nominal 0, attempt 1, epoch 0): what
    :func:`pack_record` gives for those fields, without building them."""
    if flags:
        return pack_str(task) + pack_str(payload) + pack_value(max_attempts) + FIXINT[flags]
    if max_attempts != DEFAULTS[2]:
        return pack_str(task) + pack_str(payload) + pack_value(max_attempts)
    if payload:
        return pack_str(task) + pack_str(payload)
    return pack_str(task) if task else b""  # trailing defaults dropped


def encode_job(spec: JobSpec, payload_limit: int) -> EncodedJob:
    """Encode a job spec for schedule.lua.

    Raises:
        TypeError, ValueError: if the payload is not encodable or over ``payload_limit``.
    """
    data, flags = encode_payload(spec.payload, payload_limit)
    rec = spec.recurrence
    if (
        rec is None
        and not spec.timeout_ms
        and not spec.trace
        and spec.key is None
        and not spec.priority
    ):
        record = pack_oneshot(spec.task.encode(), data, spec.max_attempts, flags)  # common
        return EncodedJob(spec.id, (spec.id.encode(), spec.mode, spec.time_ms, record))
    fields = record_fields(spec, data, flags)
    values = (spec.id.encode(), spec.mode, spec.time_ms, pack_record(fields))
    return EncodedJob(spec.id, values, spec.priority)


def record_fields(spec: JobSpec, data: bytes, flags: int) -> list[int | bytes]:
    """A new job's record fields (nominal 0, attempt 1, epoch 0) in :data:`FIELDS`
    order, from its spec and encoded payload; :func:`pack_record` drops the defaults."""
    fields: list[int | bytes] = [spec.task.encode(), data, spec.max_attempts, flags, 0, 1, 0]
    rec = spec.recurrence
    if rec is not None:
        kind = KIND_INTERVAL if rec.every_ms else KIND_CRON
        fields += [kind, rec.spec.encode(), POLICY_CODES[rec.missed], rec.max_catch_up]
        fields.append(rec.misfire_grace_ms)
    if spec.timeout_ms:
        fields = with_timeout(fields, spec.timeout_ms)
    if spec.trace:
        fields = with_trace(fields, spec.trace.encode())
    if spec.key is not None:
        fields = with_key(fields, spec.key.encode())
    return with_priority(fields, spec.priority)


def with_key(fields: list[int | bytes], key: bytes) -> list[int | bytes]:
    """Record fields (up to the trace at most) with the flow key after them, the fields
    between at their defaults."""
    return [*fields, *DEFAULTS[len(fields) : KEY_FIELD], key]


def claimed_key(value: object) -> str:
    """A claim row's key field as :attr:`Job.key` (a hostile record cannot break the
    claim: anything but bytes of at most MAX_KEY_BYTES reads as "")."""
    if type(value) is bytes and len(value) <= MAX_KEY_BYTES:
        return value.decode(errors="replace")
    return ""


def with_timeout(fields: list[int | bytes], timeout_ms: int) -> list[int | bytes]:
    """Record fields (up to the error at most) with the job's own timeout after them,
    the fields between at their defaults."""
    return [*fields, *DEFAULTS[len(fields) : TIMEOUT_FIELD], timeout_ms]


def with_trace(fields: list[int | bytes], trace: bytes) -> list[int | bytes]:
    """Record fields (up to the timeout) with the trace context field after them, the
    fields between at their defaults."""
    return [*fields, *DEFAULTS[len(fields) : TRACE_FIELD], trace]


# The packed defaults from field n (from 0) up to the version, by n.
_PADS = [
    b"".join(pack_value(d) for d in DEFAULTS[n:VERSION_FIELD]) for n in range(VERSION_FIELD + 1)
]


def with_version(record: bytes, version: int, count: int = -1) -> bytes:
    """A packed record with the version of the PostgreSQL row it was written from as
    its last field (the fields between at their defaults); as it is for version 0.
    ``count``: the record's number of fields when known (:func:`record_count`; reading
    them is most of the cost: 3.1 against 0.5 us a job)."""
    if not version:
        return record
    if count < 0 or count > VERSION_FIELD:
        unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(record) + 1)
        unpacker.feed(record)
        fields = list(unpacker)
        if len(fields) > VERSION_FIELD:  # one already: replaced
            return pack_record([*fields[:VERSION_FIELD], version])
        count = len(fields)
    return record + _PADS[count] + pack_value(version)


def record_count(fields: Sequence[int | bytes]) -> int:
    """The number of fields :func:`pack_record` packs of ``fields``."""
    n = len(fields)
    while n and fields[n - 1] == DEFAULTS[n - 1]:
        n -= 1
    return n


def claimed_extras(reply: Sequence[Any], i: int, count: int) -> tuple[bytes, str]:
    """The trace context and flow key of the claim row at ``reply[i]`` of ``count``
    record fields: only a full row has them."""
    if count != CLAIM_FULL_ROW:
        return b"", ""
    return claimed_trace(reply[i + 19]), claimed_key(reply[i + 20])


def with_priority(fields: list[int | bytes], priority: int) -> list[int | bytes]:
    """Record fields (up to the key at most) with the priority field after them, the fields
    between at their defaults; ``fields`` as they are for priority 0."""
    if not priority:
        return fields
    return [*fields, *DEFAULTS[len(fields) : PRIORITY_FIELD], priority]


def record_priority(record: object) -> int:
    """The priority field of a packed record (0 when it has none, or is not a record:
    never raises). A record without one stops before it, so short ones are not read."""
    if not isinstance(record, bytes | memoryview) or len(record) <= PRIORITY_FIELD:
        return 0
    unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(record) + 1)
    try:
        unpacker.feed(bytes(record))
        fields = list(unpacker)
    except Exception:  # not a record: none
        return 0
    value = fields[PRIORITY_FIELD] if len(fields) > PRIORITY_FIELD else 0
    return value if type(value) is int and 0 <= value <= MAX_PRIORITY else 0


def claimed_trace(value: object) -> bytes:
    """A claim row's trace field as :attr:`Job.trace`: bytes of at most
    :data:`MAX_TRACE_BYTES`, else b"" (a hostile record cannot break the claim)."""
    if type(value) is bytes and len(value) <= MAX_TRACE_BYTES:
        return value
    return b""


# -- reply -> Job, JobInfo ------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def recurrence_of(kind: int, spec: bytes, policy: int, cap: int, grace: int) -> Recurrence | None:
    """The record's recurrence fields as a Recurrence (cached: a recurring job is claimed
    again and again with the same fields)."""
    # A jitter is a "J=<ms> " prefix of the spec; none (older records) reads as 0.
    if kind == KIND_INTERVAL:
        if spec[:2] == b"J=":
            rest, jitter = Recurrence.split_jitter(spec.decode())
            return Recurrence(int(rest), "", POLICY_BY_CODE[policy], cap, grace, "", jitter)
        return Recurrence(int(spec), "", POLICY_BY_CODE[policy], cap, grace)
    if kind == KIND_CRON:  # "TZ=<zone> <expr>", or "<expr>" for UTC (older records)
        text = spec.decode()
        expr, tz = Recurrence.split_spec(text)
        jitter = Recurrence.split_jitter(text)[1]
        return Recurrence(0, expr, POLICY_BY_CODE[policy], cap, grace, tz, jitter)
    return None


def job_info(job_id: str, shard: int, state: JobState, when: int, f: Sequence[Any]) -> JobInfo:
    """A JobInfo from the record fields of a reply row (in :data:`FIELDS` order)."""
    task, payload, max_attempts, flags, nominal, attempt, epoch = f[:7]
    rec, error, timeout, key, priority = f[7:12], f[12], f[13], f[15], f[16]
    if state == JobState.DUE and f[17]:  # waiting for its flow key (field 18)
        state = JobState.WAITING
    return JobInfo(
        id=job_id,
        shard=shard,
        state=state,
        when_ms=when,
        task=task.decode(errors="replace"),
        payload=decode_payload(payload, flags),
        nominal_ms=nominal,
        attempt=attempt,
        max_attempts=max_attempts,
        epoch=epoch,
        recurrence=recurrence_of(*rec),
        last_error=error.decode(errors="replace"),
        timeout_ms=timeout,
        key=key.decode(errors="replace") if key else None,
        priority=priority,
    )


def info_rows(shard: int, state: JobState, reply: Sequence[Any]) -> list[JobInfo]:
    """The rows of a dead_list.lua or due_list.lua reply (after its total), each id,
    when, then the record's fields."""
    return [
        job_info(reply[i].decode(), shard, state, reply[i + 1], reply[i + 2 : i + _ROW_STRIDE])
        for i in range(1, len(reply), _ROW_STRIDE)
    ]
