"""The one place that translates the driver's errors into the library's.

The caller of :class:`PgStore` sees :class:`PostgresUnavailable` (transient: the same call
may succeed later), :class:`Fenced` (a function refused a stale epoch with SQLSTATE
``TWFEN``, see the migrations), or the driver's own error for a bug. asyncpg is imported
inside :func:`translate` only: ``PgStore.open`` has loaded it by the time an error comes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tickwheel.durable.model import Fenced, PostgresUnavailable

__all__ = ["stored_epoch", "translate", "translated"]

# SQLSTATE classes a restart, a failover or an overload produces: the same call may
# succeed later. 08 connection exception, 53 insufficient resources, 57 operator
# intervention (admin shutdown, cannot connect now), 40 transaction rollback
# (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "53", "57", "40")
_FENCED = "TWFEN"


def translate(exc: BaseException, shard: int | None = None) -> BaseException:
    """Map what asyncpg (or the socket under it) raised to what the caller should see."""
    import asyncpg  # noqa: PLC0415  (loaded by open() already)

    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        if state == _FENCED:
            return Fenced(str(exc), shard)
        if state[:2] in _TRANSIENT_CLASSES:
            return PostgresUnavailable(f"postgres unavailable: {exc}")
        return exc
    # InternalClientError: a pooled connection left mid-operation when its server died
    # (seen in the chaos test: the pool's reset on release, "cannot switch to state").
    if isinstance(
        exc, OSError | TimeoutError | asyncpg.InterfaceError | asyncpg.InternalClientError
    ):
        return PostgresUnavailable(f"postgres unavailable: {exc!r}")
    return exc


def stored_epoch(exc: BaseException) -> int:
    """The stored epoch a ``TWFEN`` refusal carries (0 if none)."""
    cause = exc.__cause__
    detail = getattr(cause, "detail", None) or "0"
    try:
        return int(detail)
    except ValueError:
        return 0


@contextlib.contextmanager
def translated(shard: int | None) -> Iterator[None]:
    """Raise the library's error for a driver's, from the body (see :func:`translate`)."""
    try:
        yield
    except (Fenced, PostgresUnavailable):
        raise
    except Exception as exc:
        mapped = translate(exc, shard)
        if mapped is exc:
            raise
        raise mapped from exc
