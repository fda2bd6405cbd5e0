"""An optional Prometheus exporter (``pip install 'tickwheel[prometheus]'``).

Ground rules:

- Nothing is counted here: a :class:`MetricsCollector` reads the counters the scheduler,
  loader and wheel keep anyway (``stats()``) when Prometheus scrapes, so the exporter
  costs nothing on the hot path.
- ``prometheus_client`` is imported lazily, so the rest of tickwheel never needs it; a
  missing install raises an ImportError that names the extra.
- The HTTP server binds to loopback unless told otherwise: metrics are for a local agent
  or a sidecar, not the open network.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tickwheel.durable.model import LATENESS_BOUNDS
from tickwheel.durable.runtime import TASK_FIELDS

if TYPE_CHECKING:
    from tickwheel.durable.runtime import Worker
    from tickwheel.durable.scheduler import Scheduler

__all__ = ["MetricsCollector", "MetricsServer", "load_prometheus_client", "start_metrics_server"]

# Counter name (without _total) -> (SchedulerStats field, help text).
_SCHEDULER_COUNTERS = {
    "tickwheel_claim_calls": ("claim_calls", "Claim script calls."),
    "tickwheel_claimed_jobs": ("claimed", "Jobs handed out by claims."),
    "tickwheel_acks": ("acked", "Leases completed by an ack."),
    "tickwheel_acks_lost": ("ack_lost", "Acks that found the lease gone."),
    "tickwheel_retries": ("retries", "Failed jobs put back to due with a backoff."),
    "tickwheel_dead_letters": ("dead_letters", "Jobs moved to the dead letters."),
    "tickwheel_reaped": ("reaped", "Expired leases returned to due or to dead."),
    "tickwheel_fenced": ("fenced", "Calls refused because this owner's epoch was stale."),
    "tickwheel_dedup_dropped": ("dedup_dropped", "Occurrences done already, dropped at claim."),
    "tickwheel_timeouts": ("timeouts", "Handlers stopped past their timeout (a failed attempt)."),
    "tickwheel_stopped": ("stopped", "Handlers stopped because their job was cancelled."),
}
# Shard moves, one counter with a kind label.
_SHARD_MOVES = {"taken": "shards_taken", "given_back": "shards_given_back", "lost": "shards_lost"}


def load_prometheus_client(module: str = "prometheus_client") -> ModuleType:
    """Import and return ``prometheus_client`` (or one of its modules).

    Raises:
        ImportError: naming the ``prometheus`` extra, if it is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            "the Prometheus exporter needs prometheus_client: pip install 'tickwheel[prometheus]'"
        ) from exc


