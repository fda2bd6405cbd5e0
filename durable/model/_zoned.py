"""Cron in an IANA time zone: occurrences as UTC instants, exact across DST changes.

cronsim matches the expression against *naive local wall times* here; this module maps
those wall times to UTC instants by the rules of Debian's cron (docs/timezones.md):

- A *fixed-time* expression (5 fields, minute and hour not starting with ``*``) fires
  at every matching wall time. A wall time in a spring-forward gap fires once, at the
  first instant after the gap (the transition); one in a repeated (fall-back) hour
  fires once, at its first pass. Several wall times mapping to one instant are one
  occurrence.
- Any other expression follows elapsed time: an instant is an occurrence iff its local
  wall time matches. A repeated hour gets both passes; a gap gets none.

Times are integer ms since the epoch (UTC). Offsets come from ``zoneinfo``, which has no
API for the transitions themselves: they are found by probing the offset every
:data:`_SCAN_MS` and bisecting (tzdata has no two transitions closer than days).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim

__all__ = ["fixed_time", "last_at_or_before", "next_after", "zone"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
_US = timedelta(microseconds=1)
# Offsets are probed this far apart when looking for a transition between two instants.
_SCAN_MS = 6 * 3_600_000
# A search crosses at most this many transitions (two a year for 50 years, cronsim's own
# horizon, with room): a bound, so a bug cannot loop forever.
_MAX_SEGMENTS = 400


def zone(name: object) -> ZoneInfo:
    """The zone named ``name`` (an IANA name known to ``zoneinfo``).

    Raises:
        TypeError: if ``name`` is not a str.
        ValueError: naming ``tz``, if no such zone exists.
    """
    if not isinstance(name, str):
        raise TypeError(f"tz must be a str (an IANA zone name), got {type(name).__name__}")
    if not name or name != name.strip() or " " in name:
        raise ValueError(f"tz is not a known IANA time zone: {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"tz is not a known IANA time zone: {name!r}") from exc


def fixed_time(expr: str) -> bool:
    """Whether ``expr`` is a fixed-time expression (Debian cron's DST special case)."""
    parts = expr.split()
    return len(parts) == 5 and not parts[0].startswith("*") and not parts[1].startswith("*")


# -- offsets and wall times -------------------------------------------------------------


def _local(tz: ZoneInfo, t: int) -> datetime:
    return (_EPOCH + t * _MS).astimezone(tz)


def _offset(tz: ZoneInfo, t: int) -> int:
    """The zone's UTC offset (ms) at instant ``t``."""
    off = _local(tz, t).utcoffset()
    assert off is not None
    return off // _MS


def _naive(wall: int) -> datetime:
    return _NAIVE_EPOCH + wall * _MS


def _wall_ms(dt: datetime) -> int:
    return (dt - _NAIVE_EPOCH) // _MS


def _first_change(tz: ZoneInfo, a: int, b: int, off: int) -> int | None:
    """The first instant in ``(a, b]`` whose offset is not ``off`` (that of ``a``)."""
    lo = a
    while lo < b:
        hi = min(lo + _SCAN_MS, b)
        if _offset(tz, hi) != off:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(tz, mid) == off:
                    lo = mid
                else:
                    hi = mid
            return hi
        lo = hi
    return None


def _segment_start(tz: ZoneInfo, a: int, b: int, off: int) -> int | None:
    """The start of the constant-offset stretch holding ``b`` (offset ``off``), if it
    starts after ``a``; None if the offset is ``off`` all through ``[a, b]``."""
    hi = b
    while hi > a:
        lo = max(hi - _SCAN_MS, a)
        if _offset(tz, lo) != off:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(tz, mid) == off:
                    hi = mid
                else:
                    lo = mid
            return hi
        hi = lo
    return None


def _next_wall(expr: str, wall: int) -> int:
    """The first wall time matching ``expr`` at or after ``wall`` (naive ms)."""
    # cronsim drops sub-second parts and starts one second later: from wall - 1 ms
    # that is the first whole second at or after wall.
    return _wall_ms(next(CronSim(expr, _naive(wall - 1))))


def _last_wall(expr: str, wall: int) -> int:
    """The last wall time matching ``expr`` at or before ``wall`` (naive ms)."""
    # In reverse, cronsim takes a time with microseconds, stripped, as its first
    # candidate: + 1 us makes it "at or before" (ms values never carry).
    return _wall_ms(next(CronSim(expr, _naive(wall) + _US, reverse=True)))


# -- elapsed-time expressions -----------------------------------------------------------


def _next_elapsed(expr: str, tz: ZoneInfo, t: int) -> int:
    s = t + 1  # the first occurrence at or after s
    for _ in range(_MAX_SEGMENTS):
        off = _offset(tz, s)
        u = _next_wall(expr, s + off) - off
        change = _first_change(tz, s, u, off)
        if change is None:
            return u
        s = change  # nothing matched before the offset changed: go on from there
    raise StopIteration


def _last_elapsed(expr: str, tz: ZoneInfo, t: int) -> int:
    e = t  # the last occurrence at or before e
    for _ in range(_MAX_SEGMENTS):
        off = _offset(tz, e)
        u = _last_wall(expr, e + off) - off
        start = _segment_start(tz, u, e, off)
        if start is None:
            return u
        e = start - 1
    raise StopIteration


# -- fixed-time expressions -------------------------------------------------------------


def _instant(tz: ZoneInfo, wall: int) -> int:
    """Wall time ``wall`` as an instant: its first pass; in a gap, the gap's end."""
    first = (_naive(wall).replace(tzinfo=tz) - _EPOCH) // _MS  # fold 0: the earlier pass
    if _offset(tz, first) + first == wall:
        return first
    # In a gap, fold 0 reads the wall with the offset before the gap, fold 1 with the
    # one after: the transition lies between the two.
    second = (_naive(wall).replace(tzinfo=tz, fold=1) - _EPOCH) // _MS
    a, b = min(first, second), max(first, second)
    change = _first_change(tz, a, b, _offset(tz, a))
    return b if change is None else change


def _next_fixed(expr: str, tz: ZoneInfo, t: int) -> int:
    # Instants grow with wall times, and no wall time before t's maps after t.
    wall = t + _offset(tz, t)
    it = CronSim(expr, _naive(wall))
    for _ in range(100_000):
        u = _instant(tz, _wall_ms(next(it)))
        if u > t:
            return u
    raise StopIteration


def _last_fixed(expr: str, tz: ZoneInfo, t: int) -> int:
    local = _local(tz, t)
    wall = t + _offset(tz, t)
    if local.fold:  # the second pass of a repeated hour: later walls map before t
        wall += t - (local.replace(fold=0) - _EPOCH) // _MS
    it = CronSim(expr, _naive(wall) + _US, reverse=True)
    for _ in range(100_000):
        u = _instant(tz, _wall_ms(next(it)))
        if u <= t:
            return u
    raise StopIteration


# -- the two questions --------------------------------------------------------------------


def next_after(expr: str, tz: ZoneInfo, t: int) -> int:
    """The first occurrence of ``expr`` in zone ``tz`` strictly after instant ``t``."""
    if fixed_time(expr):
        return _next_fixed(expr, tz, t)
    return _next_elapsed(expr, tz, t)


def last_at_or_before(expr: str, tz: ZoneInfo, t: int) -> int:
    """The last occurrence of ``expr`` in zone ``tz`` at or before instant ``t``."""
    if fixed_time(expr):
        return _last_fixed(expr, tz, t)
    return _last_elapsed(expr, tz, t)
