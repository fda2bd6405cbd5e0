"""The first screen's view per task: pending, overdue, waiting to retry and dead, with
the lateness of the oldest overdue job, from bounded samples.

Ground rules:

- Nothing keeps counts per task: a job's task is in its record, not in any index. So
  the view reads the head of each shard's scheduled list (:data:`DUE_SAMPLE` jobs, in due
  order: the overdue ones come first) and of its dead letters (:data:`DEAD_SAMPLE`),
  one call each per shard, all at once: 2 x shards calls, bounded whatever the number
  of pending jobs (no scan). Running per task: the task of up to
  :data:`RUNNING_SAMPLE` leases per shard (a ZRANGE, then one pipeline reading their
  records), only for shards holding leases.
- Per shard, a count is exact when the shard's whole list fit in the sample (the
  shard's totals come from ``inspect.lua``, exact); otherwise the task's share of the
  sample is scaled to the shard's exact total and the row says it is an estimate.
  Pending per task past the sample is a lower bound (``at_least``).
- Throughput, failures and firing lateness per task come from the workers' chart
  samples (``_charts.Charts.per_task``), added by the overview.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import msgpack  # type: ignore[import-untyped]

from tickwheel.durable.model import DeadPage, JobInfo, ListingTooLong, ShardInfo
from tickwheel.durable.scheduler import Scheduler

__all__ = [
    "DEAD_SAMPLE",
    "DUE_SAMPLE",
    "ERROR_HOVER_CHARS",
    "ERROR_PREVIEW_CHARS",
    "RUNNING_SAMPLE",
    "TaskRow",
    "task_rows",
]

# Scheduled jobs read per shard from the head of its list (due order).
DUE_SAMPLE = 40
# Dead letters read per shard (oldest first).
DEAD_SAMPLE = 25
# Leases read per shard for the running count per task.
RUNNING_SAMPLE = 20
# Characters of a task's last error the first screen shows (its first line), and
# those shown on hover.
ERROR_PREVIEW_CHARS = 160
ERROR_HOVER_CHARS = 2000


@dataclass(slots=True)
class TaskRow:
    """One task's line on the first screen (counts may be estimates: ``exact``)."""

    task: str
    pending: float = 0.0  # scheduled jobs seen (a lower bound past the sample)
    overdue: float = 0.0  # due now and not yet claimed (scaled past the sample)
    paused: int = 0  # due jobs set aside while the task (or all) is paused
    running: float = 0.0  # leased now (scaled past the sample)
    retrying: int = 0  # seen waiting for another attempt (attempt > 1)
    dead: float = 0.0  # dead letters (scaled past the sample)
    oldest_overdue_ms: int = 0  # due time of its oldest overdue job seen; 0: none
    next_due_ms: int = 0  # its earliest due time after now seen; 0: none
    last_error: str = ""  # the last error of a retrying job or a dead letter seen
    exact: bool = True  # due now and dead are exact (no shard's was scaled)
    at_least: bool = False  # pending is a lower bound (a shard held more than its sample)

    def as_dict(self, now_ms: int) -> dict[str, Any]:
        """The row as the page and the JSON API show it."""
        late = now_ms - self.oldest_overdue_ms if self.oldest_overdue_ms else 0
        return {
            "task": self.task,
            "pending": round(self.pending),
            "pending_at_least": self.at_least,
            "overdue": round(self.overdue),
            "paused": self.paused,
            "running": round(self.running),
            "retrying": self.retrying,
            "dead": round(self.dead),
            "exact": self.exact,
            "oldest_overdue_ms": self.oldest_overdue_ms,
            "lateness_ms": max(late, 0),
            "next_due_ms": self.next_due_ms,
            # Its first line (the exception, not a traceback), then the whole on hover.
            "last_error": self.last_error.strip().split("\n", 1)[0][:ERROR_PREVIEW_CHARS],
            "last_error_full": self.last_error[:ERROR_HOVER_CHARS],
        }


def _row(rows: dict[str, TaskRow], task: str) -> TaskRow:
    got = rows.get(task)
    if got is None:
        got = rows[task] = TaskRow(task)
    return got


