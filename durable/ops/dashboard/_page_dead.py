"""The dead letters page: dead letters listed and filtered (by task, reason or shard),
and requeued or purged by id or in bulk by filter.

Ground rules:

- Dead letters have no index by task or reason: a filtered list reads each shard's dead
  set in pages of :data:`PAGE`, at most :data:`SCAN_LIMIT` entries per shard, and says
  whether it looked at all of them (``complete``).
- A bulk action collects every matching id first, then acts in batches: acting while
  paging would shift the offsets. An empty filter needs the "all dead letters" box.
- Routes: ``/dead`` and ``/api/dead`` (``?task=&reason=&shard=&offset=&count=``), and
  the POSTs ``/dead/{action}`` (by id) and ``/dead/bulk/{action}`` (by filter), with
  their ``/api/`` twins, for ``requeue`` and ``purge``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.model import MAX_TASK_BYTES, JobInfo
from tickwheel.durable.scheduler import MAX_ERROR_CHARS

from ._namespace import PAGE, SCAN_LIMIT, Namespace
from ._refusals import ActionError, checked_id, digits, whole_number
from ._rows import job_row
from ._web import PAGE_ROWS, Web

__all__ = ["DeadFilter", "dead", "dead_act", "dead_bulk", "routes"]


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead letters a list or a bulk action covers (all fields optional)."""

    task: str = ""  # exact task name
    reason: str = ""  # substring of the last error, case-insensitive
    shard: int | None = None  # only this shard

    @classmethod
    def parse(cls, task: str, reason: str, shard: str, shards: int) -> DeadFilter:
        """Validate a filter from a form or query string.

        Raises:
            ActionError: (400) naming the bad field.
        """
        task, reason, shard = task.strip(), reason.strip(), shard.strip()
        if len(task.encode()) > MAX_TASK_BYTES:
            raise ActionError(f"task must be at most {MAX_TASK_BYTES} bytes")
        if len(reason) > MAX_ERROR_CHARS:
            raise ActionError(f"reason must be at most {MAX_ERROR_CHARS} characters")
        number: int | None = None
        if shard:
            if not digits(shard) or len(shard) > 18 or int(shard) >= shards:
                raise ActionError(f"shard must be a number from 0 to {shards - 1}, got {shard!r}")
            number = int(shard)
        return cls(task, reason, number)

    @property
    def empty(self) -> bool:
        """True when it matches every dead letter."""
        return not (self.task or self.reason or self.shard is not None)

    def matches(self, job: JobInfo) -> bool:
        """Does ``job`` pass the filter."""
        if self.task and job.task != self.task:
            return False
        return not self.reason or self.reason.lower() in job.last_error.lower()

    def as_dict(self) -> dict[str, Any]:
        """The fields, for a page's forms ("" for no shard)."""
        return {
            "task": self.task,
            "reason": self.reason,
            "shard": "" if self.shard is None else str(self.shard),
        }


async def dead(ns: Namespace, flt: DeadFilter, offset: int, count: int) -> dict[str, Any]:
    """Dead letters matching ``flt``, oldest first per shard: ``count`` from the
    ``offset``-th match, looking at most ``SCAN_LIMIT`` entries per shard."""
    sched = await ns.need()
    if not 1 <= count <= PAGE:
        raise ActionError(f"count must be from 1 to {PAGE}, got {count}")
    if offset < 0:
        raise ActionError(f"offset must be >= 0, got {offset}")
    shards = [flt.shard] if flt.shard is not None else range(sched.keys.shards)
    rows: list[dict[str, Any]] = []
    total = skipped = looked = 0
    complete = True
    now = await sched.console.now(0)  # for "2 min ago"
    for shard in shards:
        if len(rows) >= count:
            break
        seen = 0
        while len(rows) < count:
            page = await sched.console.dead_list(shard, seen, PAGE if not flt.empty else count)
            if seen == 0:
                total += page.total
            seen += len(page.jobs)
            looked += len(page.jobs)
            for job in page.jobs:
                if not flt.matches(job):
                    continue
                if skipped < offset:
                    skipped += 1
                elif len(rows) < count:
                    rows.append(job_row(job, now))
            if not page.jobs or seen >= page.total:
                break
            if seen >= SCAN_LIMIT:
                complete = False
                break
    return {
        "filter": flt.as_dict(),
        "offset": offset,
        "count": count,
        "total_dead": total,
        "looked_at": looked,
        "complete": complete,
        "now_ms": now,
        "jobs": rows,
    }


