"""The job codec: a :class:`JobSpec` to the record the scripts store, and back to a
:class:`Job` or a :class:`JobInfo`.

Ground rules:

- The record is the job's fields as a msgpack stream in :data:`FIELDS` order, trailing
  defaults dropped. ``lua/_lib.lua`` is the other side of the same layout (its ``F_*``
  constants and ``DEFAULTS``); ``tests/test_durable_keys.py`` holds the two equal.
- A payload is bytes as is (flags 0) or JSON text (:data:`FLAG_JSON`); it is encoded once,
  when the job is scheduled, and decoded where a reply is read, here.
- Every reply that carries a record is decoded here: a claim's rows into :class:`Job`
  (the hot path: one slice and one keyword construction per job), get / listing rows
  into :class:`JobInfo`.

The bytes themselves are packed by ``_msgpack.py``; nothing there knows a job.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tickwheel.durable.model import (
    KIND_CRON,
    KIND_INTERVAL,
    POLICY_BY_CODE,
    POLICY_CODES,
    ClaimBatch,
    DurableError,
    Job,
    JobInfo,
    JobSpec,
    JobState,
    Recurrence,
)

from ._msgpack import FIXINT, pack_str, pack_value, unpack_reply

__all__ = [
    "DEFAULTS",
    "FIELDS",
    "FLAG_JSON",
    "ClaimedRef",
    "EncodedJob",
    "decode_claim",
    "decode_payload",
    "encode_job",
    "encode_payload",
    "info_rows",
    "job_info",
    "pack_oneshot",
    "pack_record",
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
)
# Their defaults, in the same order (lua/_lib.lua: DEFAULTS); trailing ones are dropped.
DEFAULTS: tuple[int | bytes, ...] = (b"", b"", 5, 0, 0, 1, 0, 0, b"", 0, 0, 0, b"")

FLAG_JSON = 1  # record field 4, bit 0: the payload is JSON text

# Values per job in the replies of get.lua / dead_list.lua / due_list.lua (id, when, then
# the record's fields in FIELDS order). claim.lua's rows have a length of their own.
_ROW_STRIDE = 2 + len(FIELDS)
_SHORT_ROW = 6  # a claim row's field count for a one-shot job without an error

# Binary payloads: a tuple for isinstance, built once (``bytes | bytearray | ...``
# builds a union object on every call: 106 against 13 ns).
_BINARY = (bytes, bytearray, memoryview)


@dataclass(frozen=True, slots=True)
class EncodedJob:
    """A validated job as schedule.lua takes it: id, mode, time and packed record."""

    id: str  # job id
    values: tuple[bytes, int, int, bytes]  # id (UTF-8), mode, time (ms), record


@dataclass(frozen=True, slots=True)
class ClaimedRef:
    """What ack/release need to name a lease."""

    id: str  # job id
    attempt: int  # the attempt held
    nominal_ms: int  # the occurrence held
    time_ms: int  # ack: next occurrence (0 none); release: the due to go back to
    renominate: bool = False  # release: time_ms is also the new nominal due


# -- JobSpec -> record ----------------------------------------------------------------


def encode_payload(payload: object, limit: int) -> tuple[bytes, int]:
    """Return ``(bytes, flags)`` for a payload: bytes as is, anything else as JSON.

    Raises:
        TypeError: if ``payload`` is neither bytes nor JSON-serialisable.
        ValueError: if it is over ``limit`` bytes once encoded.
    """
    if type(payload) is bytes:  # the common case first; then a tuple, not a union per call
        data, flags = payload, 0
    elif isinstance(payload, _BINARY):
        data, flags = bytes(payload), 0
    else:
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"payload must be bytes or JSON-serialisable: {exc}") from exc
        data, flags = text.encode(), FLAG_JSON
    if len(data) > limit:
        raise ValueError(f"payload must be at most {limit} bytes encoded, got {len(data)}")
    return data, flags


def decode_payload(data: bytes, flags: int) -> Any:
    """Inverse of :func:`encode_payload`."""
    return json.loads(data) if flags & FLAG_JSON else data


def pack_record(fields: Sequence[int | bytes]) -> bytes:
    """A job record: the fields (in :data:`FIELDS` order) as a msgpack stream, trailing
    defaults dropped."""
    n = len(fields)
    while n and fields[n - 1] == DEFAULTS[n - 1]:
        n -= 1
    return b"".join([pack_value(f) for f in fields[:n]])


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
    if rec is None:  # the common case, without building the field list
        record = pack_oneshot(spec.task.encode(), data, spec.max_attempts, flags)
        return EncodedJob(spec.id, (spec.id.encode(), spec.mode, spec.time_ms, record))
    kind, spec_text = (KIND_INTERVAL, str(rec.every_ms)) if rec.every_ms else (KIND_CRON, rec.cron)
    fields: list[int | bytes] = [
        *(spec.task.encode(), data, spec.max_attempts, flags, 0, 1, 0),
        *(kind, spec_text.encode(), POLICY_CODES[rec.missed], rec.max_catch_up),
        rec.misfire_grace_ms,
    ]
    return EncodedJob(spec.id, (spec.id.encode(), spec.mode, spec.time_ms, pack_record(fields)))


# -- reply -> Job, JobInfo ------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _recurrence(kind: int, spec: bytes, policy: int, cap: int, grace: int) -> Recurrence | None:
    """The record's recurrence fields as a Recurrence (cached: a recurring job is claimed
    again and again with the same fields)."""
    if kind == KIND_INTERVAL:
        return Recurrence(int(spec), "", POLICY_BY_CODE[policy], cap, grace)
    if kind == KIND_CRON:
        return Recurrence(0, spec.decode(), POLICY_BY_CODE[policy], cap, grace)
    return None


def decode_claim(packed: bytes, shard: int, epoch: int) -> ClaimBatch:
    """claim.lua's reply (one msgpack array) as a ClaimBatch.

    The reply is now, dropped, then one row per job: id, due, deadline, tag (bit 0 the
    duplicate flag, the rest the record's bucket), count, then ``count`` record fields.

    Raises:
        DurableError: if the reply is not claim.lua's (a msgpack array).
    """
    try:
        reply = unpack_reply(packed)
    except ValueError as exc:  # not claim.lua's reply: a script of another version?
        raise DurableError(f"claim on shard {shard}: {exc}") from None
    jobs: list[Job] = []
    append = jobs.append
    # One slice per row: this loop runs once per claimed job.
    i, end = 2, len(reply)
    while i < end:
        (ident, due, deadline, tag, count, task, data, mx, flags, nominal, attempt) = reply[
            i : i + 11
        ]
        if count == _SHORT_ROW:
            ep, recurrence, error = epoch, None, ""
        else:  # all 13: a recurring job, or one with an error
            ep, kind = reply[i + 11], reply[i + 12]
            recurrence = _recurrence(kind, *reply[i + 13 : i + 17]) if kind else None
            error = reply[i + 17].decode(errors="replace")
        i += 5 + count
        append(
            Job(
                id=ident.decode(),
                shard=shard,
                task=task.decode(),
                payload=data if flags == 0 else decode_payload(data, flags),
                nominal_ms=nominal,
                due_ms=due,
                deadline_ms=deadline,
                attempt=attempt,
                max_attempts=mx,
                epoch=ep,
                recurrence=recurrence,
                duplicate=bool(tag & 1),
                last_error=error,
                bucket=tag >> 1,
            )
        )
    return ClaimBatch(shard=shard, now_ms=int(reply[0]), jobs=jobs, dropped=int(reply[1]))


def job_info(job_id: str, shard: int, state: JobState, when: int, f: Sequence[Any]) -> JobInfo:
    """A JobInfo from the record fields of a reply row (in :data:`FIELDS` order)."""
    task, payload, max_attempts, flags, nominal, attempt, epoch, *rec, error = f
    return JobInfo(
        id=job_id,
        shard=shard,
        state=state,
        when_ms=when,
        task=task.decode(),
        payload=decode_payload(payload, flags),
        nominal_ms=nominal,
        attempt=attempt,
        max_attempts=max_attempts,
        epoch=epoch,
        recurrence=_recurrence(*rec),
        last_error=error.decode(errors="replace"),
    )


def info_rows(shard: int, state: JobState, reply: Sequence[Any]) -> list[JobInfo]:
    """The rows of a dead_list.lua or due_list.lua reply (after its total), each id,
    when, then the record's fields."""
    return [
        job_info(reply[i].decode(), shard, state, reply[i + 1], reply[i + 2 : i + _ROW_STRIDE])
        for i in range(1, len(reply), _ROW_STRIDE)
    ]
