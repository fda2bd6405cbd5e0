"""The first screen ("is anything wrong"): the namespace's totals, the view per task
(``_tasks.py``), what is paused, and the charts sampled from the workers' stats; and
the data of the internals page (every shard's counts, lag, owner and epoch, the live
workers: ``_page_internals.py``).

Ground rules:

- The internals are a bounded number of round trips: one pipeline of inspect.lua over
  the shards (one round trip per node) and two commands for the workers (their member
  set, then one MGET of their stats documents, all in the ``{ns}`` slot). The first
  screen adds two bounded reads per shard (``_tasks.py``). Nothing runs SCAN or KEYS.
- A member counts as live while its stats document lives (it has the member TTL) or,
  without one, while its last beat is younger than the default member TTL: the member
  set is pruned only when a worker beats.
- Routes: ``/`` (``?fragment=1``: the part the page refreshes), ``/api/overview`` (the
  first screen's data and the internals'), ``/api/charts``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.scheduler import DEFAULT_OWNER_TTL, Scheduler
from tickwheel.durable.store import STATS_COUNTERS

from ._charts import HISTORY_S, TASK_WINDOW_S, Charts
from ._namespace import Namespace
from ._page_pause import paused_rows
from ._refusals import ActionError
from ._rows import iso, shard_row
from ._tasks import TaskRow, task_rows
from ._web import REDIS_DOWN, Web

__all__ = ["STALE_BEAT_MS", "internals", "overview", "routes", "sample_charts", "workers"]

logger = logging.getLogger("tickwheel.dashboard")

# A member without a stats document is gone once its beat is this old (ms): the
# default member (owner) TTL.
STALE_BEAT_MS = int(DEFAULT_OWNER_TTL * 1000)
# How the first screen names the tasks a worker counted together past its MAX_TASKS.
OTHER_TASKS_LABEL = "(other tasks)"


async def internals(ns: Namespace, with_tasks: bool = False) -> dict[str, Any]:
    """Per shard counts, lag, owner, epoch and next due; live workers; totals; with
    ``with_tasks`` the view per task too (``_tasks.py``)."""
    sched = await ns.scheduler()
    if sched is None:
        return {
            "namespace": ns.namespace,
            "created": False,
            "shards": [],
            "workers": [],
            "tasks": [],
        }
    rows = await sched.console.inspect_all()
    tasks, exact = await task_rows(sched, rows) if with_tasks else ([], True)
    now = max(r.now_ms for r in rows)
    live = await workers(sched, now)
    names = {w["token"]: w["name"] for w in live}
    totals = {
        name: sum(getattr(r, name) for r in rows)
        for name in ("due", "overdue", "leased", "expired", "dead", "parked")
    }
    totals["timeouts"] = sum(w["counters"].get("timeouts", 0) for w in live)
    totals["max_lag_ms"] = max((r.lag_ms for r in rows), default=0)
    totals["owned"] = sum(1 for r in rows if r.owner)
    nexts = [r.next_due_ms for r in rows if r.next_due_ms]
    totals["next_due_ms"] = min(nexts, default=0)
    totals["oldest_overdue_ms"] = min(
        (r.oldest_overdue_ms for r in rows if r.oldest_overdue_ms), default=0
    )
    totals["running"] = sum(w["running"] or 0 for w in live)
    return {
        "namespace": ns.namespace,
        "created": True,
        "now_ms": now,
        "now": iso(now),
        "shards": [shard_row(r, names) for r in rows],
        "workers": live,
        "totals": totals,
        "next_due": iso(totals["next_due_ms"]),
        "paused": [
            {**row, "since": iso(row["since_ms"])}
            for row in paused_rows(await sched.console.paused())
        ],
        "tasks": tasks,
        "tasks_exact": exact,
    }


async def overview(ns: Namespace, charts: Charts | None = None) -> dict[str, Any]:
    """The first screen's data: :func:`internals` with the view per task, and with
    ``charts`` each task's runs, acks per minute, failures and lateness over the last
    ``TASK_WINDOW_S`` (``throughput``; a task that only ran there gets a row too)."""
    data = await internals(ns, with_tasks=True)
    if charts is None or not data["created"]:
        return data
    per_task = charts.per_task()
    rows = data["tasks"]
    seen = {row["task"] for row in rows}
    for task in sorted(set(per_task) - seen):
        rows.append({**TaskRow(task).as_dict(data["now_ms"]), "task": task or OTHER_TASKS_LABEL})
    for row in rows:
        row["throughput"] = per_task.get("" if row["task"] == OTHER_TASKS_LABEL else row["task"])
    data["task_window_s"] = TASK_WINDOW_S
    return data


async def workers(sched: Scheduler, now_ms: int) -> list[dict[str, Any]]:
    """The live workers in the member set with their published stats (two commands)."""
    out: list[dict[str, Any]] = []
    for member in await sched.workers.members():
        doc = member.stats or {}
        token = member.token
        age = max(now_ms - member.beat_ms, 0)
        if not doc and age > STALE_BEAT_MS:
            continue  # gone: its stats expired and the member set was not pruned yet
        counters = dict(zip(STATS_COUNTERS, doc.get("c", []), strict=False))
        out.append(
            {
                "token": token,
                "name": f"{doc.get('host', '?')}:{doc.get('pid', '?')}/{token[:6]}"
                if doc
                else token[:12],
                "beat_age_ms": age,
                "owned": doc.get("owned"),
                "loaded": doc.get("loaded"),
                "running": doc.get("running"),
                "counters": counters,
                "stats": doc,
            }
        )
    return out


async def sample_charts(web: Web) -> None:
    """The chart sampler: every interval, the workers' chart samples added since the
    last read (one XRANGE; the last hour at the first); runs until cancelled, whatever
    a read raised."""
    while True:
        try:
            sched = await web.ns.scheduler()
            if sched is not None:
                charts = web.charts
                now = await sched.console.now(0)
                since = now - int(HISTORY_S * 1000)
                charts.add(await sched.workers.samples(charts.last_id, since), now)
            web.redis_error = ""
        except REDIS_DOWN as exc:
            web.redis_error = web.unreachable(exc)
        except ActionError as exc:
            web.redis_error = web.hide(str(exc))
        except Exception:  # the sampler must outlive a bad reply
            logger.exception("tickwheel dashboard: chart sample failed")
        await asyncio.sleep(web.config.sample_interval)


async def _page(web: Web, request: Request) -> Response:
    try:
        data, status, error = await overview(web.ns, web.charts), 200, ""
    except REDIS_DOWN as exc:
        data = {"created": False, "shards": [], "workers": [], "tasks": []}
        status, error = 503, web.unreachable(exc)
    name = "overview_live.html" if request.query_params.get("fragment") else "overview.html"
    last = web.charts.points[-1] if web.charts.points else None
    return web.render(request, name, status, o=data, error=error, last=last, title="Overview")


async def _api(web: Web, request: Request) -> Response:
    return JSONResponse(await overview(web.ns, web.charts))


async def _api_charts(web: Web, request: Request) -> Response:
    return JSONResponse({**web.charts.series(), "error": web.redis_error})


def routes(web: Web) -> list[Route]:
    """The overview's page and API routes."""
    return [
        web.read("/", _page),
        web.read("/api/overview", _api),
        web.read("/api/charts", _api_charts),
    ]
