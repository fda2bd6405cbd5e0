"""What the runtime logs, and how: the fields of a job's lines, the text of a failure
kept with the job, and outages logged once when they start and once when they end.

Ground rules:

- Every line goes to the ``tickwheel.durable`` logger; the message never repeats the
  logger's name (the formatter adds it). A line about one job carries its fields as
  record attributes (``extra``): ``job_id``, ``task``, ``attempt``, ``shard`` (the JSON
  format of the CLI writes them out).
- Levels: a task failure that will be retried is a WARNING, a dead letter an ERROR (both
  with the exception and its traceback); a lost lease, a fenced shard and an outage's
  start WARNING; shard moves and an outage's end INFO; each job's claim, start and ack
  DEBUG (built only when DEBUG is on).
- An outage of a store (Redis or PostgreSQL) is one WARNING when the first call fails
  and one INFO when a call of the same loop succeeds again, with the failed calls
  counted in between (a 7 s Redis outage used to log 19 lines). A configuration Redis
  starts refusing while the worker runs (its password or ACL changed:
  ``RedisConfigError``) is handled the same way, under its own name: one ERROR when it
  starts, one INFO when Redis accepts the worker again, the refused calls counted
  between; the loops go on retrying meanwhile, so the fix needs no restart.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from tickwheel.durable.model import (
    ERROR_TRACEBACK_MARK,
    BrokerUnavailable,
    Job,
    PostgresUnavailable,
    RedisConfigError,
    RedisUnavailable,
)

__all__ = [
    "ERROR_SUMMARY_CHARS",
    "OUTAGE_ERRORS",
    "TRACEBACK_CHARS",
    "Outages",
    "failure_text",
    "job_fields",
    "log_start",
    "logger",
]

logger = logging.getLogger("tickwheel.durable")

# What a loop reports to :class:`Outages` (and waits out) rather than logging each time.
OUTAGE_ERRORS = (RedisUnavailable, PostgresUnavailable, RedisConfigError)
# The name an Outages gives a refused configuration (not an unreachable store).
_REFUSED = "Redis configuration"

# A failure kept with its job (its last error, shown by Scheduler.get, the dead letters
# and the dashboard): the exception's repr cut to ERROR_SUMMARY_CHARS, then the last
# TRACEBACK_CHARS of its traceback (the innermost frames, where it was raised). Both
# together stay well inside the scheduler's MAX_ERROR_CHARS.
ERROR_SUMMARY_CHARS = 1024
TRACEBACK_CHARS = 4096


def job_fields(job: Job) -> dict[str, Any]:
    """The structured fields of a line about ``job`` (``extra=``)."""
    return {"job_id": job.id, "task": job.task, "attempt": job.attempt, "shard": job.shard}


def log_start(job: Job, late_ms: float | None) -> None:
    """The DEBUG line of a job's start, with its lateness (ms) if known."""
    fields = job_fields(job)
    if late_ms is None:
        logger.debug("job %r started (task %s, attempt %d)", job.id, job.task, job.attempt,
                     extra=fields)  # fmt: skip
        return
    fields["lateness_ms"] = round(late_ms, 1)
    logger.debug(
        "job %r started (task %s, attempt %d, %.1f ms late)",
        job.id,
        job.task,
        job.attempt,
        late_ms,
        extra=fields,
    )


def failure_text(exc: BaseException) -> str:
    """What is kept as a failed job's last error: ``repr(exc)`` (bounded), then
    ``ERROR_TRACEBACK_MARK`` and the tail of its traceback (``split_error`` reads it
    back). Frames cut from the top are marked as such."""
    summary = repr(exc)
    if len(summary) > ERROR_SUMMARY_CHARS:
        summary = summary[: ERROR_SUMMARY_CHARS - 3] + "..."
    text = "".join(traceback.format_exception(exc))
    header = ERROR_TRACEBACK_MARK.lstrip("\n")
    body = text.removeprefix(header)
    if len(body) > TRACEBACK_CHARS:
        tail = body[-TRACEBACK_CHARS:]
        cut = tail.find("\n", 0, len(tail) // 2)
        tail = tail[cut + 1 :]  # from a whole line, unless that line is most of it
        body = f"  [... {len(body) - len(tail)} characters cut ...]\n{tail}"
    return summary + ERROR_TRACEBACK_MARK + body.rstrip("\n")


class Outages:
    """One WARNING when a store becomes unreachable, one INFO when it answers again.

    Each loop reports its failures (:meth:`failed`) and its successes (:meth:`ok`) under
    its own name. An outage starts at the first failure of any loop; it ends when a loop
    that saw it fail succeeds again (that loop reached the store), and the line says how
    many calls failed in between and for how long. Redis and PostgreSQL are tracked
    apart: a Redis round that succeeds says nothing about PostgreSQL.
    """

    def __init__(self) -> None:
        # store -> (monotonic start, failed calls, the loops that saw it fail)
        self._open: dict[str, tuple[float, int, set[str]]] = {}

    @staticmethod
    def store_of(exc: BaseException) -> str:
        if isinstance(exc, BrokerUnavailable):
            return "Broker"
        if isinstance(exc, RedisConfigError):
            return _REFUSED
        return "PostgreSQL" if isinstance(exc, PostgresUnavailable) else "Redis"

    @property
    def ongoing(self) -> set[str]:
        """The stores in an outage now."""
        return set(self._open)

    def failed(self, what: str, exc: BaseException) -> None:
        """A call of loop ``what`` could not reach its store: logged if it starts an
        outage, counted otherwise (at DEBUG)."""
        store = self.store_of(exc)
        entry = self._open.get(store)
        if entry is None:
            self._open[store] = (time.monotonic(), 1, {what})
            if store == _REFUSED:
                logger.error(
                    "Redis refuses this worker (%s: %s); retrying, its end will be logged",
                    what,
                    exc,
                    extra={"store": store},
                )
                return
            logger.warning(
                "%s unreachable (%s: %s); retrying, its end will be logged",
                store,
                what,
                exc,
                extra={"store": store},
            )
            return
        start, count, loops = entry
        loops.add(what)
        self._open[store] = (start, count + 1, loops)
        logger.debug("%s still unreachable (%s: %s)", store, what, exc, extra={"store": store})

    def ok(self, what: str) -> None:
        """A call of loop ``what`` succeeded: ends the outages it saw."""
        if not self._open:  # the common case: one dict check per round
            return
        for store, (start, count, loops) in list(self._open.items()):
            if what in loops:
                del self._open[store]
                if store == _REFUSED:
                    logger.info(
                        "Redis accepts this worker again after %.1f s (%d refused call(s)"
                        " meanwhile)",
                        time.monotonic() - start,
                        count,
                        extra={"store": store, "failed_calls": count},
                    )
                    continue
                logger.info(
                    "%s reachable again after %.1f s (%d failed call(s) meanwhile)",
                    store,
                    time.monotonic() - start,
                    count,
                    extra={"store": store, "failed_calls": count},
                )
