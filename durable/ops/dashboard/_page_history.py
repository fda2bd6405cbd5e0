"""The history of finished attempts: the recent ones across every shard (filter by task
and outcome), and one job's attempts for the job page.

Ground rules:

- Workers write each ended attempt to its shard's capped stream (``store/_history.py``,
  the last ``HISTORY_CAP`` batches of up to ``BATCH_MAX`` rows a shard); the pages read
  them, never anything else.
- The recent list reads every shard's newest batches before the cursor in one pipeline
  (``count`` per shard without a filter, ``HISTORY_SCAN`` with one), merges their rows
  newest first by (Redis ms, sequence, shard, index) and keeps ``count``, and only
  rows newer than what a full read left unread. The cursor is the last shown row's
  place in that order (``ms-seq-shard-index``): nothing is shown twice or skipped,
  ties within a millisecond included.
- A job's attempts are those among its shard's last ``HISTORY_SCAN`` batches: a job
  that finished long ago, or whose shard is busy, may show none (the page says so).
- Routes: ``/history`` and ``/api/history`` (``?task=&outcome=&before=&count=``;
  ``/api/history?id=`` one job's attempts).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.store import BATCH_MAX, HISTORY_CAP, HISTORY_SCAN, HistoryEntry

from ._namespace import Namespace
from ._refusals import ActionError, checked_id, whole_number
from ._web import PAGE_ROWS, Web

__all__ = ["OUTCOMES", "attempts", "recent", "routes"]

# The outcomes an entry may name (the filter's choices).
OUTCOMES = ("acked", "retried", "dead", "deferred", "cancelled", "lease_lost", "expired")
# Entries shown per page at most.
MAX_COUNT = 500
_CURSOR = re.compile(r"\A(\d{1,20})-(\d{1,20})-(\d{1,6})-(\d{1,6})\Z")


def _place(before: str) -> tuple[int, int, int, int] | None:
    """The row place the cursor ``before`` names (``ms-seq-shard-index``)."""
    got = _CURSOR.match(before)
    return None if got is None else (int(got[1]), int(got[2]), int(got[3]), int(got[4]))


def _row(e: HistoryEntry) -> dict[str, Any]:
    row = e.as_dict()
    row["took_ms"] = e.ended_ms - e.started_ms if e.started_ms else None
    return row


async def attempts(ns: Namespace, job_id: str) -> list[dict[str, Any]]:
    """The finished attempts of ``job_id`` kept in its shard's history, oldest first."""
    sched = await ns.need()
    return [_row(e) for e in await sched.history.attempts(job_id)]


async def recent(ns: Namespace, task: str, outcome: str, before: str, count: int) -> dict[str, Any]:
    """The newest finished attempts across every shard before the cursor ``before``,
    of ``task`` and ``outcome`` when given."""
    if outcome and outcome not in OUTCOMES:
        raise ActionError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if before and not _CURSOR.match(before):
        raise ActionError(f"before must be a row's place (ms-seq-shard-index), got {before!r}")
    if not 1 <= count <= MAX_COUNT:
        raise ActionError(f"count must be from 1 to {MAX_COUNT}, got {count}")
    sched = await ns.need()
    filtered = bool(task or outcome)
    per_shard = HISTORY_SCAN if filtered else count
    shards = list(range(sched.keys.shards))
    read = await sched.history.read(shards, _place(before) if before else None, per_shard)
    merged = [
        e
        for rows, _ in read
        for e in rows
        if (not task or e.task == task) and (not outcome or e.outcome == outcome)
    ]
    # A shard that returned a full read has older batches unread: only what is newer
    # than the newest of those shards' oldest batches read (the horizon) is complete.
    horizon = max((oldest for _, oldest in read if oldest is not None), default=None)
    if horizon is not None:
        merged = [e for e in merged if e.order >= horizon]
    merged.sort(key=lambda e: e.order, reverse=True)  # newest first
    page = merged[:count]
    # Past the page: from its last row; all known shown: from the horizon, if any.
    rest = "-".join(map(str, horizon)) if horizon is not None else ""
    nxt = page[-1].cursor if len(merged) > count else rest
    return {
        "task": task,
        "outcome": outcome,
        "before": before,
        "count": count,
        "shards": len(shards),
        "cap": HISTORY_CAP,
        "batch": BATCH_MAX,
        "scan": per_shard,
        "entries": [_row(e) for e in page],
        "next": nxt,
    }


async def _data(web: Web, request: Request) -> dict[str, Any]:
    q = request.query_params
    return await recent(
        web.ns,
        q.get("task", "").strip(),
        q.get("outcome", "").strip(),
        q.get("before", "").strip(),
        whole_number(q.get("count", str(PAGE_ROWS)), "count"),
    )


async def _page(web: Web, request: Request) -> Response:
    data = await _data(web, request)
    now = await (await web.ns.need()).console.now(0)
    return web.render(
        request, "history.html", h=data, outcomes=OUTCOMES, now_ms=now, title="History"
    )


async def _api(web: Web, request: Request) -> Response:
    job_id = request.query_params.get("id", "")
    if job_id:  # one job's attempts (its record may be gone: acked, cancelled)
        return JSONResponse({"id": job_id, "attempts": await attempts(web.ns, checked_id(job_id))})
    return JSONResponse(await _data(web, request))


def routes(web: Web) -> list[Route]:
    """The history page's routes."""
    return [web.read("/history", _page), web.read("/api/history", _api)]
