"""The producer scripts' calls, as data: the keys and arguments of each, and its reply
decoded. Pure (no I/O): the asyncio :class:`~._store.Store` and the synchronous
:class:`~._sync.SyncStore` both send what is built here, so the two cannot drift.

Each ``*_call`` returns ``(keys, args)`` for one script call on one shard; each
``*_result`` turns that script's reply into the typed value the store returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from tickwheel.durable.model import (
    JobInfo,
    JobState,
    Limits,
    PostgresModeRequired,
    ScheduleResult,
    ScheduleStatus,
)

from ._codec import EncodedJob, job_info
from ._keys import Keys, parse_layout
from ._msgpack import pack_array, pack_schedule_batch

__all__ = [
    "ROUND_BYTES",
    "ROUND_JOBS",
    "SCHEDULE_CHUNK_BYTES",
    "STATUSES",
    "ClaimLimits",
    "ScheduleCall",
    "cancel_call",
    "cancel_result",
    "claim_call",
    "flow_call",
    "get_call",
    "get_result",
    "init_call",
    "init_result",
    "now_call",
    "reschedule_call",
    "reschedule_result",
    "schedule_call",
    "schedule_one_call",
    "schedule_one_result",
    "schedule_results",
    "schedule_rounds",
]

# Status codes of schedule.lua by value: indexing beats the enum's call in a hot loop.
STATUSES: tuple[ScheduleStatus, ...] = (ScheduleStatus.CREATED, *ScheduleStatus)  # [0] unused

Call = tuple[list[str], list[Any]]

# How much of a schedule_many Redis runs at once (docs/design.md, "Bounded work per
# call"). schedule.lua costs about 4-7 us a job plus 4-8 us a KiB of packed jobs inside
# Redis (SLOWLOG on redis 7.0, 2 shared cores: 1,000 small jobs 4-5 ms; 1,000 jobs of
# 1 KiB 6-8 ms; 100 jobs of 64 KiB 21-25 ms; 1,000 of 16 KiB 60-130 ms). So:
# - one script call holds at most MAX_BATCH (1,000) jobs and SCHEDULE_CHUNK_BYTES of
#   packed jobs (a chunk over it is split; one job is never split): at most ~10 ms;
# - one round (one MULTI/EXEC on one Redis; one pipeline per master on a cluster or
#   with replicas) holds at most ROUND_JOBS jobs and ROUND_BYTES packed bytes, whole
#   chunks, at least one: measured at most ~15 ms each, ~30 ms both at once, within the
#   50 ms the design allows any single command or transaction. Other clients' commands
#   run between rounds; each round is one round trip, bounded by call_timeout.
SCHEDULE_CHUNK_BYTES = 1 << 20
ROUND_JOBS = 2000
ROUND_BYTES = 2 << 20


class ScheduleCall:
    """One schedule.lua call of a schedule_many: its shard, jobs, keys and args."""

    __slots__ = ("args", "jobs", "keys", "shard", "size")

    def __init__(self, keys: Keys, shard: int, jobs: Sequence[EncodedJob], replace: bool) -> None:
        self.shard = shard
        self.jobs = jobs
        self.keys, self.args = schedule_call(keys, shard, jobs, replace)
        self.size: int = len(self.args[1])  # the packed batch (bytes)


# A job's priority, for map() (schedule_call).
_PRIORITY_OF = attrgetter("priority")


def _split_by_bytes(jobs: Sequence[EncodedJob]) -> list[Sequence[EncodedJob]]:
    """``jobs`` in runs of at most about SCHEDULE_CHUNK_BYTES packed (one job at least)."""
    pieces: list[Sequence[EncodedJob]] = []
    start, size = 0, 0
    for i, job in enumerate(jobs):
        ident, _, _, record = job.values
        cost = len(ident) + len(record) + 32  # msgpack's headers and the two numbers
        if size and size + cost > SCHEDULE_CHUNK_BYTES:
            pieces.append(jobs[start:i])
            start, size = i, 0
        size += cost
    pieces.append(jobs[start:])
    return pieces


def schedule_rounds(
    keys: Keys, groups: Mapping[int, Sequence[Sequence[EncodedJob]]], replace: bool
) -> list[list[ScheduleCall]]:
    """schedule_many's script calls (one per chunk of ``groups``, a chunk over
    SCHEDULE_CHUNK_BYTES split), in rounds of at most ROUND_JOBS jobs and ROUND_BYTES
    bytes (whole calls; one call at least), in the order of ``groups``.

    A batch that fits one round is one round: one round trip, as before the bound.
    """
    rounds: list[list[ScheduleCall]] = []
    current: list[ScheduleCall] = []
    jobs = size = 0
    for shard, chunks in groups.items():
        for chunk in chunks:
            call = ScheduleCall(keys, shard, chunk, replace)
            todo = [call]
            if call.size > SCHEDULE_CHUNK_BYTES and len(chunk) > 1:  # rare: big payloads
                todo = [ScheduleCall(keys, shard, p, replace) for p in _split_by_bytes(chunk)]
            for call in todo:
                n = len(call.jobs)
                if current and (jobs + n > ROUND_JOBS or size + call.size > ROUND_BYTES):
                    rounds.append(current)
                    current, jobs, size = [], 0, 0
                current.append(call)
                jobs += n
                size += call.size
    if current:
        rounds.append(current)
    return rounds


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The flow limits a claim takes its limited jobs' permits by (claim.lua ARGV[7..];
    docs/limits.md, "How a limited job runs"): a worker's limits of record of the tasks
    with a concurrency and no rate. Only on one Redis, in the Redis-only mode.

    Args:
        hold_ms: a permit's length (the run's lease).
        recheck_ms: a permit waiter's recheck bound (two leases).
        tasks: task -> its limits (each with a concurrency and no rate).
    """

    hold_ms: int
    recheck_ms: int
    tasks: Mapping[str, Limits]
    # ARGV[13..]: per task, its name, the start of its keys' names, its concurrency.
    _tail: list[object] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tail: list[object] = []
        for task, lim in self.tasks.items():
            tail += [task, f"{len(task)}:{task}:", lim.concurrency]  # as Keys.limit_keys
        object.__setattr__(self, "_tail", tail)

    def args(self, keys: Keys, shard: int) -> list[object]:
        """claim.lua's ARGV[7..] for ``shard``."""
        k = keys.shard(shard)
        head = [self.hold_ms, self.recheck_ms, shard, f"{{{keys.namespace}:L:"]
        return [*head, k.wakes, k.rechecks, *self._tail]


