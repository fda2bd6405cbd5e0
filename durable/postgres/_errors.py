"""The one place that translates the driver's errors into the library's.

The caller of :class:`PgStore` sees :class:`PostgresUnavailable` (transient: the same call
may succeed later), :class:`Fenced` (a function refused a stale epoch with SQLSTATE
``TWFEN``, see the migrations), or the driver's own error for a bug. asyncpg is imported
only for an error that came from it.
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
    """Map what the driver (or the socket under it) raised to what the caller should see.

    asyncpg's errors by their classes; the other drivers' (psycopg 3, and SQLAlchemy's or
    Django's wrappers of it, for an application's connection: ``_drivers.py``) by the
    SQLSTATE they carry, a lost connection (an ``OperationalError`` with none) being
    transient too.
    """
    module = type(exc).__module__ or ""
    if module == "asyncpg" or module.startswith("asyncpg."):
        return _translate_asyncpg(exc, shard)
    if isinstance(exc, OSError | TimeoutError):
        return PostgresUnavailable(f"postgres unavailable: {exc!r}")
    chain = _chain(exc)
    state = next((s for s in map(_sqlstate, chain) if s), "")
    if state == _FENCED:
        return Fenced(str(exc), shard)
    if state[:2] in _TRANSIENT_CLASSES or (
        not state and any(type(e).__name__ == "OperationalError" for e in chain)
    ):
        return PostgresUnavailable(f"postgres unavailable: {exc}")
    return exc


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (SQLAlchemy's ``orig``, a ``__cause__``), a few deep."""
    out = [exc]
    for _ in range(3):
        nxt = getattr(out[-1], "orig", None) or out[-1].__cause__
        if not isinstance(nxt, BaseException) or nxt in out:
            break
        out.append(nxt)
    return out


def _sqlstate(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return state if isinstance(state, str) else ""


def _translate_asyncpg(exc: BaseException, shard: int | None) -> BaseException:
    import asyncpg  # noqa: PLC0415  (the error came from it: it is loaded)

    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        if state == _FENCED:
            return Fenced(str(exc), shard)
        if state[:2] in _TRANSIENT_CLASSES:
            return PostgresUnavailable(f"postgres unavailable: {exc}")
        return exc
    # InternalClientError: a pooled connection left mid-operation when its server died
    # (seen in the chaos test: the pool's reset on release, "cannot switch to state").
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
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
