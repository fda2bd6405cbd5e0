"""The live charts: rates and lateness percentiles sampled from the workers' stats.

Ground rules:

- Workers publish monotonic counters (``_worker.Worker.publish_stats``); the dashboard
  samples them every ``interval`` seconds (two commands, see ``_page_overview.workers``) and
  keeps the last hour of per-interval rates in memory. The history starts when the
  dashboard starts: nothing is stored in Redis for it.
- A worker's rate is its counters' change between its last two documents over the
  time between them (its own clock); one that restarted (a counter went down) counts
  from its new values; a worker seen once gives no rate until its second document.
- Lateness percentiles are the upper bounds of the histogram buckets that hold them
  (``_stats.LATENESS_BOUNDS``), over the jobs fired during the interval.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from tickwheel.durable.runtime import STATS_COUNTERS

from ._rows import lateness_quantile

__all__ = ["HISTORY_S", "Charts"]

# How much history the charts keep (s).
HISTORY_S = 3600.0
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _delta(now: Sequence[int], before: Sequence[int]) -> list[int]:
    """``now - before`` per counter; ``now`` itself when a counter went down (the worker
    restarted under the same token) or the shapes differ."""
    if len(before) != len(now) or any(a < b for a, b in zip(now, before, strict=True)):
        return list(now)
    return [a - b for a, b in zip(now, before, strict=True)]


class Charts:
    """Rates of claims, acks, retries, dead letters and reaps over every worker, and
    firing lateness percentiles, for the last :data:`HISTORY_S`.

    Each worker's rate is taken between its last two published documents, over the
    time between them by its own clock (``t``), so sampling faster than workers publish
    repeats a rate instead of showing zeros and spikes.

    Args:
        interval: seconds between samples (the caller's loop keeps the pace).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval  # seconds between samples
        self.points: deque[dict[str, Any]] = deque(maxlen=max(int(HISTORY_S / interval), 2))
        # token -> (t, counters, histogram) of its last document
        self._docs: dict[str, tuple[int, list[int], list[int]]] = {}
        # token -> (rates per second, histogram delta) between its last two documents
        self._rates: dict[str, tuple[list[float], list[int]]] = {}

    def add(self, workers: Sequence[dict[str, Any]], wall_ms: int | None = None) -> None:
        """Add one sample of ``_page_overview.workers`` rows."""
        present: set[str] = set()
        for w in workers:
            doc = w.get("stats") or {}
            try:
                t = int(doc["t"])
                c = [int(x) for x in doc["c"]]
                h = [int(x) for x in doc.get("lat", [])]
            except (KeyError, TypeError, ValueError):
                continue  # no stats (yet), or an older format
            if len(c) < 5:  # the five counters of the first format are in every one
                continue
            c = (c + [0] * len(STATS_COUNTERS))[: len(STATS_COUNTERS)]
            token = w["token"]
            present.add(token)
            prev = self._docs.get(token)
            if prev is not None and t > prev[0]:
                dt = (t - prev[0]) / 1000
                rates = [d / dt for d in _delta(c, prev[1])]
                self._rates[token] = (rates, _delta(h, prev[2]) if h else [])
            if prev is None or t > prev[0]:
                self._docs[token] = (t, c, h)
        for gone in set(self._docs) - present:
            self._docs.pop(gone, None)
            self._rates.pop(gone, None)
        if not self._rates and not self.points and not present:
            return
        sums = [0.0] * len(STATS_COUNTERS)
        lat: list[int] = []
        for rates, hist in self._rates.values():
            for i, r in enumerate(rates):
                sums[i] += r
            if len(hist) > len(lat):
                lat += [0] * (len(hist) - len(lat))
            for i, n in enumerate(hist):
                lat[i] += n
        point: dict[str, Any] = {"t": wall_ms if wall_ms is not None else int(time.time() * 1000)}
        for name, total in zip(STATS_COUNTERS, sums, strict=True):
            point[name] = round(total, 2)
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