def claim_call(
    keys: Keys, shard: int, replies: tuple[str, str], args: Sequence[object],
    limits: ClaimLimits | None,
) -> Call:  # fmt: skip
    """claim.lua on ``shard``: ``replies`` its reply key and the one to forget, ``args``
    its ARGV[1..6], then ``limits``' (None: none)."""
    k = keys.shard(shard)
    head = [k.due, k.leased, k.done, k.epoch, k.clock, *replies, k.dead, k.far]
    tail = [] if limits is None else limits.args(keys, shard)
    return [*head, k.faro, k.paused, k.parked, k.parkedx, k.prio, k.waiting, *k.jobs], [
        *args,
        *tail,
    ]


def init_call(keys: Keys, postgres: bool = False) -> Call:
    """init.lua: store the layout on first use (and the Postgres mode, ``postgres``)."""
    return [keys.meta, keys.mode], [f"{keys.shards}:{keys.buckets}", "1" if postgres else ""]


def init_result(keys: Keys, reply: Any, postgres: bool = False) -> tuple[int, int]:
    """The stored ``(shards, buckets)``.

    Raises:
        PostgresModeRequired: if the namespace is in the Postgres mode and the caller
            (``postgres`` False) is not.
    """
    layout, mode = reply
    if mode and not postgres:
        raise PostgresModeRequired(keys.namespace)
    return parse_layout(layout)


def now_call(keys: Keys, shard: int) -> Call:
    """now.lua: Redis's now for ``shard`` (ms), ``int(reply)``."""
    return [keys.shard(shard).clock], []


def schedule_call(keys: Keys, shard: int, jobs: Sequence[EncodedJob], replace: bool) -> Call:
    """schedule.lua over ``jobs`` (one shard's, at most ``MAX_BATCH``)."""
    k = keys.shard(shard)
    args = [1 if replace else 0, pack_schedule_batch([job.values for job in jobs])]
    # One job needs its own bucket only (the script then skips hashing the id).
    buckets = [keys.jobs_key(shard, jobs[0].id)] if len(jobs) == 1 else k.jobs
    keys_ = [k.due, k.leased, k.done, k.dead, k.clock, k.far, k.faro, k.parked, k.parkedx, k.prio]
    keys_.append(k.waiting)
    # (position, priority) of the jobs with one: schedule.lua indexes them (prio_add).
    # Looked for in C first (map): most batches have none.
    if any(map(_PRIORITY_OF, jobs)):
        prio = [x for i, job in enumerate(jobs, 1) if job.priority for x in (i, job.priority)]
        args.append(pack_array(prio))
    return [*keys_, *buckets], args


