"""Recurring jobs: occurrences of an interval or a cron expression, and missed runs.

Ground rules:

- Occurrences are computed from the nominal due (the occurrence's identity), never from
  when a run happened, so an interval never drifts.
- "Now" is the Redis time the claim script returned, never the client's clock.
- An occurrence ``o`` is *missed* once the next one is due (``next(o) <= now``) or once it
  is more than the misfire grace late (``now - o > grace``). A claim a little late (a
  slow poll, a GC pause) is therefore not a missed run; a downtime is.
- Lua cannot parse cron, so all of this runs in Python, here, for both kinds; the
  scripts receive the resulting times.
- Cron expressions are evaluated with cronsim (5 fields, or 6 with seconds), in UTC
  unless the series has a zone (``tz``, an IANA name): then ``_zoned.py`` maps local
  wall times to UTC instants by Debian cron's DST rules (docs/timezones.md). Either way
  an occurrence's identity is its UTC instant.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from cronsim import CronSim, CronSimError

from . import _zoned
from ._args import finite_seconds_ms, int_between

__all__ = [
    "DEFAULT_MAX_CATCH_UP",
    "DEFAULT_MISFIRE_GRACE_MS",
    "MAX_CATCH_UP",
    "MAX_CRON_CHARS",
    "MAX_JITTER_MS",
    "MissedRun",
    "Plan",
    "Recurrence",
]

# Quartz's misfireThreshold: one minute late is still "on time", so a failover or a slow
# poll does not count as a missed run.
DEFAULT_MISFIRE_GRACE_MS = 60_000
# 'all' fires at most this many missed runs after a downtime: a minutely job down for a
# week would otherwise fire ten thousand times.
DEFAULT_MAX_CATCH_UP = 100
# The ceiling of max_catch_up. A claim decides 'all' by stepping through at most this
# many occurrences (cronsim: ~1-25 us a step), on the worker's loop: 10,000 keeps that
# within ~12 ms for the densest cron (one a second) and the sparse ones stop early.
MAX_CATCH_UP = 10_000
# Cron text is stored in every record of its series and parsed at every claim of it.
MAX_CRON_CHARS = 1_000
# The largest jitter of a series: a week (a run is at most this late on purpose).
MAX_JITTER_MS = 7 * 86_400_000
# No cron expression fires more often than once a second (6 fields, with seconds).
_CRON_MIN_STEP_MS = 1_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_US = timedelta(microseconds=1)


class MissedRun(StrEnum):
    """What a recurring job does about occurrences missed during a downtime."""

    ONCE = "once"  # fire one run now, then resume at the first future occurrence
    ALL = "all"  # fire every missed occurrence in order (at most max_catch_up of them)
    SKIP = "skip"  # fire none; resume at the first occurrence that is not missed


# Codes stored in the job record (field 10, see lua/_lib.lua).
POLICY_CODES: dict[MissedRun, int] = {MissedRun.ONCE: 0, MissedRun.ALL: 1, MissedRun.SKIP: 2}
POLICY_BY_CODE: dict[int, MissedRun] = {v: k for k, v in POLICY_CODES.items()}
KIND_INTERVAL = 1  # record field 8
KIND_CRON = 2
# A zoned cron's record spec (field 9) is this prefix, the zone name, a space, then the
# expression; a spec without it (every record written before zones existed) is UTC.
TZ_PREFIX = "TZ="
# A jittered series' spec starts with this prefix, the jitter in ms and a space (before
# any TZ=); a spec without it (every record written before jitter existed) has none.
JITTER_PREFIX = "J="


def _to_dt(ms: int) -> datetime:
    return _EPOCH + ms * _MS


def _to_ms(dt: datetime) -> int:
    return (dt - _EPOCH) // _MS


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a claimed occurrence of a recurring job."""

    deliver: bool  # run it now
    next_due_ms: int  # when deliver: the next occurrence, re-inserted by ack
    # when not deliver: the occurrence to move the job to, unrun; when deliver and not
    # 0: the occurrence (due already) the claimed job runs as now, in place of the
    # claimed one (its lease moved to it), the ones between skipped
    advance_to_ms: int