class MetricsCollector:
    """A Prometheus collector over a scheduler's (and a worker's) ``stats()``.

    Register it on a ``prometheus_client.CollectorRegistry`` (or use
    :func:`start_metrics_server`). Every metric has a ``namespace`` label.

    Args:
        scheduler: whose counters to export.
        worker: also export its loader's counters and firing-lateness histogram and its
            wheel's counters, while it runs.
    """

    def __init__(self, scheduler: Scheduler, worker: Worker | None = None) -> None:
        self.scheduler = scheduler  # counters of claims, acks, ...
        self.worker = worker  # loader and wheel, when set

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called by prometheus_client on each scrape)."""
        metrics = load_prometheus_client("prometheus_client.core")
        ns = self.scheduler.keys.namespace
        stats = self.scheduler.stats()
        for name, (field, text) in _SCHEDULER_COUNTERS.items():
            family = metrics.CounterMetricFamily(name, text, labels=["namespace"])
            family.add_metric([ns], getattr(stats, field))
            yield family
        moves = metrics.CounterMetricFamily(
            "tickwheel_shard_moves",
            "Shards taken, given back or lost.",
            labels=["namespace", "kind"],
        )
        for kind, field in _SHARD_MOVES.items():
            moves.add_metric([ns, kind], getattr(stats, field))
        yield moves
        owned = metrics.GaugeMetricFamily(
            "tickwheel_owned_shards", "Shards this process owns.", labels=["namespace"]
        )
        owned.add_metric([ns], len(self.scheduler.ownership.owned))
        yield owned
        loader = self.worker.loader if self.worker is not None else None
        if loader is None:
            return
        for name, value, text in (
            ("tickwheel_loaded_jobs", loader.loaded, "Jobs loaded into the wheel, not started."),
            ("tickwheel_running_jobs", loader.running, "Jobs fired, not yet acked or retried."),
        ):
            gauge = metrics.GaugeMetricFamily(name, text, labels=["namespace"])
            gauge.add_metric([ns], value)
            yield gauge
        waiting = metrics.GaugeMetricFamily(
            "tickwheel_limit_waiting",
            "Jobs waiting for a permit or a start of their flow key, by limited task (as"
            " this worker last read them).",
            labels=["namespace", "task"],
        )
        for task, count in loader.limiter.waiting.items():
            waiting.add_metric([ns, task], count)
        yield waiting
        fired = metrics.CounterMetricFamily(
            "tickwheel_jobs", "Jobs by outcome in this worker.", labels=["namespace", "outcome"]
        )
        for outcome, value in loader.stats.as_dict().items():
            fired.add_metric([ns, outcome], value)
        yield fired
        hist = loader.lateness
        lateness = metrics.HistogramMetricFamily(
            "tickwheel_job_lateness_seconds",
            "Firing lateness of durable jobs: loop time at firing minus the due time.",
            labels=["namespace"],
        )
        lateness.add_metric([ns], hist.cumulative(), sum_value=hist.sum)
        yield lateness
        yield from _per_task(metrics, ns, loader.stats.tasks.snapshot())
        wheel = loader.wheel.stats()
        for name, value, text in (
            ("tickwheel_wheel_fired", wheel.fired, "Wheel callbacks run."),
            ("tickwheel_wheel_cancelled", wheel.cancelled, "Wheel timers cancelled."),
            ("tickwheel_wheel_wakeups", wheel.wakeups, "Times the loop woke the wheel."),
        ):
            counter = metrics.CounterMetricFamily(name, text, labels=["namespace"])
            counter.add_metric([ns], value)
            yield counter
        pending = metrics.GaugeMetricFamily(
            "tickwheel_wheel_pending", "Wheel timers pending.", labels=["namespace"]
        )
        pending.add_metric([ns], wheel.pending)
        yield pending


def _per_task(metrics: ModuleType, ns: str, tasks: dict[str, list[int]]) -> Iterator[Any]:
    """The per-task families: runs by outcome and the firing lateness histogram, with a
    ``task`` label. Bounded: a worker counts at most ``MAX_TASKS`` task names, the rest
    under the label ``(other)``."""
    runs = metrics.CounterMetricFamily(
        "tickwheel_task_runs",
        "Runs of durable jobs by task and outcome in this worker"
        " (started; acked; retried; dead: dead-lettered).",
        labels=["namespace", "task", "outcome"],
    )
    lateness = metrics.HistogramMetricFamily(
        "tickwheel_task_lateness_seconds",
        "Firing lateness of durable jobs by task: loop time at firing minus the due time.",
        labels=["namespace", "task"],
    )
    bounds = (*map(repr, LATENESS_BOUNDS), "+Inf")
    for task, row in sorted(tasks.items()):
        label = task or "(other)"
        for outcome, value in zip(("started", "acked", "retried", "dead"), row, strict=False):
            runs.add_metric([ns, label, outcome], value)
        cumulative, total = [], 0
        for bound, n in zip(bounds, row[len(TASK_FIELDS) :], strict=False):
            total += n
            cumulative.append((bound, total))
        lateness.add_metric([ns, label], cumulative, sum_value=row[4] / 1_000_000)
    yield runs
    yield lateness


@dataclass
class MetricsServer:
    """A running metrics HTTP server (a daemon thread of prometheus_client)."""

    port: int  # the port it listens on
    _server: Any  # the WSGI server
    _thread: Any  # its thread

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_metrics_server(
    collector: MetricsCollector, port: int, addr: str = "127.0.0.1"
) -> MetricsServer:
    """Serve ``collector`` (only it) at ``http://addr:port/metrics`` in a thread.

    Args:
        collector: what to export.
        port: TCP port; 0 picks a free one (see ``MetricsServer.port``).
        addr: address to bind; loopback by default.

    Returns:
        The server; call ``stop()`` on it.

    Raises:
        ImportError: if prometheus_client is not installed (names the extra).
        OSError: if the port cannot be bound.
    """
    prom = load_prometheus_client()
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = prom.start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(int(server.server_address[1]), server, thread)
