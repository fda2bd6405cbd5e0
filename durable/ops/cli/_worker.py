"""``tickwheel worker``: run durable jobs with the tasks of a registry."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
from typing import Any

from tickwheel.durable.model import PRIORITY_AGING
from tickwheel.durable.ops.logs import FORMATS
from tickwheel.durable.runtime import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_LIMIT,
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REAP_INTERVAL,
    DEFAULT_RECONCILE_INTERVAL,
    DEFAULT_START_MARGIN,
    TaskRegistry,
    Worker,
)
from tickwheel.durable.scheduler import (
    DEFAULT_LEASE,
    DEFAULT_OWNER_TTL,
    Scheduler,
)

from ._args import (
    AddCommand,
    common_options,
    non_negative_float,
    port,
    positive_float,
    positive_int,
)
from ._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    connect_redis,
    fail,
    run,
)
from ._publish import add_publish_options, open_publisher


def _load_registry(path: str) -> TaskRegistry:
    """Import ``module:attr`` (attr may be dotted) and return the registry it names.

    Raises:
        ValueError: if the path is malformed or does not name a TaskRegistry.
        ImportError: if the module cannot be imported.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"registry must be MODULE:ATTRIBUTE, got {path!r}")
    if os.getcwd() not in sys.path:  # the console script, unlike `python -m`, omits it
        sys.path.insert(0, os.getcwd())
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, TaskRegistry):
        raise ValueError(f"{path} is a {type(obj).__name__}, not a TaskRegistry")
    return obj


