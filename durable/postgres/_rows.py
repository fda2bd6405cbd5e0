"""A job as PostgreSQL stores it, and back into the form Redis indexes.

- :func:`encode_pg_job` turns a :class:`JobSpec` into the arguments of ``tickwheel_put``
  (the columns of a job row, migration 0005) together with its Redis record, encoded
  once, so the row and the index entry always carry the same bytes.
- :class:`OutboxRow` and :class:`PendingRow` are what the relay and reconcile read
  (``_relay.py``); :func:`redis_job` and :func:`retried_job` make the schedule.lua form
  of a stored job from its columns.

The record itself (its fields and their packing) is the Redis store's: this module uses
``pack_record`` and ``EncodedJob`` from ``tickwheel.durable.store``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]

from tickwheel.durable.model import (
    KIND_CRON,
    KIND_INTERVAL,
    MAX_KEY_BYTES,
    MAX_TRACE_BYTES,
    POLICY_CODES,
    JobSpec,
)
from tickwheel.durable.store import (
    KEY_FIELD,
    TIMEOUT_FIELD,
    TRACE_FIELD,
    EncodedJob,
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

__all__ = ["OutboxRow", "PendingRow", "PgJob", "encode_pg_job", "redis_job", "retried_job"]


@dataclass(frozen=True, slots=True)
class PgJob:
    """A validated job as ``tickwheel_put`` takes it."""

    id: str
    shard: int
    args: tuple[Any, ...]  # task .. record, after ns, id and shard
    record: bytes  # the Redis record (nominal 0, attempt 1)
    version: int = 0  # a replace's row version (migration 0012), taken under its locks
    count: int = -1  # the record's number of fields (-1: not known)


def encode_pg_job(spec: JobSpec, shard: int, payload_limit: int, version: int = 0) -> PgJob:
    """Encode a job spec for ``tickwheel_put`` (and its Redis record).

    Raises:
        TypeError, ValueError: if the payload is not encodable or over ``payload_limit``.
    """
    data, flags = encode_payload(spec.payload, payload_limit)
    rec = spec.recurrence
    rkind, rspec, policy, cap, grace = 0, "", 0, 0, 0
    if rec is not None:
        # The zone travels in rspec ("TZ=<zone> <expr>"), as in the Redis record.
        rkind, rspec = (KIND_INTERVAL if rec.every_ms else KIND_CRON), rec.spec
        policy, cap, grace = POLICY_CODES[rec.missed], rec.max_catch_up, rec.misfire_grace_ms
    # The job's own timeout (JobSpec.timeout_ms), the trace context (JobSpec.trace) and
    # the flow key (JobSpec.key) ride in the record column, no column of their own:
    # retried_job reads them back.
    fields = record_fields(spec, data, flags)
    record = pack_record(fields)
    args = (
        spec.task,
        data,
        bool(flags & 1),
        spec.max_attempts,
        spec.mode,
        spec.time_ms,
        rkind,
        rspec,
        policy,
        cap,
        grace,
        record,
    )
    return PgJob(spec.id, shard, args, record, version, record_count(fields))


def record_extras(record: object) -> tuple[int, bytes, bytes]:
    """The job's own timeout (ms; 0: none), trace context (b"": none) and flow key
    (b"": none) fields of a stored record; ``(0, b"", b"")`` when it has none of them,
    or is not a record: never raises."""
    if not isinstance(record, bytes | memoryview) or len(record) <= TIMEOUT_FIELD:
        return 0, b"", b""  # fewer bytes than fields up to the timeout: none
    unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(record) + 1)
    try:
        unpacker.feed(bytes(record))
        fields = list(itertools.islice(unpacker, KEY_FIELD + 1))
    except Exception:  # not a record: none
        return 0, b"", b""
    timeout = fields[TIMEOUT_FIELD] if len(fields) > TIMEOUT_FIELD else 0
    if type(timeout) is not int or timeout < 0:
        timeout = 0
    trace = fields[TRACE_FIELD] if len(fields) > TRACE_FIELD else b""
    if type(trace) is not bytes or len(trace) > MAX_TRACE_BYTES:
        trace = b""
    key = fields[KEY_FIELD] if len(fields) > KEY_FIELD else b""
    if type(key) is not bytes or len(key) > MAX_KEY_BYTES:
        key = b""
    return timeout, trace, key


def record_trace(record: object) -> bytes:
    """The trace context field of a stored record (b"" when it has none, or the record
    is not one: never raises)."""
    return record_extras(record)[1]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An index entry still to be written to Redis."""

    seq: int
    job: EncodedJob | None  # None: the job is gone or moved on (nothing to write)
    shard: int
    cancel: str = ""  # a cancel mark's id (cancel(conn=)): remove it from Redis


@dataclass(frozen=True, slots=True)
class PendingRow:
    """A pending job as reconcile puts it back in Redis."""

    shard: int
    due_ms: int
    job: EncodedJob


def redis_job(
    job_id: str, due_ms: int, record: bytes, version: int = 0, count: int = -1
) -> EncodedJob:
    """The schedule.lua form of a stored job: its own id at its nominal due, its record
    carrying the row's version (migration 0012; 0: none); ``count``: its number of
    fields, if known (``PgJob.count``)."""
    rec = with_version(record, version, count)
    return EncodedJob(job_id, (job_id.encode(), 0, due_ms, rec), record_priority(record))


def retried_job(row: Any) -> EncodedJob:
    """The schedule.lua form of a retried occurrence, from the columns of a pending row
    (``_relay.pending``): due at its next run, its record carrying the occurrence's
    nominal due and the attempt it runs as (the nominal is the occurrence's identity:
    an ack of it completes the row, a done row of it drops it at its claim)."""
    fields: list[int | bytes] = [
        row["task"].encode(),
        bytes(row["payload"]),
        int(row["max_attempts"]),
        1 if row["json_payload"] else 0,
        int(row["due_ms"]),
        int(row["attempt"]),
        0,
    ]
    if row["rkind"]:
        fields += [
            int(row["rkind"]),
            row["rspec"].encode(),
            int(row["policy"]),
            int(row["max_catch_up"]),
            int(row["grace_ms"]),
        ]
    # The job's own timeout, the producer's trace context and the flow key, kept from
    # the stored record.
    timeout, trace, key = record_extras(row["record"])
    if timeout:
        fields = with_timeout(fields, timeout)
    if trace:
        fields = with_trace(fields, trace)
    if key:
        fields = with_key(fields, key)
    # The priority too (schedule.lua indexes it: EncodedJob.priority).
    priority = record_priority(row["record"])
    fields = with_priority(fields, priority)
    # The row's version (migration 0012; a row read without the column has none).
    record = with_version(pack_record(fields), int(row.get("version") or 0))
    values = (row["id"].encode(), 0, int(row["run_ms"]), record)
    return EncodedJob(row["id"], values, priority)
