"""The live charts: rates and lateness percentiles sampled from the workers' stats.

Ground rules:

- Workers publish monotonic counters (``_worker.Worker.publish_stats``); the dashboard
  samples them every ``interval`` seconds (two commands, see ``Namespace.workers``) and
  keeps the last hour of per-interval rates in memory. The history starts when the
  dashboard starts: nothing is stored in Redis for it.
- A worker that restarted (a counter went down) counts from its new values; a worker
  seen once gives no rate until its second sample.
- Lateness percentiles are the upper bounds of the histogram buckets that hold them
  (``_stats.LATENESS_BOUNDS``), over the jobs fired during the interval.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from tickwheel.durable._worker import STATS_COUNTERS

from ._data import lateness_quantile

__all__ = ["HISTORY_S", "Charts"]

# How much history the charts keep (s).
HISTORY_S = 3600.0
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _delta(now: Sequence[int], before: Sequence[int] | None) -> list[int]:
    if (
        before is None
        or len(before) != len(now)
        or any(a < b for a, b in zip(now, before, strict=True))
    ):
        return list(now) if before is not None else [0] * len(now)
    return [a - b for a, b in zip(now, before, strict=True)]


class Charts:
    """Per-interval rates of claims, acks, retries, dead letters and reaps over every
    worker, and firing lateness percentiles, for the last :data:`HISTORY_S`.

    Args:
        interval: seconds between samples (the caller's loop keeps the pace).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval  # seconds between samples
        self.points: deque[dict[str, Any]] = deque(maxlen=max(int(HISTORY_S / interval), 2))
        self._last: dict[str, tuple[list[int], list[int]]] = {}  # token -> (c, lat)
        self._last_t: float | None = None  # monotonic time of the last sample

    def add(self, workers: Sequence[dict[str, Any]], wall_ms: int | None = None) -> None:
        """Add one sample of :meth:`Namespace.workers` rows."""
        now = time.monotonic()
        dt = now - self._last_t if self._last_t is not None else None
        sums = [0] * len(STATS_COUNTERS)
        lat: list[int] = []
        seen: dict[str, tuple[list[int], list[int]]] = {}
        for w in workers:
            doc = w.get("stats") or {}
            c = [int(x) for x in doc.get("c", [])][: len(STATS_COUNTERS)]
            h = [int(x) for x in doc.get("lat", [])]
            if len(c) != len(STATS_COUNTERS):
                continue
            prev = self._last.get(w["token"])
            seen[w["token"]] = (c, h)
            if prev is None:
                continue  # a rate needs two samples of the same worker
            for i, d in enumerate(_delta(c, prev[0])):
                sums[i] += d
            dh = _delta(h, prev[1]) if h else []
            if len(dh) > len(lat):
                lat += [0] * (len(dh) - len(lat))
            for i, d in enumerate(dh):
                lat[i] += d
        self._last = seen
        self._last_t = now
        if dt is None or dt <= 0:
            return
        point: dict[str, Any] = {"t": wall_ms if wall_ms is not None else int(time.time() * 1000)}
        for name, total in zip(STATS_COUNTERS, sums, strict=True):
            point[name] = round(total / dt, 3)
        for name, q in QUANTILES:
            v = lateness_quantile(lat, q)
            point[name] = None if v is None else (v if v != float("inf") else -1)
        point["fired"] = sum(lat)
        self.points.append(point)

    def series(self) -> dict[str, Any]:
        """The history as the JSON API returns it."""
        return {
            "interval_s": self.interval,
            "history_s": HISTORY_S,
            "counters": list(STATS_COUNTERS),
            "quantiles": [name for name, _ in QUANTILES],
            "points": list(self.points),
        }
