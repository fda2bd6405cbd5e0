"""What a worker publishes about itself for the dashboard: its stats document every
balancing round, a chart sample (its counters' growth) every ``SAMPLE_S`` seconds, and
the attempts it ended since the last round (the shards' history, ``_history.py``).

Ground rules:

- All are written by the balancer, off the job path: one SET per round, one XADD per
  sample (``store/_workers.py`` holds their shapes and keys), one pipeline of a few XADDs
  for the history (``store/_history.py``: batches of rows).
- A sample is the difference between the counters now and at the previous sample, so
  samples from every worker add up: the dashboard's rate over an interval is the sum of
  the samples covering it over their time. The first sample counts from the worker's
  start, and the last is written when the worker stops: no run goes uncounted.
- A sample that could not be written is not lost: the next one covers its interval too
  (the baseline moves only once a sample is written).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from tickwheel.durable.store import SAMPLE_S, STATS_VERSION

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["StatsPublisher"]


def _minus(now: list[int], before: list[int] | None) -> list[int]:
    """``now - before`` per counter (``now`` when there is no ``before``)."""
    if before is None:
        return list(now)
    return [a - b for a, b in zip(now, before + [0] * (len(now) - len(before)), strict=False)]


class StatsPublisher:
    """The stats document and the chart samples of one worker.

    Args:
        worker: the worker described (its scheduler, ownership and loader are read).
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.sample_s = SAMPLE_S  # seconds between chart samples
        # The counters at the last sample written: (monotonic time, document); None
        # before the first (which counts from the worker's start).
        self._base: tuple[float, dict[str, Any]] | None = None
        self._started = time.monotonic()  # the first sample's interval starts here

    def document(self) -> dict[str, Any]:
        """The worker's counters, compact (the shape is ``store/_workers.py``'s).

        ``t`` is this host's wall clock (ms) when it was made; ``c`` monotonic counters
        since the worker started (claimed, acked, retries, dead letters, reaped,
        timeouts); ``lat`` the firing-lateness histogram's bucket counts (bounds
        ``LATENESS_BOUNDS`` in ``model/_stats.py``, the last one +Inf); ``tasks`` the
        same per task (``runtime/_task_stats.py``); ``v`` the format version.
        """
        worker = self.worker
        stats = worker.scheduler.stats()
        loader = worker.loader
        doc: dict[str, Any] = {
            "v": STATS_VERSION,
            "t": int(time.time() * 1000),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "owned": len(worker.ownership.owned),
            "c": [
                *(stats.claimed, stats.acked, stats.retries, stats.dead_letters, stats.reaped),
                stats.timeouts,
            ],
        }
        if loader is not None:
            doc["loaded"] = loader.loaded
            doc["running"] = loader.running
            doc["lat"] = list(loader.lateness.counts)
            doc["tasks"] = loader.stats.tasks.snapshot()
        return doc

    async def publish(self, final: bool = False) -> None:
        """Write the document (one SET with the member TTL) and, when a sample is due
        (or ``final``: the worker is stopping), a chart sample (one XADD).

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        worker = self.worker
        doc = self.document()
        board = worker.scheduler.workers
        if not final:
            await board.publish(worker.token, doc, worker.ownership.ttl_ms)
        now = time.monotonic()
        since = self._base[0] if self._base is not None else self._started
        if final or now - since >= self.sample_s:
            sample = self.sample(doc, now - since)
            if sample is not None:
                await board.add_sample(sample, doc["t"])
            self._base = (now, doc)
        await self.write_history()

    async def write_history(self) -> None:
        """Write the attempts ended since the last write to their shards' history
        streams (one pipeline); put back for the next round if that fails.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        loader = self.worker.loader
        recorder = loader.stats.history if loader is not None else None
        if recorder is None or not recorder.pending:
            return
        batch = recorder.take()
        try:
            await self.worker.scheduler.history.add(recorder.worker, batch)
        except BaseException:
            recorder.put_back(batch)
            raise

    def sample(self, doc: dict[str, Any], elapsed_s: float) -> dict[str, Any] | None:
        """The growth of ``doc``'s counters since the last sample, over ``elapsed_s``;
        None when nothing grew (an idle worker adds nothing to the stream)."""
        before = self._base[1] if self._base is not None else None
        c = _minus(doc["c"], before["c"] if before else None)
        lat = _minus(doc.get("lat", []), before.get("lat") if before else None)
        old_tasks: dict[str, list[int]] = before.get("tasks", {}) if before else {}
        tasks = {}
        for task, row in doc.get("tasks", {}).items():
            grew = _minus(row, old_tasks.get(task))
            if any(grew):
                tasks[task] = grew
        if not any(c) and not any(lat) and not tasks:
            return None
        return {
            "w": self.worker.token[:8],
            "dt": max(int(elapsed_s * 1000), 1),
            "c": c,
            "lat": lat,
            "tasks": tasks,
        }