def _add_scheduled(
    rows: dict[str, TaskRow], info: ShardInfo, jobs: Sequence[JobInfo]
) -> tuple[bool, bool]:
    """One shard's head of the scheduled list into ``rows`` (parked jobs come first);
    return whether the shard held more than the sample, and whether its overdue count
    was scaled."""
    now = info.now_ms
    cut = len(jobs) < info.due  # the shard has more than the sample
    parked = min(info.parked, len(jobs))
    overdue_seen: dict[str, int] = {}
    for i, job in enumerate(jobs):
        row = _row(rows, job.task)
        row.pending += 1
        if job.attempt > 1:
            row.retrying += 1
            row.last_error = row.last_error or job.last_error
        if i < parked:
            row.paused += 1
        elif job.when_ms <= now:
            overdue_seen[job.task] = overdue_seen.get(job.task, 0) + 1
            if not row.oldest_overdue_ms or job.when_ms < row.oldest_overdue_ms:
                row.oldest_overdue_ms = job.when_ms
        elif not row.next_due_ms or job.when_ms < row.next_due_ms:
            row.next_due_ms = job.when_ms
    seen = sum(overdue_seen.values())
    scale = info.overdue / seen if seen and info.overdue > seen else 1.0
    for task, n in overdue_seen.items():
        rows[task].overdue += n * scale
    return cut, scale != 1.0


def _add_dead(rows: dict[str, TaskRow], total: int, jobs: Sequence[JobInfo]) -> bool:
    """One shard's oldest dead letters into ``rows``, scaled to its ``total``; return
    whether they were scaled."""
    scale = total / len(jobs) if jobs and total > len(jobs) else 1.0
    for job in jobs:  # oldest first: the latest dead letter's error wins
        row = _row(rows, job.task)
        row.dead += scale
        if job.last_error:
            row.last_error = job.last_error
    return scale != 1.0


def _task_of(record: bytes | None) -> str | None:
    """The task name of a stored record (its first msgpack value); None if unreadable."""
    if record is None:
        return None
    try:
        first = next(iter(msgpack.Unpacker(BytesIO(record), raw=True)))
    except (ValueError, StopIteration, msgpack.UnpackException):
        return None
    return first.decode("utf-8", "replace") if isinstance(first, bytes) else None


async def _leased_tasks(sched: Scheduler, info: ShardInfo) -> list[str]:
    """The tasks of up to :data:`RUNNING_SAMPLE` of the shard's leases: a ZRANGE, then
    one pipeline of HGETs of their records (all in the shard's slot)."""
    if not info.leased:
        return []
    store, keys = sched.store, sched.keys
    leased = keys.shard(info.shard).leased
    ids: Any = await store.transport.bounded(
        lambda: store.client.zrange(leased, 0, RUNNING_SAMPLE - 1), info.shard
    )
    if not ids:
        return []

    async def records() -> Any:
        pipe = store.client.pipeline(transaction=False)
        for raw in ids:
            job_id = raw.decode("utf-8", "replace")
            pipe.hget(keys.jobs_key(info.shard, job_id), raw)
        return await pipe.execute()

    got = await store.transport.bounded(records, info.shard)
    return [t for t in map(_task_of, got) if t is not None]


async def task_rows(
    sched: Scheduler, shards: Sequence[ShardInfo]
) -> tuple[list[dict[str, Any]], bool]:
    """Every task seen in the samples, worst first (dead, then overdue), and whether
    every count is exact. ``shards`` is ``inspect_all``'s answer (exact totals)."""
    console = sched.console

    async def head(info: ShardInfo) -> list[JobInfo]:
        if not info.due:
            return []
        try:
            return (await console.due_list(info.shard, 0, DUE_SAMPLE)).jobs
        except ListingTooLong:  # cannot happen from rank 0; kept safe
            return []

    async def dead(info: ShardInfo) -> DeadPage:
        if not info.dead:
            return DeadPage(0, [])
        return await console.dead_list(info.shard, 0, DEAD_SAMPLE)

    heads, deads, leases = await asyncio.gather(
        asyncio.gather(*(head(i) for i in shards)),
        asyncio.gather(*(dead(i) for i in shards)),
        asyncio.gather(*(_leased_tasks(sched, i) for i in shards)),
    )
    rows: dict[str, TaskRow] = {}
    cut = scaled = False
    for info, jobs in zip(shards, heads, strict=True):
        more, shrunk = _add_scheduled(rows, info, jobs)
        cut, scaled = cut or more, scaled or shrunk
    for page in deads:
        scaled = _add_dead(rows, page.total, page.jobs) or scaled
    for info, tasks in zip(shards, leases, strict=True):
        scale = info.leased / len(tasks) if tasks and info.leased > len(tasks) else 1.0
        scaled = scaled or scale != 1.0
        for task in tasks:
            _row(rows, task).running += scale
    # A task may hide past any shard's sample: then no row's count is exact.
    for row in rows.values():
        row.at_least, row.exact = cut, not scaled
    now = max((i.now_ms for i in shards), default=0)
    out = [r.as_dict(now) for r in rows.values()]
    out.sort(key=lambda r: (-r["dead"], -r["overdue"], -r["lateness_ms"], r["task"]))
    return out, all(r.exact and not r.at_least for r in rows.values())
