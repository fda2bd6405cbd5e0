"""A claimed batch's recurring jobs sorted by what the claim does with each (pure).

The missed-run policy (``Recurrence.plan``), jitter (a jittered occurrence claimed before
its run time goes back to due, unrun) and the duplicate occurrences, decided on the
claim's reply without I/O; :meth:`Leases._plan` then makes the store calls.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from tickwheel.durable.model import ClaimBatch, Job
from tickwheel.durable.store import ClaimedRef

__all__ = ["Planned", "plan_batch"]


class Planned(NamedTuple):
    """What becomes of a claimed batch's jobs."""

    jobs: list[Job]  # run now, as claimed
    moves: list[ClaimedRef]  # not run: moved on to a later occurrence
    runs_as: list[ClaimedRef]  # run now as a later occurrence (their lease moves first)
    as_jobs: list[Job]  # those jobs, as they run
    dups: list[ClaimedRef]  # occurrences done already: acked, not run
    waits: list[ClaimedRef]  # jittered occurrences back to due until their time


def plan_batch(batch: ClaimBatch) -> Planned:
    """Sort ``batch``'s jobs (see :class:`Planned`)."""
    jobs: list[Job] = []
    moves: list[ClaimedRef] = []
    runs_as: list[ClaimedRef] = []  # run now as a later occurrence (plan.advance_to_ms)
    as_jobs: list[Job] = []  # their jobs, as they run
    dups: list[ClaimedRef] = []
    waits: list[ClaimedRef] = []  # jittered occurrences back to due until their time
    for job in batch.jobs:
        rec = job.recurrence
        if rec is None:
            if not job.duplicate:
                jobs.append(job)
            continue
        if job.duplicate:
            dups.append(
                ClaimedRef(
                    job.id,
                    job.attempt,
                    job.nominal_ms,
                    rec.next_after(job.nominal_ms, job.nominal_ms),
                )
            )
            continue
        off = rec.offset_ms(job.id, job.nominal_ms) if rec.jitter_ms else 0
        # A retry of this occurrence, or a Defer of it (due after its run time: only a
        # deferral puts it there, a jittered wait puts it at the run time): not missed.
        if job.attempt > 1 or job.due_ms > job.nominal_ms + off:
            jobs.append(
                dataclasses.replace(job, next_due_ms=rec.next_after(job.nominal_ms, job.nominal_ms))
            )
            continue
        if off and job.due_ms < job.nominal_ms + off and batch.now_ms < job.nominal_ms + off:
            # A jittered occurrence claimed before its run time (nominal + offset):
            # back to due at that time, unrun, the same occurrence and attempt.
            waits.append(ClaimedRef(job.id, job.attempt, job.nominal_ms, job.nominal_ms + off))
            continue
        # Lateness counts from the run time, so the missed-run decision is the one
        # the occurrence would get without jitter.
        plan = rec.plan(job.nominal_ms, batch.now_ms - off)
        if plan.deliver and plan.advance_to_ms:
            # Runs now as a later occurrence (already due): its lease moves to it
            # first, so that its ack records that occurrence (and the next from it).
            runs_as.append(
                ClaimedRef(
                    job.id,
                    job.attempt,
                    job.nominal_ms,
                    plan.advance_to_ms,
                    renominate=True,
                    keep_leased=True,
                )
            )
            as_jobs.append(
                dataclasses.replace(
                    job, nominal_ms=plan.advance_to_ms, next_due_ms=plan.next_due_ms
                )
            )
        elif plan.deliver:
            jobs.append(dataclasses.replace(job, next_due_ms=plan.next_due_ms))
        else:
            moves.append(
                ClaimedRef(job.id, job.attempt, job.nominal_ms, plan.advance_to_ms, renominate=True)
            )
    return Planned(jobs, moves, runs_as, as_jobs, dups, waits)
