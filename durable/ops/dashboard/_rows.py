"""How the pages and the JSON API show what they read: times, jobs, shards, recurrences
and the lateness histogram's quantiles. Pure functions; nothing here reads Redis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tickwheel.durable.model import (
    LATENESS_BOUNDS,
    JobInfo,
    JobState,
    Recurrence,
    ShardInfo,
    UndecodablePayload,
)

__all__ = [
    "PAYLOAD_PREVIEW_CHARS",
    "UPCOMING",
    "UPCOMING_ROWS",
    "describe_recurrence",
    "iso",
    "job_row",
    "lateness_quantile",
    "seen_of",
    "shard_row",
    "upcoming_rows",
]

# Characters of a payload a page shows; the rest is cut (and said to be).
PAYLOAD_PREVIEW_CHARS = 2000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """ISO 8601 UTC of epoch ms (``-`` for 0), or the ms when a datetime cannot show them."""
    if not ms:
        return "-"
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def describe_recurrence(rec: Recurrence | None) -> str:
    """``every 30s`` or ``cron */5 * * * *``, with the missed-run policy; ``""`` if none."""
    if rec is None:
        return ""
    what = f"every {rec.every_ms / 1000:g}s" if rec.every_ms else f"cron {rec.cron}"
    if rec.tz:
        what += f" ({rec.tz})"
    policy = f"missed: {rec.missed.value}"
    if rec.missed.value == "all":
        policy += f" (at most {rec.max_catch_up})"
    jitter = f", jitter {rec.jitter_ms / 1000:g}s" if rec.jitter_ms else ""
    return f"{what}, {policy}, grace {rec.misfire_grace_ms / 1000:g}s{jitter}"


def _payload_text(payload: Any) -> tuple[str, int]:
    """A payload as text, and its size in characters before any cut."""
    if isinstance(payload, bytes):
        text = payload.decode("utf-8", errors="backslashreplace")
    elif isinstance(payload, UndecodablePayload):  # why, then its bytes
        text = f"{payload}; as stored: {payload.data.decode('utf-8', errors='backslashreplace')}"
    else:
        text = json.dumps(payload, ensure_ascii=False)
    return text, len(text)


def _payload_kind(payload: Any) -> str:
    if isinstance(payload, bytes):
        return "bytes"
    return "undecodable" if isinstance(payload, UndecodablePayload) else "json"


# Occurrences a page shows of a recurring series, from its next one.
UPCOMING = 5
# The recurring page lists them for its first this many series (by next occurrence).
UPCOMING_ROWS = 200


def upcoming_rows(job: JobInfo, count: int = UPCOMING) -> list[dict[str, Any]]:
    """A recurring job's next occurrences, each in UTC and in the series' zone."""
    rec = job.recurrence
    if rec is None:
        return []
    out = []
    for ms in job.upcoming(count):
        try:
            local = rec.local(ms).isoformat(timespec="seconds")
        except (OverflowError, OSError, ValueError):
            local = iso(ms)
        out.append({"ms": ms, "utc": iso(ms), "local": local})
    return out


def seen_of(job: JobInfo) -> str:
    """What an action form carries to detect a job that moved on."""
    return f"{job.state.value}:{job.nominal_ms}:{job.attempt}"


def job_row(job: JobInfo, now_ms: int, upcoming: int = 0) -> dict[str, Any]:
    """A job as the pages and the JSON API show it (the payload cut to a preview), with
    its next ``upcoming`` occurrences when recurring (~40 us each for a zoned cron:
    the listings ask for them on the rows they show first only)."""
    text, size = _payload_text(job.payload)
    rec = job.recurrence
    next_ms = 0
    if rec is not None:
        next_ms = (
            job.when_ms
            if job.state in (JobState.DUE, JobState.WAITING)
            else rec.next_after(job.nominal_ms, job.nominal_ms)
        )
    return {
        "id": job.id,
        "shard": job.shard,
        "state": job.state.name.lower(),
        "task": job.task,
        "payload": text[:PAYLOAD_PREVIEW_CHARS],
        "payload_chars": size,
        "payload_truncated": size > PAYLOAD_PREVIEW_CHARS,
        "payload_kind": _payload_kind(job.payload),
        "when_ms": job.when_ms,
        "when": iso(job.when_ms),
        "in_ms": job.when_ms - now_ms if now_ms else 0,
        "nominal_ms": job.nominal_ms,
        "nominal": iso(job.nominal_ms),
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "priority": job.priority,  # schedule(priority=), 0 .. 9
        "epoch": job.epoch,
        "recurring": describe_recurrence(rec),
        # cron: the zone it reads in ("UTC" without one); "" for an interval or one-shot
        "tz": (rec.tz or "UTC") if rec is not None and rec.cron else "",
        "upcoming": upcoming_rows(job, upcoming) if upcoming else [],
        "next_ms": next_ms,
        "next": iso(next_ms),
        "last_error": job.last_error,
        "key": job.key,
        "seen": seen_of(job),
    }


def shard_row(r: ShardInfo, names: dict[str, str]) -> dict[str, Any]:
    """A shard as the overview shows it, its owner by worker name (``names``)."""
    row = r.as_dict()
    row["owner_name"] = names.get(r.owner, r.owner[:12]) if r.owner else ""
    row["next_due"] = iso(r.next_due_ms)
    row["oldest_overdue"] = iso(r.oldest_overdue_ms)
    return row


def lateness_quantile(counts: Sequence[float], q: float) -> float | None:
    """The upper bound (s) of the bucket holding quantile ``q`` of a lateness histogram
    (``inf`` past the last bound); None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    run = 0.0
    for i, n in enumerate(counts):
        run += n
        if run >= rank and n:
            return LATENESS_BOUNDS[i] if i < len(LATENESS_BOUNDS) else float("inf")
    return float("inf")
