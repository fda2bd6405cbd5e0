"""The skew between PostgreSQL's clock and Redis's, measured and bounded.

In the Postgres mode a ``delay`` is added to PostgreSQL's clock (the due is decided in
the transaction that commits the job, which may be the application's), and the job
fires when Redis's clock reaches it. So a job fires ``delay`` after its commit by
PostgreSQL's clock plus the skew (PostgreSQL minus Redis) by Redis's: early by the skew
when PostgreSQL's clock is behind. :func:`measure` bounds that skew from the servers'
own clocks, and ``tickwheel check --postgres-url`` reports it (a problem past
``--max-clock-skew``, 50 ms by default); every reconcile that runs (a worker's, every
``--reconcile-interval``) measures it too and logs a warning past 50 ms
(:func:`warn_of_skew`).

How: read Redis's clock (``r0``), PostgreSQL's (``p``), Redis's again (``r1``). ``p`` was
read at some Redis instant in ``[r0, r1]``, so the skew is in ``[p - r1, p - r0]``: its
midpoint, plus or minus half the interval and PostgreSQL's clock resolution (1 ms, the
unit the mode decides dues in). The tightest of a few samples is kept, so a slow round
trip widens nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["DEFAULT_MAX_SKEW_MS", "ClockSkew", "measure", "pg_redis_skew", "warn_of_skew"]

logger = logging.getLogger("tickwheel.durable")

# What `tickwheel check` accepts before it calls the skew a problem (ms): a few times
# what NTP keeps two hosts of one network within, well under a timer tick of the wheel.
DEFAULT_MAX_SKEW_MS = 50.0
_PG_NOW = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


@dataclasses.dataclass(frozen=True, slots=True)
class ClockSkew:
    """PostgreSQL's clock minus Redis's, in ms: within ``offset_ms`` +/- ``bound_ms``."""

    offset_ms: float  # the measured skew (positive: PostgreSQL's clock is ahead)
    bound_ms: float  # half the width of the interval the skew is certainly in
    samples: int  # round trips measured (the tightest one kept)

    @property
    def worst_ms(self) -> float:
        """The largest skew the measurement allows, either way: |offset| + bound."""
        return abs(self.offset_ms) + self.bound_ms


async def measure(
    pg_now: Callable[[], Awaitable[float]],
    redis_now: Callable[[], Awaitable[float]],
    samples: int = 5,
) -> ClockSkew:
    """Measure the skew from ``samples`` reads of Redis, PostgreSQL, Redis (each clock
    in ms, as the callables read it) and keep the tightest.

    Raises:
        ValueError: if ``samples`` < 1; what the callables raise.
    """
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    best: tuple[float, float] | None = None
    for _ in range(samples):
        r0 = await redis_now()
        p = await pg_now()
        r1 = await redis_now()
        low, high = p - r1, p - r0 + 1.0  # p is floored to the ms: up to 1 ms more
        if best is None or high - low < best[1] - best[0]:
            best = (low, high)
    assert best is not None
    low, high = best
    return ClockSkew((low + high) / 2, (high - low) / 2, samples)


async def warn_of_skew(
    pg_now: Callable[[], Awaitable[float]],
    redis_now: Callable[[], Awaitable[float]],
    limit_ms: float = DEFAULT_MAX_SKEW_MS,
) -> ClockSkew | None:
    """:func:`measure`, and log a warning when the skew may pass ``limit_ms``. Never
    raises: a measurement that failed is logged (debug) and gives None."""
    try:
        skew = await measure(pg_now, redis_now)
    except Exception as exc:  # a side check: the caller's work goes on
        logger.debug("clock skew not measured (%r)", exc)
        return None
    if skew.worst_ms > limit_ms:
        logger.warning(
            "PostgreSQL's clock is %+.1f ms (+/- %.1f) off Redis's, over %g ms: a delay is"
            " decided on PostgreSQL's clock and fires on Redis's (keep both on NTP)",
            skew.offset_ms,
            skew.bound_ms,
            limit_ms,
        )
    return skew


async def pg_redis_skew(pg_url: str, client: Any, *, samples: int = 5) -> ClockSkew:
    """:func:`measure` between the PostgreSQL at ``pg_url`` (a connection of its own,
    no schema needed) and the Redis of ``client`` (``TIME``, its server clock).

    Raises:
        PostgresUnavailable: if PostgreSQL cannot be reached.
        RedisUnavailable: as the client's calls raise it.
    """
    import asyncpg  # noqa: PLC0415

    from ._errors import translated  # noqa: PLC0415

    with translated(None):
        conn = await asyncpg.connect(pg_url, timeout=10)
        try:

            async def pg_now() -> float:
                return float(await conn.fetchval(_PG_NOW))

            async def redis_now() -> float:
                seconds, micros = await client.time()
                return int(seconds) * 1000 + int(micros) / 1000

            return await measure(pg_now, redis_now, samples)
        finally:
            await conn.close()
