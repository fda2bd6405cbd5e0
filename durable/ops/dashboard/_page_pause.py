"""Pause and resume from the dashboard: two writes, behind the write guards (token
session and CSRF, as every dashboard write), shown on the overview.

Ground rules:

- ``POST /pause`` and ``/resume`` (and their ``/api/`` twins) take ``task``: a task
  name, or empty for the whole namespace. A bad name is refused (400) naming ``task``,
  before anything is written.
- The state shown is the namespace's of record (``Scheduler.paused``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tickwheel.durable.model import check_task_name

from ._namespace import Namespace
from ._refusals import ActionError
from ._web import Web

__all__ = ["pause_act", "paused_rows", "routes"]


def paused_rows(state: dict[str | None, int]) -> list[dict[str, Any]]:
    """The pause state as rows (the whole namespace first): task (None: all), since."""
    order = sorted(state.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))
    return [{"task": task, "since_ms": since} for task, since in order]


async def pause_act(ns: Namespace, action: str, task: str | None) -> dict[str, Any]:
    """Pause or resume ``task`` (None: the whole namespace)."""
    if task is not None:
        try:
            check_task_name(task, "task")
        except (TypeError, ValueError) as exc:
            raise ActionError(str(exc)) from None
    sched = await ns.need()
    moved = 0
    if action == "pause":
        await sched.pause(task)
    else:
        moved = await sched.resume(task)
    state = await sched.paused()
    return {"action": action, "task": task, "moved": moved, "paused": paused_rows(state)}


def _handler(action: str) -> Any:
    async def handle(web: Web, request: Request) -> Response:
        v = await web.values(request)
        raw = v.get("task", "")
        if not isinstance(raw, str):
            raise ActionError("task must be a task name, or empty for the whole namespace")
        task = raw or None
        result = await pause_act(web.ns, action, task)
        what = f"task {task!r}" if task is not None else "the whole namespace"
        if action == "pause":
            message = f"paused {what}: its due jobs wait until a resume"
        else:
            message = f"resumed {what}: {result['moved']} waiting job(s) back to due"
        return web.done(request, message, "/", result)

    return handle


def routes(web: Web) -> list[Route]:
    """The pause and resume writes."""
    return [
        web.write("/pause", _handler("pause")),
        web.write("/resume", _handler("resume")),
        web.write("/api/pause", _handler("pause")),
        web.write("/api/resume", _handler("resume")),
    ]
