"""The job pages: a job looked up by id, one shard's scheduled jobs in due order, and
what an operator may do to a job (cancel it, run it now, move it).

Ground rules:

- A lookup is one pipeline of get.lua and now.lua on the id's own shard (one round trip).
- Every action names what the operator saw (``seen``: state, nominal due and attempt):
  if the job moved on since, nothing is written and :class:`Stale` says so.
- Routes: ``/job`` and ``/api/job`` (``?id=``), ``/scheduled`` and ``/api/scheduled``
  (``?shard=&offset=&count=&from=``: one shard; without ``shard``, every shard merged
  in due order, ``?task=&prefix=&from=&skip=&count=``: ``_merge.py``), and the POSTs
  ``/job/{action}`` and ``/api/job/{action}`` for ``cancel``, ``run-now`` and
  ``reschedule``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.model import JobInfo, JobState
from tickwheel.durable.scheduler import Scheduler
from tickwheel.durable.store import HISTORY_SCAN

from ._merge import MergeFilter, scheduled_all
from ._namespace import PAGE, Namespace
from ._page_history import attempts
from ._refusals import (
    ActionError,
    NotFound,
    Stale,
    check_shard,
    checked_id,
    parse_when,
    seconds,
    whole_number,
)
from ._rows import UPCOMING, iso, job_row, seen_of
from ._web import PAGE_ROWS, Web

__all__ = ["cancel", "job", "reschedule", "routes", "scheduled"]


# -- reads -----------------------------------------------------------------------------


async def job(ns: Namespace, job_id: str) -> dict[str, Any]:
    """One job by id: one call on its own shard.

    Raises:
        ActionError: (400) for a malformed id; NotFound if there is no such job.
    """
    job_id = checked_id(job_id)
    sched = await ns.need()
    info, now = await sched.console.get_and_now(job_id)
    if info is None:
        raise NotFound(
            f"no job {job_id!r} (shard {sched.keys.shard_of(job_id)}): it completed, was "
            "cancelled or purged, or was never scheduled"
        )
    return {
        "now_ms": now,
        "job": job_row(info, now, UPCOMING),
        "attempts": await attempts(ns, job_id),
    }


async def scheduled(
    ns: Namespace, shard: int, offset: int, count: int, from_ms: int | None
) -> dict[str, Any]:
    """A page of one shard's due jobs in due order, from ``from_ms`` when given."""
    sched = await ns.need()
    check_shard(shard, sched.keys.shards)
    if not 1 <= count <= PAGE:
        raise ActionError(f"count must be from 1 to {PAGE}, got {count}")
    if offset < 0:
        raise ActionError(f"offset must be >= 0, got {offset}")
    start = offset
    if from_ms is not None:
        start += await sched.console.due_rank(shard, from_ms)
    page = await sched.console.due_list(shard, start, count)
    now = await sched.console.now(shard)
    return {
        "shard": shard,
        "shards": sched.keys.shards,
        "offset": offset,
        "count": count,
        "start_rank": start,
        "total": page.total,
        "now_ms": now,
        "jobs": [job_row(j, now) for j in page.jobs],
    }


# -- actions ---------------------------------------------------------------------------


async def _current(sched: Scheduler, job_id: str, seen: str) -> JobInfo:
    info = await sched.console.get(job_id)
    if info is None:
        raise Stale(
            f"job {job_id!r} is gone (completed, cancelled or purged) since the page "
            "was loaded: nothing was done"
        )
    if seen and seen_of(info) != seen:
        raise Stale(
            f"job {job_id!r} moved on since the page was loaded (now "
            f"{info.state.name.lower()}, attempt {info.attempt}): nothing was done; "
            "reload it and try again"
        )
    return info


async def cancel(ns: Namespace, job_id: str, seen: str) -> str:
    """Cancel a job in any state (a leased job's holder gets LeaseLost on ack)."""
    job_id = checked_id(job_id)
    sched = await ns.need()
    await _current(sched, job_id, seen)
    state = await sched.console.cancel(job_id)
    if state is None:
        raise Stale(f"job {job_id!r} was gone before the cancel reached it")
    return f"cancelled job {job_id!r} (it was {state.name.lower()})"


async def reschedule(
    ns: Namespace,
    job_id: str,
    seen: str,
    *,
    delay: float | None = None,
    at_ms: int | None = None,
) -> str:
    """Move a due job to ``now + delay`` or to ``at_ms`` (a new occurrence)."""
    job_id = checked_id(job_id)
    sched = await ns.need()
    info = await _current(sched, job_id, seen)
    if info.state not in (JobState.DUE, JobState.WAITING):
        raise Stale(
            f"job {job_id!r} is {info.state.name.lower()}: only a due job can be moved",
        )
    try:
        moved = await sched.reschedule(job_id, delay=delay, at=at_ms)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None
    if not moved:
        raise Stale(f"job {job_id!r} could not be moved: it is no longer due, or that run is done")
    if at_ms is not None:
        return f"job {job_id!r} now due at {iso(at_ms)}"
    if not delay:
        return f"job {job_id!r} runs now"
    return f"job {job_id!r} now due in {delay:g} s"


