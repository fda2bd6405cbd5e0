"""What the dashboard reads and does over one namespace, without any web framework.

Ground rules:

- Every read is a bounded number of round trips: the overview is one pipeline of
  inspect.lua over the shards (one round trip per node) and two commands for the
  workers (their member set, then one MGET of their stats, all in the ``{ns}`` slot);
  a lookup is one pipeline of get.lua and now.lua on the id's own shard (one round
  trip). Nothing here runs SCAN or KEYS.
- Lists that have no index (dead letters by task or reason, recurring series) are
  read in pages of :data:`PAGE` from their sorted sets, up to a stated bound, and the
  answer says how far it looked.
- Every action names what the operator saw (``seen``: state, nominal due and attempt):
  if the job moved on since, nothing is written and :class:`Stale` says so.
- Errors an operator can act on are :class:`ActionError` with an HTTP status and one
  sentence; the Redis URL's password never appears in one (``_connect.shown_url``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.exceptions

from tickwheel.durable.model import (
    LATENESS_BOUNDS,
    MAX_TASK_BYTES,
    JobInfo,
    JobState,
    ListingTooLong,
    Recurrence,
    RedisUnavailable,
    ShardInfo,
    check_job_id,
)
from tickwheel.durable.runtime import STATS_COUNTERS
from tickwheel.durable.scheduler import DEFAULT_OWNER_TTL, MAX_BATCH, MAX_ERROR_CHARS, Scheduler
from tickwheel.durable.store import Client, Keys, connect, parse_layout, shown_url

__all__ = [
    "PAGE",
    "PAYLOAD_PREVIEW_CHARS",
    "SCAN_LIMIT",
    "ActionError",
    "Namespace",
    "NotFound",
    "Stale",
    "checked_id",
    "describe_recurrence",
    "iso",
    "job_row",
    "lateness_quantile",
    "parse_when",
    "seen_of",
]

# Entries read per script call when paging a sorted set (the scripts' batch cap).
PAGE = MAX_BATCH
# How many entries per shard a filtered list looks at before it stops and says so.
SCAN_LIMIT = 20_000
# Characters of a payload a page shows; the rest is cut (and said to be).
PAYLOAD_PREVIEW_CHARS = 2000
# A member without a stats document is gone once its beat is this old (ms): the
# default member (owner) TTL.
STALE_BEAT_MS = int(DEFAULT_OWNER_TTL * 1000)
# The last epoch ms a datetime can show (9999-12-31T23:59:59.999Z).
MAX_WHEN_MS = 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ActionError(Exception):
    """A request the dashboard refuses or cannot serve: an HTTP status and a sentence."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFound(ActionError):
    """No such job (404)."""

    status = 404


class Stale(ActionError):
    """The job moved on since the page was loaded (409): nothing was written."""

    status = 409


