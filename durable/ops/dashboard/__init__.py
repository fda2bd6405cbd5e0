"""``tickwheel dashboard``: a web UI and a JSON API over a live namespace.

Needs the ``dashboard`` extra (``pip install 'tickwheel[dashboard]'``): Starlette,
uvicorn and Jinja2, imported only by this package, so the rest of tickwheel works
without them. ``_data.py`` reads and acts on Redis, ``_app.py`` is the ASGI app and its
guards, ``_charts.py`` the live charts, ``_serve.py`` the command.
"""

from __future__ import annotations

from ._app import SESSION_COOKIE, DashboardConfig, create_app
from ._serve import TOKEN_ENV, is_loopback, serve

__all__ = ["SESSION_COOKIE", "TOKEN_ENV", "DashboardConfig", "create_app", "is_loopback", "serve"]
