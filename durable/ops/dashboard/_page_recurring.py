"""The recurring page: the recurring series among each shard's scheduled jobs.

Recurring jobs have no index of their own: each shard's due list is read in pages of
:data:`PAGE` up to a bound per shard, and the answer says whether it saw everything (a
shard whose far index is too long to list, or past the bound, makes it incomplete). A
series whose run is leased right now shows again once it is acked.

Routes: ``/recurring`` and ``/api/recurring``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.model import JobInfo, ListingTooLong

from ._namespace import PAGE, SCAN_LIMIT, Namespace
from ._rows import UPCOMING, UPCOMING_ROWS, job_row, upcoming_rows
from ._web import Web

__all__ = ["recurring", "routes"]


async def recurring(ns: Namespace, limit: int = SCAN_LIMIT) -> dict[str, Any]:
    """Recurring series among the first ``limit`` due jobs of each shard, by due time;
    the first :data:`UPCOMING_ROWS` with their next occurrences in UTC and local time."""
    sched = await ns.need()
    rows: list[dict[str, Any]] = []
    infos: dict[str, JobInfo] = {}
    complete = True
    for shard in range(sched.keys.shards):
        seen = 0
        while seen < limit:
            try:
                page = await sched.console.due_list(shard, seen, PAGE)
            except ListingTooLong:  # a shard whose far index is too long to read
                complete = False
                break
            seen += len(page.jobs)
            for j in page.jobs:
                if j.recurrence is not None:
                    rows.append(job_row(j, 0))
                    infos[j.id] = j
            if not page.jobs or seen >= page.total:
                break
        else:
            complete = False
    rows.sort(key=lambda r: r["next_ms"])
    for row, info in ((r, infos[r["id"]]) for r in rows[:UPCOMING_ROWS]):
        row["upcoming"] = upcoming_rows(info, UPCOMING)
    return {"jobs": rows, "complete": complete, "limit_per_shard": limit}


async def _page(web: Web, request: Request) -> Response:
    return web.render(request, "recurring.html", r=await recurring(web.ns), title="Recurring")


async def _api(web: Web, request: Request) -> Response:
    return JSONResponse(await recurring(web.ns))


def routes(web: Web) -> list[Route]:
    """The recurring page's routes."""
    return [web.read("/recurring", _page), web.read("/api/recurring", _api)]
