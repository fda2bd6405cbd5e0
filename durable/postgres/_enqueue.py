"""The steps of an enqueue that do no I/O, shared by the asyncio mode (``_mode.py``) and
the synchronous one (``_drivers.py``'s :func:`schedule_sync`): the specs become rows in
id order, and the function's replies become :class:`ScheduleResult` values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tickwheel.durable.model import JobSpec, ScheduleResult, ScheduleStatus

from ._rows import PgJob, encode_pg_job

__all__ = ["STATUS", "encode_jobs", "first_run", "needs_now", "results", "sorted_by_id"]

# tickwheel_put's status codes (schedule.lua's): created, kept, done.
STATUS = {1: ScheduleStatus.CREATED, 2: ScheduleStatus.KEPT, 5: ScheduleStatus.DONE}


def first_run(spec: JobSpec, now: int) -> JobSpec:
    """A recurring job without ``delay``/``at`` starts at its first occurrence after
    ``now`` (PostgreSQL's clock): the spec with that ``delay`` or ``at``."""
    rec = spec.recurrence
    if rec is None or spec.delay is not None or spec.at is not None:
        return spec
    if rec.every_ms:
        return dataclasses.replace(spec, delay=rec.every_ms / 1000)
    return dataclasses.replace(spec, at=rec.next_after(now, now))


def needs_now(specs: Sequence[JobSpec]) -> bool:
    """Whether a spec's first run depends on PostgreSQL's clock."""
    return any(s.recurrence is not None and s.delay is None and s.at is None for s in specs)


def encode_jobs(
    specs: Sequence[JobSpec], shard_of: Callable[[str], int], limit: int, now: int | None
) -> list[PgJob]:
    """The rows of ``specs`` (``now``: PostgreSQL's clock, when :func:`needs_now`).

    Raises:
        TypeError, ValueError: if a payload is not encodable or over ``limit``.
    """
    return [
        encode_pg_job(spec if now is None else first_run(spec, now), shard_of(spec.id), limit)
        for spec in specs
    ]


def sorted_by_id(jobs: Sequence[PgJob]) -> list[int]:
    """Positions of ``jobs`` in id order: rows are locked in that order, so concurrent
    batches never deadlock."""
    return sorted(range(len(jobs)), key=lambda k: jobs[k].id)


def results(
    jobs: Sequence[PgJob], order: Sequence[int], replies: Sequence[tuple[int, int, int]]
) -> list[tuple[PgJob, ScheduleResult, int]]:
    """Per job in the caller's order: the job, its result and its outbox seq, from the
    replies of the jobs sent in ``order``."""
    out: list[tuple[int, int, int]] = [(0, 0, 0)] * len(jobs)
    for k, reply in zip(order, replies, strict=True):
        out[k] = reply
    return [
        (job, ScheduleResult(job.id, STATUS[status], when), seq)
        for job, (status, when, seq) in zip(jobs, out, strict=True)
    ]
