"""Times as an operator reads them: ``in 3 h 12 min``, ``2 min ago``, ``now``, with the
exact UTC time on hover. Pure functions; the pages render them on the server.

Ground rules:

- A span is shown in its two largest units (``3 h 12 min``, ``2 d 4 h``, ``45 s``), cut
  down (never rounded up: ``59.9 s`` is ``59 s``); under a second, in ms; past 10,000
  days, in years. ``0`` is ``now``.
- :func:`relative` says which side of ``now`` a time is on (``in ...``, ``... ago``);
  :func:`time_tag` wraps it in ``<time>`` with the exact UTC time as its ``title`` and
  ``datetime``, every value escaped.
"""

from __future__ import annotations

from markupsafe import Markup

from ._rows import iso

__all__ = ["duration", "relative", "time_tag", "utc"]

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))
# Past this many days a span reads in years (a date in 9999, a far-off cron).
_YEARS_FROM_DAYS = 10_000


def duration(ms: int | float) -> str:
    """A span (its sign ignored) in words: ``3 h 12 min``, ``450 ms``, ``0 s`` for 0."""
    ms = abs(int(ms))
    if ms == 0:
        return "0 s"
    if ms < 1000:
        return f"{ms} ms"
    days = ms // 86_400_000
    if days >= _YEARS_FROM_DAYS:
        return f"{days // 365:,} years"
    parts: list[str] = []
    for unit, size in _UNITS:
        if ms >= size:
            parts.append(f"{ms // size} {unit}")
            ms %= size
        elif parts:
            break  # two adjacent units at most: "3 h", never "3 h 0 min 5 s"
        if len(parts) == 2:
            break
    return " ".join(parts)


def relative(when_ms: int, now_ms: int) -> str:
    """``when_ms`` seen from ``now_ms``: ``in 3 h 12 min``, ``2 min ago``, ``now`` (within
    a second either way); ``-`` when ``when_ms`` is 0 (no time)."""
    if not when_ms:
        return "-"
    delta = int(when_ms) - int(now_ms)
    if abs(delta) < 1000:
        return "now"
    text = duration(delta)
    return f"in {text}" if delta > 0 else f"{text} ago"


def utc(ms: int) -> str:
    """Epoch ms as ``2026-12-06 00:00:08.696 UTC`` (``-`` for 0)."""
    return iso(ms).replace("T", " ").replace("+00:00", " UTC")


def time_tag(when_ms: int, now_ms: int) -> Markup:
    """``<time>`` with :func:`relative` as its text and the exact UTC time (ISO 8601) as
    its ``title`` and ``datetime``; ``-`` when ``when_ms`` is 0."""
    if not when_ms:
        return Markup("-")
    exact = iso(when_ms)
    shown = utc(when_ms)
    return Markup('<time datetime="{0}" title="{1}">{2}</time>').format(
        exact, shown, relative(when_ms, now_ms)
    )
