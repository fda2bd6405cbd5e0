"""The scheduled list across every shard, in due order: a merge of each shard's list,
read from a cursor, bounded per page.

Ground rules:

- A page starts at a cursor: a due time ``from_ms`` and ``skip``, how many jobs due at
  exactly that time the pages before showed. Each shard is read from its rank of
  ``from_ms`` (``due_rank``), all shards at once: ``count + skip`` jobs without a filter,
  at least :data:`FILTER_READ` with one (a task, an id prefix). Two calls per shard per
  page, whatever the number of pending jobs. Past ``PAGE`` (1,000) jobs due at one same
  ms, the next page starts after that ms (the rest of them are not listed).
- The rows are merged by (due, shard, rank). A shard that has more than was read
  ("cut") bounds the page: no row past its last read one is shown, since its unread
  jobs may come first. So a filtered page may be short, or empty when the filter
  matched nothing within the reads; its ``next`` cursor goes on from there.
- A shard whose list cannot be read from that point (``ListingTooLong``: too deep in
  its far index) is named in ``unlisted``, never silently dropped.
- Jobs of paused tasks come first in their shard's list (``due_list.lua``), not in due
  order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tickwheel.durable.model import DeadPage, JobInfo, ListingTooLong, check_task_name

from ._namespace import PAGE, Namespace
from ._refusals import ActionError
from ._rows import job_row

__all__ = ["FILTER_READ", "MAX_COUNT", "MergeFilter", "scheduled_all"]

# Jobs read per shard for a filtered page.
FILTER_READ = 200
# The most rows one page shows.
MAX_COUNT = 200


@dataclass(frozen=True, slots=True)
class MergeFilter:
    """Which scheduled jobs the merged list shows (empty fields: all)."""

    task: str = ""  # exact task name
    prefix: str = ""  # the job id starts with it

    @classmethod
    def parse(cls, task: str, prefix: str) -> MergeFilter:
        """Validate a filter from a query string.

        Raises:
            ActionError: (400) naming the bad field.
        """
        task, prefix = task.strip(), prefix.strip()
        if task:
            try:
                check_task_name(task, "task")
            except (TypeError, ValueError) as exc:
                raise ActionError(str(exc)) from None
        if len(prefix.encode()) > 256:
            raise ActionError("prefix must be at most 256 bytes")
        return cls(task, prefix)

    @property
    def empty(self) -> bool:
        """True when it matches every job."""
        return not (self.task or self.prefix)

    def matches(self, job: JobInfo) -> bool:
        """Does ``job`` pass the filter."""
        if self.task and job.task != self.task:
            return False
        return job.id.startswith(self.prefix)


async def scheduled_all(
    ns: Namespace, flt: MergeFilter, from_ms: int | None, skip: int, count: int
) -> dict[str, Any]:
    """A page of every shard's scheduled jobs merged in due order, from the cursor
    (``from_ms``, ``skip``): see the module's rules."""
    if not 1 <= count <= MAX_COUNT:
        raise ActionError(f"count must be from 1 to {MAX_COUNT}, got {count}")
    if skip < 0 or skip + count > PAGE:
        raise ActionError(f"skip must be from 0 to {PAGE - count}, got {skip}")
    read = max(FILTER_READ if not flt.empty else 0, count + skip)
    sched = await ns.need()
    console = sched.console

    async def shard_page(shard: int) -> tuple[int, DeadPage] | None:
        try:
            rank = await console.due_rank(shard, from_ms) if from_ms else 0
            return rank, await console.due_list(shard, rank, read)
        except ListingTooLong:
            return None

    shards = range(sched.keys.shards)
    pages, now = await asyncio.gather(
        asyncio.gather(*(shard_page(s) for s in shards)), console.now(0)
    )
    entries: list[tuple[int, int, int, JobInfo]] = []
    cut: list[tuple[int, int]] = []  # (last due read, shard) of shards with more
    unlisted: list[int] = []
    total = 0
    for shard, got in zip(shards, pages, strict=True):
        if got is None:
            unlisted.append(shard)
            continue
        rank, page = got
        total += page.total
        if page.jobs and rank + len(page.jobs) < page.total:
            cut.append((page.jobs[-1].when_ms, shard))
        for i, job in enumerate(page.jobs):
            if (not from_ms or job.when_ms >= from_ms) and flt.matches(job):
                entries.append((job.when_ms, shard, i, job))
    entries.sort(key=lambda e: e[:3])

    def safe(due: int, shard: int) -> bool:
        return all(due < last or (due == last and shard <= s) for last, s in cut)

    rows: list[JobInfo] = []
    skipped = 0
    for due, shard, _, job in entries:
        if not safe(due, shard):
            break
        if from_ms and due == from_ms and skipped < skip:
            skipped += 1
            continue
        rows.append(job)
        if len(rows) == count:
            break
    nxt: dict[str, int] | None = None
    if rows:
        last = rows[-1].when_ms
        same = sum(1 for j in rows if j.when_ms == last) + (skip if last == from_ms else 0)
        more = len(rows) == count or bool(cut)
        if more:
            nxt = {"from_ms": last, "skip": same} if same + count <= PAGE else None
            if nxt is None:  # too many due at one ms to page through: go on past it
                nxt = {"from_ms": last + 1, "skip": 0}
    elif cut:
        start = min(last for last, _ in cut)
        nxt = {"from_ms": start if start != from_ms else start + 1, "skip": 0}
    return {
        "filter": {"task": flt.task, "prefix": flt.prefix},
        "from_ms": from_ms or 0,
        "skip": skip,
        "count": count,
        "total": total,
        "now_ms": now,
        "shards": sched.keys.shards,
        "unlisted": unlisted,
        "next": nxt,
        "jobs": [job_row(j, now) for j in rows],
    }
