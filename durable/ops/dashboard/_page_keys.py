"""The flow key page (issue 35, docs/limits.md): one key of one task looked up, with
its limits, the runs holding its permits, the jobs waiting and the next release.

Ground rules:

- A lookup is two reads and never opens the namespace: the limits of record (one
  HGETALL, O(tasks)) and the key's permits (limits.lua's look, in the key's own slot,
  O(log N)): a key lookup does not scan the jobs.
- Routes: ``/key`` and ``/api/key`` (``?task=&key=``; an empty ``key``: the task's
  single key). A bad task or key is refused (400) naming it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tickwheel.durable.model import Limits, check_key, check_task_name

from ._namespace import Namespace
from ._refusals import ActionError
from ._rows import iso
from ._web import Web

__all__ = ["key_lookup", "routes"]


async def key_lookup(ns: Namespace, task: str, key: str) -> dict[str, Any]:
    """One flow key of ``task`` (``""``: the task's single key).

    Raises:
        ActionError: (400) naming a malformed ``task`` or ``key``.
    """
    try:
        check_task_name(task, "task")
        if key:
            check_key(key)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None
    sched = await ns.need()
    calls = sched.store.limits
    lim = (await calls.read()).get(task, Limits())
    state = await calls.look(task, key, lim)
    return {
        "task": task,
        "key": key,
        "concurrency": lim.concurrency,
        "rate": [lim.rate_n, lim.rate_ms / 1000] if lim.rate_n else None,
        "running": state.running,
        "waiting": state.waiting,
        "handed": state.handed,
        "next_release_ms": state.next_release_ms,
        "next_release": iso(state.next_release_ms) if state.next_release_ms >= 0 else "",
        "next_start_ms": state.next_start_ms,
        "next_start": iso(state.next_start_ms) if state.next_start_ms >= 0 else "",
        "window_starts": state.window_starts,
        "now_ms": state.now_ms,
    }


async def _key_page(web: Web, request: Request) -> Response:
    task = request.query_params.get("task", "")
    key = request.query_params.get("key", "")
    if not task:
        return web.render(request, "key.html", row=None, task="", key=key, title="Flow key")
    try:
        row = await key_lookup(web.ns, task, key)
    except ActionError as exc:
        return web.render(
            request, "key.html", exc.status, row=None, task=task, key=key, error=str(exc),
            title="Flow key",
        )  # fmt: skip
    return web.render(request, "key.html", row=row, task=task, key=key, title=f"Key {key}")


async def _api_key(web: Web, request: Request) -> Response:
    q = request.query_params
    return JSONResponse(await key_lookup(web.ns, q.get("task", ""), q.get("key", "")))


def routes(web: Web) -> list[Route]:
    """The key lookup's routes."""
    return [web.read("/key", _key_page), web.read("/api/key", _api_key)]
