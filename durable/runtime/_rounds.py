"""The round loop of the runtime: run a round, log what failed, wait, until stopped.

Ground rules:

- A round that fails is never fatal: an unreachable store (Redis or PostgreSQL) is a
  warning, anything else is logged with its traceback, and the next round runs after
  the usual pause. A stopped reaper or balancer would strand leases and shards.
- A loop stops on its stop event, not by cancellation: redis-py can swallow a
  cancellation that lands while a command is in flight, and the loop would go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tickwheel.durable.model import PostgresUnavailable, RedisUnavailable

from ._logs import OUTAGE_ERRORS, Outages

__all__ = ["open_when_reachable", "run_rounds"]

# Seconds between two tries of a worker's start while its store does not answer.
OPEN_RETRY_FIRST = 0.2
OPEN_RETRY_CAP = 5.0

logger = logging.getLogger("tickwheel.durable")


async def run_rounds(
    body: Callable[[], Awaitable[bool | None]],
    *,
    stop: asyncio.Event,
    interval: float,
    what: str,
    outages: Outages | None = None,
) -> None:
    """Until ``stop`` is set: await ``body()``, then wait ``interval`` seconds (or until
    ``stop``), or go again at once when the round returned True (more is waiting).

    Args:
        body: one round.
        stop: ends the loop after the round in flight (and cuts its pause short).
        interval: seconds between rounds.
        what: the loop's name in the log.
        outages: where an unreachable store is reported (logged once per outage);
            without it, each failed round logs a warning.
    """
    while not stop.is_set():
        again = False
        try:
            again = bool(await body())
            if outages is not None:
                outages.ok(what)
        except OUTAGE_ERRORS as exc:
            if outages is not None:
                outages.failed(what, exc)
            else:
                logger.warning("%s cannot reach its store (%s)", what, exc)
        except Exception:  # a bug or an unexpected reply: the next round may do better
            logger.exception("%s round failed", what)
        if not again:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


async def open_when_reachable(
    open_: Callable[[], Awaitable[object]], *, stop: asyncio.Event, outages: Outages
) -> bool:
    """Await ``open_()`` until it succeeds, trying again after an outage (Redis or
    PostgreSQL not answering: transient) with a pause that doubles up to
    :data:`OPEN_RETRY_CAP`; any other error (a shard count mismatch, refused
    credentials) is raised. False if ``stop`` was set first."""
    pause = OPEN_RETRY_FIRST
    while not stop.is_set():
        try:
            await open_()
        except (RedisUnavailable, PostgresUnavailable) as exc:
            outages.failed("start", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            pause = min(pause * 2, OPEN_RETRY_CAP)
            continue
        outages.ok("start")
        return True
    return False
