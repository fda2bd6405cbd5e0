"""The charts and the throughput per task: rates and lateness percentiles from the
chart samples the workers keep in Redis (``{ns}:samples``, ``store/_workers.py``).

Ground rules:

- Workers add a sample every ``SAMPLE_S`` seconds: how much their counters grew over
  the ``dt`` ms before it. The dashboard reads the stream (the last hour at start, then
  what is new, one XRANGE each interval) and keeps the last hour in memory, so a
  restarted dashboard shows the hour before it started, dead letters included.
- A sample's growth is spread over the buckets (``interval`` s wide, aligned on the
  epoch) its ``dt`` covers, in proportion to the overlap; a bucket's rate is its sum
  over its width. Samples of every worker add up, and a worker that restarted counts
  from its start: no differences are taken here.
- A bucket is drawn once it is complete: every live worker has written a sample that
  covers it (its end is at least one sample period before now).
- Lateness percentiles are the upper bounds of the histogram buckets that hold them
  (``_stats.LATENESS_BOUNDS``), over the jobs fired in the bucket.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from tickwheel.durable.runtime import STATS_COUNTERS, TASK_FIELDS
from tickwheel.durable.store import SAMPLE_S, Sample, task_growth

from ._rows import lateness_quantile

__all__ = ["HISTORY_S", "TASK_WINDOW_S", "Charts"]

# How much history the charts keep (s).
HISTORY_S = 3600.0
# The window (s) of the first screen's throughput, failures and lateness per task.
TASK_WINDOW_S = 300.0
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# A task's counters in a sample ("runs", "acked", "retries", "dead", "late_us"), then
# its lateness buckets.
_TASK_FIELDS = len(TASK_FIELDS)
# Seconds past a sample period before a bucket counts as complete: a worker writes its
# sample in its balancing round (about a second apart), so a little after the period.
_LAG_MARGIN_S = 2.0


def _overlaps(start: float, end: float, width: float) -> Iterable[tuple[int, float]]:
    """``(bucket index, share of [start, end])`` for the buckets of ``width`` that
    ``[start, end]`` covers."""
    span = end - start
    first, last = math.floor(start / width), math.floor(end / width)
    if first == last or span <= 0:
        yield last, 1.0
        return
    for k in range(first, last + 1):
        lo, hi = max(start, k * width), min(end, (k + 1) * width)
        if hi > lo:
            yield k, (hi - lo) / span


class Charts:
    """Rates of claims, acks, retries, dead letters and reaps over every worker, and
    firing lateness percentiles, for the last :data:`HISTORY_S`, from the samples.

    Args:
        interval: seconds a chart bucket spans (and between the sampler's reads).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval  # bucket width (s)
        self.samples: deque[Sample] = deque()  # the last hour's, oldest first
        self.last_id: str | None = None  # where the next read starts (exclusive)
        self.now_ms = 0  # Redis time of the last read
        self._points: list[dict[str, Any]] | None = None  # cached until a read adds

    def add(self, samples: Iterable[Sample], now_ms: int) -> None:
        """Add what one read of the stream returned (Redis time ``now_ms``)."""
        for s in samples:
            self.samples.append(s)
            self.last_id = s.id
        self.now_ms = now_ms
        oldest = now_ms - HISTORY_S * 1000 - SAMPLE_S * 1000
        while self.samples and self.samples[0].t_ms < oldest:
            self.samples.popleft()
        self._points = None

    def lag_ms(self) -> float:
        """How long (ms) after its end a bucket is complete: the longest sample period
        seen (a worker's ``dt``) and a margin."""
        dts = [s.data["dt"] for s in self.samples if s.t_ms >= self.now_ms - 300_000]
        return max(dts, default=SAMPLE_S * 1000) * 1.25 + _LAG_MARGIN_S * 1000

    @property
    def points(self) -> list[dict[str, Any]]:
        """The chart points, oldest first: per complete bucket, ``t`` (its end, ms),
        the rate of each counter per second, ``p50``/``p90``/``p99`` (s; -1 past the
        last bound, None without firings) and ``fired``."""
        if self._points is None:
            self._points = self._compute()
        return self._points

    def _compute(self) -> list[dict[str, Any]]:
        if not self.samples:
            return []
        width = self.interval * 1000
        # The last complete bucket: its end, (k + 1) x width, at least the lag before now.
        end_k = math.floor((self.now_ms - self.lag_ms()) / width) - 1
        first_k = max(
            math.floor((self.samples[0].t_ms - self.samples[0].data["dt"]) / width),
            math.floor((self.now_ms - HISTORY_S * 1000) / width),
        )
        if end_k < first_k:
            return []
        n = end_k - first_k + 1
        sums = [[0.0] * len(STATS_COUNTERS) for _ in range(n)]
        lats: list[list[float]] = [[] for _ in range(n)]
        for s in self.samples:
            c, lat = s.data["c"], s.data.get("lat", [])
            for k, share in _overlaps(s.t_ms - s.data["dt"], s.t_ms, width):
                i = k - first_k
                if not 0 <= i < n:
                    continue
                row = sums[i]
                for j, v in enumerate(c[: len(row)]):
                    row[j] += v * share
                hist = lats[i]
                if len(hist) < len(lat):
                    hist += [0.0] * (len(lat) - len(hist))
                for j, v in enumerate(lat):
                    hist[j] += v * share
        out = []
        for i in range(n):
            point: dict[str, Any] = {"t": int((first_k + i + 1) * width)}
            for name, total in zip(STATS_COUNTERS, sums[i], strict=True):
                point[name] = round(total / self.interval, 2)
            for name, q in QUANTILES:
                v = lateness_quantile(lats[i], q)
                point[name] = None if v is None else (v if v != float("inf") else -1)
            point["fired"] = round(sum(lats[i]))
            out.append(point)
        return out

    def per_task(self, window_s: float = TASK_WINDOW_S) -> dict[str, dict[str, Any]]:
        """Per task over the last ``window_s`` (by sample end): runs, acks, retries and
        dead letters (whole counts), acks per minute (over the time the samples cover,
        when that is shorter) and lateness p50/p99 (s)."""
        rows, first_ms = task_growth(self.samples, int(self.now_ms - window_s * 1000))
        first_ms = first_ms or self.now_ms
        # Per minute over what the samples cover (less than the window just after the
        # workers started), at least a sample period.
        span_s = max(min(window_s, (self.now_ms - first_ms) / 1000), SAMPLE_S)
        out = {}
        for task, counted in rows.items():
            row = counted + [0] * max(_TASK_FIELDS - len(counted), 0)
            lat = row[_TASK_FIELDS:]
            p50, p99 = lateness_quantile(lat, 0.5), lateness_quantile(lat, 0.99)
            out[task] = {
                "runs": row[0],
                "acked": row[1],
                "retries": row[2],
                "dead": row[3],
                "acked_per_min": round(row[1] * 60 / span_s, 1),
                "lateness_p50": p50 if p50 != float("inf") else -1,
                "lateness_p99": p99 if p99 != float("inf") else -1,
            }
        return out

    def series(self) -> dict[str, Any]:
        """The history as the JSON API returns it."""
        return {
            "interval_s": self.interval,
            "history_s": HISTORY_S,
            "counters": list(STATS_COUNTERS),
            "quantiles": [name for name, _ in QUANTILES],
            "points": self.points,
        }