def iso(ms: int) -> str:
    """ISO 8601 UTC of epoch ms (``-`` for 0), or the ms when a datetime cannot show them."""
    if not ms:
        return "-"
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def parse_when(text: str) -> int:
    """Epoch ms of an ISO 8601 time with a zone (``Z`` allowed) or of epoch ms digits.

    Raises:
        ActionError: (400) naming ``at``.
    """
    text = text.strip()
    if text.isdigit():
        ms = int(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ActionError(
                f"at must be ISO 8601 with a zone or epoch ms, got {text!r}"
            ) from None
        if when.tzinfo is None:
            raise ActionError(f"at must carry a zone (for example Z), got {text!r}")
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_WHEN_MS:
        raise ActionError(f"at must be between 1970 and 9999, got {text!r}")
    return ms


def describe_recurrence(rec: Recurrence | None) -> str:
    """``every 30s`` or ``cron */5 * * * *``, with the missed-run policy; ``""`` if none."""
    if rec is None:
        return ""
    what = f"every {rec.every_ms / 1000:g}s" if rec.every_ms else f"cron {rec.cron}"
    policy = f"missed: {rec.missed.value}"
    if rec.missed.value == "all":
        policy += f" (at most {rec.max_catch_up})"
    return f"{what}, {policy}, grace {rec.misfire_grace_ms / 1000:g}s"


def _payload_text(payload: Any) -> tuple[str, int]:
    """A payload as text, and its size in characters before any cut."""
    if isinstance(payload, bytes):
        text = payload.decode("utf-8", errors="backslashreplace")
    else:
        text = json.dumps(payload, ensure_ascii=False)
    return text, len(text)


def seen_of(job: JobInfo) -> str:
    """What an action form carries to detect a job that moved on."""
    return f"{job.state.value}:{job.nominal_ms}:{job.attempt}"


def job_row(job: JobInfo, now_ms: int) -> dict[str, Any]:
    """A job as the pages and the JSON API show it (the payload cut to a preview)."""
    text, size = _payload_text(job.payload)
    rec = job.recurrence
    next_ms = 0
    if rec is not None:
        next_ms = (
            job.when_ms
            if job.state is JobState.DUE
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
        "payload_kind": "bytes" if isinstance(job.payload, bytes) else "json",
        "when_ms": job.when_ms,
        "when": iso(job.when_ms),
        "in_ms": job.when_ms - now_ms if now_ms else 0,
        "nominal_ms": job.nominal_ms,
        "nominal": iso(job.nominal_ms),
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "epoch": job.epoch,
        "recurring": describe_recurrence(rec),
        "next_ms": next_ms,
        "next": iso(next_ms),
        "last_error": job.last_error,
        "seen": seen_of(job),
    }


def _layout(stored: bytes | None) -> tuple[int, int] | None:
    if stored is None:
        return None
    try:
        return parse_layout(stored)
    except ValueError:
        raise ActionError(f"the namespace's layout key holds {stored!r}", 500) from None


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead letters a list or a bulk action covers (all fields optional)."""

    task: str = ""  # exact task name
    reason: str = ""  # substring of the last error, case-insensitive
    shard: int | None = None  # only this shard

    @classmethod
    def parse(cls, task: str, reason: str, shard: str, shards: int) -> DeadFilter:
        """Validate a filter from a form or query string.

        Raises:
            ActionError: (400) naming the bad field.
        """
        task, reason, shard = task.strip(), reason.strip(), shard.strip()
        if len(task.encode()) > MAX_TASK_BYTES:
            raise ActionError(f"task must be at most {MAX_TASK_BYTES} bytes")
        if len(reason) > MAX_ERROR_CHARS:
            raise ActionError(f"reason must be at most {MAX_ERROR_CHARS} characters")
        number: int | None = None
        if shard:
            if not shard.isdigit() or int(shard) >= shards:
                raise ActionError(f"shard must be a number from 0 to {shards - 1}, got {shard!r}")
            number = int(shard)
        return cls(task, reason, number)

    @property
    def empty(self) -> bool:
        """True when it matches every dead letter."""
        return not (self.task or self.reason or self.shard is not None)

    def matches(self, job: JobInfo) -> bool:
        """Does ``job`` pass the filter."""
        if self.task and job.task != self.task:
            return False
        return not self.reason or self.reason.lower() in job.last_error.lower()

    def as_dict(self) -> dict[str, Any]:
        """The fields, for a page's forms ("" for no shard)."""
        return {
            "task": self.task,
            "reason": self.reason,
            "shard": "" if self.shard is None else str(self.shard),
        }


class Namespace:
    """The dashboard's view of one namespace on one Redis or Redis Cluster.

    The client is made on first use and kept; while Redis is unreachable every call
    raises :class:`RedisUnavailable` and the next one tries again.

    Args:
        url: the Redis URL (its password is never shown).
        namespace: the tickwheel namespace.
    """

    def __init__(self, url: str, namespace: str, postgres_url: str | None = None) -> None:
        Keys(namespace, 1)  # validates the name
        self.url = url  # where Redis is
        self.namespace = namespace  # the namespace
        self.postgres_url = postgres_url  # the Postgres mode's source of truth, or None
        self._client: Client | None = None  # made on first use
        self._scheduler: Scheduler | None = None  # made once the namespace exists

    @property
    def where(self) -> str:
        """The URL without its password."""
        return shown_url(self.url)

    async def aclose(self) -> None:
        """Close the client (and the Postgres mode's pool)."""
        client, self._client, sched, self._scheduler = self._client, None, self._scheduler, None
        if sched is not None and sched.pg is not None:
            await sched.pg.store.aclose()
        if client is not None:
            await client.aclose()

    async def client(self) -> Client:
        """The Redis client, connected on first use.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._client is None:
            try:
                self._client = await connect(self.url)
            except ValueError:  # the message may quote the URL: say less
                raise ActionError("the Redis URL is malformed (check --redis-url)", 500) from None
        return self._client

    async def scheduler(self) -> Scheduler | None:
        """The namespace's scheduler with its stored layout; None if it was never
        created (nothing is written to find out: one GET of its layout key).

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._scheduler is not None:
            return self._scheduler
        client = await self.client()
        keys = Keys(self.namespace, 1)
        try:
            stored: Any = await client.get(keys.meta)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise RedisUnavailable(f"cannot reach Redis: {type(exc).__name__}") from exc
        layout = _layout(stored)
        if layout is None:
            return None
        shards, buckets = layout
        sched = Scheduler(
            client,
            self.namespace,
            shards=shards,
            buckets=buckets,
            check=False,
            postgres_url=self.postgres_url,
        )
        self._scheduler = sched
        return sched

    async def _need(self) -> Scheduler:
        sched = await self.scheduler()
        if sched is None:
            raise NotFound(
                f"namespace {self.namespace!r} does not exist yet: nothing was ever scheduled "
                "in it (check --namespace and --redis-url)"
            )
        return sched

    # -- reads -----------------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        """Per shard counts, lag, owner, epoch and next due; live workers; totals."""
        sched = await self.scheduler()
        if sched is None:
            return {"namespace": self.namespace, "created": False, "shards": [], "workers": []}
        rows = await sched.store.inspect_all()
        now = max(r.now_ms for r in rows)
        workers = await self.workers(sched, now)
        names = {w["token"]: w["name"] for w in workers}
        totals = {
            name: sum(getattr(r, name) for r in rows)
            for name in ("due", "overdue", "leased", "expired", "dead")
        }
        totals["max_lag_ms"] = max((r.lag_ms for r in rows), default=0)
        totals["owned"] = sum(1 for r in rows if r.owner)
        nexts = [r.next_due_ms for r in rows if r.next_due_ms]
        totals["next_due_ms"] = min(nexts, default=0)
        return {
            "namespace": self.namespace,
            "created": True,
            "now_ms": now,
            "now": iso(now),
            "shards": [_shard_row(r, names) for r in rows],
            "workers": workers,
            "totals": totals,
            "next_due": iso(totals["next_due_ms"]),
        }

    async def workers(self, sched: Scheduler, now_ms: int) -> list[dict[str, Any]]:
        """The live workers in the member set with their published stats (two commands).

        The member set is pruned only when a worker beats, so a member counts as live
        while its stats document lives (it has the member TTL) or, without one, while
        its last beat is younger than the default member TTL."""
        client = sched.store.client
        keys = sched.keys
        entries: Any = await client.zrange(keys.workers, 0, -1, withscores=True)
        tokens = [m.decode(errors="replace") for m, _ in entries]
        docs: list[Any] = []
        if tokens:
            docs = await client.mget([keys.worker_stats(t) for t in tokens])
        out: list[dict[str, Any]] = []
        for (_, beat), token, raw in zip(
            entries, tokens, docs or [None] * len(tokens), strict=True
        ):
            doc = _stats_doc(raw)
            age = max(now_ms - int(beat), 0)
            if not doc and age > STALE_BEAT_MS:
                continue  # gone: its stats expired and the member set was not pruned yet
            counters = dict(zip(STATS_COUNTERS, doc.get("c", []), strict=False))
            out.append(
                {
                    "token": token,
                    "name": f"{doc.get('host', '?')}:{doc.get('pid', '?')}/{token[:6]}"
                    if doc
                    else token[:12],
                    "beat_age_ms": age,
                    "owned": doc.get("owned"),
                    "loaded": doc.get("loaded"),
                    "running": doc.get("running"),
                    "counters": counters,
                    "stats": doc,
                }
            )
        return out

    async def job(self, job_id: str) -> dict[str, Any]:
        """One job by id: one call on its own shard.

        Raises:
            ActionError: (400) for a malformed id; NotFound if there is no such job.
        """
        job_id = checked_id(job_id)
        sched = await self._need()
        shard = sched.keys.shard_of(job_id)
        info, now = await sched.store.get_and_now(shard, job_id)
        if info is None:
            raise NotFound(
                f"no job {job_id!r} (shard {shard}): it completed, was cancelled or purged, "
                "or was never scheduled"
            )
        return {"now_ms": now, "job": job_row(info, now)}

    async def scheduled(
        self, shard: int, offset: int, count: int, from_ms: int | None
    ) -> dict[str, Any]:
        """A page of one shard's due jobs in due order, from ``from_ms`` when given."""
        sched = await self._need()
        _check_shard(shard, sched.keys.shards)
        if not 1 <= count <= PAGE:
            raise ActionError(f"count must be from 1 to {PAGE}, got {count}")
        if offset < 0:
            raise ActionError(f"offset must be >= 0, got {offset}")
        start = offset
        if from_ms is not None:
            start += await sched.store.due_rank(shard, from_ms)
        page = await sched.store.due_list(shard, start, count)
        now = await sched.store.now(shard)
        return {
            "shard": shard,
            "shards": sched.keys.shards,
            "offset": offset,
            "count": count,
            "start_rank": start,
            "total": page.total,
            "now_ms": now,
            "jobs": [job_row(j, now) for j in page.jobs],
        }

    async def dead(self, flt: DeadFilter, offset: int, count: int) -> dict[str, Any]:
        """Dead letters matching ``flt``, oldest first per shard: ``count`` from the
        ``offset``-th match, looking at most ``SCAN_LIMIT`` entries per shard."""
        sched = await self._need()
        if not 1 <= count <= PAGE:
            raise ActionError(f"count must be from 1 to {PAGE}, got {count}")
        if offset < 0:
            raise ActionError(f"offset must be >= 0, got {offset}")
        shards = [flt.shard] if flt.shard is not None else range(sched.keys.shards)
        rows: list[dict[str, Any]] = []
        total = skipped = looked = 0
        complete = True
        now = 0
        for shard in shards:
            if len(rows) >= count:
                break
            seen = 0
            while len(rows) < count:
                page = await sched.store.dead_list(shard, seen, PAGE if not flt.empty else count)
                if seen == 0:
                    total += page.total
                seen += len(page.jobs)
                looked += len(page.jobs)
                for job in page.jobs:
                    if not flt.matches(job):
                        continue
                    if skipped < offset:
                        skipped += 1
                    elif len(rows) < count:
                        rows.append(job_row(job, now))
                if not page.jobs or seen >= page.total:
                    break
                if seen >= SCAN_LIMIT:
                    complete = False
                    break
        return {
            "filter": flt.as_dict(),
            "offset": offset,
            "count": count,
            "total_dead": total,
            "looked_at": looked,
            "complete": complete,
            "jobs": rows,
        }

    async def recurring(self, limit: int = SCAN_LIMIT) -> dict[str, Any]:
        """Recurring series among the first ``limit`` due jobs of each shard, by due
        time (recurring jobs have no index of their own; a series whose run is leased
        right now shows again once it is acked)."""
        sched = await self._need()
        rows: list[dict[str, Any]] = []
        complete = True
        for shard in range(sched.keys.shards):
            seen = 0
            while seen < limit:
                try:
                    page = await sched.store.due_list(shard, seen, PAGE)
                except ListingTooLong:  # a shard whose far index is too long to read
                    complete = False
                    break
                seen += len(page.jobs)
                rows += [job_row(j, 0) for j in page.jobs if j.recurrence is not None]
                if not page.jobs or seen >= page.total:
                    break
            else:
                complete = False
        rows.sort(key=lambda r: r["next_ms"])
        return {"jobs": rows, "complete": complete, "limit_per_shard": limit}

    # -- actions ---------------------------------------------------------------------

    async def _current(self, sched: Scheduler, job_id: str, seen: str) -> JobInfo:
        info = await sched.store.get(sched.keys.shard_of(job_id), job_id)
        if info is None:
            raise Stale(
                f"job {job_id!r} is gone (completed, cancelled or purged) since the page "
                "was loaded: nothing was done"
            )
        if seen and seen_of(info) != seen:
            raise Stale(
                f"job {job_id!r} moved on since the page was loaded (now "
                f"{info.state.name.lower()}, attempt {info.attempt}): nothing was done; "
                "reload it and try again"
            )
        return info

    async def cancel(self, job_id: str, seen: str) -> str:
        """Cancel a job in any state (a leased job's holder gets LeaseLost on ack)."""
        job_id = checked_id(job_id)
        sched = await self._need()
        await self._current(sched, job_id, seen)
        if sched.pg is not None:  # both stores, as Scheduler.cancel does
            _, state = await sched.pg.cancel(sched, job_id)
        else:
            state = await sched.store.cancel(sched.keys.shard_of(job_id), job_id)
        if state is None:
            raise Stale(f"job {job_id!r} was gone before the cancel reached it")
        return f"cancelled job {job_id!r} (it was {state.name.lower()})"

    async def reschedule(
        self, job_id: str, seen: str, *, delay: float | None = None, at_ms: int | None = None
    ) -> str:
        """Move a due job to ``now + delay`` or to ``at_ms`` (a new occurrence)."""
        job_id = checked_id(job_id)
        sched = await self._need()
        info = await self._current(sched, job_id, seen)
        if info.state is not JobState.DUE:
            raise Stale(
                f"job {job_id!r} is {info.state.name.lower()}: only a due job can be moved",
            )
        try:
            moved = await sched.reschedule(job_id, delay=delay, at=at_ms)
        except (TypeError, ValueError) as exc:
            raise ActionError(str(exc)) from None
        if not moved:
            raise Stale(
                f"job {job_id!r} could not be moved: it is no longer due, or that run is done"
            )
        if at_ms is not None:
            return f"job {job_id!r} now due at {iso(at_ms)}"
        if not delay:
            return f"job {job_id!r} runs now"
        return f"job {job_id!r} now due in {delay:g} s"

    async def dead_act(self, action: str, job_ids: Sequence[str]) -> dict[str, Any]:
        """Requeue or purge dead letters by id; the ids that were not dead are named."""
        if action not in ("requeue", "purge"):
            raise ActionError(f"action must be requeue or purge, got {action!r}")
        if not job_ids:
            raise ActionError("select at least one dead letter")
        ids = [checked_id(i) for i in job_ids]
        sched = await self._need()
        act = sched.requeue_dead if action == "requeue" else sched.purge_dead
        done = await act(ids)
        got = set(done)
        missing = [i for i in ids if i not in got]
        verb = "requeued" if action == "requeue" else "purged"
        return {verb: done, "missing": missing, "action": action}

    async def dead_bulk(self, action: str, flt: DeadFilter, everything: bool) -> dict[str, Any]:
        """Requeue or purge every dead letter matching ``flt``; an empty filter needs
        ``everything`` (the "all dead letters" box)."""
        if action not in ("requeue", "purge"):
            raise ActionError(f"action must be requeue or purge, got {action!r}")
        if flt.empty and not everything:
            raise ActionError(
                "give a task, a reason or a shard, or tick 'all dead letters' to act on every one"
            )
        sched = await self._need()
        act = sched.requeue_dead if action == "requeue" else sched.purge_dead
        shards = [flt.shard] if flt.shard is not None else range(sched.keys.shards)
        done: list[str] = []
        for shard in shards:
            ids: list[str] = []
            offset = 0
            while True:  # collect first: acting while paging would shift the offsets
                page = await sched.store.dead_list(shard, offset, PAGE)
                ids += [j.id for j in page.jobs if flt.matches(j)]
                offset += len(page.jobs)
                if not page.jobs or offset >= page.total:
                    break
            for i in range(0, len(ids), PAGE):
                done += await act(ids[i : i + PAGE])
        verb = "requeued" if action == "requeue" else "purged"
        return {verb: done, "count": len(done), "action": action, "filter": flt.as_dict()}


def checked_id(job_id: str) -> str:
    """``job_id`` if it is a valid id, else ActionError (400) naming ``job_id``."""
    try:
        return check_job_id(job_id)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None


def _check_shard(shard: int, shards: int) -> None:
    if not 0 <= shard < shards:
        raise ActionError(f"shard must be a number from 0 to {shards - 1}, got {shard}")


def _stats_doc(raw: Any) -> dict[str, Any]:
    """A worker's stats document, or {} when absent or unreadable."""
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _shard_row(r: ShardInfo, names: dict[str, str]) -> dict[str, Any]:
    row = r.as_dict()
    row["owner_name"] = names.get(r.owner, r.owner[:12]) if r.owner else ""
    row["next_due"] = iso(r.next_due_ms)
    row["oldest_overdue"] = iso(r.oldest_overdue_ms)
    return row


def lateness_quantile(counts: Sequence[int], q: float) -> float | None:
    """The upper bound (s) of the bucket holding quantile ``q`` of a lateness histogram
    (``inf`` past the last bound); None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    run = 0
    for i, n in enumerate(counts):
        run += n
        if run >= rank and n:
            return LATENESS_BOUNDS[i] if i < len(LATENESS_BOUNDS) else float("inf")
    return float("inf")