async def _work(args: argparse.Namespace, registry: TaskRegistry) -> int:
    client = await connect_redis(args.redis_url)
    metrics = None
    scheduler: Scheduler | None = None
    close_publisher = None
    try:
        publisher, close_publisher = await open_publisher(args)
        scheduler = Scheduler(
            client,
            args.namespace,
            shards=args.shards,
            owner_ttl=args.owner_ttl,
            check=not args.no_check,
            postgres_url=args.postgres_url,
            worker_id=args.worker_id,
            tracing=args.tracing,
        )
        worker = Worker(
            scheduler,
            registry,
            lookahead=args.lookahead,
            lease=args.lease,
            limit=args.limit,
            poll_interval=args.poll_interval,
            max_running=args.max_running,
            reap_interval=args.reap_interval,
            drain_timeout=args.drain_timeout,
            reconcile_interval=args.reconcile_interval,
            default_timeout=args.task_timeout,
            start_margin=args.start_margin,
            priority_aging=args.priority_aging,
            publisher=publisher,
            history=args.history,
        )
        await scheduler.open()  # fail early: unreachable, shard count mismatch
        if args.metrics_port is not None:
            from tickwheel.durable.ops.metrics import (  # noqa: PLC0415  (optional extra)
                MetricsCollector,
                start_metrics_server,
            )

            try:
                metrics = start_metrics_server(
                    MetricsCollector(scheduler, worker), args.metrics_port
                )
            except ImportError as exc:
                raise CliError(EXIT_USAGE, f"--metrics-port: {exc}") from None
            except OSError as exc:
                raise CliError(
                    EXIT_FAILED, f"--metrics-port {args.metrics_port}: cannot listen ({exc})"
                ) from None
        loop = asyncio.get_running_loop()
        got: list[int] = []  # the signals that stopped it

        def on_signal(sig: int) -> None:
            got.append(sig)
            worker.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        started: dict[str, Any] = {"event": "started", "pid": os.getpid()}
        if metrics is not None:
            started["metrics_port"] = metrics.port
        print(json.dumps(started), flush=True)
        stats = await worker.run()
        stopped = {
            "event": "stopped",
            "stats": stats.as_dict(),
            "scheduler": scheduler.stats().as_dict(),
            # Per task: runs, acked, retries, dead, late_us, then the lateness buckets.
            "tasks": stats.tasks.snapshot(),
        }
        print(json.dumps(stopped), flush=True)
        if signal.SIGINT in got:  # Ctrl-C: the same graceful stop as SIGTERM, then 130
            print(f"tickwheel {args.command}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return EXIT_OK
    finally:
        if metrics is not None:
            metrics.stop()
        if close_publisher is not None:
            await close_publisher()
        if scheduler is not None:
            await scheduler.close_connections()  # its own (the Postgres pool), not client
        await client.aclose()


def _worker(args: argparse.Namespace) -> int:
    try:
        registry = _load_registry(args.registry)
    except (ValueError, ImportError, AttributeError) as exc:
        return fail(args, CliError(EXIT_USAGE, f"registry: {exc}"))
    if args.tracing:
        try:
            import opentelemetry.trace  # noqa: F401, PLC0415
        except ImportError:
            message = "--tracing needs opentelemetry-api: pip install 'tickwheel[otel]'"
            return fail(args, CliError(EXIT_USAGE, message))
    return run(args, lambda: _work(args, registry))


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add this group's commands (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    work = add(
        "worker",
        "run durable jobs with the tasks of a registry (prints JSON lines: started, stopped)",
        parents=[common_options(with_json=False)],
    )
    work.add_argument("registry", help="MODULE:ATTRIBUTE naming a TaskRegistry")
    work.add_argument("--owner-ttl", type=positive_float, default=DEFAULT_OWNER_TTL)
    work.add_argument("--lookahead", type=non_negative_float, default=DEFAULT_LOOKAHEAD)
    work.add_argument("--lease", type=positive_float, default=DEFAULT_LEASE)
    work.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT)
    work.add_argument("--max-running", type=positive_int, default=DEFAULT_MAX_RUNNING)
    work.add_argument("--poll-interval", type=positive_float, default=DEFAULT_POLL_INTERVAL)
    work.add_argument("--reap-interval", type=positive_float, default=DEFAULT_REAP_INTERVAL)
    work.add_argument("--drain-timeout", type=non_negative_float, default=DEFAULT_DRAIN_TIMEOUT)
    work.add_argument(
        "--task-timeout",
        type=positive_float,
        default=None,
        help="seconds a handler may run when its task sets no timeout (default: no limit)",
    )
    work.add_argument(
        "--reconcile-interval",
        type=positive_float,
        default=DEFAULT_RECONCILE_INTERVAL,
        help="Postgres mode: seconds between reconciles (one runs at start)",
    )
    work.add_argument("--no-check", action="store_true", help="skip the server config check")
    work.add_argument(
        "--log-format",
        choices=FORMATS,
        help="log lines to stderr as text or JSON, one object a line (alone: INFO and up;"
        " -v: also each job's claim, start and ack)",
    )
    work.add_argument(
        "--worker-id",
        help="a stable id for this worker process (one per process running at once): a"
        " worker restarted with the same id takes its shards back at once, instead of"
        " waiting --owner-ttl for the old tokens to expire",
    )
    work.add_argument(
        "--start-margin",
        type=positive_float,
        default=DEFAULT_START_MARGIN,
        help="seconds a claimed job's lease lasts past the lookahead until its run starts"
        " (then it is extended to --lease): a killed worker's unstarted jobs are back"
        " within --lookahead plus this, at the same attempt",
    )
    work.add_argument(
        "--priority-aging",
        type=non_negative_float,
        default=PRIORITY_AGING,
        help="seconds late after which a due job is claimed before any priority, oldest"
        " first: the longest a low priority waits behind higher ones, past its due",
    )
    work.add_argument(
        "--metrics-port",
        type=port,
        help="serve Prometheus metrics on 127.0.0.1:PORT (needs tickwheel[prometheus])",
    )
    add_publish_options(work)
    work.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry spans of each run, claim and reap (needs tickwheel[otel] and an"
        " SDK the process configures, e.g. under opentelemetry-instrument)",
    )
    work.add_argument(
        "--history",
        action="store_true",
        help="keep each shard's history of finished attempts for the dashboard's job and"
        " history pages (one batch per shard a second; costs up to ~20%% of the worker's"
        " CPU with no-op tasks)",
    )
    work.set_defaults(func=_worker)