@dataclass(frozen=True, slots=True)
class Recurrence:
    """An interval or a cron schedule with its missed-run policy.

    Build one with :meth:`interval` or :meth:`cron`, which validate their arguments.
    """

    every_ms: int  # interval in ms; 0 for cron
    cron: str  # cron expression; "" for an interval
    missed: MissedRun  # missed-run policy
    max_catch_up: int  # cap on the runs 'all' fires after a downtime
    misfire_grace_ms: int  # lateness (ms) below which an occurrence is not missed
    tz: str = ""  # cron only: the IANA zone the expression reads in; "" for UTC
    jitter_ms: int = 0  # each run is up to this much after its occurrence (0: none)

    def __post_init__(self) -> None:
        if self.tz:
            _zoned.zone(self.tz)  # a record or a caller naming no zone fails here

    @classmethod
    def interval(
        cls,
        every: float | timedelta,
        *,
        missed: MissedRun | str = MissedRun.ONCE,
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_MS / 1000,
        jitter: float | timedelta = 0,
    ) -> Recurrence:
        """An occurrence every ``every`` seconds from the first due; each run up to
        ``jitter`` seconds after its occurrence (see :meth:`offset_ms`).

        Raises:
            TypeError, ValueError: naming the bad parameter.
        """
        every_ms = finite_seconds_ms("every", every)
        seconds = every.total_seconds() if isinstance(every, timedelta) else every
        if every_ms < 1 or seconds < 0.001:  # not rounded up to 1 ms in silence
            raise ValueError(f"every must be at least 1 ms (0.001 s), got {every!r}")
        return cls(every_ms, "", *_policy(missed, max_catch_up, misfire_grace), "", _jitter(jitter))

    @classmethod
    def cron_expr(
        cls,
        expr: str,
        *,
        tz: str | None = None,
        missed: MissedRun | str = MissedRun.ONCE,
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_MS / 1000,
        jitter: float | timedelta = 0,
    ) -> Recurrence:
        """The occurrences of cron expression ``expr`` (5 fields, or 6 with seconds),
        read in zone ``tz`` (an IANA name such as ``"Europe/Paris"``; None for UTC);
        each run up to ``jitter`` seconds after its occurrence (:meth:`offset_ms`).

        Raises:
            TypeError, ValueError: naming the bad parameter (a malformed ``cron``, an
                unknown or non-string ``tz``).
        """
        if not isinstance(expr, str):
            raise TypeError(f"cron must be a str, got {type(expr).__name__}")
        if len(expr) > MAX_CRON_CHARS:
            raise ValueError(f"cron must be at most {MAX_CRON_CHARS} characters, got {len(expr)}")
        if tz is not None:
            _zoned.zone(tz)
        try:
            it = CronSim(expr, _EPOCH)
            next(it)
        except (CronSimError, StopIteration, ValueError) as exc:
            raise ValueError(f"cron is not a valid cron expression: {expr!r} ({exc})") from exc
        policy = _policy(missed, max_catch_up, misfire_grace)
        return cls(0, expr, *policy, tz or "", _jitter(jitter))

    @property
    def spec(self) -> str:
        """The record's spec (field 9): the interval in ms, or the cron expression
        with its zone as a ``TZ=<zone> `` prefix (none for UTC); a jitter first, as a
        ``J=<ms> `` prefix (none without)."""
        text = str(self.every_ms) if self.every_ms else self.cron
        if self.tz:
            text = f"{TZ_PREFIX}{self.tz} {text}"
        return f"{JITTER_PREFIX}{self.jitter_ms} {text}" if self.jitter_ms else text

    @staticmethod
    def split_spec(spec: str) -> tuple[str, str]:
        """A cron record spec as ``(expression, zone)``; zone ``""`` (UTC) when the
        spec has no ``TZ=`` prefix, as in every record written before zones. A
        ``J=`` prefix is dropped (:meth:`split_jitter` reads it)."""
        spec = Recurrence.split_jitter(spec)[0]
        if spec.startswith(TZ_PREFIX):
            name, _, expr = spec.partition(" ")
            return expr, name[len(TZ_PREFIX) :]
        return spec, ""

    @staticmethod
    def split_jitter(spec: str) -> tuple[str, int]:
        """A record spec as ``(the rest, jitter in ms)``; 0 without a ``J=`` prefix,
        as in every record written before jitter."""
        if spec.startswith(JITTER_PREFIX):
            head, _, rest = spec.partition(" ")
            return rest, int(head[len(JITTER_PREFIX) :])
        return spec, 0

    def offset_ms(self, job_id: str, nominal_ms: int) -> int:
        """How long after occurrence ``nominal_ms`` job ``job_id`` runs: 0 without a
        jitter, else a number in ``[0, jitter_ms]`` fixed by a hash of (id, nominal),
        the same on every worker and at every claim of that occurrence."""
        if not self.jitter_ms:
            return 0
        digest = hashlib.blake2b(f"{job_id}:{nominal_ms}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % (self.jitter_ms + 1)

    # -- occurrences ---------------------------------------------------------------

    def next_after(self, t: int, anchor: int) -> int:
        """The first occurrence strictly after ``t`` (ms). O(1) for intervals.

        Args:
            t: a time in ms.
            anchor: an occurrence of the series (intervals count from it).
        """
        if self.every_ms:
            if t < anchor:
                return anchor
            return anchor + ((t - anchor) // self.every_ms + 1) * self.every_ms
        if self.tz:
            return _zoned.next_after(self.cron, _zoned.zone(self.tz), t)
        return _to_ms(next(CronSim(self.cron, _to_dt(t))))

    def last_at_or_before(self, t: int, anchor: int) -> int:
        """The last occurrence at or before ``t``, never earlier than ``anchor``."""
        if self.every_ms:
            return anchor + max(0, (t - anchor) // self.every_ms) * self.every_ms
        if self.tz:
            return max(_zoned.last_at_or_before(self.cron, _zoned.zone(self.tz), t), anchor)
        # cronsim's reverse iteration starts strictly before its time, unless that time
        # has microseconds, which it strips as the first candidate: so t + 1 us is
        # "at or before t" (ms times have at most 999000 us, so this never carries).
        last = _to_ms(next(CronSim(self.cron, _to_dt(t) + _US, reverse=True)))
        return max(last, anchor)

    def prev(self, o: int, steps: int) -> int:
        """The occurrence ``steps`` before occurrence ``o``."""
        if self.every_ms:
            return o - steps * self.every_ms
        if steps == 0:
            return o
        if self.tz:
            zone = _zoned.zone(self.tz)
            for _ in range(steps):
                o = _zoned.last_at_or_before(self.cron, zone, o - 1)
            return o
        it = CronSim(self.cron, _to_dt(o), reverse=True)
        for _ in range(steps - 1):
            next(it)
        return _to_ms(next(it))

    def upcoming(self, first_ms: int, count: int) -> list[int]:
        """Occurrence ``first_ms`` and the ``count - 1`` after it (UTC instants, ms);
        ``[]`` when ``count`` < 1. What a page or ``tickwheel inspect --job`` shows."""
        out: list[int] = []
        t = first_ms
        for _ in range(count):
            out.append(t)
            try:
                t = self.next_after(t, first_ms)
            except (StopIteration, ValueError, OverflowError):  # no later one (cronsim)
                break
        return out

    def local(self, ms: int) -> datetime:
        """Instant ``ms`` as an aware datetime in the series' zone (UTC without one)."""
        dt = _to_dt(ms)
        return dt.astimezone(_zoned.zone(self.tz)) if self.tz else dt

    # -- missed runs ---------------------------------------------------------------

    def plan(self, nominal: int, now: int) -> Plan:
        """Decide what a claim of occurrence ``nominal`` does at Redis time ``now``.

        Args:
            nominal: the claimed occurrence's nominal due (ms).
            now: Redis's now (ms), as the claim script returned it.

        Returns:
            A :class:`Plan`: deliver (with the next occurrence for ack), or move unrun.
        """
        grace = self.misfire_grace_ms
        if nominal > now:  # claimed ahead of time by the lookahead
            return Plan(True, self.next_after(nominal, nominal), 0)
        last = self.last_at_or_before(now, nominal)
        last_missed = now - last > grace
        if last == nominal and not last_missed:  # on time
            return Plan(True, self.next_after(nominal, nominal), 0)
        if self.missed is MissedRun.ONCE:
            return Plan(True, self.next_after(max(now, last), nominal), 0)
        # The runs skipped below are not moved to unrun, to be claimed again: by then
        # (a claim cycle later) a series faster than the claim cycle has a newer
        # occurrence due, and would be moved on again, never run. The claimed job runs
        # now as the occurrence it would have been moved to, already due.
        if self.missed is MissedRun.SKIP:
            if last_missed:  # resume at the first occurrence to come, unrun
                return Plan(False, 0, self.next_after(last, nominal))
            return Plan(True, self.next_after(last, nominal), last)  # the current one
        # ALL: fire every missed run in order, the last max_catch_up of them at most.
        newest_missed = last if last_missed else self.prev(last, 1)
        cap = min(self.max_catch_up, MAX_CATCH_UP)  # a record may predate the ceiling
        if self._more_than(nominal, newest_missed, cap):
            first = self.prev(newest_missed, cap - 1)
            return Plan(True, self.next_after(first, nominal), first)
        return Plan(True, self.next_after(nominal, nominal), 0)

    def _more_than(self, first: int, last: int, limit: int) -> bool:
        """Whether [first, last] holds more than ``limit`` occurrences (``first`` being
        one). O(1) for intervals, and for a cron span too short to hold that many (at
        most one a second); else at most ``limit`` cron steps, never one per occurrence
        of a long span: a series far behind is decided in O(max_catch_up), and one
        within its cap, claimed run after run while it catches up, in O(1) each."""
        if last < first:
            return False
        if self.every_ms:
            return (last - first) // self.every_ms + 1 > limit
        if (last - first) // _CRON_MIN_STEP_MS + 1 <= limit:
            return False
        return self._count(first, last, limit + 1) > limit

    def _count(self, first: int, last: int, limit: int) -> int:
        """Occurrences in [first, last], counting no further than ``limit``."""
        if last < first:
            return 0
        if self.every_ms:
            return min(limit, (last - first) // self.every_ms + 1)
        n, o = 1, first
        if self.tz:
            zone = _zoned.zone(self.tz)
            while n < limit:
                o = _zoned.next_after(self.cron, zone, o)
                if o > last:
                    break
                n += 1
            return n
        it = CronSim(self.cron, _to_dt(first))
        while n < limit:
            o = _to_ms(next(it))
            if o > last:
                break
            n += 1
        return n


def _jitter(jitter: float | timedelta) -> int:
    ms = finite_seconds_ms("jitter", jitter)
    if ms > MAX_JITTER_MS:
        raise ValueError(f"jitter must be at most {MAX_JITTER_MS // 1000} s, got {jitter!r}")
    return ms


def _policy(
    missed: MissedRun | str, max_catch_up: int, misfire_grace: float | timedelta
) -> tuple[MissedRun, int, int]:
    try:
        policy = MissedRun(missed)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in MissedRun)
        raise ValueError(f"missed must be one of {choices}, got {missed!r}") from None
    max_catch_up = int_between("max_catch_up", max_catch_up, 1, MAX_CATCH_UP)
    return policy, max_catch_up, finite_seconds_ms("misfire_grace", misfire_grace)