def schedule_results(jobs: Sequence[EncodedJob], reply: Sequence[Any]) -> list[ScheduleResult]:
    """schedule.lua's reply: one result per job, in order."""
    statuses = STATUSES
    return [
        ScheduleResult(job.id, statuses[reply[1 + 2 * i]], reply[2 + 2 * i])
        for i, job in enumerate(jobs)
    ]


def schedule_one_call(keys: Keys, shard: int, job: EncodedJob, replace: bool) -> Call:
    """schedule_one.lua for one job.

    Raises:
        ValueError: for a mode or time the batch packer would refuse too.
    """
    k = keys.shard(shard)
    ident, mode, time_ms, record = job.values
    # What pack_schedule_batch checks for a batch: here the values go as text.
    if mode not in (0, 1):
        raise ValueError(f"mode must be 0 or 1, got {mode}")
    if not 0 <= time_ms < 1 << 64:
        raise ValueError(f"schedule times must be in 0 .. 2**64 - 1, got {time_ms}")
    return (
        [
            *(k.due, k.leased, k.done, k.dead, k.clock, k.far, k.faro),
            *(keys.jobs_key(shard, job.id), k.parked, k.parkedx, k.prio, k.waiting),
        ],
        [1 if replace else 0, ident, mode, time_ms, record, job.priority],
    )


def schedule_one_result(job: EncodedJob, reply: Sequence[Any]) -> ScheduleResult:
    """schedule_one.lua's reply."""
    return ScheduleResult(job.id, STATUSES[reply[1]], reply[2])


def flow_call(keys: Keys, shard: int, job: EncodedJob, flow: tuple[str, int, int]) -> Call:
    """flow.lua for one job; ``flow`` is ``JobSpec.flow``: ("d", debounce, max_wait) (0:
    none) or ("t", throttle, 0), in ms. The job's delay/at is not sent: the script
    computes the due from now."""
    kind, window_ms, max_wait_ms = flow
    if kind not in ("d", "t"):
        raise ValueError(f"kind must be 'd' or 't', got {kind!r}")
    k = keys.shard(shard)
    flow_key = keys.flow_key(shard, kind, job.id)
    ident, _, _, record = job.values
    bucket = keys.jobs_key(shard, job.id)
    return (
        [
            *(k.due, k.leased, k.dead, k.clock, bucket, k.parked, k.parkedx, flow_key),
            *(k.prio, k.trail, k.waiting),
        ],
        [kind, ident, window_ms, max_wait_ms, record, job.priority],
    )


def cancel_call(keys: Keys, shard: int, job_id: str) -> Call:
    """cancel.lua (it publishes a removed leased job's id on the namespace's cancels
    channel, so the worker running it stops its handler)."""
    k = keys.shard(shard)
    return (
        [
            *(k.due, k.leased, k.dead, keys.jobs_key(shard, job_id)),
            *(k.parked, k.parkedx, k.prio, k.trail, k.waiting),
        ],
        [job_id, keys.cancels],
    )


def cancel_result(reply: Any) -> JobState | None:
    """The state the cancelled job had, or None if there was none."""
    return JobState(reply) if reply else None


def reschedule_call(
    keys: Keys, shard: int, job_id: str, mode: int, time_ms: int, *, version: int = 0
) -> Call:
    """reschedule.lua; ``version`` (the Postgres mode's new row version) if above 0."""
    k = keys.shard(shard)
    args: list[Any] = [job_id, mode, time_ms]
    if version > 0:
        args.append(version)
    return (
        [
            *(k.due, k.done, k.clock, k.leased, k.dead, k.far, k.faro),
            *(keys.jobs_key(shard, job_id), k.parked, k.parkedx, k.prio, k.waiting),
        ],
        args,
    )


def reschedule_result(reply: Sequence[Any]) -> tuple[int, int]:
    """``(status, when_ms)``: status 1 when moved."""
    return int(reply[0]), int(reply[1])


def get_call(keys: Keys, shard: int, job_id: str) -> Call:
    """get.lua."""
    k = keys.shard(shard)
    return [k.due, k.leased, k.dead, keys.jobs_key(shard, job_id), k.parked], [job_id]


def get_result(shard: int, job_id: str, reply: Any) -> JobInfo | None:
    """The job's state and record, or None."""
    if reply is None:
        return None
    return job_info(job_id, shard, JobState(reply[0]), reply[1], reply[2:])