async def dead_act(ns: Namespace, action: str, job_ids: Sequence[str]) -> dict[str, Any]:
    """Requeue or purge dead letters by id; the ids that were not dead are named."""
    if action not in ("requeue", "purge"):
        raise ActionError(f"action must be requeue or purge, got {action!r}")
    if not job_ids:
        raise ActionError("select at least one dead letter")
    ids = [checked_id(i) for i in job_ids]
    sched = await ns.need()
    act = sched.requeue_dead if action == "requeue" else sched.purge_dead
    done = await act(ids)
    got = set(done)
    missing = [i for i in ids if i not in got]
    verb = "requeued" if action == "requeue" else "purged"
    return {verb: done, "missing": missing, "action": action}


async def dead_bulk(
    ns: Namespace, action: str, flt: DeadFilter, everything: bool
) -> dict[str, Any]:
    """Requeue or purge every dead letter matching ``flt``; an empty filter needs
    ``everything`` (the "all dead letters" box)."""
    if action not in ("requeue", "purge"):
        raise ActionError(f"action must be requeue or purge, got {action!r}")
    if flt.empty and not everything:
        raise ActionError(
            "give a task, a reason or a shard, or tick 'all dead letters' to act on every one"
        )
    sched = await ns.need()
    act = sched.requeue_dead if action == "requeue" else sched.purge_dead
    shards = [flt.shard] if flt.shard is not None else range(sched.keys.shards)
    done: list[str] = []
    for shard in shards:
        ids: list[str] = []
        offset = 0
        while True:  # collect first: acting while paging would shift the offsets
            page = await sched.console.dead_list(shard, offset, PAGE)
            ids += [j.id for j in page.jobs if flt.matches(j)]
            offset += len(page.jobs)
            if not page.jobs or offset >= page.total:
                break
        for i in range(0, len(ids), PAGE):
            done += await act(ids[i : i + PAGE])
    verb = "requeued" if action == "requeue" else "purged"
    return {verb: done, "count": len(done), "action": action, "filter": flt.as_dict()}


# -- routes ----------------------------------------------------------------------------


async def _filter(web: Web, values: Any) -> DeadFilter:
    sched = await web.ns.scheduler()
    shards = sched.keys.shards if sched is not None else 1
    return DeadFilter.parse(
        str(values.get("task", "")),
        str(values.get("reason", "")),
        str(values.get("shard", "")),
        shards,
    )


async def _data(web: Web, request: Request) -> dict[str, Any]:
    q = request.query_params
    flt = await _filter(web, q)
    return await dead(
        web.ns,
        flt,
        whole_number(q.get("offset", "0"), "offset"),
        whole_number(q.get("count", str(PAGE_ROWS)), "count"),
    )


async def _page(web: Web, request: Request) -> Response:
    return web.render(request, "dead.html", d=await _data(web, request), title="Dead letters")


async def _api(web: Web, request: Request) -> Response:
    return JSONResponse(await _data(web, request))


async def _by_id(web: Web, request: Request) -> Response:
    action = request.path_params["action"]
    v = await web.values(request)
    ids = v.get("ids") or []
    if isinstance(ids, str) or not isinstance(ids, list):
        raise ActionError("ids must be a list of job ids")
    result = await dead_act(web.ns, action, [str(i) for i in ids])
    verb = "requeued" if action == "requeue" else "purged"
    message = f"{verb} {len(result[verb])} dead letter(s)"
    if result["missing"]:
        message += "; not dead letters (any more): " + ", ".join(result["missing"])
    if result["missing"] and not result[verb]:
        raise ActionError(message, 409)
    return web.done(request, message, "/dead", result)


async def _bulk(web: Web, request: Request) -> Response:
    action = request.path_params["action"]
    v = await web.values(request)
    flt = await _filter(web, v)
    everything = str(v.get("all", "")).lower() in ("1", "on", "true", "yes")
    result = await dead_bulk(web.ns, action, flt, everything)
    verb = "requeued" if action == "requeue" else "purged"
    return web.done(request, f"{verb} {result['count']} dead letter(s)", "/dead", result)


def routes(web: Web) -> list[Route]:
    """The dead letters' page, API and action routes."""
    return [
        web.read("/dead", _page),
        web.read("/api/dead", _api),
        web.write("/dead/bulk/{action}", _bulk),
        web.write("/dead/{action}", _by_id),
        web.write("/api/dead/bulk/{action}", _bulk),
        web.write("/api/dead/{action}", _by_id),
    ]