# -- routes ----------------------------------------------------------------------------


async def _job_page(web: Web, request: Request) -> Response:
    job_id = request.query_params.get("id", "")
    if not job_id:
        return web.render(request, "job.html", job=None, job_id="", title="Job lookup")
    sched = await web.ns.scheduler()
    shard = sched.keys.shard_of(job_id) if sched is not None else 0
    where = {"history_scan": HISTORY_SCAN, "history_shard": shard}
    try:
        data = await job(web.ns, job_id)
    except ActionError as exc:
        # A job gone (acked, cancelled) may still have its finished attempts.
        done = await attempts(web.ns, job_id) if isinstance(exc, NotFound) and sched else []
        now = await sched.console.now(shard) if done and sched is not None else 0
        return web.render(
            request,
            "job.html",
            exc.status,
            job=None,
            job_id=job_id,
            error=str(exc),
            attempts=done,
            now_ms=now,
            title="Job lookup",
            **where,
        )
    return web.render(
        request,
        "job.html",
        job=data["job"],
        job_id=job_id,
        now_ms=data["now_ms"],
        attempts=data["attempts"],
        title=f"Job {job_id}",
        **where,
    )


async def _api_job(web: Web, request: Request) -> Response:
    return JSONResponse(await job(web.ns, request.query_params.get("id", "")))


async def _scheduled_data(web: Web, request: Request) -> dict[str, Any]:
    q = request.query_params
    from_text = q.get("from", "").strip()
    return await scheduled(
        web.ns,
        whole_number(q.get("shard", "0"), "shard"),
        whole_number(q.get("offset", "0"), "offset"),
        whole_number(q.get("count", str(PAGE_ROWS)), "count"),
        parse_when(from_text) if from_text else None,
    ) | {"from": from_text}


async def _merged_data(web: Web, request: Request) -> dict[str, Any]:
    q = request.query_params
    from_text = q.get("from", "").strip()
    flt = MergeFilter.parse(q.get("task", ""), q.get("prefix", ""))
    return await scheduled_all(
        web.ns,
        flt,
        parse_when(from_text) if from_text else None,
        whole_number(q.get("skip", "0"), "skip"),
        whole_number(q.get("count", str(PAGE_ROWS)), "count"),
    ) | {"from": from_text}


async def _scheduled_page(web: Web, request: Request) -> Response:
    if request.query_params.get("shard", "").strip():
        data = await _scheduled_data(web, request)
        return web.render(request, "scheduled.html", s=data, title="Scheduled")
    data = await _merged_data(web, request)
    return web.render(request, "scheduled_all.html", s=data, title="Scheduled")


async def _api_scheduled(web: Web, request: Request) -> Response:
    if request.query_params.get("shard", "").strip():
        return JSONResponse(await _scheduled_data(web, request))
    return JSONResponse(await _merged_data(web, request))


async def _action(web: Web, request: Request) -> Response:
    action = request.path_params["action"]
    v = await web.values(request)
    job_id = checked_id(str(v.get("id", "")))
    seen = str(v.get("seen", ""))
    back = f"/job?id={quote(job_id, safe='')}"
    if action == "cancel":
        message = await cancel(web.ns, job_id, seen)
        back = "/"
    elif action == "run-now":
        message = await reschedule(web.ns, job_id, seen, delay=0.0)
    elif action == "reschedule":
        at = str(v.get("at") or "").strip()
        delay_text = str(v.get("delay") if v.get("delay") is not None else "").strip()
        if at and delay_text:
            raise ActionError("give a delay or a time (at), not both")
        if at:
            message = await reschedule(web.ns, job_id, seen, at_ms=parse_when(at))
        elif delay_text:
            message = await reschedule(web.ns, job_id, seen, delay=seconds(delay_text))
        else:
            raise ActionError("give a delay (seconds) or a time (at) to reschedule to")
    else:
        raise ActionError(f"unknown action {action!r}", 404)
    return web.done(request, message, back, {"id": job_id, "action": action})


def routes(web: Web) -> list[Route]:
    """The job lookup's, the scheduled list's and the job actions' routes."""
    return [
        web.read("/job", _job_page),
        web.read("/api/job", _api_job),
        web.read("/scheduled", _scheduled_page),
        web.read("/api/scheduled", _api_scheduled),
        web.write("/job/{action}", _action),
        web.write("/api/job/{action}", _action),
    ]
