"""A Django project in one file: an order and its "charge in 3 days" job are written in
the same ``transaction.atomic()`` (tickwheel's Postgres mode), so the charge exists iff
the order does.

    python orders_app.py setup               # the orders table (tickwheel pg migrate first)
    uvicorn orders_app:application --port 8000
    tickwheel worker orders_tasks:registry --postgres-url $DATABASE_URL
"""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import urlsplit

import django
from django.conf import settings

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@localhost:5432/shop")
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = os.environ.get("TICKWHEEL_NAMESPACE", "orders")
CHARGE_DELAY = float(os.environ.get("CHARGE_DELAY", "259200"))  # seconds: 3 days

_db = urlsplit(DATABASE_URL)
settings.configure(
    DEBUG=False,
    SECRET_KEY="example-only-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
    USE_TZ=True,
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _db.path.lstrip("/"),
            "USER": _db.username or "",
            "PASSWORD": _db.password or "",
            "HOST": _db.hostname or "",
            "PORT": str(_db.port or 5432),
        }
    },
)
django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402
from orders_tasks import Charge, charge  # noqa: E402

from tickwheel.durable import SyncScheduler  # noqa: E402

# One per process, shared by every request thread.
jobs = SyncScheduler.from_url(REDIS_URL, NAMESPACE, postgres_url=DATABASE_URL)


class CardDeclined(Exception):
    """A step after the enqueue fails: the order and its charge roll back together."""


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    order, cents = str(body["id"]), int(body["total_cents"])
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO orders (id, total_cents) VALUES (%s, %s)", [order, cents])
            charge.schedule_sync(
                Charge(order=order, cents=cents),
                id=f"charge:{order}",
                delay=CHARGE_DELAY,
                conn=connection,  # the job row joins this transaction
                scheduler=jobs,
            )
            if body.get("decline"):
                raise CardDeclined(order)
    except CardDeclined:
        return JsonResponse({"id": order, "status": "declined"}, status=402)
    return JsonResponse({"id": order, "status": "created"}, status=201)


urlpatterns = [path("orders", create_order)]
application = get_asgi_application()


def setup() -> None:
    """Create the orders table (the app's own schema; tickwheel's is `tickwheel pg migrate`)."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total_cents integer)")


if __name__ == "__main__" and sys.argv[1:] == ["setup"]:
    setup()
