"""``tickwheel dashboard``: a web UI and a JSON API over a live namespace.

Needs the ``dashboard`` extra (``pip install 'tickwheel[dashboard]'``): Starlette,
uvicorn and Jinja2, imported only by this package, so the rest of tickwheel works
without them. ``_app.py`` assembles the ASGI app from the pages (``_page_overview.py``,
``_page_internals.py``, ``_page_jobs.py``, ``_page_dead.py``, ``_page_recurring.py``,
``_page_pause.py``, ``_page_login.py``: each one's reads and acts over the namespace and
its routes); ``_web.py`` is what the pages share (rendering, guards, errors),
``_sessions.py`` who may write, ``_namespace.py`` the Redis client and scheduler,
``_tasks.py`` the first screen's view per task, ``_merge.py`` the scheduled list across
shards, ``_rows.py`` how things are shown, ``_human.py`` times in words,
``_refusals.py`` the errors an operator acts on, ``_charts.py`` the live charts,
``_serve.py`` the command.
"""

from __future__ import annotations

from ._app import create_app
from ._config import DashboardConfig
from ._serve import TOKEN_ENV, is_loopback, serve
from ._sessions import SESSION_COOKIE

__all__ = ["SESSION_COOKIE", "TOKEN_ENV", "DashboardConfig", "create_app", "is_loopback", "serve"]
